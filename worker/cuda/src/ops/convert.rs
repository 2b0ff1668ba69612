//! f32 <-> storage conversion on the device: bf16 rounds to nearest even (NaN preserved), f32
//! storage copies.

use cudarc::driver::CudaSlice;

use crate::device::CudaEngine;
use crate::error::Result;
use crate::kernels::Kernel;
use crate::storage::Storage;

impl CudaEngine {
    /// `y[..n] = S(x[..n])` with `n = x.len()`.
    pub fn f32_to_storage<S: Storage>(
        &self,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<S>,
    ) -> Result<()> {
        // SAFETY: `F32ToBf16` has signature (const float*, bf16_t*, long long).
        unsafe { self.launch_unary_as(S::KIND, "f32_to_storage", Kernel::F32ToBf16, 1, x, y) }
    }

    /// `y[..n] = f32(x[..n])` with `n = x.len()` (exact).
    pub fn storage_to_f32<S: Storage>(
        &self,
        x: &CudaSlice<S>,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        // SAFETY: `Bf16ToF32` has signature (const bf16_t*, float*, long long).
        unsafe { self.launch_unary_as(S::KIND, "storage_to_f32", Kernel::Bf16ToF32, 1, x, y) }
    }
}
