//! The dw_striding subsampling convolutions (3x3, stride 2, padding 1), channels-last.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
/// Output length of one stride-2 3x3 convolution (shared with the CPU engine).
pub use model_core::encoder::stride2_out_len;

use super::activation::pack_len;
use super::{check_len, rows_for_grid, to_i32, to_i64};
use crate::device::CudaEngine;
use crate::driver::launch::{elementwise_config, BLOCK_THREADS};
use crate::error::{CudaEngineError, Result};
use crate::kernels::Kernel;
use crate::storage::Storage;

/// Channel units per block at most; bounds the depthwise kernel's staged weights to
/// `64 * 8 * 9` f32 (18 KiB).
const MAX_BLOCK_UNITS: usize = 64;

/// Threads per block of the fused conv0 + depthwise kernel: it holds ~180 registers per thread
/// (conv0's weights among them), so smaller blocks let more of them share an SM.
const FUSED_BLOCK_THREADS: usize = 128;

/// The fused kernel splits output rows into shorter column runs (more threads, a little more
/// conv0 recomputation at each run's start) until about this many threads run.
const FUSED_TARGET_THREADS: usize = 1 << 17;

/// One stride-2 3x3 convolution: input `[batch, time, freq(, channels)]`, output
/// `[batch, stride2_out_len(time), stride2_out_len(freq), channels]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dShape {
    pub batch: usize,
    pub time: usize,
    pub freq: usize,
    pub channels: usize,
}

impl Conv2dShape {
    pub fn out_time(&self) -> usize {
        stride2_out_len(self.time)
    }

    pub fn out_freq(&self) -> usize {
        stride2_out_len(self.freq)
    }

    pub fn out_elements(&self) -> usize {
        self.batch * self.out_time() * self.out_freq() * self.channels
    }

    /// The next stage's input: this convolution's output.
    pub fn next(&self) -> Conv2dShape {
        Conv2dShape {
            batch: self.batch,
            time: self.out_time(),
            freq: self.out_freq(),
            channels: self.channels,
        }
    }

    /// x: one output frame per block; y: groups of `block_x` channel units (16-byte packs of
    /// `pack` channels); the block's `BLOCK_THREADS / block_x` rows of threads stride over the
    /// frame's output columns. Dynamic shared memory: the block's 3x3 weights as f32 (read by
    /// the depthwise kernel only).
    fn launch_config(&self, op: &'static str, pack: usize) -> Result<LaunchConfig> {
        let frames = rows_for_grid(op, self.batch * self.out_time())?;
        let units = self.channels.div_ceil(pack);
        let block_units = units.clamp(1, MAX_BLOCK_UNITS);
        let channel_blocks = u32::try_from(units.div_ceil(block_units))
            .ok()
            .filter(|&n| n <= 65_535)
            .ok_or_else(|| CudaEngineError::Shape {
                op,
                detail: format!("{self:?}: too many channels for the grid"),
            })?;
        let block_x = block_units as u32;
        Ok(LaunchConfig {
            grid_dim: (frames, channel_blocks, 1),
            block_dim: (block_x, BLOCK_THREADS / block_x, 1),
            shared_mem_bytes: (block_units * pack * 9 * 4) as u32,
        })
    }

    fn kernel_args(&self, op: &'static str) -> Result<[i32; 6]> {
        if [self.batch, self.time, self.freq, self.channels].contains(&0) {
            return Err(CudaEngineError::Shape {
                op,
                detail: format!("{self:?}: every dimension must be at least 1"),
            });
        }
        Ok([
            to_i32(op, "batch", self.batch)?,
            to_i32(op, "time", self.time)?,
            to_i32(op, "freq", self.freq)?,
            to_i32(op, "channels", self.channels)?,
            to_i32(op, "out_time", self.out_time())?,
            to_i32(op, "out_freq", self.out_freq())?,
        ])
    }
}

/// The 3x3 weights `[channels, 3*3]` and bias `[channels]` (f32) of one subsampling convolution.
#[derive(Debug, Clone, Copy)]
pub struct Conv3x3<'a> {
    pub weight: &'a CudaSlice<f32>,
    pub bias: &'a CudaSlice<f32>,
}

/// Launch of `subsample_conv0_depthwise` for conv0's input `shape`: blocks of
/// `block_x` channel units × `rows` work items, a work item being one output frame and a run of
/// `cols_per_thread` output columns; grid x over the work items, y over channel blocks. Dynamic
/// shared memory: the block's depthwise weights as f32.
fn fused_launch(
    op: &'static str,
    shape: Conv2dShape,
    pack: usize,
    column_runs: Option<usize>,
) -> Result<(LaunchConfig, usize)> {
    let out = shape.next().next();
    let units = shape.channels.div_ceil(pack);
    let block_units = units.clamp(1, MAX_BLOCK_UNITS);
    let rows = (FUSED_BLOCK_THREADS / block_units).max(1);
    let frames = out.batch * out.time;
    let runs = column_runs
        .unwrap_or_else(|| FUSED_TARGET_THREADS.div_ceil((frames * units).max(1)))
        .clamp(1, out.freq.max(1));
    let cols_per_thread = out.freq.div_ceil(runs);
    let items = frames * out.freq.div_ceil(cols_per_thread);
    let blocks = rows_for_grid(op, items.div_ceil(rows))?;
    let channel_blocks = u32::try_from(units.div_ceil(block_units))
        .ok()
        .filter(|&n| n <= 65_535)
        .ok_or_else(|| CudaEngineError::Shape {
            op,
            detail: format!("{shape:?}: too many channels for the grid"),
        })?;
    let config = LaunchConfig {
        grid_dim: (blocks, channel_blocks, 1),
        block_dim: (block_units as u32, rows as u32, 1),
        shared_mem_bytes: (block_units * pack * 9 * 4) as u32,
    };
    Ok((config, cols_per_thread))
}

impl CudaEngine {
    /// First subsampling convolution (one input channel) with ReLU. `x` is `[batch, time, freq]`
    /// f32; frames `t >= lengths[b]` read as zero. `weight` is `[channels, 3*3]`, `bias`
    /// `[channels]`; `y` is `[batch, out_time, out_freq, channels]`.
    pub fn subsample_conv0_relu<S: Storage>(
        &self,
        x: &CudaSlice<f32>,
        lengths: &CudaSlice<i32>,
        weight: &CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        shape: Conv2dShape,
        y: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "subsample_conv0_relu";
        let dims = shape.kernel_args(OP)?;
        let mut config = shape.launch_config(OP, pack_len::<S>())?;
        // This kernel keeps its weights in registers.
        config.shared_mem_bytes = 0;
        check_len(OP, "x", x.len(), shape.batch * shape.time * shape.freq)?;
        check_conv_params(OP, lengths, weight, bias, shape)?;
        let n = shape.out_elements();
        check_len(OP, "y", y.len(), n)?;
        // SAFETY: signature (const float* x, const int* lengths, const float* weight,
        // const float* bias, int batch, int time, int freq, int channels, int out_time,
        // int out_freq, bf16_t* y); every buffer was checked against these dimensions above, and
        // the grid covers exactly the output frames and channel units (threads past the
        // channels return).
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::SubsampleConv0Relu,
                config,
                || format!("{shape:?}"),
                |args| {
                    args.arg(x).arg(lengths).arg(weight).arg(bias);
                    for d in &dims {
                        args.arg(d);
                    }
                    args.arg(y);
                },
            )
        }
    }

    /// The first convolution with ReLU fused with the second stage's depthwise convolution:
    /// bitwise what [`CudaEngine::subsample_conv0_relu`] then [`CudaEngine::subsample_depthwise`]
    /// give, without conv0's output ever reaching memory. `x` is `[batch, time, freq]` f32 (conv0's
    /// input `shape`); `lengths` are the valid feature frames and conv0's valid output frames
    /// (`stride2_out_len` of the first), each `[batch]`; `y` is `shape.next().next()`'s
    /// `[batch, out_time, out_freq, channels]`. `column_runs` splits each output row into that
    /// many runs (None: chosen from the shape); results do not depend on it.
    pub fn subsample_conv0_depthwise<S: Storage>(
        &self,
        x: &CudaSlice<f32>,
        lengths: [&CudaSlice<i32>; 2],
        [conv0, depthwise]: [Conv3x3<'_>; 2],
        shape: Conv2dShape,
        column_runs: Option<usize>,
        y: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "subsample_conv0_depthwise";
        let mid = shape.next();
        let out = mid.next();
        let (config, cols) = fused_launch(OP, shape, pack_len::<S>(), column_runs)?;
        // conv0's dimensions and output size, then the depthwise output size and the run length.
        let mut dims = [0; 9];
        dims[..6].copy_from_slice(&shape.kernel_args(OP)?);
        dims[6..8].copy_from_slice(&mid.kernel_args(OP)?[4..]);
        dims[8] = to_i32(OP, "cols_per_thread", cols)?;
        check_len(OP, "x", x.len(), shape.batch * shape.time * shape.freq)?;
        check_conv_params(OP, lengths[0], conv0.weight, conv0.bias, shape)?;
        check_conv_params(OP, lengths[1], depthwise.weight, depthwise.bias, mid)?;
        check_len(
            OP,
            "y",
            y.len(),
            out.batch * out.time * out.freq * out.channels,
        )?;
        // SAFETY: signature (const float* x, const int* lengths0, const int* lengths1,
        // const float* conv_weight, const float* conv_bias, const float* dw_weight,
        // const float* dw_bias, int batch, int time, int freq, int channels, int mid_time,
        // int mid_freq, int out_time, int out_freq, int cols_per_thread, bf16_t* y); every buffer
        // was checked against these dimensions above; threads past the work items or the
        // channels return (after staging the weights), each run stays below out_freq, and the
        // shared memory holds the block's 9 * blockDim.x * pack depthwise weights.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::SubsampleConv0Depthwise,
                config,
                || format!("{shape:?} runs of {cols} columns"),
                |args| {
                    args.arg(x).arg(lengths[0]).arg(lengths[1]);
                    args.arg(conv0.weight).arg(conv0.bias);
                    args.arg(depthwise.weight).arg(depthwise.bias);
                    for d in &dims {
                        args.arg(d);
                    }
                    args.arg(y);
                },
            )
        }
    }

    /// Depthwise 3x3 stride-2 convolution of every channel (no activation). `x` is
    /// `[batch, time, freq, channels]`; frames `t >= lengths[b]` read as zero.
    pub fn subsample_depthwise<S: Storage>(
        &self,
        x: &CudaSlice<S>,
        lengths: &CudaSlice<i32>,
        weight: &CudaSlice<f32>,
        bias: &CudaSlice<f32>,
        shape: Conv2dShape,
        y: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "subsample_depthwise";
        let dims = shape.kernel_args(OP)?;
        let config = shape.launch_config(OP, pack_len::<S>())?;
        check_len(
            OP,
            "x",
            x.len(),
            shape.batch * shape.time * shape.freq * shape.channels,
        )?;
        check_conv_params(OP, lengths, weight, bias, shape)?;
        let n = shape.out_elements();
        check_len(OP, "y", y.len(), n)?;
        // SAFETY: signature (const bf16_t* x, const int* lengths, const float* weight,
        // const float* bias, int batch, int time, int freq, int channels, int out_time,
        // int out_freq, bf16_t* y); every buffer was checked against these dimensions above, the
        // grid covers exactly the output frames and channel units (threads past the channels
        // return) and the shared memory holds the block's 9 * blockDim.x * pack weights.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::SubsampleDepthwise,
                config,
                || format!("{shape:?}"),
                |args| {
                    args.arg(x).arg(lengths).arg(weight).arg(bias);
                    for d in &dims {
                        args.arg(d);
                    }
                    args.arg(y);
                },
            )
        }
    }

    /// `x = max(x, 0)` over the first `n` elements, in place.
    pub fn relu_inplace<S: Storage>(&self, x: &mut CudaSlice<S>, n: usize) -> Result<()> {
        const OP: &str = "relu_inplace";
        check_len(OP, "x", x.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let count = to_i64(OP, "n", n)?;
        // SAFETY: signature (bf16_t* x, long long n); x holds at least n elements and the
        // kernel's grid-stride loops touch only indices < n, whatever the grid.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::ReluInplace,
                elementwise_config(n.div_ceil(pack_len::<S>())),
                || format!("n={n}"),
                |args| {
                    args.arg(x).arg(&count);
                },
            )
        }
    }
}

fn check_conv_params(
    op: &'static str,
    lengths: &CudaSlice<i32>,
    weight: &CudaSlice<f32>,
    bias: &CudaSlice<f32>,
    shape: Conv2dShape,
) -> Result<()> {
    check_len(op, "lengths", lengths.len(), shape.batch)?;
    check_len(op, "weight", weight.len(), shape.channels * 9)?;
    check_len(op, "bias", bias.len(), shape.channels)
}
