//! cuBLASLt: the library handle, the matrix-layout, matmul and preference descriptors (each
//! destroyed on drop), the algorithm queries and the matmul call itself.

use std::ffi::c_void;
use std::mem;

use cudarc::cublaslt::result::{self as lt, CublasError};
use cudarc::cublaslt::sys;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaStream;

use super::drop_errors::record_drop_error;

/// A cuBLASLt handle, destroyed on drop.
pub(crate) struct Handle(sys::cublasLtHandle_t);

// SAFETY: a cuBLASLt handle is not bound to the thread that created it; the engine that owns it
// is used from one thread at a time (it is Send, not Sync), and every call binds the context.
unsafe impl Send for Handle {}

impl Handle {
    pub(crate) fn new() -> Result<Self, CublasError> {
        lt::create_handle().map(Self)
    }

    /// The workspace bytes `algo` needs for this problem, if cuBLASLt accepts it.
    pub(crate) fn check_algo(
        &self,
        desc: &Desc,
        [layout_a, layout_b, layout_d]: [&Layout; 3],
        algo: &sys::cublasLtMatmulAlgo_t,
    ) -> Result<usize, CublasError> {
        let mut result = mem::MaybeUninit::<sys::cublasLtMatmulHeuristicResult_t>::zeroed();
        // SAFETY: every descriptor is alive for the duration of the call, `algo` is an
        // algorithm cuBLASLt returned for these types, `result` is writable.
        let status = unsafe {
            sys::cublasLtMatmulAlgoCheck(
                self.0,
                desc.0,
                layout_a.0,
                layout_b.0,
                layout_d.0,
                layout_d.0,
                algo,
                result.as_mut_ptr(),
            )
        };
        status.result()?;
        // SAFETY: on success cuBLASLt filled `result`.
        Ok(unsafe { result.assume_init() }.workspaceSize)
    }

    /// The heuristic's first choice for these descriptors under `pref`.
    pub(crate) fn heuristic(
        &self,
        desc: &Desc,
        [layout_a, layout_b, layout_d]: [&Layout; 3],
        pref: &Pref,
    ) -> Result<sys::cublasLtMatmulAlgo_t, CublasError> {
        // SAFETY: every descriptor is alive for the duration of the call.
        let heuristic = unsafe {
            lt::get_matmul_algo_heuristic(
                self.0, desc.0, layout_a.0, layout_b.0, layout_d.0, layout_d.0, pref.0,
            )
        }?;
        Ok(heuristic.algo)
    }

    /// `d = alpha * op(a) . op(b)` (beta = 0: C, aliased to D, is never read), queued on
    /// `stream`.
    ///
    /// # Safety
    ///
    /// `a`, `b` and `d` must be device addresses of buffers that hold at least what their
    /// layouts address, and `workspace` of `workspace_bytes` bytes, all on `stream`'s context
    /// (which must be current) and ordered on `stream`; `algo` must be one cuBLASLt gave or
    /// accepted for these descriptors with at most `workspace_bytes` of workspace.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn matmul(
        &self,
        desc: &Desc,
        alpha: f32,
        (a, layout_a): (CUdeviceptr, &Layout),
        (b, layout_b): (CUdeviceptr, &Layout),
        (d, layout_d): (CUdeviceptr, &Layout),
        algo: &sys::cublasLtMatmulAlgo_t,
        (workspace, workspace_bytes): (CUdeviceptr, usize),
        stream: &CudaStream,
    ) -> Result<(), CublasError> {
        let beta = 0.0f32;
        // SAFETY: forwarded from this function's contract; the descriptors, the algorithm and
        // the scalars outlive the call.
        unsafe {
            lt::matmul(
                self.0,
                desc.0,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                a as *const c_void,
                layout_a.0,
                b as *const c_void,
                layout_b.0,
                d as *const c_void,
                layout_d.0,
                d as *mut c_void,
                layout_d.0,
                algo,
                workspace as *mut c_void,
                workspace_bytes,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        let handle = mem::replace(&mut self.0, std::ptr::null_mut());
        if !handle.is_null() {
            // SAFETY: the handle came from cublasLtCreate and is destroyed exactly once.
            let destroyed = unsafe { lt::destroy_handle(handle) };
            record_drop_error("destroying the cuBLASLt handle", destroyed);
        }
    }
}

// ── RAII descriptors ────────────────────────────────────────────────────────────────────────
// Each is created and destroyed exactly once; a failed destroy is recorded, not returned.

/// A matrix layout: its element type, rows, columns, leading dimension and batch.
pub(crate) struct Layout(sys::cublasLtMatrixLayout_t);

impl Layout {
    pub(crate) fn new(
        dtype: sys::cudaDataType,
        rows: u64,
        cols: u64,
        ld: i64,
    ) -> Result<Self, CublasError> {
        lt::create_matrix_layout(dtype, rows, cols, ld).map(Self)
    }

    pub(crate) fn set_batch(&self, count: i64, stride: i64) -> Result<(), CublasError> {
        let count = count as i32;
        // SAFETY: the layout is alive; each value has the size and type the attribute expects.
        unsafe {
            lt::set_matrix_layout_attribute(
                self.0,
                sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                &count as *const i32 as *const c_void,
                mem::size_of::<i32>(),
            )?;
            lt::set_matrix_layout_attribute(
                self.0,
                sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                &stride as *const i64 as *const c_void,
                mem::size_of::<i64>(),
            )
        }
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatrixLayoutCreate, destroyed once.
        let destroyed = unsafe { lt::destroy_matrix_layout(self.0) };
        record_drop_error("destroying a cuBLASLt matrix layout", destroyed);
    }
}

/// A matmul descriptor: fp32 compute and scale type, and the attributes set on it.
pub(crate) struct Desc(sys::cublasLtMatmulDesc_t);

impl Desc {
    pub(crate) fn new() -> Result<Self, CublasError> {
        lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType_t::CUDA_R_32F,
        )
        .map(Self)
    }

    /// `T` must be the attribute's documented type (the callers pass exactly those).
    pub(crate) fn set<T>(
        &self,
        attribute: sys::cublasLtMatmulDescAttributes_t,
        value: &T,
    ) -> Result<(), CublasError> {
        // SAFETY: the descriptor is alive and `value` points to size_of::<T>() readable bytes.
        unsafe {
            lt::set_matmul_desc_attribute(
                self.0,
                attribute,
                value as *const T as *const c_void,
                mem::size_of::<T>(),
            )
        }
    }
}

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulDescCreate, destroyed once.
        let destroyed = unsafe { lt::destroy_matmul_desc(self.0) };
        record_drop_error("destroying a cuBLASLt matmul descriptor", destroyed);
    }
}

/// A heuristic preference: the limits a chosen algorithm must keep.
pub(crate) struct Pref(sys::cublasLtMatmulPreference_t);

impl Pref {
    pub(crate) fn new() -> Result<Self, CublasError> {
        lt::create_matmul_pref().map(Self)
    }

    /// `T` must be the attribute's documented type (the callers pass exactly those).
    pub(crate) fn set<T>(
        &self,
        attribute: sys::cublasLtMatmulPreferenceAttributes_t,
        value: &T,
    ) -> Result<(), CublasError> {
        // SAFETY: the preference is alive and `value` points to size_of::<T>() readable bytes.
        unsafe {
            lt::set_matmul_pref_attribute(
                self.0,
                attribute,
                value as *const T as *const c_void,
                mem::size_of::<T>(),
            )
        }
    }
}

impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulPreferenceCreate, destroyed once.
        let destroyed = unsafe { lt::destroy_matmul_pref(self.0) };
        record_drop_error("destroying a cuBLASLt matmul preference", destroyed);
    }
}
