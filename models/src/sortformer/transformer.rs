//! The Sortformer head after the FastConformer: `encoder_proj`, the post-LN transformer
//! (NeMo `TransformerEncoder`, no positional encoding) and the sigmoid speaker layer.
//!
//! Transformer layer: `x = LN1(x + MHA(x)); x = LN2(x + W_out·ReLU(W_in·x))`.
//! Speaker layer: `σ(W_spk · ReLU(W_hh · ReLU(x)))` (`hidden_to_spks` is unused at inference).

use crate::checkpoint::TensorMap;
use crate::error::ModelError;
use crate::linalg::{add_scaled, matmul, matmul_bt, relu_in_place, softmax_in_place};
use crate::linalg::{sigmoid, Bias, LayerNorm, Linear};

use super::config::SortformerConfig;

/// torch `nn.LayerNorm` default, which NeMo's transformer uses.
const LAYER_NORM_EPS: f32 = 1e-5;

#[derive(Debug, Clone)]
struct SelfAttention {
    n_heads: usize,
    query: Linear,
    key: Linear,
    value: Linear,
    out: Linear,
}

impl SelfAttention {
    fn load(
        tensors: &TensorMap,
        prefix: &str,
        d: usize,
        n_heads: usize,
    ) -> Result<Self, ModelError> {
        let lin = |name: &str| {
            Linear::load(
                tensors,
                &format!("{prefix}.{name}"),
                d,
                d,
                false,
                Bias::Required,
            )
        };
        Ok(Self {
            n_heads,
            query: lin("query_net")?,
            key: lin("key_net")?,
            value: lin("value_net")?,
            out: lin("out_projection")?,
        })
    }

    /// Full (unmasked) attention of `[t, d]` over itself.
    fn forward(&self, x: &[f32], t: usize) -> Vec<f32> {
        let d = self.query.out_dim;
        let dh = d / self.n_heads;
        // NeMo divides queries and keys by d_h^(1/4) each, for range; the product is the usual
        // 1/√d_h scaling.
        let scale = 1.0 / (dh as f32).sqrt().sqrt();
        let mut q = self.query.forward(x, t);
        let mut k = self.key.forward(x, t);
        let v = self.value.forward(x, t);
        q.iter_mut().chain(k.iter_mut()).for_each(|e| *e *= scale);
        let head = |m: &[f32], h: usize| -> Vec<f32> {
            m.chunks_exact(d)
                .flat_map(|row| row[h * dh..(h + 1) * dh].iter().copied())
                .collect()
        };
        let mut context = vec![0.0; t * d];
        let mut scores = vec![0.0; t * t];
        let mut ctx_h = vec![0.0; t * dh];
        for h in 0..self.n_heads {
            let (qh, kh, vh) = (head(&q, h), head(&k, h), head(&v, h));
            matmul_bt(&qh, t, dh, &kh, t, &mut scores);
            scores.chunks_exact_mut(t).for_each(softmax_in_place);
            matmul(&scores, t, t, &vh, dh, &mut ctx_h);
            for (row, src) in context.chunks_exact_mut(d).zip(ctx_h.chunks_exact(dh)) {
                row[h * dh..(h + 1) * dh].copy_from_slice(src);
            }
        }
        self.out.forward(&context, t)
    }
}

#[derive(Debug, Clone)]
struct TransformerLayer {
    attention: SelfAttention,
    layer_norm_1: LayerNorm,
    dense_in: Linear,
    dense_out: Linear,
    layer_norm_2: LayerNorm,
}

impl TransformerLayer {
    fn load(tensors: &TensorMap, prefix: &str, cfg: &SortformerConfig) -> Result<Self, ModelError> {
        let tf = &cfg.transformer;
        let (d, inner) = (tf.hidden, tf.inner);
        let ffn = format!("{prefix}.second_sub_layer");
        Ok(Self {
            attention: SelfAttention::load(
                tensors,
                &format!("{prefix}.first_sub_layer"),
                d,
                tf.n_heads,
            )?,
            layer_norm_1: LayerNorm::load(
                tensors,
                &format!("{prefix}.layer_norm_1"),
                d,
                LAYER_NORM_EPS,
            )?,
            dense_in: Linear::load(
                tensors,
                &format!("{ffn}.dense_in"),
                d,
                inner,
                false,
                Bias::Required,
            )?,
            dense_out: Linear::load(
                tensors,
                &format!("{ffn}.dense_out"),
                inner,
                d,
                false,
                Bias::Required,
            )?,
            layer_norm_2: LayerNorm::load(
                tensors,
                &format!("{prefix}.layer_norm_2"),
                d,
                LAYER_NORM_EPS,
            )?,
        })
    }

    fn forward(&self, x: &[f32], t: usize) -> Vec<f32> {
        let mut h = self.attention.forward(x, t);
        add_scaled(&mut h, x, 1.0);
        let h = self.layer_norm_1.forward(&h);
        let mut f = self.dense_in.forward(&h, t);
        relu_in_place(&mut f);
        let mut f = self.dense_out.forward(&f, t);
        add_scaled(&mut f, &h, 1.0);
        self.layer_norm_2.forward(&f)
    }
}

/// Everything between the conformer output and the speaker probabilities.
#[derive(Debug, Clone)]
pub(crate) struct SpeakerHead {
    encoder_proj: Option<Linear>,
    layers: Vec<TransformerLayer>,
    hidden_to_hidden: Linear,
    hidden_to_speakers: Linear,
}

impl SpeakerHead {
    pub(crate) fn load(tensors: &TensorMap, cfg: &SortformerConfig) -> Result<Self, ModelError> {
        let (fc, tf, spk) = (
            cfg.encoder.d_model,
            cfg.transformer.hidden,
            cfg.num_speakers,
        );
        let m = "sortformer_modules";
        let encoder_proj = if cfg.has_encoder_projection() {
            Some(Linear::load(
                tensors,
                &format!("{m}.encoder_proj"),
                fc,
                tf,
                false,
                Bias::Required,
            )?)
        } else {
            None
        };
        let layers = (0..cfg.transformer.n_layers)
            .map(|l| {
                TransformerLayer::load(tensors, &format!("transformer_encoder.layers.{l}"), cfg)
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(extra) = tensors.names().find_map(|n| {
            let i = n
                .strip_prefix("transformer_encoder.layers.")?
                .split('.')
                .next()?;
            i.parse::<usize>()
                .ok()
                .filter(|&i| i >= cfg.transformer.n_layers)
        }) {
            return Err(ModelError::InvalidConfig {
                file: tensors.source.clone(),
                key: "transformer_encoder.num_layers".into(),
                problem: format!(
                    "the state dict has transformer_encoder.layers.{extra} but the config says {} layers",
                    cfg.transformer.n_layers
                ),
            });
        }
        Ok(Self {
            encoder_proj,
            layers,
            hidden_to_hidden: Linear::load(
                tensors,
                &format!("{m}.first_hidden_to_hidden"),
                tf,
                tf,
                false,
                Bias::Required,
            )?,
            hidden_to_speakers: Linear::load(
                tensors,
                &format!("{m}.single_hidden_to_spks"),
                tf,
                spk,
                false,
                Bias::Required,
            )?,
        })
    }

    /// Conformer output `[t, d_model]` → speaker probabilities `[t, num_speakers]`.
    pub(crate) fn forward(&self, encoded: Vec<f32>, t: usize) -> Vec<f32> {
        let mut x = match &self.encoder_proj {
            Some(proj) => proj.forward(&encoded, t),
            None => encoded,
        };
        for layer in &self.layers {
            x = layer.forward(&x, t);
        }
        relu_in_place(&mut x);
        let mut h = self.hidden_to_hidden.forward(&x, t);
        relu_in_place(&mut h);
        let mut p = self.hidden_to_speakers.forward(&h, t);
        p.iter_mut().for_each(|v| *v = sigmoid(*v));
        p
    }
}
