//! Row softmax over attention scores with a per-utterance length mask.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::{check_len, rows_for_grid, to_i32};
use crate::device::CudaEngine;
use crate::driver::launch::per_row_config;
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
    /// `q >= lengths[b]`, get probability 0 (never NaN, also for `lengths[b] = 0`). Rows are
    /// `row_stride >= tk` elements apart in both buffers; the columns past `tk` are untouched.
    pub fn masked_softmax<S: Storage>(
        &self,
        scores: &CudaSlice<f32>,
        lengths: &CudaSlice<i32>,
        scale: f32,
        shape: AttentionShape,
        row_stride: usize,
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
        if row_stride < tk {
            return Err(CudaEngineError::Shape {
                op: OP,
                detail: format!("{shape:?}: row stride {row_stride} is shorter than tk"),
            });
        }
        let elements = batch * heads * tq * row_stride;
        check_len(OP, "scores", scores.len(), elements)?;
        check_len(OP, "probs", probs.len(), elements)?;
        check_len(OP, "lengths", lengths.len(), batch)?;
        let (heads_arg, tq_arg, tk_arg, row_arg) = (
            to_i32(OP, "heads", heads)?,
            to_i32(OP, "tq", tq)?,
            to_i32(OP, "tk", tk)?,
            to_i32(OP, "row_stride", row_stride)?,
        );
        // SAFETY: signature (const float*, const int*, float, int heads, int tq, int tk,
        // int row_stride, bf16_t*); scores and probs hold batch*heads*tq rows of row_stride >= tk
        // elements, lengths batch; one block per row.
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
                        .arg(&row_arg)
                        .arg(probs);
                },
            )
        }
    }
}
