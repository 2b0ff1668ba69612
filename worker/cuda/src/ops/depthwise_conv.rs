//! Depthwise 1-D convolution over time (BatchNorm folded in, see [`crate::fold_batch_norm`])
//! with padding-frame masking and an optional fused SiLU.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::activation::pack_len;
use super::{check_len, to_i32};
use crate::device::CudaEngine;
use crate::driver::launch::BLOCK_THREADS;
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

/// Channel units (16-byte packs) per block at most: one warp across 256 bf16 channels.
const MAX_BLOCK_UNITS: usize = 32;
/// Time steps each thread computes (the block's staged weights serve them all).
const STEPS_PER_THREAD: usize = 4;
/// The default dynamic shared memory limit of one block.
const MAX_SHARED_BYTES: usize = 48 * 1024;

impl DepthwiseShape {
    /// x: channel units (fewer per block when the block's weights would not fit shared memory),
    /// y: time, z: batch; shared memory holds the block's weights as f32.
    fn launch_config(&self, op: &'static str, pack: usize) -> Result<LaunchConfig> {
        let units = self.channels.div_ceil(pack);
        let shared_bytes = |block_units: usize| block_units * pack * self.kernel * 4;
        let mut block_units = units.min(MAX_BLOCK_UNITS);
        while block_units > 1 && shared_bytes(block_units) > MAX_SHARED_BYTES {
            block_units /= 2;
        }
        if shared_bytes(block_units) > MAX_SHARED_BYTES {
            return Err(CudaEngineError::Shape {
                op,
                detail: format!("{self:?}: the kernel's weights do not fit shared memory"),
            });
        }
        let block_x = block_units as u32;
        let block_y = BLOCK_THREADS / block_x;
        let steps = block_y as usize * STEPS_PER_THREAD;
        Ok(LaunchConfig {
            grid_dim: (
                units.div_ceil(block_units) as u32,
                self.time.div_ceil(steps).clamp(1, 65_535) as u32,
                self.batch.clamp(1, 65_535) as u32,
            ),
            block_dim: (block_x, block_y, 1),
            shared_mem_bytes: shared_bytes(block_units) as u32,
        })
    }
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
        let config = shape.launch_config(OP, pack_len::<S>())?;
        // SAFETY: signature (const bf16_t*, const float*, const float*, const int*, int batch,
        // int time, int channels, int kernel, int apply_silu, bf16_t*); x and y hold
        // batch*time*channels elements, weight channels*kernel, bias channels, lengths batch;
        // the kernel guards every index by these dimensions, and the dynamic shared memory holds
        // kernel * blockDim.x * pack floats, the weights it stages.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::DepthwiseConv1d,
                config,
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
