//! The prediction and joint networks on the device. The matrices the decoding kernel multiplies
//! are in its build's storage type: f32 for the exact decoder (its choices are the CPU
//! reference's even where two logits are a hair apart), bf16 for the bf16 engine's (rounded to
//! nearest even once, at load), and so is layer 0's per-label table (computed in f32 first).
//! Biases stay f32. The encoder-side joint projection runs once per batch through cuBLASLt
//! (fp32 operands).

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use half::bf16;
use model_core::config::{DecoderConfig, EncoderConfig};
use models::checkpoint::TensorMap;
use models::ModelError;

use crate::device::CudaEngine;
use crate::error::Result;
use crate::matmul::MatmulSpec;
use crate::storage::StorageKind;

/// A matrix the decoding kernel reads, in the storage type of the kernel build that reads it.
pub(crate) enum KernelMatrix {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<bf16>),
}

impl KernelMatrix {
    fn upload(engine: &CudaEngine, storage: StorageKind, data: &[f32]) -> Result<Self> {
        Ok(match storage {
            StorageKind::F32 => Self::F32(engine.upload(data)?),
            StorageKind::Bf16 => {
                let rounded: Vec<bf16> = data.iter().map(|v| bf16::from_f32(*v)).collect();
                Self::Bf16(engine.upload(&rounded)?)
            }
        })
    }

    pub(crate) fn address(&self, stream: &CudaStream) -> u64 {
        match self {
            Self::F32(m) => m.device_ptr(stream).0,
            Self::Bf16(m) => m.device_ptr(stream).0,
        }
    }
}

/// The LSTM layers, stacked so one kernel argument addresses every layer (gate order i, f, g,
/// o). Layer 0's input product depends only on the label fed, so it is tabulated per label at
/// load (`x_table`) and its `W_ih` is not kept.
pub(crate) struct LstmWeights {
    /// `[vocab + 1, H, 4]`: `W_ih x + b_ih + b_hh` of layer 0 for every label's embedding `x`,
    /// the four gates of a unit together (one load in the kernel).
    pub(crate) x_table: KernelMatrix,
    /// `[layers, 4H, H]`.
    pub(crate) w_hh: KernelMatrix,
    /// `[layers - 1, 4H, H]`: the layers above the first (one unused value when there are none).
    pub(crate) w_ih: KernelMatrix,
    /// `[layers - 1, 4H]`: `b_ih + b_hh` of the layers above the first.
    pub(crate) bias: CudaSlice<f32>,
}

/// A Linear layer: `[out, in]` weight (`CudaSlice<f32>` or a [`KernelMatrix`]), f32 bias (zeros
/// when the checkpoint has none).
pub(crate) struct Linear<W> {
    pub(crate) weight: W,
    pub(crate) bias: CudaSlice<f32>,
}

pub(crate) struct DecoderWeights {
    pub(crate) lstm: LstmWeights,
    /// `joint.pred`: `[J, H]`.
    pub(crate) pred: Linear<KernelMatrix>,
    /// `joint.enc`: `[J, d_model]` in f32, applied to every encoder frame at once.
    pub(crate) enc: Linear<CudaSlice<f32>>,
    /// The joint's output Linear: `[vocab + 1 + durations, J]`.
    pub(crate) out: Linear<KernelMatrix>,
    /// `decoding.durations` as kernel ints.
    pub(crate) durations: CudaSlice<i32>,
}

impl DecoderWeights {
    /// The weights for the decoding kernel's build for `storage`.
    pub(crate) fn load(
        engine: &CudaEngine,
        tensors: &TensorMap,
        enc_cfg: &EncoderConfig,
        cfg: &DecoderConfig,
        storage: StorageKind,
    ) -> Result<Self> {
        let h = cfg.pred_hidden;
        let j = cfg.joint_hidden;
        let n_out = cfg.vocab_size + 1 + cfg.durations.len();
        let lstm = LstmWeights::load(engine, tensors, cfg, storage)?;
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
        let matrix = |data: &[f32]| KernelMatrix::upload(engine, storage, data);
        Ok(Self {
            lstm,
            pred: Linear::load(engine, tensors, "joint.pred", h, j, matrix)?,
            enc: Linear::load(engine, tensors, "joint.enc", enc_cfg.d_model, j, |data| {
                engine.upload(data)
            })?,
            out: Linear::load(engine, tensors, &out_prefix, j, n_out, matrix)?,
            durations: engine.upload(&durations)?,
        })
    }
}

impl LstmWeights {
    fn load(
        engine: &CudaEngine,
        tensors: &TensorMap,
        cfg: &DecoderConfig,
        storage: StorageKind,
    ) -> Result<Self> {
        let h = cfg.pred_hidden;
        let labels = cfg.vocab_size + 1;
        let name = |what: &str, l: usize| format!("decoder.prediction.dec_rnn.lstm.{what}_l{l}");
        let bias = |l: usize| -> Result<Vec<f32>> {
            let mut sum = vec![0.0f32; 4 * h];
            for kind in ["bias_ih", "bias_hh"] {
                if let Some(b) = tensors.get_optional(&name(kind, l), &[4 * h])? {
                    sum.iter_mut().zip(&b.data).for_each(|(s, v)| *s += v);
                }
            }
            Ok(sum)
        };
        let (mut w_hh, mut w_ih, mut upper_bias) = (Vec::new(), Vec::new(), Vec::new());
        for l in 0..cfg.pred_rnn_layers {
            w_hh.extend_from_slice(&tensors.get(&name("weight_hh", l), &[4 * h, h])?.data);
            if l > 0 {
                w_ih.extend_from_slice(&tensors.get(&name("weight_ih", l), &[4 * h, h])?.data);
                upper_bias.extend(bias(l)?);
            }
        }
        // A zero-length device buffer cannot be allocated; one float stands in, never read.
        for stacked in [&mut w_ih, &mut upper_bias] {
            if stacked.is_empty() {
                stacked.push(0.0);
            }
        }

        // x_table = embedding . W_ih0ᵀ + (b_ih0 + b_hh0), fp32 (cuBLASLt never uses TF32 here).
        let embedding = engine.upload(
            &tensors
                .get("decoder.prediction.embed.weight", &[labels, h])?
                .data,
        )?;
        let w_ih0 = engine.upload(&tensors.get(&name("weight_ih", 0), &[4 * h, h])?.data)?;
        let bias0 = engine.upload(&bias(0)?)?;
        let mut table = engine.zeros::<f32>(labels * 4 * h)?;
        engine.matmul(
            &MatmulSpec::linear(labels, h, 4 * h),
            &embedding,
            &w_ih0,
            Some(&bias0),
            &mut table,
        )?;
        // [label][gate][unit] -> [label][unit][gate], then the storage type.
        let table = engine.download(&table)?;
        let mut by_unit = vec![0.0f32; table.len()];
        for (label, row) in table.chunks_exact(4 * h).enumerate() {
            for (i, v) in row.iter().enumerate() {
                by_unit[label * 4 * h + (i % h) * 4 + i / h] = *v;
            }
        }
        Ok(Self {
            x_table: KernelMatrix::upload(engine, storage, &by_unit)?,
            w_hh: KernelMatrix::upload(engine, storage, &w_hh)?,
            w_ih: KernelMatrix::upload(engine, storage, &w_ih)?,
            bias: engine.upload(&upper_bias)?,
        })
    }
}

impl<W> Linear<W> {
    fn load(
        engine: &CudaEngine,
        tensors: &TensorMap,
        prefix: &str,
        in_dim: usize,
        out_dim: usize,
        upload_weight: impl FnOnce(&[f32]) -> Result<W>,
    ) -> Result<Self> {
        let weight = tensors.get(&format!("{prefix}.weight"), &[out_dim, in_dim])?;
        let bias = match tensors.get_optional(&format!("{prefix}.bias"), &[out_dim])? {
            Some(b) => b.data.clone(),
            None => vec![0.0; out_dim],
        };
        Ok(Self {
            weight: upload_weight(&weight.data)?,
            bias: engine.upload(&bias)?,
        })
    }
}
