//! The decoder's device buffers for a row capacity and a frame capacity, allocated once (at
//! warm-up for the envelope) so decoding allocates nothing, their raw addresses for the
//! kernels and the captured graph, and that graph ([`StepGraph`]).

use cudarc::driver::{CudaGraph, CudaSlice, DevicePtr};

use crate::device::CudaEngine;
use crate::error::{DriverContext, Result};

use super::layout::{DS_FIELDS, KEYS_PER_BLOCK_ROW, RS_FIELDS, SCORED_TOKENS_PER_FRAME};

/// The decoder's sizes a workspace is allocated for (besides its rows and frames).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkspaceSizes {
    pub(crate) hidden: usize,
    pub(crate) joint_hidden: usize,
    pub(crate) layers: usize,
    /// Labels a row may emit per frame.
    pub(crate) max_symbols: usize,
    /// Blocks of the cooperative decoding kernel.
    pub(crate) grid: usize,
}

/// Device addresses of the workspace buffers (valid while the workspace lives).
pub(crate) struct Pointers {
    pub(crate) rs: u64,
    pub(crate) ds: u64,
    pub(crate) frames: u64,
    pub(crate) enc_rows: u64,
    pub(crate) h: u64,
    pub(crate) c: u64,
    pub(crate) rec: u64,
    pub(crate) pred_proj: u64,
    pub(crate) joint_in: u64,
    pub(crate) keys: u64,
    pub(crate) tokens: u64,
    pub(crate) enc_proj: u64,
    pub(crate) pred_hist: u64,
}

pub(crate) struct DecoderWorkspace {
    /// Rows every kernel iterates over (the batch capacity).
    pub(crate) rows: usize,
    /// Encoder frames per row the projection buffer holds.
    pub(crate) max_frames: usize,
    /// Tokens per row the output holds: `max_frames * max_symbols`, a true bound (a row
    /// emits at most `max_symbols` labels per frame).
    pub(crate) token_capacity: usize,
    /// Prediction outputs kept per row for scoring (after 0, 1, ... tokens):
    /// `SCORED_TOKENS_PER_FRAME * max_frames + 1`, enough for every row `score` scores.
    pub(crate) hist_capacity: usize,
    pub(crate) rs: CudaSlice<i32>,
    /// Steps run since the reset, and the counters that tag the exchanged values (`DS_*` in
    /// `decoder.cu`).
    pub(crate) ds: CudaSlice<i32>,
    pub(crate) frames: CudaSlice<i32>,
    pub(crate) enc_rows: CudaSlice<i32>,
    pub(crate) tokens: CudaSlice<i32>,
    pub(crate) enc_proj: CudaSlice<f32>,
    /// Owns `ptr.pred_hist`, `[hist_capacity, rows, J]` (`pred_hist` of `decoder.cu`).
    _pred_hist: CudaSlice<f32>,
    /// Own the buffers `ptr` points into: c, rec, pred_proj; the tagged h and joint input;
    /// the blocks' choice keys.
    _state: Vec<CudaSlice<f32>>,
    _tagged: Vec<CudaSlice<f32>>,
    _keys: CudaSlice<u64>,
    pub(crate) ptr: Pointers,
    /// Blocks of the cooperative decoding kernel (lowered at the first launch the driver
    /// refuses as too large, e.g. under an MPS thread limit).
    pub(crate) grid: usize,
    /// The decoding launch captured at warm-up.
    pub(crate) graph: Option<StepGraph>,
}

impl DecoderWorkspace {
    /// Buffers for `rows` rows (at least 1) of at most `max_frames` frames (at least 1); the
    /// caller checked that the decoding kernel's shared memory fits that many rows.
    pub(crate) fn new(
        engine: &CudaEngine,
        sizes: WorkspaceSizes,
        rows: usize,
        max_frames: usize,
    ) -> Result<Self> {
        let (h, j) = (sizes.hidden, sizes.joint_hidden);
        let rows = rows.max(1);
        let max_frames = max_frames.max(1);
        let token_capacity = max_frames * sizes.max_symbols.max(1);
        let state_len = sizes.layers * rows * h;
        let rs = engine.zeros::<i32>(rows * RS_FIELDS)?;
        let ds = engine.zeros::<i32>(DS_FIELDS)?;
        let frames = engine.zeros::<i32>(rows)?;
        let enc_rows = engine.zeros::<i32>(rows)?;
        let tokens = engine.zeros::<i32>(rows * token_capacity * 3)?;
        let enc_proj = engine.zeros::<f32>(rows * max_frames * j)?;
        let hist_capacity = SCORED_TOKENS_PER_FRAME * max_frames + 1;
        let pred_hist = engine.zeros::<f32>(hist_capacity * rows * j)?;
        // c, the recurrent products (4 gates per unit), pred_proj.
        let state = [state_len, 4 * state_len, rows * j]
            .into_iter()
            .map(|n| engine.zeros::<f32>(n))
            .collect::<Result<Vec<_>>>()?;
        // The values blocks exchange, in two halves each (`decoder.cu`, top), at most 4 bytes an
        // element. Their first contents carry the tags no use of the first two looks for: h
        // with bit 14 of every 16 bits set (|h| <= 1 never sets it), the joint input with bit 15
        // (it is never negative), the keys with all of their step bits set.
        let tagged = [(2 * state_len, 0x4040_4040u32), (2 * rows * j, 0x8080_8080)]
            .into_iter()
            .map(|(n, bits)| engine.upload(&vec![f32::from_bits(bits); n]))
            .collect::<Result<Vec<_>>>()?;
        let keys = engine.upload(&vec![u64::MAX; 2 * rows * sizes.grid * KEYS_PER_BLOCK_ROW])?;
        let stream = engine.stream();
        let addr = |s: &CudaSlice<f32>| s.device_ptr(stream).0;
        let addr_i32 = |s: &CudaSlice<i32>| s.device_ptr(stream).0;
        let ptr = Pointers {
            rs: addr_i32(&rs),
            ds: addr_i32(&ds),
            frames: addr_i32(&frames),
            enc_rows: addr_i32(&enc_rows),
            h: addr(&tagged[0]),
            c: addr(&state[0]),
            rec: addr(&state[1]),
            pred_proj: addr(&state[2]),
            joint_in: addr(&tagged[1]),
            keys: keys.device_ptr(stream).0,
            tokens: addr_i32(&tokens),
            enc_proj: addr(&enc_proj),
            pred_hist: addr(&pred_hist),
        };
        Ok(Self {
            rows,
            max_frames,
            token_capacity,
            hist_capacity,
            rs,
            ds,
            frames,
            enc_rows,
            tokens,
            enc_proj,
            _pred_hist: pred_hist,
            _state: state,
            _tagged: tagged,
            _keys: keys,
            ptr,
            grid: sizes.grid,
            graph: None,
        })
    }

    /// Steps that finish any batch of at most `frames` frames per row: a row's every step
    /// advances it by at least one frame or emits one of at most `token_capacity` labels, and
    /// rows step in parallel. Never reached unless the kernel is wrong.
    pub(crate) fn step_bound(&self, frames: usize) -> usize {
        frames + self.token_capacity + 1
    }

    /// Whether a batch of `batch` utterances of at most `frames` encoder frames fits.
    pub(crate) fn fits(&self, batch: usize, frames: usize) -> bool {
        batch <= self.rows && frames <= self.max_frames
    }
}

/// The captured decoding launch on one workspace (its device addresses are baked in).
pub(crate) struct StepGraph {
    graph: CudaGraph,
    pub(crate) max_steps: usize,
}

// SAFETY: a CUDA graph exec may be launched from any thread as long as calls are not
// concurrent; the graph lives inside the decoder's workspace, which a mutex guards.
unsafe impl Send for StepGraph {}

impl StepGraph {
    pub(crate) fn new(graph: CudaGraph, max_steps: usize) -> Self {
        Self { graph, max_steps }
    }

    pub(crate) fn launch(&self) -> Result<()> {
        self.graph
            .launch()
            .context(|| format!("replaying the decoder launch ({} steps)", self.max_steps))
    }
}
