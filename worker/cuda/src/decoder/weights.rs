//! The prediction and joint networks on the device, in f32: they are small, and f32 keeps the
//! decoder's choices those of the CPU reference even where two logits are a hair apart. The
//! encoder-side joint projection runs once per batch through cuBLASLt (fp32 operands).

use cudarc::driver::CudaSlice;
use models::checkpoint::TensorMap;
use models::config::{DecoderConfig, EncoderConfig};
use models::ModelError;

use crate::device::CudaEngine;
use crate::error::Result;

/// One LSTM layer: `[4H, H]` input and hidden weights (gate order i, f, g, o) and the sum of
/// both biases.
pub(crate) struct LstmWeights {
    pub(crate) w_ih: CudaSlice<f32>,
    pub(crate) w_hh: CudaSlice<f32>,
    pub(crate) bias: CudaSlice<f32>,
}

/// A Linear layer in f32: `[out, in]` weight, bias (zeros when the checkpoint has none).
pub(crate) struct LinearF32 {
    pub(crate) weight: CudaSlice<f32>,
    pub(crate) bias: CudaSlice<f32>,
}

pub(crate) struct DecoderWeights {
    /// `[vocab + 1, H]`; the blank row is the start-of-sequence input.
    pub(crate) embedding: CudaSlice<f32>,
    pub(crate) lstm: Vec<LstmWeights>,
    /// `joint.pred`: `[J, H]`.
    pub(crate) pred: LinearF32,
    /// `joint.enc`: `[J, d_model]`, applied to every encoder frame at once.
    pub(crate) enc: LinearF32,
    /// The joint's output Linear: `[vocab + 1 + durations, J]`.
    pub(crate) out: LinearF32,
    /// `decoding.durations` as kernel ints.
    pub(crate) durations: CudaSlice<i32>,
}

impl DecoderWeights {
    pub(crate) fn load(
        engine: &CudaEngine,
        tensors: &TensorMap,
        enc_cfg: &EncoderConfig,
        cfg: &DecoderConfig,
    ) -> Result<Self> {
        let h = cfg.pred_hidden;
        let j = cfg.joint_hidden;
        let n_out = cfg.vocab_size + 1 + cfg.durations.len();
        let embedding = engine.upload(
            &tensors
                .get("decoder.prediction.embed.weight", &[cfg.vocab_size + 1, h])?
                .data,
        )?;
        let lstm = (0..cfg.pred_rnn_layers)
            .map(|l| {
                let name = |what: &str| format!("decoder.prediction.dec_rnn.lstm.{what}_l{l}");
                let w_ih = tensors.get(&name("weight_ih"), &[4 * h, h])?;
                let w_hh = tensors.get(&name("weight_hh"), &[4 * h, h])?;
                let mut bias = vec![0.0f32; 4 * h];
                for kind in ["bias_ih", "bias_hh"] {
                    if let Some(b) = tensors.get_optional(&name(kind), &[4 * h])? {
                        bias.iter_mut().zip(&b.data).for_each(|(sum, v)| *sum += v);
                    }
                }
                Ok(LstmWeights {
                    w_ih: engine.upload(&w_ih.data)?,
                    w_hh: engine.upload(&w_hh.data)?,
                    bias: engine.upload(&bias)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let out_prefix = tensors.require_joint_output_prefix()?;
        let durations: Vec<i32> = cfg
            .durations
            .iter()
            .map(|d| i32::try_from(*d))
            .collect::<Result<_, _>>()
            .map_err(|_| ModelError::InvalidConfig {
                file: tensors.source.clone(),
                key: "decoding.durations".into(),
                problem: "durations must fit 32-bit integers".into(),
            })?;
        Ok(Self {
            embedding,
            lstm,
            pred: LinearF32::load(engine, tensors, "joint.pred", h, j)?,
            enc: LinearF32::load(engine, tensors, "joint.enc", enc_cfg.d_model, j)?,
            out: LinearF32::load(engine, tensors, &out_prefix, j, n_out)?,
            durations: engine.upload(&durations)?,
        })
    }
}

impl LinearF32 {
    fn load(
        engine: &CudaEngine,
        tensors: &TensorMap,
        prefix: &str,
        in_dim: usize,
        out_dim: usize,
    ) -> Result<Self> {
        let weight = tensors.get(&format!("{prefix}.weight"), &[out_dim, in_dim])?;
        let bias = match tensors.get_optional(&format!("{prefix}.bias"), &[out_dim])? {
            Some(b) => b.data.clone(),
            None => vec![0.0; out_dim],
        };
        Ok(Self {
            weight: engine.upload(&weight.data)?,
            bias: engine.upload(&bias)?,
        })
    }
}
