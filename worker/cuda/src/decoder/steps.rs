//! Launches of the decoder's kernels (`kernels/decoder.cu`) on a workspace's fixed device
//! addresses, and the CUDA graph that replays the decoding launch.

use cudarc::driver::sys::{cudaError_enum, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};

use crate::device::{elementwise_config, CudaEngine};
use crate::error::{CudaEngineError, DriverContext, Result};
use crate::kernels::Kernel;
use crate::ops::{to_i32, to_i64};

use super::workspace::{DecoderWorkspace, RS_FIELDS};
use super::GpuDecoder;

/// Warps per block, batch rows per staged chunk, weight rows per tile and inner-dimension
/// values per work item of `tdt_decode` (`DEC_WARPS`, `ROW_CHUNK`, `TILE`, `CHUNK` in
/// `decoder.cu`), and floats per block and row of its partial maxima (`PARTIAL`).
const WARPS_PER_BLOCK: usize = 16;
const ROW_CHUNK: usize = 16;
const TILE: usize = 4;
const CHUNK: usize = 128;
pub(crate) const PARTIAL: usize = 4;
pub(crate) const DECODE_THREADS: u32 = (WARPS_PER_BLOCK * 32) as u32;

/// Dynamic shared memory of `tdt_decode` for `rows` batch rows on `grid` blocks (the layout
/// comment of `tdt_decode`): the staged rows, the warps' tile sums, the row state.
pub(crate) fn decode_shared_bytes(
    hidden: usize,
    joint_hidden: usize,
    n_out: usize,
    rows: usize,
    grid: usize,
) -> usize {
    let grid = grid.max(1);
    let width = hidden.max(joint_hidden);
    let per_block = hidden.max(joint_hidden).max(n_out).div_ceil(grid);
    let tiles = hidden.div_ceil(grid).max(per_block.div_ceil(TILE));
    let stage = 2 * ROW_CHUNK * width;
    let parts = tiles * width.div_ceil(CHUNK) * ROW_CHUNK * TILE;
    (stage + parts) * 4 + rows * RS_FIELDS * 4
}

/// `TdtParams` in `decoder.cu`: 17 device addresses, then 10 ints, in this order.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct TdtParams {
    rs: u64,
    ds: u64,
    tokens: u64,
    x_table: u64,
    w_hh: u64,
    w_ih: u64,
    bias: u64,
    h: u64,
    c: u64,
    pred_w: u64,
    pred_b: u64,
    pred_proj: u64,
    enc_proj: u64,
    out_w: u64,
    out_b: u64,
    partial: u64,
    durations: u64,
    rows: i32,
    layers: i32,
    hidden: i32,
    joint_hidden: i32,
    n_out: i32,
    n_classes: i32,
    n_durations: i32,
    max_symbols: i32,
    token_capacity: i32,
    max_steps: i32,
}

// SAFETY: plain integers in C layout (8-byte fields first, so no padding), the layout of
// `TdtParams` in decoder.cu; the kernel receives it by value.
unsafe impl DeviceRepr for TdtParams {}

/// The captured decoding launch on one workspace (its device addresses are baked in).
pub(crate) struct StepGraph {
    graph: CudaGraph,
    pub(crate) max_steps: usize,
}

// SAFETY: a CUDA graph exec may be launched from any thread as long as calls are not
// concurrent; the graph lives inside the decoder's workspace, which a mutex guards.
unsafe impl Send for StepGraph {}

impl StepGraph {
    pub(crate) fn launch(&self) -> Result<()> {
        self.graph
            .launch()
            .context(|| format!("replaying the decoder launch ({} steps)", self.max_steps))
    }
}

impl GpuDecoder {
    /// Resets every row of `ws` for a batch (rows past the batch are unused).
    pub(crate) fn reset(
        &self,
        engine: &CudaEngine,
        ws: &DecoderWorkspace,
        batch: usize,
    ) -> Result<()> {
        let op = "tdt_reset";
        let p = &ws.ptr;
        let state_len = 2 * self.layers() * ws.rows * self.hidden();
        let (batch, rows) = (to_i32(op, "batch", batch)?, to_i32(op, "rows", ws.rows)?);
        let blank = to_i32(op, "blank", self.blank())?;
        let state = to_i64(op, "state", state_len)?;
        // SAFETY: the arguments follow tdt_reset's signature; h/c hold `state_len` floats,
        // ds DS_FIELDS ints, and rs/frames/enc_rows hold `ws.rows` rows (workspace invariants).
        unsafe {
            engine.launch(
                Kernel::TdtReset,
                elementwise_config(state_len.max(ws.rows)),
                || format!("rows={rows}"),
                |args| {
                    args.arg(&p.rs)
                        .arg(&p.ds)
                        .arg(&p.frames)
                        .arg(&p.enc_rows)
                        .arg(&batch)
                        .arg(&rows)
                        .arg(&blank)
                        .arg(&p.h)
                        .arg(&p.c)
                        .arg(&state);
                },
            )
        }
    }

    fn params(
        &self,
        engine: &CudaEngine,
        ws: &DecoderWorkspace,
        max_steps: usize,
    ) -> Result<TdtParams> {
        let op = "tdt_decode";
        let stream = engine.stream();
        let w = &self.weights;
        let addr = |s: &cudarc::driver::CudaSlice<f32>| s.device_ptr(stream).0;
        let p = &ws.ptr;
        Ok(TdtParams {
            rs: p.rs,
            ds: p.ds,
            tokens: p.tokens,
            x_table: addr(&w.lstm.x_table),
            w_hh: addr(&w.lstm.w_hh),
            w_ih: addr(&w.lstm.w_ih),
            bias: addr(&w.lstm.bias),
            h: p.h,
            c: p.c,
            pred_w: addr(&w.pred.weight),
            pred_b: addr(&w.pred.bias),
            pred_proj: p.pred_proj,
            enc_proj: p.enc_proj,
            out_w: addr(&w.out.weight),
            out_b: addr(&w.out.bias),
            partial: p.partial,
            durations: w.durations.device_ptr(stream).0,
            rows: to_i32(op, "rows", ws.rows)?,
            layers: to_i32(op, "layers", self.layers())?,
            hidden: to_i32(op, "hidden", self.hidden())?,
            joint_hidden: to_i32(op, "joint_hidden", self.joint_hidden())?,
            n_out: to_i32(op, "n_out", self.n_out())?,
            n_classes: to_i32(op, "n_classes", self.blank() + 1)?,
            n_durations: to_i32(op, "durations", self.cfg.durations.len())?,
            max_symbols: to_i32(op, "max_symbols", self.cfg.max_symbols_per_step)?,
            token_capacity: to_i32(op, "token_capacity", ws.token_capacity)?,
            max_steps: to_i32(op, "max_steps", max_steps)?,
        })
    }

    /// Queues one cooperative launch of `tdt_decode` on `ws.grid` blocks running at most
    /// `max_steps` steps (it returns early once every row is done).
    fn launch_decode_once(
        &self,
        engine: &CudaEngine,
        ws: &DecoderWorkspace,
        max_steps: usize,
    ) -> Result<()> {
        let params = self.params(engine, ws, max_steps)?;
        let shared = decode_shared_bytes(
            self.hidden(),
            self.joint_hidden(),
            self.n_out(),
            ws.rows,
            ws.grid,
        );
        let config = LaunchConfig {
            grid_dim: (ws.grid as u32, 1, 1),
            block_dim: (DECODE_THREADS, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        let shape = || format!("rows={} grid={} shared={shared}", ws.rows, ws.grid);
        // SAFETY: TdtParams mirrors the kernel's by-value struct; its addresses are the
        // workspace's buffers (sized for `ws.rows` rows, `ws.max_frames` frames and
        // `token_capacity` tokens per row, h/c in two halves, partials in two halves for up to
        // `decoder.grid` >= `ws.grid` blocks) and the
        // decoder's weights, whose shapes the loader checked; labels index the x_table rows
        // (argmax indices < vocab + 1); frames index enc_proj below each row's frame count. The
        // dynamic shared size is the one the kernel's layout needs for this grid and row count,
        // allowed at load; the cooperative launch guarantees the co-residency its barrier needs.
        unsafe {
            engine.launch_cooperative(Kernel::TdtDecode, config, shape, |args| {
                args.arg(&params);
            })
        }
    }

    /// [`GpuDecoder::launch_decode_once`], halving `ws.grid` while the driver refuses the
    /// cooperative launch as too large (an MPS client may see fewer resident blocks than the
    /// device has multiprocessors).
    pub(crate) fn launch_decode(
        &self,
        engine: &CudaEngine,
        ws: &mut DecoderWorkspace,
        max_steps: usize,
    ) -> Result<()> {
        loop {
            match self.launch_decode_once(engine, ws, max_steps) {
                Err(CudaEngineError::Launch { source, .. })
                    if source.0 == cudaError_enum::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
                        && ws.grid > 1 =>
                {
                    ws.grid /= 2;
                }
                other => return other,
            }
        }
    }

    /// Captures the decoding launch on `ws` into a graph (warm-up only: under MPS a capture
    /// while sibling processes run work is not safe). `ws.grid` must already be accepted by
    /// the driver (a launch on it succeeded).
    pub(crate) fn capture(
        &self,
        engine: &CudaEngine,
        ws: &DecoderWorkspace,
        max_steps: usize,
    ) -> Result<StepGraph> {
        let stream = engine.stream();
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .context(|| "starting the decoder graph capture".into())?;
        let queued = self.launch_decode_once(engine, ws, max_steps);
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        queued?;
        let graph = ended
            .context(|| "capturing the decoder launch".into())?
            .ok_or_else(|| CudaEngineError::Decoder("stream capture produced no graph".into()))?;
        graph
            .upload()
            .context(|| "uploading the decoder graph".into())?;
        Ok(StepGraph { graph, max_steps })
    }
}
