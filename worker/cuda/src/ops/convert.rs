//! f32 <-> bf16 conversion on the device (round to nearest even, NaN preserved).

use cudarc::driver::CudaSlice;
use half::bf16;

use crate::device::CudaEngine;
use crate::error::Result;
use crate::kernels::Kernel;

impl CudaEngine {
    /// `y[..n] = bf16(x[..n])` with `n = x.len()`.
    pub fn f32_to_bf16(&self, x: &CudaSlice<f32>, y: &mut CudaSlice<bf16>) -> Result<()> {
        // SAFETY: `F32ToBf16` has signature (const float*, bf16_t*, long long).
        unsafe { self.launch_unary("f32_to_bf16", Kernel::F32ToBf16, x, y) }
    }

    /// `y[..n] = f32(x[..n])` with `n = x.len()` (exact).
    pub fn bf16_to_f32(&self, x: &CudaSlice<bf16>, y: &mut CudaSlice<f32>) -> Result<()> {
        // SAFETY: `Bf16ToF32` has signature (const bf16_t*, float*, long long).
        unsafe { self.launch_unary("bf16_to_f32", Kernel::Bf16ToF32, x, y) }
    }
}
