//! [`GpuDecoder`]: the decoder's weights, configuration and launch limits, and the workspace it
//! allocates. Its decoding (`mod.rs`) and kernel launches (`steps.rs`) are `impl` blocks on it
//! elsewhere in `decoder/`.

use std::sync::Mutex;

use model_core::config::DecoderConfig;

use crate::device::CudaEngine;
use crate::error::{CudaEngineError, Result};
use crate::storage::StorageKind;

use super::layout::{DecodeLayout, DecoderDims};
use super::weights::DecoderWeights;
use super::workspace::{DecoderWorkspace, WorkspaceSizes};

/// Batched label-looping TDT greedy decoding on the GPU (see the `decoder` module).
pub struct GpuDecoder {
    pub(super) cfg: DecoderConfig,
    /// Which build of the decoding kernel runs, and the type of the matrices it reads.
    pub(super) storage: StorageKind,
    pub(super) d_model: usize,
    pub(super) weights: DecoderWeights,
    /// Blocks of the cooperative decoding kernel: one per multiprocessor this context may use.
    pub(super) grid: usize,
    /// Dynamic shared memory the decoding kernel may use per block (the device's opt-in limit).
    pub(super) max_shared_bytes: usize,
    /// Streams the weights in pieces of this many rows even where they would stay resident
    /// (tests and benchmarks: [`GpuDecoder::with_layout`]).
    pub(super) piece_rows: Option<usize>,
    /// The envelope's workspace (with its graph), once warmed up.
    pub(super) warm: Mutex<Option<DecoderWorkspace>>,
}

impl GpuDecoder {
    /// The decoding kernel's shared memory for `rows` rows on `grid` blocks.
    pub(crate) fn layout(&self, rows: usize, grid: usize) -> Option<DecodeLayout> {
        DecodeLayout::new(
            DecoderDims::of(&self.cfg),
            self.storage,
            rows,
            grid,
            self.max_shared_bytes,
            self.piece_rows,
        )
    }

    pub(crate) fn hidden(&self) -> usize {
        self.cfg.pred_hidden
    }
    pub(crate) fn joint_hidden(&self) -> usize {
        self.cfg.joint_hidden
    }
    pub(crate) fn layers(&self) -> usize {
        self.cfg.pred_rnn_layers
    }
    pub(crate) fn blank(&self) -> usize {
        self.cfg.blank_id()
    }
    pub(crate) fn n_out(&self) -> usize {
        DecoderDims::of(&self.cfg).n_out
    }

    /// A workspace for `rows` rows of at most `max_frames` frames, if the decoding kernel's
    /// shared memory fits that many rows.
    pub(crate) fn new_workspace(
        &self,
        engine: &CudaEngine,
        rows: usize,
        max_frames: usize,
    ) -> Result<DecoderWorkspace> {
        let rows = rows.max(1);
        if self.layout(rows, self.grid).is_none() {
            return Err(CudaEngineError::Shape {
                op: "GpuDecoder workspace",
                detail: format!(
                    "{rows} rows do not fit the {} bytes of shared memory per block this GPU \
                     allows",
                    self.max_shared_bytes
                ),
            });
        }
        let sizes = WorkspaceSizes {
            hidden: self.hidden(),
            joint_hidden: self.joint_hidden(),
            layers: self.layers(),
            max_symbols: self.cfg.max_symbols_per_step,
            grid: self.grid,
        };
        DecoderWorkspace::new(engine, sizes, rows, max_frames)
    }
}
