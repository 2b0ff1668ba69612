//! The decoder's device buffers for a row capacity and a frame capacity, allocated once (at
//! warm-up for the envelope) so decoding allocates nothing, and their raw addresses for the
//! kernels and the captured graph.

use cudarc::driver::{CudaSlice, DevicePtr};

use crate::device::CudaEngine;
use crate::error::Result;

use super::steps::StepGraph;
use super::GpuDecoder;

/// Fields per row of the row-state buffer (`RS_FIELDS` in `decoder.cu`).
pub(crate) const RS_FIELDS: usize = 8;
pub(crate) const RS_TOKENS: usize = 6;
pub(crate) const RS_TIME: usize = 1;
pub(crate) const RS_FRAMES: usize = 0;

/// Device addresses of the workspace buffers (valid while the workspace lives).
pub(crate) struct Pointers {
    pub(crate) rs: u64,
    pub(crate) frames: u64,
    pub(crate) enc_rows: u64,
    pub(crate) h: u64,
    pub(crate) c: u64,
    pub(crate) h_new: u64,
    pub(crate) c_new: u64,
    pub(crate) pred_proj: u64,
    pub(crate) logits: u64,
    pub(crate) tokens: u64,
    pub(crate) enc_proj: u64,
}

pub(crate) struct DecoderWorkspace {
    /// Rows every kernel iterates over (the batch capacity).
    pub(crate) rows: usize,
    /// Encoder frames per row the projection buffer holds.
    pub(crate) max_frames: usize,
    /// Tokens per row the output holds: `max_frames * max_symbols`, a true bound (a row
    /// emits at most `max_symbols` labels per frame).
    pub(crate) token_capacity: usize,
    pub(crate) rs: CudaSlice<i32>,
    pub(crate) frames: CudaSlice<i32>,
    pub(crate) enc_rows: CudaSlice<i32>,
    pub(crate) tokens: CudaSlice<i32>,
    pub(crate) enc_proj: CudaSlice<f32>,
    /// Owns the f32 buffers `ptr` points into (h, c, h_new, c_new, pred_proj, logits).
    _state: Vec<CudaSlice<f32>>,
    pub(crate) ptr: Pointers,
    /// Steps replayed per launch when the workspace was captured at warm-up.
    pub(crate) graph: Option<StepGraph>,
}

impl DecoderWorkspace {
    pub(crate) fn new(
        engine: &CudaEngine,
        decoder: &GpuDecoder,
        rows: usize,
        max_frames: usize,
    ) -> Result<Self> {
        let (h, j) = (decoder.hidden(), decoder.joint_hidden());
        let rows = rows.max(1);
        let max_frames = max_frames.max(1);
        let token_capacity = max_frames * decoder.cfg.max_symbols_per_step.max(1);
        let state_len = decoder.layers() * rows * h;
        let rs = engine.zeros::<i32>(rows * RS_FIELDS)?;
        let frames = engine.zeros::<i32>(rows)?;
        let enc_rows = engine.zeros::<i32>(rows)?;
        let tokens = engine.zeros::<i32>(rows * token_capacity * 3)?;
        let enc_proj = engine.zeros::<f32>(rows * max_frames * j)?;
        // h, c, h_new, c_new, pred_proj, logits.
        let state = [
            state_len,
            state_len,
            state_len,
            state_len,
            rows * j,
            rows * decoder.n_out(),
        ]
        .into_iter()
        .map(|n| engine.zeros::<f32>(n))
        .collect::<Result<Vec<_>>>()?;
        let stream = engine.stream();
        let addr = |s: &CudaSlice<f32>| s.device_ptr(stream).0;
        let addr_i32 = |s: &CudaSlice<i32>| s.device_ptr(stream).0;
        let ptr = Pointers {
            rs: addr_i32(&rs),
            frames: addr_i32(&frames),
            enc_rows: addr_i32(&enc_rows),
            h: addr(&state[0]),
            c: addr(&state[1]),
            h_new: addr(&state[2]),
            c_new: addr(&state[3]),
            pred_proj: addr(&state[4]),
            logits: addr(&state[5]),
            tokens: addr_i32(&tokens),
            enc_proj: addr(&enc_proj),
        };
        Ok(Self {
            rows,
            max_frames,
            token_capacity,
            rs,
            frames,
            enc_rows,
            tokens,
            enc_proj,
            _state: state,
            ptr,
            graph: None,
        })
    }

    /// Whether a batch of `batch` utterances of at most `frames` encoder frames fits.
    pub(crate) fn fits(&self, batch: usize, frames: usize) -> bool {
        batch <= self.rows && frames <= self.max_frames
    }
}
