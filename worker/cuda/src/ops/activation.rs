//! SiLU and GLU in bf16 storage with fp32 arithmetic, plus the launch shape shared by the
//! kernels that move one 16-byte pack of channels per thread.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::{check_len, to_i32, to_i64};
use crate::device::CudaEngine;
use crate::driver::launch::BLOCK_THREADS;
use crate::error::{CudaEngineError, Result};
use crate::kernels::Kernel;
use crate::storage::Storage;

impl CudaEngine {
    /// `y = x * sigmoid(x)` over the first `x.len()` elements.
    pub fn silu<S: Storage>(&self, x: &CudaSlice<S>, y: &mut CudaSlice<S>) -> Result<()> {
        // SAFETY: silu_bf16 is (const bf16_t*, bf16_t*, long long n); its grid-stride loops touch
        // only indices < n (packs of whole elements below n / pack, single elements above).
        unsafe { self.launch_unary_as(S::KIND, "silu", Kernel::Silu, pack_len::<S>(), x, y) }
    }

    /// GLU over channels: `x` is `[rows, 2 * half]`, `y[rows, half] = x[:, :half] *
    /// sigmoid(x[:, half:])` (the Conformer convolution module's gate).
    pub fn glu<S: Storage>(
        &self,
        x: &CudaSlice<S>,
        rows: usize,
        half: usize,
        y: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "glu";
        if rows == 0 || half == 0 {
            return Err(CudaEngineError::Shape {
                op: OP,
                detail: format!("rows={rows} half={half}: both must be at least 1"),
            });
        }
        check_len(OP, "x", x.len(), rows * 2 * half)?;
        check_len(OP, "y", y.len(), rows * half)?;
        let rows_arg = to_i64(OP, "rows", rows)?;
        let half_arg = to_i32(OP, "half", half)?;
        let config = row_units_config(half.div_ceil(pack_len::<S>()), rows);
        // SAFETY: signature (const bf16_t*, bf16_t*, long long, int); x holds rows*2*half and y
        // rows*half elements; the kernel reads columns < half of rows < rows only.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::Glu,
                config,
                || format!("rows={rows} half={half}"),
                |args| {
                    args.arg(x).arg(y).arg(&rows_arg).arg(&half_arg);
                },
            )
        }
    }
}

/// Storage elements in one 16-byte pack (the kernels' `kPack`: 8 bf16 or 4 f32).
pub(super) fn pack_len<S: Storage>() -> usize {
    16 / std::mem::size_of::<S>()
}

/// Launch shape of the row kernels that give each thread one unit (one pack of consecutive
/// columns) of a row: x covers `units` (exactly, rounded up to whole blocks), y strides over
/// `rows` (capped at the grid's y limit; the kernels loop). `units` must fit an `i32`.
pub(super) fn row_units_config(units: usize, rows: usize) -> LaunchConfig {
    let block_x = units.clamp(1, BLOCK_THREADS as usize) as u32;
    let block_y = BLOCK_THREADS / block_x;
    let grid_x = units.div_ceil(block_x as usize).max(1) as u32;
    let grid_y = rows.div_ceil(block_y as usize).clamp(1, 65_535) as u32;
    LaunchConfig {
        grid_dim: (grid_x, grid_y, 1),
        block_dim: (block_x, block_y, 1),
        shared_mem_bytes: 0,
    }
}
