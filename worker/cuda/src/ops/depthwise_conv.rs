//! Depthwise 1-D convolution over time (BatchNorm folded in, see [`crate::fold_batch_norm`])
//! with padding-frame masking and an optional fused SiLU.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::{check_len, to_i32};
use crate::device::{elementwise_config, CudaEngine};
use crate::error::{CudaEngineError, Result};
use crate::kernels::Kernel;
use crate::storage::Storage;

/// `x` and `y` are `[batch, time, channels]`; the kernel has `kernel` taps (odd), padded
/// symmetrically by `(kernel - 1) / 2` frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DepthwiseShape {
    pub batch: usize,
    pub time: usize,
    pub channels: usize,
    pub kernel: usize,
}

impl CudaEngine {
    /// `y[b, t, c] = act(bias[c] + sum_k weight[c, k] * x[b, t + k - pad, c])`, where frames
    /// `t >= lengths[b]` count as zero on input and are written as zero; `act` is SiLU when
    /// `apply_silu`, identity otherwise. `weight` is `[channels, kernel]`, `bias` `[channels]`.
    #[allow(clippy::too_many_arguments)]
    pub fn depthwise_conv1d<S: Storage>(
        &self,
        x: &CudaSlice<S>,
        weight: &CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        lengths: &CudaSlice<i32>,
        shape: DepthwiseShape,
        apply_silu: bool,
        y: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "depthwise_conv1d";
        let DepthwiseShape {
            batch,
            time,
            channels,
            kernel,
        } = shape;
        if [batch, time, channels, kernel].contains(&0) || kernel % 2 == 0 {
            return Err(CudaEngineError::Shape {
                op: OP,
                detail: format!("{shape:?}: dimensions must be >= 1 and kernel odd"),
            });
        }
        let elements = batch * time * channels;
        check_len(OP, "x", x.len(), elements)?;
        check_len(OP, "y", y.len(), elements)?;
        check_len(OP, "weight", weight.len(), channels * kernel)?;
        check_len(OP, "bias", bias.len(), channels)?;
        check_len(OP, "lengths", lengths.len(), batch)?;
        let args_i32 = [
            to_i32(OP, "batch", batch)?,
            to_i32(OP, "time", time)?,
            to_i32(OP, "channels", channels)?,
            to_i32(OP, "kernel", kernel)?,
            i32::from(apply_silu),
        ];
        // SAFETY: signature (const bf16_t*, const float*, const float*, const int*, int batch,
        // int time, int channels, int kernel, int apply_silu, bf16_t*); x and y hold
        // batch*time*channels elements, weight channels*kernel, bias channels, lengths batch.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::DepthwiseConv1d,
                elementwise_config(elements),
                || format!("{shape:?} silu={apply_silu}"),
                |args| {
                    args.arg(x).arg(weight).arg(bias).arg(lengths);
                    for value in &args_i32 {
                        args.arg(value);
                    }
                    args.arg(y);
                },
            )
        }
    }
}
