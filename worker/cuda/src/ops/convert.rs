//! f32 <-> bf16 conversion on the device (round to nearest even, NaN preserved).

use cudarc::driver::{CudaSlice, PushKernelArg};
use half::bf16;

use super::{check_len, to_i64};
use crate::device::{elementwise_config, CudaEngine};
use crate::error::Result;
use crate::kernels::Kernel;

impl CudaEngine {
    /// `y[..n] = bf16(x[..n])` with `n = x.len()`.
    pub fn f32_to_bf16(&self, x: &CudaSlice<f32>, y: &mut CudaSlice<bf16>) -> Result<()> {
        const OP: &str = "f32_to_bf16";
        let n = x.len();
        check_len(OP, "y", y.len(), n)?;
        let count = to_i64(OP, "n", n)?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: signature (const float*, bf16_t*, long long); both buffers hold n elements.
        unsafe {
            self.launch(
                Kernel::F32ToBf16,
                elementwise_config(n),
                || format!("n={n}"),
                |args| {
                    args.arg(x).arg(y).arg(&count);
                },
            )
        }
    }

    /// `y[..n] = f32(x[..n])` with `n = x.len()` (exact).
    pub fn bf16_to_f32(&self, x: &CudaSlice<bf16>, y: &mut CudaSlice<f32>) -> Result<()> {
        const OP: &str = "bf16_to_f32";
        let n = x.len();
        check_len(OP, "y", y.len(), n)?;
        let count = to_i64(OP, "n", n)?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: signature (const bf16_t*, float*, long long); both buffers hold n elements.
        unsafe {
            self.launch(
                Kernel::Bf16ToF32,
                elementwise_config(n),
                || format!("n={n}"),
                |args| {
                    args.arg(x).arg(y).arg(&count);
                },
            )
        }
    }
}
