//! One FastConformer layer (NeMo `ConformerLayer`):
//! `x += ½·FF1(LN x); x += MHSA(LN x); x += Conv(LN x); x += ½·FF2(LN x); x = LN(x)`.

use crate::checkpoint::TensorMap;
use crate::error::ModelError;
use crate::linalg::{add_scaled, load_vector, sigmoid, silu_in_place, Bias, LayerNorm, Linear};
use model_core::config::{AttentionModel, EncoderConfig};

use super::attention::RelPosAttention;

/// Residual weight of the two macaron feed-forward modules.
const FF_RESIDUAL_SCALE: f32 = 0.5;

/// `Linear → SiLU → Linear`.
#[derive(Debug, Clone)]
struct FeedForward {
    linear1: Linear,
    linear2: Linear,
}

impl FeedForward {
    fn load(tensors: &TensorMap, prefix: &str, cfg: &EncoderConfig) -> Result<Self, ModelError> {
        let bias = Bias::required_if(cfg.use_bias);
        let (d, ff) = (cfg.d_model, cfg.ff_hidden);
        Ok(Self {
            linear1: Linear::load(tensors, &format!("{prefix}.linear1"), d, ff, false, bias)?,
            linear2: Linear::load(tensors, &format!("{prefix}.linear2"), ff, d, false, bias)?,
        })
    }

    fn forward(&self, x: &[f32], t: usize) -> Vec<f32> {
        let mut h = self.linear1.forward(x, t);
        silu_in_place(&mut h);
        self.linear2.forward(&h, t)
    }
}

/// `pointwise_conv1 → GLU → depthwise_conv (with BatchNorm folded in) → SiLU → pointwise_conv2`.
#[derive(Debug, Clone)]
struct ConvModule {
    d_model: usize,
    kernel: usize,
    pointwise1: Linear,
    /// `[d_model, kernel]`, BatchNorm scale folded in.
    depthwise_weight: Vec<f32>,
    /// `[d_model]`, conv bias and BatchNorm shift folded in.
    depthwise_bias: Vec<f32>,
    pointwise2: Linear,
}

impl ConvModule {
    fn load(tensors: &TensorMap, prefix: &str, cfg: &EncoderConfig) -> Result<Self, ModelError> {
        let (d, k) = (cfg.d_model, cfg.conv_kernel_size);
        if k % 2 == 0 {
            return Err(ModelError::InvalidConfig {
                file: tensors.source.clone(),
                key: "encoder.conv_kernel_size".into(),
                problem: format!("{k} is even; the depthwise convolution needs an odd kernel"),
            });
        }
        let bias = Bias::required_if(cfg.use_bias);
        let pointwise1 = Linear::load(
            tensors,
            &format!("{prefix}.pointwise_conv1"),
            d,
            2 * d,
            true,
            bias,
        )?;
        let pointwise2 = Linear::load(
            tensors,
            &format!("{prefix}.pointwise_conv2"),
            d,
            d,
            true,
            bias,
        )?;
        let dw_weight = tensors.get(&format!("{prefix}.depthwise_conv.weight"), &[d, 1, k])?;
        let dw_name = format!("{prefix}.depthwise_conv.bias");
        let dw_bias = match bias {
            Bias::Required => Some(tensors.get(&dw_name, &[d])?),
            Bias::IfPresent => tensors.get_optional(&dw_name, &[d])?,
        };
        let bn = |name: &str| load_vector(tensors, &format!("{prefix}.batch_norm.{name}"), d);
        let (gamma, beta) = (bn("weight")?, bn("bias")?);
        let (mean, var) = (bn("running_mean")?, bn("running_var")?);

        // BN(conv(x)) = conv(x)·s + (β − μ·s) with s = γ / √(σ² + ε).
        let mut depthwise_weight = dw_weight.data.clone();
        let mut depthwise_bias = vec![0.0; d];
        for c in 0..d {
            let s = gamma[c] / (var[c] + cfg.batch_norm_eps).sqrt();
            for w in &mut depthwise_weight[c * k..(c + 1) * k] {
                *w *= s;
            }
            let b = dw_bias.map_or(0.0, |b| b.data[c]);
            depthwise_bias[c] = (b - mean[c]) * s + beta[c];
        }
        Ok(Self {
            d_model: d,
            kernel: k,
            pointwise1,
            depthwise_weight,
            depthwise_bias,
            pointwise2,
        })
    }

    fn forward(&self, x: &[f32], t: usize) -> Vec<f32> {
        let d = self.d_model;
        let a = self.pointwise1.forward(x, t);
        // GLU over channels: first half · σ(second half).
        let mut glu = vec![0.0; t * d];
        for (g, row) in glu.chunks_exact_mut(d).zip(a.chunks_exact(2 * d)) {
            let (value, gate) = row.split_at(d);
            for ((o, v), gt) in g.iter_mut().zip(value).zip(gate) {
                *o = v * sigmoid(*gt);
            }
        }
        // Depthwise conv over time, zero padding (k−1)/2 on both sides.
        let pad = self.kernel / 2;
        let mut y = vec![0.0; t * d];
        for (ti, out_row) in y.chunks_exact_mut(d).enumerate() {
            out_row.copy_from_slice(&self.depthwise_bias);
            for tap in 0..self.kernel {
                let src = ti + tap;
                if src < pad || src - pad >= t {
                    continue;
                }
                let in_row = &glu[(src - pad) * d..(src - pad + 1) * d];
                for (c, (o, v)) in out_row.iter_mut().zip(in_row).enumerate() {
                    *o += self.depthwise_weight[c * self.kernel + tap] * v;
                }
            }
        }
        silu_in_place(&mut y);
        self.pointwise2.forward(&y, t)
    }
}

#[derive(Debug, Clone)]
pub(crate) struct ConformerLayer {
    norm_feed_forward1: LayerNorm,
    feed_forward1: FeedForward,
    norm_self_att: LayerNorm,
    self_attn: RelPosAttention,
    norm_conv: LayerNorm,
    conv: ConvModule,
    norm_feed_forward2: LayerNorm,
    feed_forward2: FeedForward,
    norm_out: LayerNorm,
}

impl ConformerLayer {
    /// `prefix` is `encoder.layers.N`.
    pub(crate) fn load(
        tensors: &TensorMap,
        prefix: &str,
        cfg: &EncoderConfig,
    ) -> Result<Self, ModelError> {
        let norm = |name: &str| {
            LayerNorm::load(
                tensors,
                &format!("{prefix}.{name}"),
                cfg.d_model,
                cfg.layer_norm_eps,
            )
        };
        Ok(Self {
            norm_feed_forward1: norm("norm_feed_forward1")?,
            feed_forward1: FeedForward::load(tensors, &format!("{prefix}.feed_forward1"), cfg)?,
            norm_self_att: norm("norm_self_att")?,
            self_attn: RelPosAttention::load(tensors, &format!("{prefix}.self_attn"), cfg)?,
            norm_conv: norm("norm_conv")?,
            conv: ConvModule::load(tensors, &format!("{prefix}.conv"), cfg)?,
            norm_feed_forward2: norm("norm_feed_forward2")?,
            feed_forward2: FeedForward::load(tensors, &format!("{prefix}.feed_forward2"), cfg)?,
            norm_out: norm("norm_out")?,
        })
    }

    /// `x` is `[t, d_model]`, updated in place; `pos_emb` is `attention`'s position table.
    pub(crate) fn forward(
        &self,
        x: &mut Vec<f32>,
        t: usize,
        attention: AttentionModel,
        pos_emb: &[f32],
    ) {
        let h = self
            .feed_forward1
            .forward(&self.norm_feed_forward1.forward(x), t);
        add_scaled(x, &h, FF_RESIDUAL_SCALE);
        let h = self
            .self_attn
            .forward(&self.norm_self_att.forward(x), t, attention, pos_emb);
        add_scaled(x, &h, 1.0);
        let h = self.conv.forward(&self.norm_conv.forward(x), t);
        add_scaled(x, &h, 1.0);
        let h = self
            .feed_forward2
            .forward(&self.norm_feed_forward2.forward(x), t);
        add_scaled(x, &h, FF_RESIDUAL_SCALE);
        *x = self.norm_out.forward(x);
    }
}
