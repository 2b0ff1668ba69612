//! Launches of the decoder's kernels (`kernels/decoder.cu`) on a workspace's fixed device
//! addresses, and the CUDA graph that replays the decoding launch.

use cudarc::driver::sys::{cudaError_enum, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use models::config::DecoderConfig;

use crate::device::{elementwise_config, CudaEngine};
use crate::error::{CudaEngineError, DriverContext, Result};
use crate::kernels::Kernel;
use crate::ops::{to_i32, to_i64};
use crate::storage::StorageKind;

use super::workspace::{DecoderWorkspace, RS_FIELDS};
use super::GpuDecoder;

/// Warps per block, batch rows per staged chunk of `tdt_decode` (`DEC_WARPS`, `ROW_CHUNK` in
/// `decoder.cu`), and 64-bit choice keys per block and row (the best label and duration).
const WARPS_PER_BLOCK: usize = 12;
const ROW_CHUNK: usize = 16;
pub(crate) const KEYS_PER_BLOCK_ROW: usize = 2;
/// The bf16 build's padding of a row in shared memory (`ROW_PAD`, elements) and the weight
/// rows one pass of its tensor-core products covers (`MMA_TILES` tiles of 8).
const BF16_ROW_PAD: usize = 8;
const MMA_PASS_ROWS: usize = 8 * 8;
pub(crate) const DECODE_THREADS: u32 = (WARPS_PER_BLOCK * 32) as u32;

/// The decoder's sizes that shape `tdt_decode`'s shared memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DecoderDims {
    pub(crate) hidden: usize,
    pub(crate) joint_hidden: usize,
    pub(crate) n_out: usize,
    pub(crate) layers: usize,
    /// Rows of layer 0's per-label table: the vocabulary and blank.
    pub(crate) labels: usize,
}

impl DecoderDims {
    pub(crate) fn of(cfg: &DecoderConfig) -> Self {
        Self {
            hidden: cfg.pred_hidden,
            joint_hidden: cfg.joint_hidden,
            // Labels, blank, then one output per duration.
            n_out: cfg.vocab_size + 1 + cfg.durations.len(),
            layers: cfg.pred_rnn_layers,
            labels: cfg.vocab_size + 1,
        }
    }
}

/// `tdt_decode`'s dynamic shared memory for a build, row count and grid (the `shared_*`
/// fields of its parameters): the staged rows, the block's weight rows (all of them, resident
/// for the launch, or two streaming buffers of `piece_rows` rows), the products, the row state,
/// the block's biases, and in the bf16 build the warps' partial products; then, where the
/// weights are resident and there is room, the block's slice of layer 0's per-label table and
/// its units' cell state and recurrent products (else the kernel reads them from global memory:
/// the same values, so a row's result does not depend on where they are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DecodeLayout {
    /// 0: every weight row the block owns stays in shared memory for the launch.
    pub(crate) piece_rows: usize,
    /// Offsets in bytes from the start of the dynamic shared memory.
    pub(crate) weights_at: usize,
    pub(crate) products_at: usize,
    pub(crate) row_state_at: usize,
    pub(crate) biases_at: usize,
    pub(crate) warp_sums_at: usize,
    pub(crate) x_table_at: Option<usize>,
    pub(crate) cells_at: Option<usize>,
    pub(crate) bytes: usize,
}

impl DecodeLayout {
    /// The resident layout where it fits in `max_bytes` (unless `piece_rows` asks to stream),
    /// else two streaming buffers of `piece_rows` rows (default: as many as fit). `None`: not
    /// even one row per buffer fits.
    pub(crate) fn new(
        dims: DecoderDims,
        storage: StorageKind,
        rows: usize,
        grid: usize,
        max_bytes: usize,
        piece_rows: Option<usize>,
    ) -> Option<Self> {
        // Block 0 owns the most: ceil(n / grid) of every kind (`Owned` in decoder.cu).
        let grid = grid.max(1);
        let units = dims.hidden.div_ceil(grid);
        let pred = dims.joint_hidden.div_ceil(grid);
        let joint = dims.n_out.div_ceil(grid);
        let lstm_rows = if dims.layers > 1 { 8 * units } else { 0 };
        let product_rows = lstm_rows.max(pred + 4 * units).max(joint);
        let biases = (dims.layers - 1) * 4 * units + pred + joint;
        // Element bytes and padding of a row in shared memory, staged rows, bytes of the warps'
        // partial products.
        let (elem_bytes, row_pad, stage_rows, warp_sums) = match storage {
            // The micro-tiles read rows 0..1, 0..4 or 0..16 of the stage.
            StorageKind::F32 => {
                let stage_rows = match rows {
                    0..=1 => 1,
                    2..=4 => 4,
                    _ => ROW_CHUNK,
                };
                (4, 0, stage_rows, 0)
            }
            // The mma tiles read all 16 rows; every warp keeps a pass's sums.
            StorageKind::Bf16 => (
                2,
                BF16_ROW_PAD,
                ROW_CHUNK,
                WARPS_PER_BLOCK * MMA_PASS_ROWS * ROW_CHUNK * 4,
            ),
        };
        // Bytes of one row of k values in shared memory (a multiple of 16).
        let row_bytes = |k: usize| (k + row_pad) * elem_bytes;
        let width = row_bytes(dims.hidden.max(dims.joint_hidden));
        let weights_at = stage_rows * width;
        let place = |piece_rows: usize, weight_bytes: usize| {
            let products_at = weights_at + weight_bytes;
            let row_state_at = products_at + product_rows * ROW_CHUNK * 4;
            let biases_at = row_state_at + rows * RS_FIELDS * 4;
            let warp_sums_at = (biases_at + biases * 4).next_multiple_of(16);
            Self {
                piece_rows,
                weights_at,
                products_at,
                row_state_at,
                biases_at,
                warp_sums_at,
                x_table_at: None,
                cells_at: None,
                bytes: warp_sums_at + warp_sums,
            }
        };
        let layout = |piece_rows: usize, weight_bytes: usize| {
            Some(place(piece_rows, weight_bytes)).filter(|l| l.bytes <= max_bytes)
        };
        let resident_bytes = (dims.layers - 1) * 8 * units * row_bytes(dims.hidden)
            + (pred + 4 * units) * row_bytes(dims.hidden)
            + joint * row_bytes(dims.joint_hidden);
        if piece_rows.is_none() {
            if let Some(mut resident) = layout(0, resident_bytes) {
                // The table slice first (its misses are on every predicting step's path), then
                // the cells: c and four recurrent products per layer, row and unit.
                let table = dims.labels * units * 4 * elem_bytes;
                resident.x_table_at = append(&mut resident.bytes, table, max_bytes);
                let cells = dims.layers * rows * units * 5 * 4;
                resident.cells_at = append(&mut resident.bytes, cells, max_bytes);
                return Some(resident);
            }
        }
        // Everything but the weight rows (whose bytes keep the alignment of what follows them).
        let fixed = place(0, 0).bytes;
        let piece = piece_rows
            .unwrap_or(max_bytes.saturating_sub(fixed) / (2 * width))
            .min(product_rows);
        if piece == 0 {
            return None;
        }
        layout(piece, 2 * piece * width)
    }
}

/// Where `extra` bytes go after `bytes` (16-byte aligned) if they fit in `max_bytes`.
fn append(bytes: &mut usize, extra: usize, max_bytes: usize) -> Option<usize> {
    let at = bytes.next_multiple_of(16);
    (at + extra <= max_bytes).then(|| {
        *bytes = at + extra;
        at
    })
}

/// `TdtParams` in `decoder.cu`: 19 device addresses, then 18 ints, in this order.
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
        let matrix = |m: &super::weights::KernelMatrix| m.address(stream);
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
            engine.launch_cooperative(self.storage, Kernel::TdtDecode, config, shape, |args| {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Parakeet TDT 0.6B v2's decoder: 2-layer LSTM 640, joint 640, 1024 tokens + blank + 5
    /// durations.
    const PARAKEET: DecoderDims = DecoderDims {
        hidden: 640,
        joint_hidden: 640,
        n_out: 1030,
        layers: 2,
        labels: 1025,
    };
    /// The opt-in shared memory per block of an H100/H200 (227 KiB), less tdt_decode's static
    /// 144 bytes (the step's row masks and two flags).
    const HOPPER_BYTES: usize = 232_448 - 144;

    #[test]
    fn parakeet_weights_stay_resident_on_a_whole_hopper_gpu() {
        let layout = DecodeLayout::new(PARAKEET, StorageKind::F32, 16, 132, HOPPER_BYTES, None)
            .expect("fits");
        assert_eq!(layout.piece_rows, 0);
        // Stage 16 x 640, weights (40 + 25 + 8) rows x 640, products 40 x 16, row state,
        // biases 4 x 5 + 5 + 8; f32, no padding, no warp sums.
        assert_eq!(layout.weights_at, 16 * 640 * 4);
        assert_eq!(layout.products_at, layout.weights_at + 73 * 640 * 4);
        assert_eq!(layout.row_state_at, layout.products_at + 40 * 16 * 4);
        assert_eq!(layout.biases_at, layout.row_state_at + 16 * RS_FIELDS * 4);
        assert_eq!(layout.warp_sums_at, layout.biases_at + 33 * 4 + 12);
        assert_eq!(layout.bytes, layout.warp_sums_at);
        assert!(layout.bytes <= HOPPER_BYTES);
        // No room for the f32 table slice (82 KB) or the cells: both stay in global memory.
        assert_eq!((layout.x_table_at, layout.cells_at), (None, None));
    }

    #[test]
    fn the_bf16_build_pads_its_rows_and_keeps_the_warp_sums() {
        let layout = DecodeLayout::new(PARAKEET, StorageKind::Bf16, 1, 132, HOPPER_BYTES, None)
            .expect("fits");
        assert_eq!(layout.piece_rows, 0);
        // Rows of 640 bf16 + 8 of padding; the stage always holds 16 rows.
        let row = 648 * 2;
        assert_eq!(layout.weights_at, 16 * row);
        assert_eq!(layout.products_at, layout.weights_at + 73 * row);
        assert_eq!(layout.warp_sums_at % 16, 0);
        let sums_end = layout.warp_sums_at + 12 * 64 * 16 * 4;
        // Then the table slice (1025 labels x 5 units x 4 gates of bf16) and the cells (2
        // layers x 1 row x 5 units x 5 floats), each 16-byte aligned.
        assert_eq!(layout.x_table_at, Some(sums_end));
        let cells_at = (sums_end + 1025 * 5 * 4 * 2).next_multiple_of(16);
        assert_eq!(layout.cells_at, Some(cells_at));
        assert_eq!(layout.bytes, cells_at + 2 * 5 * 5 * 4);
        assert!(layout.bytes <= HOPPER_BYTES);
        // 64 rows still fit both; with a little less room the cells stay in global memory.
        let rows64 = DecodeLayout::new(PARAKEET, StorageKind::Bf16, 64, 132, HOPPER_BYTES, None)
            .expect("fits");
        assert!(rows64.x_table_at.is_some() && rows64.cells_at.is_some());
        let tight = DecodeLayout::new(PARAKEET, StorageKind::Bf16, 64, 132, rows64.bytes - 1, None)
            .expect("fits");
        assert_eq!(tight.x_table_at, rows64.x_table_at);
        assert_eq!(tight.cells_at, None);
        assert_eq!(
            Some(tight.bytes),
            tight.x_table_at.map(|at| at + 1025 * 5 * 4 * 2)
        );
        let streamed = DecodeLayout::new(PARAKEET, StorageKind::Bf16, 16, 33, HOPPER_BYTES, None)
            .expect("fits");
        assert!(streamed.piece_rows > 0 && streamed.piece_rows <= 160);
        assert_eq!((streamed.x_table_at, streamed.cells_at), (None, None));
        assert_eq!(
            streamed.products_at,
            streamed.weights_at + 2 * streamed.piece_rows * row
        );
        assert!(streamed.bytes <= HOPPER_BYTES);
    }

    #[test]
    fn a_quarter_of_the_gpu_streams_the_weights_in_two_buffers() {
        let layout = DecodeLayout::new(PARAKEET, StorageKind::F32, 16, 33, HOPPER_BYTES, None)
            .expect("fits");
        // 20 units, 20 joint.pred outputs, 32 joint outputs per block: 160 LSTM rows at most.
        assert!(layout.piece_rows > 0 && layout.piece_rows <= 160);
        assert_eq!(
            layout.products_at,
            layout.weights_at + 2 * layout.piece_rows * 640 * 4
        );
        assert!(layout.bytes <= HOPPER_BYTES);
        let more = DecodeLayout::new(
            PARAKEET,
            StorageKind::F32,
            16,
            33,
            HOPPER_BYTES + 2 * 640 * 4,
            None,
        )
        .expect("fits");
        assert_eq!(
            more.piece_rows,
            layout.piece_rows + 1,
            "as many rows as fit"
        );
    }

    #[test]
    fn streaming_can_be_forced_and_an_impossible_fit_is_none() {
        let f32_layout = |rows, bytes, piece| {
            DecodeLayout::new(PARAKEET, StorageKind::F32, rows, 132, bytes, piece)
        };
        let forced = f32_layout(16, HOPPER_BYTES, Some(7)).expect("fits");
        assert_eq!(forced.piece_rows, 7);
        // One row per buffer is the least; the stage alone needs 16 x 640 floats.
        assert!(f32_layout(16, 16 * 640 * 4, None).is_none());
        // Small row counts stage 1 or 4 rows.
        let one = f32_layout(1, HOPPER_BYTES, None).expect("fits");
        assert_eq!(one.weights_at, 640 * 4);
        let three = f32_layout(3, HOPPER_BYTES, None).expect("fits");
        assert_eq!(three.weights_at, 4 * 640 * 4);
    }
}
