//! Checkpoint tensors converted once into device buffers: matmul weights in the storage type, norms, biases
//! and small convolution kernels in f32, BatchNorm folded into the depthwise convolution, Q/K/V
//! fused into one `[3d, d]` weight.

use cudarc::driver::CudaSlice;
use model_core::config::EncoderConfig;
use models::checkpoint::TensorMap;

use crate::device::CudaEngine;
use crate::error::Result;
use crate::fold::{fold_batch_norm, BatchNorm};
use crate::matmul::MatmulSpec;
use crate::ops::LayerNormWeights;
use crate::storage::Storage;
use crate::weight_arena::WeightBuffer;

/// A Linear layer (or kernel-1 Conv1d) on the device: `y = x Wᵀ (+ b)`, weights in the storage
/// type `S`. The bias is kept in both output types because cuBLASLt's bias epilogue takes the
/// output's type.
pub(crate) struct DeviceLinear<S> {
    pub(crate) in_dim: usize,
    pub(crate) out_dim: usize,
    weight: WeightBuffer<S>,
    bias_storage: Option<CudaSlice<S>>,
    bias_f32: Option<CudaSlice<f32>>,
}

impl<S: Storage> DeviceLinear<S> {
    /// `weight` is `[out_dim, in_dim]` row-major f32.
    pub(crate) fn new(
        engine: &CudaEngine,
        in_dim: usize,
        out_dim: usize,
        weight: &[f32],
        bias: Option<&[f32]>,
    ) -> Result<Self> {
        Ok(Self {
            in_dim,
            out_dim,
            weight: WeightBuffer::upload(engine, &to_storage(weight))?,
            bias_storage: bias.map(|b| upload_storage(engine, b)).transpose()?,
            bias_f32: bias.map(|b| engine.upload(b)).transpose()?,
        })
    }

    /// Loads `{prefix}.weight` (`[out, in]`, or `[out, in, 1]` when `conv1d`) and an optional
    /// `{prefix}.bias`.
    pub(crate) fn load(
        engine: &CudaEngine,
        tensors: &TensorMap,
        prefix: &str,
        (in_dim, out_dim): (usize, usize),
        conv1d: bool,
    ) -> Result<Self> {
        let name = format!("{prefix}.weight");
        let weight = if conv1d {
            tensors.get(&name, &[out_dim, in_dim, 1])?
        } else {
            tensors.get(&name, &[out_dim, in_dim])?
        };
        let bias = tensors.get_optional(&format!("{prefix}.bias"), &[out_dim])?;
        Self::new(
            engine,
            in_dim,
            out_dim,
            &weight.data,
            bias.map(|b| b.data.as_slice()),
        )
    }

    /// The weight matrix's buffer (to move it into a shared arena).
    pub(crate) fn weight_mut(&mut self) -> &mut WeightBuffer<S> {
        &mut self.weight
    }

    /// Output in the storage type (the input of another matmul or an activation).
    pub(crate) fn forward_storage(
        &self,
        engine: &CudaEngine,
        x: &CudaSlice<S>,
        rows: usize,
        out: &mut CudaSlice<S>,
    ) -> Result<()> {
        let spec = MatmulSpec::linear(rows, self.in_dim, self.out_dim);
        engine.matmul(&spec, x, &self.weight, self.bias_storage.as_ref(), out)
    }

    /// f32 output (a branch added to the fp32 residual stream).
    pub(crate) fn forward_f32(
        &self,
        engine: &CudaEngine,
        x: &CudaSlice<S>,
        rows: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let spec = MatmulSpec::linear(rows, self.in_dim, self.out_dim);
        engine.matmul(&spec, x, &self.weight, self.bias_f32.as_ref(), out)
    }
}

/// LayerNorm parameters on the device.
pub(crate) struct DeviceLayerNorm {
    gamma: CudaSlice<f32>,
    beta: CudaSlice<f32>,
    eps: f32,
}

impl DeviceLayerNorm {
    pub(crate) fn load(
        engine: &CudaEngine,
        tensors: &TensorMap,
        prefix: &str,
        cfg: &EncoderConfig,
    ) -> Result<Self> {
        Self::load_sized(engine, tensors, prefix, cfg.d_model, cfg.layer_norm_eps)
    }

    /// `{prefix}.weight` and `{prefix}.bias` of width `dim`.
    pub(crate) fn load_sized(
        engine: &CudaEngine,
        tensors: &TensorMap,
        prefix: &str,
        dim: usize,
        eps: f32,
    ) -> Result<Self> {
        Ok(Self {
            gamma: load_f32(engine, tensors, &format!("{prefix}.weight"), &[dim])?,
            beta: load_f32(engine, tensors, &format!("{prefix}.bias"), &[dim])?,
            eps,
        })
    }

    pub(crate) fn weights(&self) -> LayerNormWeights<'_> {
        LayerNormWeights {
            gamma: &self.gamma,
            beta: &self.beta,
            eps: self.eps,
        }
    }
}

/// The Conformer convolution module's depthwise conv with its BatchNorm folded in.
pub(crate) struct DeviceDepthwise {
    pub(crate) kernel: usize,
    pub(crate) weight: CudaSlice<f32>,
    pub(crate) bias: CudaSlice<f32>,
}

impl DeviceDepthwise {
    pub(crate) fn load(
        engine: &CudaEngine,
        tensors: &TensorMap,
        prefix: &str,
        cfg: &EncoderConfig,
    ) -> Result<Self> {
        let (d, k) = (cfg.d_model, cfg.conv_kernel_size);
        let weight = tensors.get(&format!("{prefix}.depthwise_conv.weight"), &[d, 1, k])?;
        let bias = tensors.get_optional(&format!("{prefix}.depthwise_conv.bias"), &[d])?;
        let bn = |name: &str| tensors.get(&format!("{prefix}.batch_norm.{name}"), &[d]);
        let folded = fold_batch_norm(
            &weight.data,
            bias.map(|b| b.data.as_slice()),
            d,
            k,
            &BatchNorm {
                gamma: &bn("weight")?.data,
                beta: &bn("bias")?.data,
                running_mean: &bn("running_mean")?.data,
                running_var: &bn("running_var")?.data,
                eps: cfg.batch_norm_eps,
            },
        )?;
        Ok(Self {
            kernel: k,
            weight: engine.upload(&folded.weight)?,
            bias: engine.upload(&folded.bias)?,
        })
    }
}

/// `values` rounded to the storage type.
fn to_storage<S: Storage>(values: &[f32]) -> Vec<S> {
    values.iter().map(|v| S::from_f32(*v)).collect()
}

/// `values` rounded to the storage type and uploaded.
pub(crate) fn upload_storage<S: Storage>(
    engine: &CudaEngine,
    values: &[f32],
) -> Result<CudaSlice<S>> {
    engine.upload(&to_storage(values))
}

pub(crate) fn load_f32(
    engine: &CudaEngine,
    tensors: &TensorMap,
    name: &str,
    shape: &[usize],
) -> Result<CudaSlice<f32>> {
    engine.upload(&tensors.get(name, shape)?.data)
}
