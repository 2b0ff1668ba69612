//! Batched matrix products through cuBLASLt: bf16 operands, fp32 accumulation, bf16 or f32
//! output, optional bias epilogue. The workspace is allocated once when the engine starts.
//!
//! Our tensors are row-major; cuBLASLt is column-major. A row-major `[r, c]` buffer is the
//! column-major `c x r` matrix, so `out[M,N] = a[M,K] . op(b)` is computed as the column-major
//! product `outᵀ (N x M) = op(b)ᵀ . aᵀ`, i.e. cuBLASLt's A is our `b` and its B is our `a`.

use std::ffi::c_void;
use std::mem;
use std::sync::Arc;

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublaslt::result::{self as lt, CublasError};
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use half::bf16;

use crate::device::CudaEngine;
use crate::error::{CudaEngineError, DriverContext, Result};

/// How the second operand `b` is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BLayout {
    /// `b` is `[n, k]` (an `nn.Linear` weight, or attention keys): `out = a . bᵀ`.
    NByK,
    /// `b` is `[k, n]` (attention values): `out = a . b`.
    KByN,
}

/// `out[batch, m, n] = alpha * a[batch, m, k] . op(b) (+ bias[n])`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatmulSpec {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub b_layout: BLayout,
    /// One `b` for every batch entry (a weight) instead of one per entry.
    pub b_shared: bool,
    pub alpha: f32,
}

impl MatmulSpec {
    /// A Linear layer over `rows` input rows: `out[rows, out_features] = x . Wᵀ (+ bias)`.
    pub fn linear(rows: usize, in_features: usize, out_features: usize) -> Self {
        Self {
            batch: 1,
            m: rows,
            n: out_features,
            k: in_features,
            b_layout: BLayout::NByK,
            b_shared: true,
            alpha: 1.0,
        }
    }

    fn describe(&self) -> String {
        format!(
            "batch={} m={} n={} k={} b={:?}{} alpha={}",
            self.batch,
            self.m,
            self.n,
            self.k,
            self.b_layout,
            if self.b_shared { " shared" } else { "" },
            self.alpha
        )
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::bf16 {}
    impl Sealed for f32 {}
}

/// Element types a matmul can read: bf16 (the encoder), or f32 for products that must stay in
/// full precision (the compute type is fp32 either way; TF32 is never enabled).
pub trait MatmulInput: DeviceRepr + sealed::Sealed {
    #[doc(hidden)]
    const DATA_TYPE: sys::cudaDataType;
}

impl MatmulInput for bf16 {
    const DATA_TYPE: sys::cudaDataType = sys::cudaDataType_t::CUDA_R_16BF;
}

impl MatmulInput for f32 {
    const DATA_TYPE: sys::cudaDataType = sys::cudaDataType_t::CUDA_R_32F;
}

/// Element types a matmul can write. The bias has the output's type: cuBLASLt 13.0 refused an
/// f32 bias with bf16 output (CUBLAS_STATUS_INVALID_VALUE from the heuristic, measured on H200).
pub trait MatmulOutput: DeviceRepr + sealed::Sealed {
    #[doc(hidden)]
    const DATA_TYPE: sys::cudaDataType;
}

impl MatmulOutput for bf16 {
    const DATA_TYPE: sys::cudaDataType = sys::cudaDataType_t::CUDA_R_16BF;
}

impl MatmulOutput for f32 {
    const DATA_TYPE: sys::cudaDataType = sys::cudaDataType_t::CUDA_R_32F;
}

/// The engine's cuBLASLt handle and its workspace, sized once.
pub(crate) struct Blas {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    stream: Arc<CudaStream>,
}

// SAFETY: a cuBLASLt handle is not bound to the thread that created it; the engine that owns it
// is used from one thread at a time (it is Send, not Sync), and every call binds the context.
unsafe impl Send for Blas {}

impl Blas {
    pub(crate) fn new(stream: Arc<CudaStream>, (major, _): (i32, i32)) -> Result<Self> {
        // NVIDIA's recommendation: 32 MiB on Hopper and newer, 4 MiB before.
        let workspace_bytes = if major >= 9 { 32 << 20 } else { 4 << 20 };
        let workspace = stream
            .alloc_zeros::<u8>(workspace_bytes)
            .context(|| format!("allocating the {workspace_bytes}-byte cuBLASLt workspace"))?;
        let handle = lt::create_handle().map_err(|source| CudaEngineError::Cublas {
            call: "cublasLtCreate",
            shape: String::new(),
            source,
        })?;
        Ok(Self {
            handle,
            workspace,
            stream,
        })
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        let handle = mem::replace(&mut self.handle, std::ptr::null_mut());
        if !handle.is_null() {
            // SAFETY: the handle came from cublasLtCreate and is destroyed exactly once. A failure
            // here could only mean an invalid handle, and there is no caller to report it to.
            let _ = unsafe { lt::destroy_handle(handle) };
        }
    }
}

impl CudaEngine {
    /// `out = alpha * a . op(b) (+ bias)` with bf16 (or f32) operands and fp32 accumulation.
    ///
    /// Numerics measured on H200 / cuBLASLt 13.0 (docs/cuda-engine.md): without bias the result
    /// is the fp32 product rounded once; with a bf16 bias some kernels round `a . b` to bf16
    /// before adding the bias (one extra rounding of the product's magnitude).
    ///
    /// Buffers may be longer than the spec needs; only the leading elements are used.
    pub fn matmul<I: MatmulInput, O: MatmulOutput>(
        &self,
        spec: &MatmulSpec,
        a: &CudaSlice<I>,
        b: &CudaSlice<I>,
        bias: Option<&CudaSlice<O>>,
        out: &mut CudaSlice<O>,
    ) -> Result<()> {
        validate(spec, a.len(), b.len(), bias.map(|b| b.len()), out.len())?;
        let blas = &self.blas;
        let fail = |call: &'static str| {
            let shape = spec.describe();
            move |source: CublasError| CudaEngineError::Cublas {
                call,
                shape,
                source,
            }
        };
        let (batch, m, n, k) = (
            spec.batch as i64,
            spec.m as u64,
            spec.n as u64,
            spec.k as u64,
        );

        // cuBLASLt's A = our b, B = our a, D = our out (see the module comment).
        let (a_rows, a_cols, lda, transa) = match spec.b_layout {
            BLayout::NByK => (k, n, k as i64, cublasOperation_t::CUBLAS_OP_T),
            BLayout::KByN => (n, k, n as i64, cublasOperation_t::CUBLAS_OP_N),
        };
        let b_stride = if spec.b_shared { 0 } else { (n * k) as i64 };
        let layout_a = Layout::new(I::DATA_TYPE, a_rows, a_cols, lda)
            .map_err(fail("cublasLtMatrixLayoutCreate"))?;
        let layout_b = Layout::new(I::DATA_TYPE, k, m, k as i64)
            .map_err(fail("cublasLtMatrixLayoutCreate"))?;
        let layout_d = Layout::new(O::DATA_TYPE, n, m, n as i64)
            .map_err(fail("cublasLtMatrixLayoutCreate"))?;
        if batch > 1 {
            layout_a
                .set_batch(batch, b_stride)
                .map_err(fail("cublasLtMatrixLayoutSetAttribute"))?;
            layout_b
                .set_batch(batch, (m * k) as i64)
                .map_err(fail("cublasLtMatrixLayoutSetAttribute"))?;
            layout_d
                .set_batch(batch, (m * n) as i64)
                .map_err(fail("cublasLtMatrixLayoutSetAttribute"))?;
        }

        let desc = Desc::new().map_err(fail("cublasLtMatmulDescCreate"))?;
        desc.set(
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            &transa,
        )
        .map_err(fail("cublasLtMatmulDescSetAttribute(TRANSA)"))?;
        desc.set(
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
            &cublasOperation_t::CUBLAS_OP_N,
        )
        .map_err(fail("cublasLtMatmulDescSetAttribute(TRANSB)"))?;

        let stream = &blas.stream;
        let bias_ptr = bias.map(|bias| bias.device_ptr(stream));
        if let Some((ptr, _)) = &bias_ptr {
            desc.set(
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
                &sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            )
            .map_err(fail("cublasLtMatmulDescSetAttribute(EPILOGUE)"))?;
            desc.set(
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                ptr,
            )
            .map_err(fail("cublasLtMatmulDescSetAttribute(BIAS_POINTER)"))?;
        }

        let workspace_bytes = blas.workspace.len();
        let pref = Pref::new().map_err(fail("cublasLtMatmulPreferenceCreate"))?;
        pref.set(
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &workspace_bytes,
        )
        .map_err(fail("cublasLtMatmulPreferenceSetAttribute"))?;
        // Split-K algorithms may sum their partial products in the output type (the in-place and
        // output-type reduction schemes); with bf16 output that rounds every partial sum. Allow
        // only reductions in the fp32 compute type (or none).
        let reduction_schemes =
            sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE as u32;
        pref.set(
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
            &reduction_schemes,
        )
        .map_err(fail(
            "cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)",
        ))?;

        // SAFETY: every descriptor is alive for the duration of the call.
        let heuristic = unsafe {
            lt::get_matmul_algo_heuristic(
                blas.handle,
                desc.0,
                layout_a.0,
                layout_b.0,
                layout_d.0,
                layout_d.0,
                pref.0,
            )
        }
        .map_err(fail("cublasLtMatmulAlgoGetHeuristic"))?;

        self.stream()
            .context()
            .bind_to_thread()
            .context(|| "binding the CUDA context for a matmul".into())?;
        let alpha = spec.alpha;
        let beta = 0.0f32;
        let (a_ptr, _a_sync) = b.device_ptr(stream);
        let (b_ptr, _b_sync) = a.device_ptr(stream);
        let (d_ptr, _d_sync) = out.device_ptr_mut(stream);
        let (w_ptr, _w_sync) = blas.workspace.device_ptr(stream);
        // SAFETY: `validate` checked that every buffer holds at least what the layouts address;
        // the descriptors, the algorithm and the workspace outlive the call, which is ordered on
        // the engine stream; beta = 0 so C (aliased to D) is never read.
        unsafe {
            lt::matmul(
                blas.handle,
                desc.0,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                a_ptr as *const c_void,
                layout_a.0,
                b_ptr as *const c_void,
                layout_b.0,
                d_ptr as *const c_void,
                layout_d.0,
                d_ptr as *mut c_void,
                layout_d.0,
                &heuristic.algo,
                w_ptr as *mut c_void,
                workspace_bytes,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(fail("cublasLtMatmul"))
    }
}

fn validate(
    spec: &MatmulSpec,
    a_len: usize,
    b_len: usize,
    bias_len: Option<usize>,
    out_len: usize,
) -> Result<()> {
    let shape_error = |detail: String| CudaEngineError::Shape {
        op: "matmul",
        detail: format!("{detail} ({})", spec.describe()),
    };
    let dims = [spec.batch, spec.m, spec.n, spec.k];
    if dims.contains(&0) {
        return Err(shape_error("every dimension must be at least 1".into()));
    }
    if dims.iter().any(|&d| d > i32::MAX as usize) {
        return Err(shape_error("dimensions must fit in 32 bits".into()));
    }
    let b_batches = if spec.b_shared { 1 } else { spec.batch };
    let needs = [
        ("a", a_len, spec.batch * spec.m * spec.k),
        ("b", b_len, b_batches * spec.n * spec.k),
        ("out", out_len, spec.batch * spec.m * spec.n),
    ];
    for (name, have, need) in needs {
        if have < need {
            return Err(shape_error(format!(
                "{name} holds {have} elements, needs {need}"
            )));
        }
    }
    if let Some(have) = bias_len {
        if have < spec.n {
            return Err(shape_error(format!(
                "bias holds {have} elements, needs {}",
                spec.n
            )));
        }
    }
    Ok(())
}

// ── RAII descriptors ────────────────────────────────────────────────────────────────────────
// Destroy failures are ignored in Drop: they only happen for invalid handles, and the handles
// here are created and destroyed exactly once.

struct Layout(sys::cublasLtMatrixLayout_t);

impl Layout {
    fn new(dtype: sys::cudaDataType, rows: u64, cols: u64, ld: i64) -> Result<Self, CublasError> {
        lt::create_matrix_layout(dtype, rows, cols, ld).map(Self)
    }

    fn set_batch(&self, count: i64, stride: i64) -> Result<(), CublasError> {
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
        let _ = unsafe { lt::destroy_matrix_layout(self.0) };
    }
}

struct Desc(sys::cublasLtMatmulDesc_t);

impl Desc {
    fn new() -> Result<Self, CublasError> {
        lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType_t::CUDA_R_32F,
        )
        .map(Self)
    }

    /// `T` must be the attribute's documented type (the callers pass exactly those).
    fn set<T>(
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
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}

struct Pref(sys::cublasLtMatmulPreference_t);

impl Pref {
    fn new() -> Result<Self, CublasError> {
        lt::create_matmul_pref().map(Self)
    }

    fn set<T>(
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
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_rejects_short_buffers_and_zero_dims() {
        let spec = MatmulSpec::linear(3, 4, 5);
        assert!(validate(&spec, 12, 20, Some(5), 15).is_ok());
        assert!(validate(&spec, 11, 20, None, 15).is_err());
        assert!(validate(&spec, 12, 19, None, 15).is_err());
        assert!(validate(&spec, 12, 20, Some(4), 15).is_err());
        assert!(validate(&spec, 12, 20, None, 14).is_err());
        let zero = MatmulSpec { m: 0, ..spec };
        assert!(validate(&zero, 12, 20, None, 15).is_err());
        let batched = MatmulSpec {
            batch: 2,
            b_shared: false,
            ..spec
        };
        assert!(validate(&batched, 24, 40, None, 30).is_ok());
        assert!(validate(&batched, 24, 20, None, 30).is_err());
    }
}
