//! One FastConformer layer on the GPU, NeMo `ConformerLayer` order:
//! `x += ½·FF1(LN x); x += MHSA(LN x); x += Conv(LN x); x += ½·FF2(LN x); x = LN(x)`.
//! The residual stream `x` stays in f32; every block's input is LayerNorm'd to bf16.

use cudarc::driver::CudaSlice;
use model_core::config::{AttentionModel, EncoderConfig};
use models::checkpoint::TensorMap;

use super::profile::{lap, Laps, Stage};
use super::weights::{DeviceDepthwise, DeviceLayerNorm, DeviceLinear};
use super::workspace::Workspace;
use crate::device::CudaEngine;
use crate::error::Result;
use crate::ops::{DepthwiseShape, QkvHeads, ResidualF32, RowShape, ScoreRows};
use crate::storage::Storage;
use crate::weight_arena::WeightBuffer;

/// Residual weight of the two macaron feed-forward modules.
const FF_RESIDUAL_SCALE: f32 = 0.5;

struct FeedForward<S> {
    linear1: DeviceLinear<S>,
    linear2: DeviceLinear<S>,
}

impl<S: Storage> FeedForward<S> {
    fn weights_mut(&mut self) -> [&mut WeightBuffer<S>; 2] {
        [self.linear1.weight_mut(), self.linear2.weight_mut()]
    }

    fn load(
        engine: &CudaEngine,
        tensors: &TensorMap,
        prefix: &str,
        cfg: &EncoderConfig,
    ) -> Result<Self> {
        let (d, ff) = (cfg.d_model, cfg.ff_hidden);
        Ok(Self {
            linear1: DeviceLinear::load(
                engine,
                tensors,
                &format!("{prefix}.linear1"),
                (d, ff),
                false,
            )?,
            linear2: DeviceLinear::load(
                engine,
                tensors,
                &format!("{prefix}.linear2"),
                (ff, d),
                false,
            )?,
        })
    }

    /// `ws.branch = linear2(SiLU(linear1(ws.normed)))`.
    fn forward(&self, engine: &CudaEngine, ws: &mut Workspace<S>, rows: usize) -> Result<()> {
        self.linear1
            .forward_storage(engine, &ws.normed, rows, &mut ws.ff_hidden)?;
        engine.silu(&ws.ff_hidden, &mut ws.ff_activated)?;
        self.linear2
            .forward_f32(engine, &ws.ff_activated, rows, &mut ws.branch)
    }
}

struct SelfAttention<S> {
    /// Q, K and V stacked: `[3d, d]`.
    qkv: DeviceLinear<S>,
    pos: DeviceLinear<S>,
    out: DeviceLinear<S>,
    pos_bias_u: CudaSlice<f32>,
    pos_bias_v: CudaSlice<f32>,
}

impl<S: Storage> SelfAttention<S> {
    fn weights_mut(&mut self) -> [&mut WeightBuffer<S>; 3] {
        [
            self.qkv.weight_mut(),
            self.pos.weight_mut(),
            self.out.weight_mut(),
        ]
    }

    fn load(
        engine: &CudaEngine,
        tensors: &TensorMap,
        prefix: &str,
        cfg: &EncoderConfig,
    ) -> Result<Self> {
        let d = cfg.d_model;
        let mut weight = Vec::with_capacity(3 * d * d);
        let mut bias = Vec::with_capacity(3 * d);
        let mut any_bias = false;
        for name in ["linear_q", "linear_k", "linear_v"] {
            weight.extend_from_slice(
                &tensors
                    .get(&format!("{prefix}.{name}.weight"), &[d, d])?
                    .data,
            );
            match tensors.get_optional(&format!("{prefix}.{name}.bias"), &[d])? {
                Some(b) => {
                    any_bias = true;
                    bias.extend_from_slice(&b.data);
                }
                None => bias.extend(std::iter::repeat_n(0.0, d)),
            }
        }
        let head_dim = d / cfg.n_heads.max(1);
        let pos_bias = |name: &str| -> Result<CudaSlice<f32>> {
            let layer_key = format!("{prefix}.{name}");
            let key = if tensors.contains(&layer_key) {
                layer_key
            } else {
                format!("encoder.{name}")
            };
            engine.upload(&tensors.get(&key, &[cfg.n_heads, head_dim])?.data)
        };
        Ok(Self {
            qkv: DeviceLinear::new(
                engine,
                d,
                3 * d,
                &weight,
                any_bias.then_some(bias.as_slice()),
            )?,
            pos: DeviceLinear::load(
                engine,
                tensors,
                &format!("{prefix}.linear_pos"),
                (d, d),
                false,
            )?,
            out: DeviceLinear::load(
                engine,
                tensors,
                &format!("{prefix}.linear_out"),
                (d, d),
                false,
            )?,
            pos_bias_u: pos_bias("pos_bias_u")?,
            pos_bias_v: pos_bias("pos_bias_v")?,
        })
    }

    /// `ws.branch = MHSA(ws.normed)` with full or local relative-position attention. Local
    /// attention still computes the full `T×T` `QKᵀ` and masks outside the band (correct, not
    /// yet the memory saving the local variant exists for).
    fn forward(&self, engine: &CudaEngine, ws: &mut Workspace<S>) -> Result<()> {
        let shape = ws.shape;
        let rows = shape.batch * shape.time;
        let positions = ws.positions;
        self.qkv
            .forward_storage(engine, &ws.normed, rows, &mut ws.qkv)?;
        engine.split_qkv_heads(
            &ws.qkv,
            &self.pos_bias_u,
            &self.pos_bias_v,
            shape,
            QkvHeads {
                q_u: &mut ws.q_u,
                q_v: &mut ws.q_v,
                k: &mut ws.k,
                v: &mut ws.v,
            },
        )?;
        self.pos
            .forward_storage(engine, &ws.pos_table, positions, &mut ws.pos_projected)?;

        let scale = 1.0 / (shape.head_dim as f32).sqrt();
        if ws.fused_attention {
            engine.rel_pos_attention(
                &ws.q_u,
                &ws.q_v,
                &ws.k,
                &ws.v,
                &ws.pos_projected,
                &ws.lengths,
                scale,
                shape,
                &mut ws.context,
            )?;
            return self
                .out
                .forward_f32(engine, &ws.context, rows, &mut ws.branch);
        }
        let no_bias: Option<&CudaSlice<f32>> = None;
        engine.matmul(
            &shape.scores_matmul(),
            &ws.q_u,
            &ws.k,
            no_bias,
            &mut ws.scores_ac,
        )?;
        engine.matmul(
            &shape.bd_matmul(positions),
            &ws.q_v,
            &ws.pos_projected,
            no_bias,
            &mut ws.scores_bd,
        )?;
        let score_rows = ScoreRows::aligned(&shape, positions);
        match ws.attention {
            AttentionModel::RelPos => engine.rel_pos_softmax(
                &ws.scores_ac,
                &ws.scores_bd,
                &ws.lengths,
                scale,
                shape,
                score_rows,
                &mut ws.probs,
            )?,
            AttentionModel::RelPosLocal { left, right } => engine.local_rel_pos_softmax(
                &ws.scores_ac,
                &ws.scores_bd,
                &ws.lengths,
                scale,
                shape,
                (left, right),
                score_rows,
                &mut ws.probs,
            )?,
        }
        engine.attend(
            &ws.probs,
            score_rows.scores,
            &ws.v,
            shape,
            &mut ws.context_heads,
            &mut ws.context,
        )?;
        self.out
            .forward_f32(engine, &ws.context, rows, &mut ws.branch)
    }
}

/// `pointwise_conv1 → GLU → depthwise (BatchNorm folded) → SiLU → pointwise_conv2`.
struct ConvModule<S> {
    pointwise1: DeviceLinear<S>,
    depthwise: DeviceDepthwise,
    pointwise2: DeviceLinear<S>,
}

impl<S: Storage> ConvModule<S> {
    fn weights_mut(&mut self) -> [&mut WeightBuffer<S>; 2] {
        [self.pointwise1.weight_mut(), self.pointwise2.weight_mut()]
    }

    fn load(
        engine: &CudaEngine,
        tensors: &TensorMap,
        prefix: &str,
        cfg: &EncoderConfig,
    ) -> Result<Self> {
        let d = cfg.d_model;
        Ok(Self {
            pointwise1: DeviceLinear::load(
                engine,
                tensors,
                &format!("{prefix}.pointwise_conv1"),
                (d, 2 * d),
                true,
            )?,
            depthwise: DeviceDepthwise::load(engine, tensors, prefix, cfg)?,
            pointwise2: DeviceLinear::load(
                engine,
                tensors,
                &format!("{prefix}.pointwise_conv2"),
                (d, d),
                true,
            )?,
        })
    }

    /// `ws.branch = Conv(ws.normed)`; padded frames enter the depthwise conv as zeros.
    fn forward(&self, engine: &CudaEngine, ws: &mut Workspace<S>) -> Result<()> {
        let shape = ws.shape;
        let (rows, d) = (shape.batch * shape.time, shape.d_model());
        self.pointwise1
            .forward_storage(engine, &ws.normed, rows, &mut ws.conv_in)?;
        engine.glu(&ws.conv_in, rows, d, &mut ws.conv_gated)?;
        engine.depthwise_conv1d(
            &ws.conv_gated,
            &self.depthwise.weight,
            &self.depthwise.bias,
            &ws.lengths,
            DepthwiseShape {
                batch: shape.batch,
                time: shape.time,
                channels: d,
                kernel: self.depthwise.kernel,
            },
            true,
            &mut ws.conv_out,
        )?;
        self.pointwise2
            .forward_f32(engine, &ws.conv_out, rows, &mut ws.branch)
    }
}

pub(crate) struct ConformerLayer<S> {
    norm_feed_forward1: DeviceLayerNorm,
    feed_forward1: FeedForward<S>,
    norm_self_att: DeviceLayerNorm,
    self_attn: SelfAttention<S>,
    norm_conv: DeviceLayerNorm,
    conv: ConvModule<S>,
    norm_feed_forward2: DeviceLayerNorm,
    feed_forward2: FeedForward<S>,
    norm_out: DeviceLayerNorm,
}

impl<S: Storage> ConformerLayer<S> {
    /// The layer's matmul weights, in a fixed order (the shared arena's layout).
    pub(crate) fn weights_mut(&mut self) -> Vec<&mut WeightBuffer<S>> {
        let mut weights = Vec::with_capacity(9);
        weights.extend(self.feed_forward1.weights_mut());
        weights.extend(self.self_attn.weights_mut());
        weights.extend(self.conv.weights_mut());
        weights.extend(self.feed_forward2.weights_mut());
        weights
    }

    pub(crate) fn load(
        engine: &CudaEngine,
        tensors: &TensorMap,
        prefix: &str,
        cfg: &EncoderConfig,
    ) -> Result<Self> {
        let norm =
            |name: &str| DeviceLayerNorm::load(engine, tensors, &format!("{prefix}.{name}"), cfg);
        Ok(Self {
            norm_feed_forward1: norm("norm_feed_forward1")?,
            feed_forward1: FeedForward::load(
                engine,
                tensors,
                &format!("{prefix}.feed_forward1"),
                cfg,
            )?,
            norm_self_att: norm("norm_self_att")?,
            self_attn: SelfAttention::load(engine, tensors, &format!("{prefix}.self_attn"), cfg)?,
            norm_conv: norm("norm_conv")?,
            conv: ConvModule::load(engine, tensors, &format!("{prefix}.conv"), cfg)?,
            norm_feed_forward2: norm("norm_feed_forward2")?,
            feed_forward2: FeedForward::load(
                engine,
                tensors,
                &format!("{prefix}.feed_forward2"),
                cfg,
            )?,
            norm_out: norm("norm_out")?,
        })
    }

    /// Updates `ws.x` in place; `laps` (when profiling) gets each stage's time.
    pub(crate) fn forward(
        &self,
        engine: &CudaEngine,
        ws: &mut Workspace<S>,
        laps: &mut Option<Laps>,
    ) -> Result<()> {
        let shape = ws.shape;
        let rows = shape.batch * shape.time;
        let row_shape = RowShape {
            rows,
            cols: shape.d_model(),
        };
        engine.layer_norm_f32(
            &ws.x,
            &self.norm_feed_forward1.weights(),
            row_shape,
            &mut ws.normed,
        )?;
        lap(laps, engine, Stage::Norms)?;
        self.feed_forward1.forward(engine, ws, rows)?;
        lap(laps, engine, Stage::FeedForward)?;
        add_and_norm(
            engine,
            ws,
            FF_RESIDUAL_SCALE,
            &self.norm_self_att,
            row_shape,
        )?;
        lap(laps, engine, Stage::Norms)?;
        self.self_attn.forward(engine, ws)?;
        lap(laps, engine, Stage::Attention)?;
        add_and_norm(engine, ws, 1.0, &self.norm_conv, row_shape)?;
        lap(laps, engine, Stage::Norms)?;
        self.conv.forward(engine, ws)?;
        lap(laps, engine, Stage::Conv)?;
        add_and_norm(engine, ws, 1.0, &self.norm_feed_forward2, row_shape)?;
        lap(laps, engine, Stage::Norms)?;
        self.feed_forward2.forward(engine, ws, rows)?;
        lap(laps, engine, Stage::FeedForward)?;
        engine.add_layer_norm_f32_inplace(
            &mut ws.x,
            ResidualF32 {
                h: &ws.branch,
                alpha: FF_RESIDUAL_SCALE,
            },
            &self.norm_out.weights(),
            row_shape,
        )?;
        lap(laps, engine, Stage::Norms)
    }
}

/// `x += alpha · branch; normed = LN(x)`.
fn add_and_norm<S: Storage>(
    engine: &CudaEngine,
    ws: &mut Workspace<S>,
    alpha: f32,
    norm: &DeviceLayerNorm,
    shape: RowShape,
) -> Result<()> {
    engine.add_layer_norm_f32(
        &mut ws.x,
        ResidualF32 {
            h: &ws.branch,
            alpha,
        },
        &norm.weights(),
        shape,
        &mut ws.normed,
    )
}
