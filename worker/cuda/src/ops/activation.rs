//! SiLU and GLU in bf16 storage with fp32 arithmetic.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::{check_len, to_i32, to_i64};
use crate::device::{elementwise_config, CudaEngine};
use crate::error::{CudaEngineError, Result};
use crate::kernels::Kernel;
use crate::storage::Storage;

impl CudaEngine {
    /// `y = x * sigmoid(x)` over the first `x.len()` elements.
    pub fn silu<S: Storage>(&self, x: &CudaSlice<S>, y: &mut CudaSlice<S>) -> Result<()> {
        // SAFETY: `Silu` has signature (const bf16_t*, bf16_t*, long long).
        unsafe { self.launch_unary_as(S::KIND, "silu", Kernel::Silu, x, y) }
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
        // SAFETY: signature (const bf16_t*, bf16_t*, long long, int); x holds rows*2*half and y
        // rows*half elements, the kernel's index range.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::Glu,
                elementwise_config(rows * half),
                || format!("rows={rows} half={half}"),
                |args| {
                    args.arg(x).arg(y).arg(&rows_arg).arg(&half_arg);
                },
            )
        }
    }
}
