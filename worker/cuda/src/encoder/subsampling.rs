//! dw_striding subsampling on the GPU: `Conv2d(1→C, 3, s2) → ReLU`, then per further stage
//! `depthwise Conv2d(C, 3, s2) → pointwise 1x1 (a Linear over channels-last positions) → ReLU`,
//! then the `out` Linear into the fp32 residual stream. conv0 and the first depthwise run as
//! one kernel, so conv0's output (the largest activation) never reaches memory.
//!
//! Layout is channels-last `[batch, time, freq, channels]`, so NeMo's flatten of `[C, T', F']`
//! into `c·F' + f` becomes `f·C + c`: the `out` weight's columns are permuted once at load.
//! x-scaling (`√d_model`) is folded into the `out` weight and bias.

use cudarc::driver::CudaSlice;
use model_core::config::EncoderConfig;
use models::checkpoint::TensorMap;
use models::ModelError;

use super::weights::{load_f32, DeviceLinear};
use crate::device::CudaEngine;
use crate::error::Result;
use crate::ops::{stride2_out_len, Conv2dShape, Conv3x3};
use crate::storage::Storage;
use crate::weight_arena::WeightBuffer;
use model_core::encoder::subsampled_len;

struct DepthwiseStage<S> {
    weight: CudaSlice<f32>,
    bias: CudaSlice<f32>,
    pointwise: DeviceLinear<S>,
}

pub(crate) struct Subsampling<S> {
    channels: usize,
    feat_in: usize,
    conv0_weight: CudaSlice<f32>,
    conv0_bias: CudaSlice<f32>,
    stages: Vec<DepthwiseStage<S>>,
    out: DeviceLinear<S>,
    /// The x-scaling folded into `out` (1 without x-scaling).
    xscale: f32,
}

/// Per-utterance valid lengths before and after every convolution stage.
pub(crate) struct StageLengths {
    /// `[stages + 1]` device buffers of `[batch]` lengths; entry 0 is the feature frames.
    pub(crate) device: Vec<CudaSlice<i32>>,
    /// The same on the host.
    pub(crate) host: Vec<Vec<usize>>,
}

impl<S: Storage> Subsampling<S> {
    pub(crate) fn load(
        engine: &CudaEngine,
        tensors: &TensorMap,
        cfg: &EncoderConfig,
    ) -> Result<Self> {
        let factor = cfg.subsampling_factor;
        if factor < 2 || !factor.is_power_of_two() {
            return Err(ModelError::UnsupportedConfig {
                file: tensors.source.clone(),
                key: "encoder.subsampling_factor".into(),
                value: factor.to_string(),
            }
            .into());
        }
        let n_stages = factor.trailing_zeros() as usize;
        let c = cfg.subsampling_conv_channels;
        let p = "encoder.pre_encode";
        let conv0_weight = load_f32(
            engine,
            tensors,
            &format!("{p}.conv.0.weight"),
            &[c, 1, 3, 3],
        )?;
        let conv0_bias = load_f32(engine, tensors, &format!("{p}.conv.0.bias"), &[c])?;
        let mut stages = Vec::new();
        for s in 1..n_stages {
            let (dw, pw) = (3 * s - 1, 3 * s);
            let pw_weight = tensors.get(&format!("{p}.conv.{pw}.weight"), &[c, c, 1, 1])?;
            let pw_bias = tensors.get(&format!("{p}.conv.{pw}.bias"), &[c])?;
            stages.push(DepthwiseStage {
                weight: load_f32(
                    engine,
                    tensors,
                    &format!("{p}.conv.{dw}.weight"),
                    &[c, 1, 3, 3],
                )?,
                bias: load_f32(engine, tensors, &format!("{p}.conv.{dw}.bias"), &[c])?,
                pointwise: DeviceLinear::new(engine, c, c, &pw_weight.data, Some(&pw_bias.data))?,
            });
        }
        let mut freq = cfg.feat_in;
        for _ in 0..n_stages {
            freq = stride2_out_len(freq);
        }
        let d = cfg.d_model;
        let width = c * freq;
        let weight = tensors.get(&format!("{p}.out.weight"), &[d, width])?;
        let bias = tensors.get(&format!("{p}.out.bias"), &[d])?;
        let scale = if cfg.xscaling {
            (d as f64).sqrt() as f32
        } else {
            1.0
        };
        let mut permuted = vec![0.0; d * width];
        for o in 0..d {
            for ch in 0..c {
                for f in 0..freq {
                    permuted[o * width + f * c + ch] =
                        weight.data[o * width + ch * freq + f] * scale;
                }
            }
        }
        let scaled_bias: Vec<f32> = bias.data.iter().map(|b| b * scale).collect();
        Ok(Self {
            channels: c,
            feat_in: cfg.feat_in,
            conv0_weight,
            conv0_bias,
            stages,
            out: DeviceLinear::new(engine, width, d, &permuted, Some(&scaled_bias))?,
            xscale: scale,
        })
    }

    /// The x-scaling factor folded into the output layer.
    pub(crate) fn xscale(&self) -> f32 {
        self.xscale
    }

    fn n_stages(&self) -> usize {
        self.stages.len() + 1
    }

    /// Valid lengths after each stage for utterances of `frames` feature frames.
    pub(crate) fn lengths(&self, engine: &CudaEngine, frames: &[usize]) -> Result<StageLengths> {
        let mut host = vec![frames.to_vec()];
        for _ in 0..self.n_stages() {
            let last = host.last().expect("starts non-empty (bug)");
            host.push(last.iter().map(|&n| stride2_out_len(n)).collect());
        }
        let device = host
            .iter()
            .map(|lens| {
                let mut as_i32: Vec<i32> = lens
                    .iter()
                    .map(|&n| i32::try_from(n).unwrap_or(i32::MAX))
                    .collect();
                // An empty batch still gets a (never read) buffer: CUDA refuses 0-byte uploads.
                if as_i32.is_empty() {
                    as_i32.push(0);
                }
                engine.upload(&as_i32)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(StageLengths { device, host })
    }

    /// The matmul weights (pointwise convolutions, output projection), in a fixed order.
    pub(crate) fn weights_mut(&mut self) -> Vec<&mut WeightBuffer<S>> {
        let mut weights: Vec<_> = self
            .stages
            .iter_mut()
            .map(|stage| stage.pointwise.weight_mut())
            .collect();
        weights.push(self.out.weight_mut());
        weights
    }

    /// Output frames for `time` padded feature frames.
    pub(crate) fn out_time(&self, time: usize) -> usize {
        subsampled_len(time, self.n_stages())
    }

    /// Elements of each of the two scratch buffers `forward` needs: the first stage's output
    /// (its depthwise, then its pointwise convolution), the largest activation that reaches
    /// memory, since conv0's output (4x larger) stays on chip in the fused kernel. Without a
    /// depthwise stage (factor 2), conv0's output itself.
    pub(crate) fn scratch_elements(&self, batch: usize, time: usize) -> usize {
        let conv0 = Conv2dShape {
            batch,
            time,
            freq: self.feat_in,
            channels: self.channels,
        };
        if self.stages.is_empty() {
            conv0.out_elements()
        } else {
            conv0.next().out_elements()
        }
    }

    /// `features` is `[batch, time, feat_in]` f32 (time-major, zero-padded); writes `x`
    /// `[batch, out_time, d_model]` f32. `current` and `scratch` hold
    /// [`Subsampling::scratch_elements`] each.
    pub(crate) fn forward(
        &self,
        engine: &CudaEngine,
        features: &CudaSlice<f32>,
        lengths: &StageLengths,
        (batch, time): (usize, usize),
        (current, scratch): (&mut CudaSlice<S>, &mut CudaSlice<S>),
        x: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let c = self.channels;
        let conv0 = Conv3x3 {
            weight: &self.conv0_weight,
            bias: &self.conv0_bias,
        };
        let mut shape = Conv2dShape {
            batch,
            time,
            freq: self.feat_in,
            channels: c,
        };
        if self.stages.is_empty() {
            engine.subsample_conv0_relu(
                features,
                &lengths.device[0],
                conv0.weight,
                conv0.bias,
                shape,
                current,
            )?;
        }
        for (s, stage) in self.stages.iter().enumerate() {
            let depthwise = Conv3x3 {
                weight: &stage.weight,
                bias: &stage.bias,
            };
            // current → scratch (depthwise; stage 0 fused with conv0 from the features) →
            // current (pointwise, ReLU).
            if s == 0 {
                engine.subsample_conv0_depthwise(
                    features,
                    [&lengths.device[0], &lengths.device[1]],
                    [conv0, depthwise],
                    shape,
                    None,
                    scratch,
                )?;
                shape = shape.next();
            } else {
                shape = shape.next();
                engine.subsample_depthwise(
                    current,
                    &lengths.device[s + 1],
                    depthwise.weight,
                    depthwise.bias,
                    shape,
                    scratch,
                )?;
            }
            let n = shape.out_elements();
            stage
                .pointwise
                .forward_storage(engine, scratch, n / c, current)?;
            engine.relu_inplace(current, n)?;
        }
        let rows = batch * shape.out_time();
        debug_assert_eq!(shape.out_freq() * c, self.out.in_dim);
        self.out.forward_f32(engine, current, rows, x)
    }
}
