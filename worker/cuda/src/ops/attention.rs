//! Relative-position attention helpers around the batched matmuls: head split/merge in the
//! head-major layout `[heads, batch, time, head_dim]` and the relative-shift softmax.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::activation::{pack_len, row_units_config};
use super::{check_len, rows_for_grid, to_i32};
use crate::device::{elementwise_config, per_row_config, CudaEngine};
use crate::error::{CudaEngineError, Result};
use crate::kernels::Kernel;
use crate::matmul::{BLayout, MatmulSpec};
use crate::storage::Storage;

/// `batch` padded sequences of `time` frames, `heads` heads of `head_dim` channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadShape {
    pub batch: usize,
    pub time: usize,
    pub heads: usize,
    pub head_dim: usize,
}

impl HeadShape {
    pub fn d_model(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Elements of one `[batch, time, d_model]` (or head-major) activation.
    pub fn elements(&self) -> usize {
        self.batch * self.time * self.d_model()
    }

    /// Rows of the full relative position table: `2 * time - 1`.
    pub fn positions(&self) -> usize {
        (2 * self.time).saturating_sub(1)
    }

    /// One product per (head, batch entry) over the head-major layout: `[heads·batch, time, k]`
    /// times `b` (`NByK`: keys `[.., n, k]`; `KByN`: values `[.., k, n]`).
    pub fn per_head_matmul(&self, n: usize, k: usize, b_layout: BLayout) -> MatmulSpec {
        MatmulSpec {
            batch: self.heads * self.batch,
            m: self.time,
            n,
            k,
            b_layout,
            b_shared: false,
            alpha: 1.0,
        }
    }

    fn kernel_args(&self, op: &'static str) -> Result<[i32; 4]> {
        if [self.batch, self.time, self.heads, self.head_dim].contains(&0) {
            return Err(CudaEngineError::Shape {
                op,
                detail: format!("{self:?}: every dimension must be at least 1"),
            });
        }
        Ok([
            to_i32(op, "batch", self.batch)?,
            to_i32(op, "time", self.time)?,
            to_i32(op, "heads", self.heads)?,
            to_i32(op, "head_dim", self.head_dim)?,
        ])
    }
}

/// The four head-major outputs of [`CudaEngine::split_qkv_heads`].
#[derive(Debug)]
pub struct QkvHeads<'a, S> {
    pub q_u: &'a mut CudaSlice<S>,
    pub q_v: &'a mut CudaSlice<S>,
    pub k: &'a mut CudaSlice<S>,
    pub v: &'a mut CudaSlice<S>,
}

impl CudaEngine {
    /// `qkv` `[batch, time, 3*d]` (q | k | v) into head-major `q + u`, `q + v`, `k`, `v`;
    /// `pos_bias_u/v` are `[d]` f32.
    pub fn split_qkv_heads<S: Storage>(
        &self,
        qkv: &CudaSlice<S>,
        pos_bias_u: &CudaSlice<f32>,
        pos_bias_v: &CudaSlice<f32>,
        shape: HeadShape,
        out: QkvHeads<'_, S>,
    ) -> Result<()> {
        const OP: &str = "split_qkv_heads";
        let dims = shape.kernel_args(OP)?;
        let n = shape.elements();
        check_len(OP, "qkv", qkv.len(), 3 * n)?;
        check_len(OP, "pos_bias_u", pos_bias_u.len(), shape.d_model())?;
        check_len(OP, "pos_bias_v", pos_bias_v.len(), shape.d_model())?;
        for (name, buffer) in [("q_u", &*out.q_u), ("q_v", &*out.q_v), ("k", &*out.k)] {
            check_len(OP, name, buffer.len(), n)?;
        }
        check_len(OP, "v", out.v.len(), n)?;
        let config = head_units_config::<S>(OP, shape)?;
        // SAFETY: signature (const bf16_t* qkv, const float* u, const float* v, int batch,
        // int time, int heads, int head_dim, bf16_t* q_u, bf16_t* q_v, bf16_t* k, bf16_t* v);
        // qkv holds 3n, the outputs n, the biases d elements (checked above); the kernel touches
        // columns < d of rows < batch*time only.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::SplitQkvHeads,
                config,
                || format!("{shape:?}"),
                |args| {
                    args.arg(qkv).arg(pos_bias_u).arg(pos_bias_v);
                    for d in &dims {
                        args.arg(d);
                    }
                    args.arg(out.q_u).arg(out.q_v).arg(out.k).arg(out.v);
                },
            )
        }
    }

    /// The projected position table `p` `[positions, d]` into `[heads, batch, positions,
    /// head_dim]` (repeated per batch entry).
    pub fn split_pos_heads<S: Storage>(
        &self,
        p: &CudaSlice<S>,
        shape: HeadShape,
        positions: usize,
        p_heads: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "split_pos_heads";
        let [batch, _, heads, head_dim] = shape.kernel_args(OP)?;
        let positions_arg = to_i32(OP, "positions", positions)?;
        check_len(OP, "p", p.len(), positions * shape.d_model())?;
        let n = shape.batch * positions * shape.d_model();
        check_len(OP, "p_heads", p_heads.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: signature (const bf16_t* p, int batch, int positions, int heads, int head_dim,
        // bf16_t* p_heads); p holds positions*d and p_heads batch*positions*d elements.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::SplitPosHeads,
                elementwise_config(n),
                || format!("{shape:?} positions={positions}"),
                |args| {
                    args.arg(p)
                        .arg(&batch)
                        .arg(&positions_arg)
                        .arg(&heads)
                        .arg(&head_dim)
                        .arg(p_heads);
                },
            )
        }
    }

    /// `probs = softmax(scale * (ac + shift(bd)))` over valid keys; see `kernels/attention.cu`.
    /// `ac` is `[heads*batch, time, time]`, `bd` `[heads*batch, time, 2*time-1]` (both f32),
    /// `probs` `[heads*batch, time, time]` bf16, `lengths` `[batch]`.
    pub fn rel_pos_softmax<S: Storage>(
        &self,
        ac: &CudaSlice<f32>,
        bd: &CudaSlice<f32>,
        lengths: &CudaSlice<i32>,
        scale: f32,
        shape: HeadShape,
        probs: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "rel_pos_softmax";
        let [batch, time, _, _] = shape.kernel_args(OP)?;
        let rows = shape.heads * shape.batch * shape.time;
        check_len(OP, "ac", ac.len(), rows * shape.time)?;
        check_len(OP, "bd", bd.len(), rows * shape.positions())?;
        check_len(OP, "probs", probs.len(), rows * shape.time)?;
        check_len(OP, "lengths", lengths.len(), shape.batch)?;
        let grid = rows_for_grid(OP, rows)?;
        // SAFETY: signature (const float* ac, const float* bd, const int* lengths, float scale,
        // int batch, int time, bf16_t* probs); one block per row of heads*batch*time rows, the
        // buffers checked against those rows above.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::RelPosSoftmax,
                per_row_config(grid),
                || format!("{shape:?}"),
                |args| {
                    args.arg(ac)
                        .arg(bd)
                        .arg(lengths)
                        .arg(&scale)
                        .arg(&batch)
                        .arg(&time)
                        .arg(probs);
                },
            )
        }
    }

    /// Local-attention softmax over keys `i-left ..= i+right`; `bd` is `[heads*batch, time,
    /// left+right+1]` against the band table. See `kernels/attention.cu` for the placement.
    #[allow(clippy::too_many_arguments)]
    pub fn local_rel_pos_softmax<S: Storage>(
        &self,
        ac: &CudaSlice<f32>,
        bd: &CudaSlice<f32>,
        lengths: &CudaSlice<i32>,
        scale: f32,
        shape: HeadShape,
        (left, right): (usize, usize),
        probs: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "local_rel_pos_softmax";
        let [batch, time, _, _] = shape.kernel_args(OP)?;
        let (left_arg, right_arg) = (to_i32(OP, "left", left)?, to_i32(OP, "right", right)?);
        let rows = shape.heads * shape.batch * shape.time;
        check_len(OP, "ac", ac.len(), rows * shape.time)?;
        check_len(OP, "bd", bd.len(), rows * (left + right + 1))?;
        check_len(OP, "probs", probs.len(), rows * shape.time)?;
        check_len(OP, "lengths", lengths.len(), shape.batch)?;
        let grid = rows_for_grid(OP, rows)?;
        // SAFETY: signature (const float* ac, const float* bd, const int* lengths, float scale,
        // int batch, int time, int left, int right, bf16_t* probs); one block per row of
        // heads*batch*time rows; ac and probs hold rows*time, bd rows*(left+right+1) elements
        // and the kernel reads bd only at columns 0 ..= left+right.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::LocalRelPosSoftmax,
                per_row_config(grid),
                || format!("{shape:?} left={left} right={right}"),
                |args| {
                    args.arg(ac)
                        .arg(bd)
                        .arg(lengths)
                        .arg(&scale)
                        .arg(&batch)
                        .arg(&time)
                        .arg(&left_arg)
                        .arg(&right_arg)
                        .arg(probs);
                },
            )
        }
    }

    /// The attention output: `context_heads = probs · v` per head (`probs` `[heads·batch, time,
    /// time]`, `v` head-major), merged back to `context` `[batch, time, d]`.
    pub fn attend<S: Storage>(
        &self,
        probs: &CudaSlice<S>,
        v: &CudaSlice<S>,
        shape: HeadShape,
        context_heads: &mut CudaSlice<S>,
        context: &mut CudaSlice<S>,
    ) -> Result<()> {
        let no_bias: Option<&CudaSlice<S>> = None;
        self.matmul(
            &shape.per_head_matmul(shape.head_dim, shape.time, BLayout::KByN),
            probs,
            v,
            no_bias,
            context_heads,
        )?;
        self.merge_heads(context_heads, shape, context)
    }

    /// Head-major `ctx` `[heads, batch, time, head_dim]` back to `[batch, time, d]`.
    pub fn merge_heads<S: Storage>(
        &self,
        ctx: &CudaSlice<S>,
        shape: HeadShape,
        out: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "merge_heads";
        let dims = shape.kernel_args(OP)?;
        let n = shape.elements();
        check_len(OP, "ctx", ctx.len(), n)?;
        check_len(OP, "out", out.len(), n)?;
        let config = head_units_config::<S>(OP, shape)?;
        // SAFETY: signature (const bf16_t* ctx, int batch, int time, int heads, int head_dim,
        // bf16_t* out); both hold batch*time*d elements, and the kernel touches columns < d of
        // rows < batch*time only.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::MergeHeads,
                config,
                || format!("{shape:?}"),
                |args| {
                    args.arg(ctx);
                    for d in &dims {
                        args.arg(d);
                    }
                    args.arg(out);
                },
            )
        }
    }
}

/// Launch shape of split_qkv_heads and merge_heads: one 16-byte pack of `d` per thread, one row
/// per `(b, t)`; the kernels index rows with an `int`.
fn head_units_config<S: Storage>(op: &'static str, shape: HeadShape) -> Result<LaunchConfig> {
    let rows = shape.batch * shape.time;
    to_i32(op, "batch * time", rows)?;
    Ok(row_units_config(
        shape.d_model().div_ceil(pack_len::<S>()),
        rows,
    ))
}
