//! Device buffers of one forward pass, sized once for its padded shape and reused by every layer.

use cudarc::driver::CudaSlice;
use half::bf16;

use crate::device::CudaEngine;
use crate::error::Result;
use crate::ops::HeadShape;

pub(crate) struct Workspace {
    pub(crate) shape: HeadShape,
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
    /// The sinusoid table `[2·time-1, d]` (the same for every layer).
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
    /// Valid encoder frames per utterance `[batch]`.
    pub(crate) lengths: CudaSlice<i32>,
}

impl Workspace {
    pub(crate) fn new(
        engine: &CudaEngine,
        shape: HeadShape,
        ff_hidden: usize,
        lengths: CudaSlice<i32>,
    ) -> Result<Self> {
        let n = shape.elements();
        let rows = shape.batch * shape.time;
        let positions = shape.positions();
        let d = shape.d_model();
        let scores = shape.heads * shape.batch * shape.time * shape.time;
        Ok(Self {
            shape,
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
            pos_table: engine.zeros(positions * d)?,
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
            lengths,
        })
    }
}
