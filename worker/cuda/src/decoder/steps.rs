//! Launches of the decoder's kernels (`kernels/decoder.cu`) on a workspace's fixed device
//! addresses, and the capture of the CUDA graph that replays the decoding launch.

use cudarc::driver::sys::{cudaError_enum, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};

use crate::device::CudaEngine;
use crate::driver::launch::{elementwise_config, LaunchMode};
use crate::error::{CudaEngineError, DriverContext, Result};
use crate::kernels::Kernel;
use crate::ops::{to_i32, to_i64};

use super::gpu_decoder::GpuDecoder;
use super::layout::{DecodeLayout, DECODE_THREADS};
use super::weights::KernelMatrix;
use super::workspace::{DecoderWorkspace, StepGraph};

/// `TdtParams` in `decoder.cu`: 20 device addresses, then 19 ints, in this order.
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
    rec: u64,
    pred_w: u64,
    pred_b: u64,
    pred_proj: u64,
    joint_in: u64,
    enc_proj: u64,
    out_w: u64,
    out_b: u64,
    keys: u64,
    durations: u64,
    pred_hist: u64,
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
    piece_rows: i32,
    shared_weights: i32,
    shared_products: i32,
    shared_row_state: i32,
    shared_biases: i32,
    shared_warp_sums: i32,
    shared_x_table: i32,
    shared_cells: i32,
    hist_capacity: i32,
}

// SAFETY: plain integers in C layout (8-byte fields first, so no padding between fields; the
// odd int count pads the end to 8 bytes in both languages), the layout of `TdtParams` in
// decoder.cu; the kernel receives it by value.
unsafe impl DeviceRepr for TdtParams {}

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
        let state_len = self.layers() * ws.rows * self.hidden();
        let (batch, rows) = (to_i32(op, "batch", batch)?, to_i32(op, "rows", ws.rows)?);
        let blank = to_i32(op, "blank", self.blank())?;
        let state = to_i64(op, "state", state_len)?;
        // SAFETY: the arguments follow tdt_reset's signature; c holds `state_len` floats and
        // rec 4 * `state_len`, ds DS_FIELDS ints, and rs/frames/enc_rows hold `ws.rows` rows
        // (workspace invariants).
        unsafe {
            engine.launch_as(
                self.storage,
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
                        .arg(&p.c)
                        .arg(&p.rec)
                        .arg(&state);
                },
            )
        }
    }

    fn params(
        &self,
        engine: &CudaEngine,
        ws: &DecoderWorkspace,
        layout: &DecodeLayout,
        max_steps: usize,
    ) -> Result<TdtParams> {
        let op = "tdt_decode";
        let stream = engine.stream();
        let w = &self.weights;
        let addr = |s: &cudarc::driver::CudaSlice<f32>| s.device_ptr(stream).0;
        let matrix = |m: &KernelMatrix| m.address(stream);
        let p = &ws.ptr;
        // -1: not in shared memory.
        let optional_offset =
            |what, at: Option<usize>| at.map_or(Ok(-1), |at| to_i32(op, what, at));
        Ok(TdtParams {
            rs: p.rs,
            ds: p.ds,
            tokens: p.tokens,
            x_table: matrix(&w.lstm.x_table),
            w_hh: matrix(&w.lstm.w_hh),
            w_ih: matrix(&w.lstm.w_ih),
            bias: addr(&w.lstm.bias),
            h: p.h,
            c: p.c,
            rec: p.rec,
            pred_w: matrix(&w.pred.weight),
            pred_b: addr(&w.pred.bias),
            pred_proj: p.pred_proj,
            joint_in: p.joint_in,
            enc_proj: p.enc_proj,
            out_w: matrix(&w.out.weight),
            out_b: addr(&w.out.bias),
            keys: p.keys,
            durations: w.durations.device_ptr(stream).0,
            pred_hist: p.pred_hist,
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
            piece_rows: to_i32(op, "piece_rows", layout.piece_rows)?,
            shared_weights: to_i32(op, "shared_weights", layout.weights_at)?,
            shared_products: to_i32(op, "shared_products", layout.products_at)?,
            shared_row_state: to_i32(op, "shared_row_state", layout.row_state_at)?,
            shared_biases: to_i32(op, "shared_biases", layout.biases_at)?,
            shared_warp_sums: to_i32(op, "shared_warp_sums", layout.warp_sums_at)?,
            shared_x_table: optional_offset("shared_x_table", layout.x_table_at)?,
            shared_cells: optional_offset("shared_cells", layout.cells_at)?,
            hist_capacity: to_i32(op, "hist_capacity", ws.hist_capacity)?,
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
        let layout = self
            .layout(ws.rows, ws.grid)
            .ok_or_else(|| CudaEngineError::Shape {
                op: "tdt_decode",
                detail: format!(
                    "{} rows on {} blocks do not fit {} bytes of shared memory per block",
                    ws.rows, ws.grid, self.max_shared_bytes
                ),
            })?;
        let params = self.params(engine, ws, &layout, max_steps)?;
        let shared = layout.bytes;
        let config = LaunchConfig {
            grid_dim: (ws.grid as u32, 1, 1),
            block_dim: (DECODE_THREADS, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        let shape = || {
            format!(
                "rows={} grid={} shared={shared} piece_rows={}",
                ws.rows, ws.grid, layout.piece_rows
            )
        };
        // SAFETY: TdtParams mirrors the kernel's by-value struct; its addresses are the
        // workspace's buffers (sized for `ws.rows` rows, `ws.max_frames` frames and
        // `token_capacity` tokens per row, h/c/rec for every layer, partials in two halves for up
        // to `decoder.grid` >= `ws.grid` blocks) and the decoder's weights, whose shapes the
        // loader checked; labels index the x_table rows (argmax indices < vocab + 1); frames
        // index enc_proj below each row's frame count. The dynamic shared size and offsets are
        // the layout's for this grid and row count, within the size allowed at load; the
        // cooperative launch guarantees the co-residency its barrier needs.
        unsafe {
            engine.launch_with(
                LaunchMode::Cooperative,
                self.storage,
                Kernel::TdtDecode,
                config,
                shape,
                |args| {
                    args.arg(&params);
                },
            )
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
        Ok(StepGraph::new(graph, max_steps))
    }
}
