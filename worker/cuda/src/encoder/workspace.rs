//! Device buffers of one forward pass, sized for one input shape ([`WorkspaceKey`]) and reused by
//! every layer and by later passes of the same shape (the encoder caches one).

use cudarc::driver::CudaSlice;
use model_core::config::AttentionModel;

use super::weights::upload_storage;
use crate::device::CudaEngine;
use crate::error::Result;
use crate::ops::HeadShape;
use crate::storage::Storage;
use model_core::encoder::{position_rows, position_table};

/// The input shape a workspace was sized for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorkspaceKey {
    /// A padded batch of feature frames (subsampling included, `subsampling_group` utterances
    /// at a time).
    Features {
        batch: usize,
        frames: usize,
        subsampling_group: usize,
    },
    /// Pre-encoded frames (the layers only).
    PreEncoded { batch: usize, frames: usize },
}

pub(crate) struct Workspace<S> {
    pub(crate) key: WorkspaceKey,
    pub(crate) shape: HeadShape,
    /// Rows of the position table (`2·time-1`, or the local band).
    pub(crate) positions: usize,
    /// Subsampling activations, each sized for the first stage's output of one group
    /// (`Subsampling::scratch_elements`).
    pub(crate) subsampling_a: CudaSlice<S>,
    pub(crate) subsampling_b: CudaSlice<S>,
    /// One group's features and subsampled output when the batch is subsampled in groups
    /// (one element otherwise).
    pub(crate) group_features: CudaSlice<f32>,
    pub(crate) group_x: CudaSlice<f32>,
    /// The fp32 residual stream `[batch, time, d]`.
    pub(crate) x: CudaSlice<f32>,
    /// LayerNorm output, the next block's input `[batch, time, d]`.
    pub(crate) normed: CudaSlice<S>,
    /// A block's output before the residual add `[batch, time, d]`.
    pub(crate) branch: CudaSlice<f32>,
    pub(crate) ff_hidden: CudaSlice<S>,
    pub(crate) ff_activated: CudaSlice<S>,
    pub(crate) qkv: CudaSlice<S>,
    pub(crate) q_u: CudaSlice<S>,
    pub(crate) q_v: CudaSlice<S>,
    pub(crate) k: CudaSlice<S>,
    pub(crate) v: CudaSlice<S>,
    /// The sinusoid table `[positions, d]` (the same for every layer).
    pub(crate) pos_table: CudaSlice<S>,
    pub(crate) pos_projected: CudaSlice<S>,
    /// `[heads·batch, time, score_row]` (rows padded for alignment, see `HeadShape::score_row`).
    pub(crate) scores_ac: CudaSlice<f32>,
    /// `[heads·batch, time, bd_row(positions)]`.
    pub(crate) scores_bd: CudaSlice<f32>,
    pub(crate) probs: CudaSlice<S>,
    pub(crate) context_heads: CudaSlice<S>,
    pub(crate) context: CudaSlice<S>,
    pub(crate) conv_in: CudaSlice<S>,
    pub(crate) conv_gated: CudaSlice<S>,
    pub(crate) conv_out: CudaSlice<S>,
    /// Valid encoder frames per utterance `[batch]` (set by every pass).
    pub(crate) lengths: CudaSlice<i32>,
    /// Attention runs as the one fused kernel: the score buffers above are then one element.
    pub(crate) fused_attention: bool,
    /// The attention of passes on this workspace (the position table above is its table).
    pub(crate) attention: AttentionModel,
}

/// What a workspace is sized from.
pub(crate) struct WorkspaceSize {
    pub(crate) key: WorkspaceKey,
    pub(crate) attention: AttentionModel,
    pub(crate) fused_attention: bool,
    pub(crate) shape: HeadShape,
    pub(crate) ff_hidden: usize,
    pub(crate) subsampling_elements: usize,
    pub(crate) group_features_elements: usize,
    pub(crate) group_x_elements: usize,
}

impl<S: Storage> Workspace<S> {
    pub(crate) fn new(engine: &CudaEngine, size: &WorkspaceSize) -> Result<Self> {
        let (shape, ff_hidden) = (size.shape, size.ff_hidden);
        let n = shape.elements();
        let rows = shape.batch * shape.time;
        let positions = position_rows(size.attention, shape.time);
        let d = shape.d_model();
        // The fused kernel keeps scores on chip: no score, probability or per-head buffers.
        let unfused = |elements: usize| if size.fused_attention { 1 } else { elements };
        let scores = unfused(shape.score_elements());
        Ok(Self {
            key: size.key,
            shape,
            positions,
            subsampling_a: engine.zeros(size.subsampling_elements)?,
            subsampling_b: engine.zeros(size.subsampling_elements)?,
            group_features: engine.zeros(size.group_features_elements)?,
            group_x: engine.zeros(size.group_x_elements)?,
            x: engine.zeros(n)?,
            normed: engine.zeros(n)?,
            branch: engine.zeros(n)?,
            ff_hidden: engine.zeros(rows * ff_hidden)?,
            ff_activated: engine.zeros(rows * ff_hidden)?,
            qkv: engine.zeros(3 * n)?,
            q_u: engine.zeros(n)?,
            q_v: engine.zeros(n)?,
            k: engine.zeros(n)?,
            v: engine.zeros(n)?,
            pos_table: upload_storage(engine, &position_table(size.attention, shape.time, d))?,
            pos_projected: engine.zeros(positions * d)?,
            scores_ac: engine.zeros(scores)?,
            scores_bd: engine.zeros(unfused(
                shape.heads * shape.batch * shape.time * HeadShape::bd_row(positions),
            ))?,
            probs: engine.zeros(scores)?,
            context_heads: engine.zeros(unfused(n))?,
            context: engine.zeros(n)?,
            conv_in: engine.zeros(2 * n)?,
            conv_gated: engine.zeros(n)?,
            conv_out: engine.zeros(n)?,
            lengths: engine.zeros(shape.batch)?,
            fused_attention: size.fused_attention,
            attention: size.attention,
        })
    }
}
