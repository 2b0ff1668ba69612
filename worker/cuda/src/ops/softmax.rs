//! Row softmax over attention scores with a per-utterance length mask.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::{check_len, rows_for_grid, to_i32};
use crate::device::{per_row_config, CudaEngine};
use crate::error::{CudaEngineError, Result};
use crate::kernels::Kernel;
use crate::storage::Storage;

/// Scores laid out `[batch, heads, tq, tk]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    pub batch: usize,
    pub heads: usize,
    pub tq: usize,
    pub tk: usize,
}

impl CudaEngine {
    /// `probs = softmax(scale * scores)` over the last axis, where for utterance `b` only the
    /// first `lengths[b]` keys take part; masked keys, and every key of query rows
    /// `q >= lengths[b]`, get probability 0 (never NaN, also for `lengths[b] = 0`).
    pub fn masked_softmax<S: Storage>(
        &self,
        scores: &CudaSlice<f32>,
        lengths: &CudaSlice<i32>,
        scale: f32,
        shape: AttentionShape,
        probs: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "masked_softmax";
        let AttentionShape {
            batch,
            heads,
            tq,
            tk,
        } = shape;
        if [batch, heads, tq, tk].contains(&0) {
            return Err(CudaEngineError::Shape {
                op: OP,
                detail: format!("{shape:?}: every dimension must be at least 1"),
            });
        }
        let grid_rows = rows_for_grid(OP, batch * heads * tq)?;
        let elements = batch * heads * tq * tk;
        check_len(OP, "scores", scores.len(), elements)?;
        check_len(OP, "probs", probs.len(), elements)?;
        check_len(OP, "lengths", lengths.len(), batch)?;
        let (heads_arg, tq_arg, tk_arg) = (
            to_i32(OP, "heads", heads)?,
            to_i32(OP, "tq", tq)?,
            to_i32(OP, "tk", tk)?,
        );
        // SAFETY: signature (const float*, const int*, float, int, int, int, bf16_t*); scores
        // and probs hold batch*heads*tq*tk elements, lengths batch; one block per row.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::MaskedSoftmax,
                per_row_config(grid_rows),
                || format!("{shape:?}"),
                |args| {
                    args.arg(scores)
                        .arg(lengths)
                        .arg(&scale)
                        .arg(&heads_arg)
                        .arg(&tq_arg)
                        .arg(&tk_arg)
                        .arg(probs);
                },
            )
        }
    }
}
