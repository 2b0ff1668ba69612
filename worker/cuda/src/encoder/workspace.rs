//! Device buffers of one forward pass, sized for one input shape ([`WorkspaceKey`]) and reused by
//! every layer and by later passes of the same shape (the encoder caches one).

use cudarc::driver::CudaSlice;
use half::bf16;
use models::config::AttentionModel;

use super::pos_table::{positions_for, table_for};
use super::weights::upload_bf16;
use crate::device::CudaEngine;
use crate::error::Result;
use crate::ops::HeadShape;

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

pub(crate) struct Workspace {
    pub(crate) key: WorkspaceKey,
    pub(crate) shape: HeadShape,
    /// Rows of the position table (`2·time-1`, or the local band).
    pub(crate) positions: usize,
    /// Subsampling activations, each sized for the first convolution's output of one group.
    pub(crate) subsampling_a: CudaSlice<bf16>,
    pub(crate) subsampling_b: CudaSlice<bf16>,
    /// One group's features and subsampled output when the batch is subsampled in groups
    /// (one element otherwise).
    pub(crate) group_features: CudaSlice<f32>,
    pub(crate) group_x: CudaSlice<f32>,
    /// The fp32 residual stream `[batch, time, d]`.
    pub(crate) x: CudaSlice<f32>,
    /// LayerNorm output, the next block's input `[batch, time, d]`.
    pub(crate) normed: CudaSlice<bf16>,
    /// A block's output before the residual add `[batch, time, d]`.
    pub(crate) branch: CudaSlice<f32>,
    pub(crate) ff_hidden: CudaSlice<bf16>,
    pub(crate) ff_activated: CudaSlice<bf16>,
    pub(crate) qkv: CudaSlice<bf16>,
    pub(crate) q_u: CudaSlice<bf16>,
    pub(crate) q_v: CudaSlice<bf16>,
    pub(crate) k: CudaSlice<bf16>,
    pub(crate) v: CudaSlice<bf16>,
    /// The sinusoid table `[positions, d]` (the same for every layer).
    pub(crate) pos_table: CudaSlice<bf16>,
    pub(crate) pos_projected: CudaSlice<bf16>,
    pub(crate) pos_heads: CudaSlice<bf16>,
    pub(crate) scores_ac: CudaSlice<f32>,
    pub(crate) scores_bd: CudaSlice<f32>,
    pub(crate) probs: CudaSlice<bf16>,
    pub(crate) context_heads: CudaSlice<bf16>,
    pub(crate) context: CudaSlice<bf16>,
    pub(crate) conv_in: CudaSlice<bf16>,
    pub(crate) conv_gated: CudaSlice<bf16>,
    pub(crate) conv_out: CudaSlice<bf16>,
    /// Valid encoder frames per utterance `[batch]` (set by every pass).
    pub(crate) lengths: CudaSlice<i32>,
}

/// What a workspace is sized from.
pub(crate) struct WorkspaceSize {
    pub(crate) key: WorkspaceKey,
    pub(crate) attention: AttentionModel,
    pub(crate) shape: HeadShape,
    pub(crate) ff_hidden: usize,
    pub(crate) subsampling_elements: usize,
    pub(crate) group_features_elements: usize,
    pub(crate) group_x_elements: usize,
}

impl Workspace {
    pub(crate) fn new(engine: &CudaEngine, size: &WorkspaceSize) -> Result<Self> {
        let (shape, ff_hidden) = (size.shape, size.ff_hidden);
        let n = shape.elements();
        let rows = shape.batch * shape.time;
        let positions = positions_for(size.attention, shape.time);
        let d = shape.d_model();
        let scores = shape.heads * shape.batch * shape.time * shape.time;
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
            pos_table: upload_bf16(engine, &table_for(size.attention, shape.time, d))?,
            pos_projected: engine.zeros(positions * d)?,
            pos_heads: engine.zeros(shape.batch * positions * d)?,
            scores_ac: engine.zeros(scores)?,
            scores_bd: engine.zeros(shape.heads * shape.batch * shape.time * positions)?,
            probs: engine.zeros(scores)?,
            context_heads: engine.zeros(n)?,
            context: engine.zeros(n)?,
            conv_in: engine.zeros(2 * n)?,
            conv_gated: engine.zeros(n)?,
            conv_out: engine.zeros(n)?,
            lengths: engine.zeros(shape.batch)?,
        })
    }
}
