//! Relative-position attention helpers around the batched matmuls: head split/merge in the
//! head-major layout `[heads, batch, time, head_dim]` and the relative-shift softmax.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::activation::{pack_len, row_units_config};
use super::{check_len, rows_for_grid, to_i32};
use crate::device::CudaEngine;
use crate::driver::launch::per_row_config;
use crate::error::{CudaEngineError, Result};
use crate::kernels::Kernel;
use crate::matmul::{BLayout, MatmulSpec, MatmulStrides};
use crate::storage::{Storage, StorageKind};

/// Longest score row `rel_pos_softmax_warp` takes (32 lanes × `REL_POS_WARP_VALUES` in
/// `kernels/attention.cu`); longer rows use the block-per-row kernel.
pub const REL_POS_WARP_KEYS: usize = 32 * 32;
/// Warps (score rows) per block of `rel_pos_softmax_warp`.
const WARPS_PER_BLOCK: usize = 8;

/// The head dimension `rel_pos_attention` is built for (`FA_HD` in
/// `kernels/fused_attention.cu`): Parakeet TDT 0.6B's 1024 channels over 8 heads.
pub const FUSED_ATTENTION_HEAD_DIM: usize = 128;
/// Queries per block and threads per block of `rel_pos_attention` (`FA_BQ`, `FA_WARPS * 32`).
const FUSED_QUERIES_PER_BLOCK: usize = 64;
const FUSED_THREADS: u32 = 128;
/// Its dynamic shared memory (`FA_SHARED_BYTES`): K and V tiles and 128 table rows of 136 bf16,
/// and a 16 x 80 f32 band per warp.
const FUSED_SHARED_BYTES: usize = (2 * 64 + 128) * (128 + 8) * 2 + 4 * 16 * 80 * 4;

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

    /// Row stride of the score and probability buffers `[heads·batch, time, score_row]`: `time`
    /// rounded up to 8 elements, so every row starts 16-byte aligned (f32 and bf16) and cuBLASLt
    /// keeps its fast kernels (measured on H200: 375-frame rows made the attention products
    /// ~12 % slower than 384-frame ones, per frame).
    pub fn score_row(&self) -> usize {
        self.time.next_multiple_of(8)
    }

    /// Row stride of a `bd` buffer of `columns` relative positions, aligned the same way.
    pub fn bd_row(columns: usize) -> usize {
        columns.next_multiple_of(8)
    }

    /// Elements of one `[heads·batch, time, score_row]` buffer.
    pub fn score_elements(&self) -> usize {
        self.heads * self.batch * self.time * self.score_row()
    }

    /// `ac = (q+u)·kᵀ` per (head, batch entry) into rows of [`Self::score_row`].
    pub fn scores_matmul(&self) -> MatmulSpec {
        MatmulSpec {
            strides: MatmulStrides {
                out_row: Some(self.score_row()),
                ..MatmulStrides::default()
            },
            ..self.per_head_matmul(self.time, self.head_dim, BLayout::NByK)
        }
    }

    /// `bd = (q+v)·pᵀ` per head against the projected position table `p` `[positions, d]`
    /// read in place: head `h` takes columns `h·head_dim ..` of every row (batch stride
    /// `head_dim`, row stride `d`), and its `batch·time` query rows are contiguous in the
    /// head-major layout, so no per-batch copy of the table is made. Rows of
    /// [`Self::bd_row`]`(positions)` in `[heads·batch, time, ..]` order.
    pub fn bd_matmul(&self, positions: usize) -> MatmulSpec {
        MatmulSpec {
            batch: self.heads,
            m: self.batch * self.time,
            n: positions,
            k: self.head_dim,
            b_layout: BLayout::NByK,
            b_shared: false,
            alpha: 1.0,
            strides: MatmulStrides {
                b_row: Some(self.d_model()),
                b_batch: Some(self.head_dim),
                out_row: Some(Self::bd_row(positions)),
                ..MatmulStrides::default()
            },
        }
    }

    /// `context_heads = probs · v` per (head, batch entry), `probs` in rows of `probs_row`.
    fn values_matmul(&self, probs_row: usize) -> MatmulSpec {
        MatmulSpec {
            strides: MatmulStrides {
                a_row: Some(probs_row),
                ..MatmulStrides::default()
            },
            ..self.per_head_matmul(self.head_dim, self.time, BLayout::KByN)
        }
    }

    /// One product per (head, batch entry) over the head-major layout: `[heads·batch, time, k]`
    /// times `b` (`NByK`: keys `[.., n, k]`; `KByN`: values `[.., k, n]`), dense rows.
    pub fn per_head_matmul(&self, n: usize, k: usize, b_layout: BLayout) -> MatmulSpec {
        MatmulSpec {
            batch: self.heads * self.batch,
            m: self.time,
            n,
            k,
            b_layout,
            b_shared: false,
            alpha: 1.0,
            strides: Default::default(),
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

/// Row strides (elements) of the attention score buffers: `scores` for `ac` and the
/// probabilities, `bd` for the relative-position scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoreRows {
    pub scores: usize,
    pub bd: usize,
}

impl ScoreRows {
    /// Dense rows: `time` keys, `bd_columns` relative positions.
    pub fn dense(time: usize, bd_columns: usize) -> Self {
        Self {
            scores: time,
            bd: bd_columns,
        }
    }

    /// The aligned rows the encoder uses ([`HeadShape::score_row`], [`HeadShape::bd_row`]).
    pub fn aligned(shape: &HeadShape, bd_columns: usize) -> Self {
        Self {
            scores: shape.score_row(),
            bd: HeadShape::bd_row(bd_columns),
        }
    }

    /// Both strides as kernel arguments, after checking they hold the columns used.
    fn checked(&self, op: &'static str, time: usize, bd_columns: usize) -> Result<(i32, i32)> {
        if self.scores < time || self.bd < bd_columns {
            return Err(CudaEngineError::Shape {
                op,
                detail: format!(
                    "{self:?} is shorter than {time} keys / {bd_columns} relative positions"
                ),
            });
        }
        Ok((
            to_i32(op, "score_row", self.scores)?,
            to_i32(op, "bd_row", self.bd)?,
        ))
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

    /// `probs = softmax(scale * (ac + shift(bd)))` over valid keys; see `kernels/attention.cu`.
    /// `ac` is `[heads*batch, time, rows.scores]`, `bd` `[heads*batch, time, rows.bd]` with
    /// `2*time-1` used columns (both f32), `probs` like `ac` in storage type, `lengths` `[batch]`.
    #[allow(clippy::too_many_arguments)]
    pub fn rel_pos_softmax<S: Storage>(
        &self,
        ac: &CudaSlice<f32>,
        bd: &CudaSlice<f32>,
        lengths: &CudaSlice<i32>,
        scale: f32,
        shape: HeadShape,
        rows: ScoreRows,
        probs: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "rel_pos_softmax";
        let [batch, time, _, _] = shape.kernel_args(OP)?;
        let (score_row, bd_row) = rows.checked(OP, shape.time, shape.positions())?;
        let n = shape.heads * shape.batch * shape.time;
        check_len(OP, "ac", ac.len(), n * rows.scores)?;
        check_len(OP, "bd", bd.len(), n * rows.bd)?;
        check_len(OP, "probs", probs.len(), n * rows.scores)?;
        check_len(OP, "lengths", lengths.len(), shape.batch)?;
        // Rows of up to REL_POS_WARP_KEYS keys: one warp per row; longer: one block per row.
        let warp = shape.time <= REL_POS_WARP_KEYS;
        let (kernel, config) = if warp {
            let blocks =
                u32::try_from(n.div_ceil(WARPS_PER_BLOCK)).map_err(|_| CudaEngineError::Shape {
                    op: OP,
                    detail: format!("{n} score rows exceed the grid"),
                })?;
            let config = LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (32 * WARPS_PER_BLOCK as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            (Kernel::RelPosSoftmaxWarp, config)
        } else {
            (Kernel::RelPosSoftmax, per_row_config(rows_for_grid(OP, n)?))
        };
        let rows_arg = n as i64;
        // SAFETY: signatures (const float* ac, const float* bd, const int* lengths, float scale,
        // int batch, int time, int score_row, int bd_row, [long long rows,] bf16_t* probs), the
        // warp kernel with `rows`: one warp (warps past `rows` return) or one block per row of
        // heads*batch*time rows, the buffers checked against those rows and strides above (the
        // strides cover the columns read: time and 2*time-1).
        unsafe {
            self.launch_as(
                S::KIND,
                kernel,
                config,
                || format!("{shape:?}"),
                |args| {
                    args.arg(ac)
                        .arg(bd)
                        .arg(lengths)
                        .arg(&scale)
                        .arg(&batch)
                        .arg(&time)
                        .arg(&score_row)
                        .arg(&bd_row);
                    if warp {
                        args.arg(&rows_arg);
                    }
                    args.arg(probs);
                },
            )
        }
    }

    /// `out [batch, time, d] = softmax(scale * ((q+u)Kᵀ + shift((q+v)Pᵀ))) V` in one kernel
    /// (`kernels/fused_attention.cu`, flash-style, no score buffers): `q_u`, `q_v`, `k`, `v`
    /// `[heads, batch, time, head_dim]` as [`CudaEngine::split_qkv_heads`] leaves them, `pos`
    /// the projected table `[2*time-1, d]` (row c: relative position `time-1-c`), `lengths`
    /// `[batch]`. bf16 only, head_dim `FUSED_ATTENTION_HEAD_DIM`, compute capability 8.0+.
    #[allow(clippy::too_many_arguments)]
    pub fn rel_pos_attention<S: Storage>(
        &self,
        q_u: &CudaSlice<S>,
        q_v: &CudaSlice<S>,
        k: &CudaSlice<S>,
        v: &CudaSlice<S>,
        pos: &CudaSlice<S>,
        lengths: &CudaSlice<i32>,
        scale: f32,
        shape: HeadShape,
        out: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "rel_pos_attention";
        let [batch, time, heads, _] = shape.kernel_args(OP)?;
        if !self.supports_fused_attention::<S>(&shape) {
            return Err(CudaEngineError::Shape {
                op: OP,
                detail: format!(
                    "{:?} storage, {shape:?}, compute capability {:?}: the kernel takes bf16, \
                     head_dim {FUSED_ATTENTION_HEAD_DIM}, 8.0 or newer",
                    S::KIND,
                    self.compute_capability()
                ),
            });
        }
        let n = shape.elements();
        for (name, len) in [
            ("q_u", q_u.len()),
            ("q_v", q_v.len()),
            ("k", k.len()),
            ("v", v.len()),
        ] {
            check_len(OP, name, len, n)?;
        }
        check_len(OP, "pos", pos.len(), shape.positions() * shape.d_model())?;
        check_len(OP, "lengths", lengths.len(), shape.batch)?;
        check_len(OP, "out", out.len(), n)?;
        let pos_row = to_i32(OP, "d_model", shape.d_model())?;
        let grid = |what: &str, count: usize| {
            u32::try_from(count).map_err(|_| CudaEngineError::Shape {
                op: OP,
                detail: format!("{count} {what} exceed the grid"),
            })
        };
        let config = LaunchConfig {
            grid_dim: (
                grid("query tiles", shape.time.div_ceil(FUSED_QUERIES_PER_BLOCK))?,
                grid("(head, utterance) pairs", shape.heads * shape.batch)?,
                1,
            ),
            block_dim: (FUSED_THREADS, 1, 1),
            shared_mem_bytes: FUSED_SHARED_BYTES as u32,
        };
        let allowed = match self.fused_attention_shared.get() {
            Some(&bytes) => bytes,
            None => {
                let (bytes, _) = self.allow_max_shared_bytes(
                    StorageKind::Bf16,
                    Kernel::RelPosAttention,
                    FUSED_THREADS,
                )?;
                *self.fused_attention_shared.get_or_init(|| bytes)
            }
        };
        if allowed < FUSED_SHARED_BYTES {
            return Err(CudaEngineError::Shape {
                op: OP,
                detail: format!(
                    "needs {FUSED_SHARED_BYTES} bytes of shared memory per block, the device \
                     allows {allowed}"
                ),
            });
        }
        // SAFETY: signature (const bf16_t* q_u, const bf16_t* q_v, const bf16_t* k,
        // const bf16_t* v, const bf16_t* pos, int pos_row, const int* lengths, float scale,
        // int batch, int time, int heads, bf16_t* out); one block per 64 queries of one
        // (head, utterance), its shared memory allowed above; every buffer checked against the
        // shape (head_dim 128), the table against 2*time-1 rows of d.
        unsafe {
            self.launch(
                Kernel::RelPosAttention,
                config,
                || format!("{shape:?}"),
                |args| {
                    args.arg(q_u)
                        .arg(q_v)
                        .arg(k)
                        .arg(v)
                        .arg(pos)
                        .arg(&pos_row)
                        .arg(lengths)
                        .arg(&scale)
                        .arg(&batch)
                        .arg(&time)
                        .arg(&heads)
                        .arg(out);
                },
            )
        }
    }

    /// Whether [`CudaEngine::rel_pos_attention`] takes this storage and shape on this device.
    pub fn supports_fused_attention<S: Storage>(&self, shape: &HeadShape) -> bool {
        S::KIND == StorageKind::Bf16
            && shape.head_dim == FUSED_ATTENTION_HEAD_DIM
            && self.compute_capability().0 >= 8
    }

    /// Local-attention softmax over keys `i-left ..= i+right`; `bd` is `[heads*batch, time,
    /// rows.bd]` against the band table (`left+right+1` used columns), `ac` and `probs` rows of
    /// `rows.scores`. See `kernels/attention.cu` for the placement.
    #[allow(clippy::too_many_arguments)]
    pub fn local_rel_pos_softmax<S: Storage>(
        &self,
        ac: &CudaSlice<f32>,
        bd: &CudaSlice<f32>,
        lengths: &CudaSlice<i32>,
        scale: f32,
        shape: HeadShape,
        (left, right): (usize, usize),
        rows: ScoreRows,
        probs: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "local_rel_pos_softmax";
        let [batch, time, _, _] = shape.kernel_args(OP)?;
        let (left_arg, right_arg) = (to_i32(OP, "left", left)?, to_i32(OP, "right", right)?);
        let (score_row, bd_row) = rows.checked(OP, shape.time, left + right + 1)?;
        let n = shape.heads * shape.batch * shape.time;
        check_len(OP, "ac", ac.len(), n * rows.scores)?;
        check_len(OP, "bd", bd.len(), n * rows.bd)?;
        check_len(OP, "probs", probs.len(), n * rows.scores)?;
        check_len(OP, "lengths", lengths.len(), shape.batch)?;
        let grid = rows_for_grid(OP, n)?;
        // SAFETY: signature (const float* ac, const float* bd, const int* lengths, float scale,
        // int batch, int time, int left, int right, int score_row, int bd_row, bf16_t* probs);
        // one block per row of heads*batch*time rows; ac and probs hold rows of score_row >=
        // time, bd rows of bd_row >= left+right+1 elements, and the kernel reads bd only at
        // columns 0 ..= left+right.
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
                        .arg(&score_row)
                        .arg(&bd_row)
                        .arg(probs);
                },
            )
        }
    }

    /// The attention output: `context_heads = probs · v` per head (`probs` `[heads·batch, time,
    /// probs_row]`, `v` head-major), merged back to `context` `[batch, time, d]`.
    pub fn attend<S: Storage>(
        &self,
        probs: &CudaSlice<S>,
        probs_row: usize,
        v: &CudaSlice<S>,
        shape: HeadShape,
        context_heads: &mut CudaSlice<S>,
        context: &mut CudaSlice<S>,
    ) -> Result<()> {
        let no_bias: Option<&CudaSlice<S>> = None;
        self.matmul(
            &shape.values_matmul(probs_row),
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
