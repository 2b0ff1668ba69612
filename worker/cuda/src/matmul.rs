//! Batched matrix products through cuBLASLt: bf16 operands, fp32 accumulation, bf16 or f32
//! output, optional bias epilogue. The workspace is allocated once when the engine starts.
//!
//! Our tensors are row-major; cuBLASLt is column-major. A row-major `[r, c]` buffer is the
//! column-major `c x r` matrix, so `out[M,N] = a[M,K] . op(b)` is computed as the column-major
//! product `outᵀ (N x M) = op(b)ᵀ . aᵀ`, i.e. cuBLASLt's A is our `b` and its B is our `a`.

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublaslt::result::{self as lt, CublasError};
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use half::bf16;

use crate::device::CudaEngine;
use crate::error::{CudaEngineError, DriverContext, Result};

/// How the second operand `b` is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// Row and batch strides where they are not the dense ones.
    pub strides: MatmulStrides,
}

/// Strides in elements; `None` is the dense layout. Padded rows keep cuBLASLt on its fast,
/// 16-byte-aligned kernels (a 375-column f32 row is only 4-byte aligned), and a batch stride
/// smaller than a matrix reads one column block of a wider buffer per batch entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MatmulStrides {
    /// Row stride of `a` (dense: `k`); its batch stride is `m` rows.
    pub a_row: Option<usize>,
    /// Row stride of `b` (dense: `k` for [`BLayout::NByK`], `n` for [`BLayout::KByN`]).
    pub b_row: Option<usize>,
    /// Batch stride of `b` (dense: one whole `b`; 0 when shared).
    pub b_batch: Option<usize>,
    /// Row stride of `out` (dense: `n`); its batch stride is `m` rows.
    pub out_row: Option<usize>,
}

/// What one matmul addresses in one buffer (strides in elements).
#[derive(Debug, Clone, Copy)]
struct Extent {
    row: usize,
    batch: usize,
    rows: usize,
    cols: usize,
}

impl Extent {
    /// Elements from the first addressed to one past the last.
    fn span(&self, batches: usize) -> usize {
        (batches - 1) * self.batch + (self.rows - 1) * self.row + self.cols
    }
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
            strides: MatmulStrides::default(),
        }
    }

    /// `a`: `[batch, m, k]`, rows `a_row` apart.
    fn a_extent(&self) -> Extent {
        let row = self.strides.a_row.unwrap_or(self.k);
        Extent {
            row,
            batch: self.m * row,
            rows: self.m,
            cols: self.k,
        }
    }

    /// `b`: `[n, k]` or `[k, n]`, rows `b_row` apart, one per batch entry unless shared.
    fn b_extent(&self) -> Extent {
        let (rows, cols) = match self.b_layout {
            BLayout::NByK => (self.n, self.k),
            BLayout::KByN => (self.k, self.n),
        };
        let row = self.strides.b_row.unwrap_or(cols);
        let dense_batch = if self.b_shared { 0 } else { rows * row };
        Extent {
            row,
            batch: self.strides.b_batch.unwrap_or(dense_batch),
            rows,
            cols,
        }
    }

    /// `out`: `[batch, m, n]`, rows `out_row` apart.
    fn out_extent(&self) -> Extent {
        let row = self.strides.out_row.unwrap_or(self.n);
        Extent {
            row,
            batch: self.m * row,
            rows: self.m,
            cols: self.n,
        }
    }

    fn describe(&self) -> String {
        format!(
            "batch={} m={} n={} k={} b={:?}{} alpha={} strides={:?}",
            self.batch,
            self.m,
            self.n,
            self.k,
            self.b_layout,
            if self.b_shared { " shared" } else { "" },
            self.alpha,
            self.strides
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
    /// The algorithm per problem, settled once: the query costs host time, and a forward pass
    /// makes ~150 products.
    algos: Mutex<HashMap<AlgoKey, sys::cublasLtMatmulAlgo_t>>,
    /// For fp32 operands: the algorithm per problem with its batch and time-dependent sizes
    /// left out (the first one the heuristic gave for it), reused for every problem that
    /// differs only in those. A fixed algorithm sums each output element in a fixed order, so a
    /// row's result does not depend on how many other rows (clips) share the product or how
    /// long they are padded.
    pinned: Mutex<HashMap<AlgoKey, sys::cublasLtMatmulAlgo_t>>,
    /// Multiprocessors the heuristic and the kernels plan for: the whole device's, also under an
    /// MPS thread limit, so a client chooses (and splits work) exactly as a lone process would.
    sm_count_target: i32,
}

/// Cached algorithms per engine before the cache starts over (~1 MB of host memory).
const MAX_CACHED_ALGOS: usize = 8192;

/// Everything the heuristic's answer depends on. Pointers are whole device allocations here,
/// always 256-byte aligned (the heuristic's default assumption).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct AlgoKey {
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    b_layout: BLayout,
    b_batch: usize,
    a_row: usize,
    b_row: usize,
    out_row: usize,
    input: sys::cudaDataType,
    output: sys::cudaDataType,
    bias: bool,
}

// SAFETY: a cuBLASLt handle is not bound to the thread that created it; the engine that owns it
// is used from one thread at a time (it is Send, not Sync), and every call binds the context.
unsafe impl Send for Blas {}

impl AlgoKey {
    /// The key of the pinned algorithm: without the batch, the rows, and for products of two
    /// activations (attention) the dimension that follows the padded time axis (`n` and the
    /// output rows of `a . bᵀ`, `k` and the rows of `a` for `a . b`).
    fn pinned(&self) -> Self {
        let mut key = Self {
            batch: 0,
            m: 0,
            b_batch: 0,
            ..*self
        };
        if self.b_batch != 0 {
            match self.b_layout {
                BLayout::NByK => (key.n, key.out_row) = (0, 0),
                BLayout::KByN => (key.k, key.a_row) = (0, 0),
            }
        }
        key
    }
}

impl Blas {
    pub(crate) fn new(
        stream: Arc<CudaStream>,
        (major, _): (i32, i32),
        sm_count_target: i32,
    ) -> Result<Self> {
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
            algos: Mutex::new(HashMap::new()),
            pinned: Mutex::new(HashMap::new()),
            sm_count_target,
        })
    }
}

impl Blas {
    /// The algorithm for `key`: the cached one; else the pinned one for its batch-free key if
    /// cuBLASLt accepts it for this problem (fp32 operands only); else the heuristic's first
    /// choice without split-K, which becomes the pinned one if there was none. Errors name the
    /// failing call.
    fn algo(
        &self,
        key: AlgoKey,
        desc: &Desc,
        [layout_a, layout_b, layout_d]: [&Layout; 3],
    ) -> std::result::Result<sys::cublasLtMatmulAlgo_t, (&'static str, CublasError)> {
        let cache = || self.algos.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(algo) = cache().get(&key) {
            return Ok(*algo);
        }
        // bf16 tensor-core kernels without split-K sum in one order whatever their tiles, so
        // the fastest one per shape is kept (measured batch- and MPS-invariant on the H200);
        // fp32 products' algorithms differ in summation order and stay pinned.
        let pin = key.input == sys::cudaDataType_t::CUDA_R_32F;
        let pinned_key = key.pinned();
        let pinned = if pin {
            self.pinned
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&pinned_key)
                .copied()
        } else {
            None
        };
        let accepted = match pinned {
            Some(algo) => {
                let mut result = mem::MaybeUninit::<sys::cublasLtMatmulHeuristicResult_t>::zeroed();
                // SAFETY: every descriptor is alive for the duration of the call, `algo` is an
                // algorithm cuBLASLt returned for these types, `result` is writable.
                let status = unsafe {
                    sys::cublasLtMatmulAlgoCheck(
                        self.handle,
                        desc.0,
                        layout_a.0,
                        layout_b.0,
                        layout_d.0,
                        layout_d.0,
                        &algo,
                        result.as_mut_ptr(),
                    )
                };
                // SAFETY: on success cuBLASLt filled `result`.
                let fits = status.result().is_ok()
                    && unsafe { result.assume_init() }.workspaceSize <= self.workspace.len();
                fits.then_some(algo)
            }
            None => None,
        };
        let algo = match accepted {
            Some(algo) => algo,
            None => {
                let algo = self.heuristic(desc, [layout_a, layout_b, layout_d])?;
                if pin {
                    self.pinned
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .entry(pinned_key)
                        .or_insert(algo);
                }
                algo
            }
        };
        let mut algos = cache();
        if algos.len() >= MAX_CACHED_ALGOS {
            // Padded lengths vary without end in a long-lived worker: start over rather than
            // grow without bound (a miss costs one check; the pinned choices stay).
            algos.clear();
        }
        algos.insert(key, algo);
        Ok(algo)
    }

    /// The heuristic's first choice for these descriptors.
    fn heuristic(
        &self,
        desc: &Desc,
        [layout_a, layout_b, layout_d]: [&Layout; 3],
    ) -> std::result::Result<sys::cublasLtMatmulAlgo_t, (&'static str, CublasError)> {
        let workspace_bytes = self.workspace.len();
        let pref = Pref::new().map_err(|e| ("cublasLtMatmulPreferenceCreate", e))?;
        pref.set(
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &workspace_bytes,
        )
        .map_err(|e| ("cublasLtMatmulPreferenceSetAttribute", e))?;
        // No split-K at all: its split points and partial-sum order follow the problem's rows,
        // the padded time axis and the multiprocessors an MPS client sees, so a clip's result
        // would depend on its batch companions and its MPS share (measured on the H200).
        let reduction_schemes =
            sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_NONE as u32;
        pref.set(
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
            &reduction_schemes,
        )
        .map_err(|e| {
            (
                "cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)",
                e,
            )
        })?;
        // SAFETY: every descriptor is alive for the duration of the call.
        let heuristic = unsafe {
            lt::get_matmul_algo_heuristic(
                self.handle,
                desc.0,
                layout_a.0,
                layout_b.0,
                layout_d.0,
                layout_d.0,
                pref.0,
            )
        }
        .map_err(|e| ("cublasLtMatmulAlgoGetHeuristic", e))?;
        Ok(heuristic.algo)
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
        let (our_a, our_b, our_out) = (spec.a_extent(), spec.b_extent(), spec.out_extent());
        let (a_rows, a_cols, transa) = match spec.b_layout {
            BLayout::NByK => (k, n, cublasOperation_t::CUBLAS_OP_T),
            BLayout::KByN => (n, k, cublasOperation_t::CUBLAS_OP_N),
        };
        let layout_a = Layout::new(I::DATA_TYPE, a_rows, a_cols, our_b.row as i64)
            .map_err(fail("cublasLtMatrixLayoutCreate"))?;
        let layout_b = Layout::new(I::DATA_TYPE, k, m, our_a.row as i64)
            .map_err(fail("cublasLtMatrixLayoutCreate"))?;
        let layout_d = Layout::new(O::DATA_TYPE, n, m, our_out.row as i64)
            .map_err(fail("cublasLtMatrixLayoutCreate"))?;
        if batch > 1 {
            layout_a
                .set_batch(batch, our_b.batch as i64)
                .map_err(fail("cublasLtMatrixLayoutSetAttribute"))?;
            layout_b
                .set_batch(batch, our_a.batch as i64)
                .map_err(fail("cublasLtMatrixLayoutSetAttribute"))?;
            layout_d
                .set_batch(batch, our_out.batch as i64)
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
        desc.set(
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
            &blas.sm_count_target,
        )
        .map_err(fail("cublasLtMatmulDescSetAttribute(SM_COUNT_TARGET)"))?;

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
        let key = AlgoKey {
            batch: spec.batch,
            m: spec.m,
            n: spec.n,
            k: spec.k,
            b_layout: spec.b_layout,
            b_batch: our_b.batch,
            a_row: our_a.row,
            b_row: our_b.row,
            out_row: our_out.row,
            input: I::DATA_TYPE,
            output: O::DATA_TYPE,
            bias: bias.is_some(),
        };
        let algo = blas
            .algo(key, &desc, [&layout_a, &layout_b, &layout_d])
            .map_err(|(call, source)| fail(call)(source))?;

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
                &algo,
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
    let needs = [
        ("a", a_len, spec.a_extent()),
        ("b", b_len, spec.b_extent()),
        ("out", out_len, spec.out_extent()),
    ];
    for (name, have, extent) in needs {
        if extent.row < extent.cols {
            return Err(shape_error(format!(
                "{name}'s row stride {} is shorter than its {} columns",
                extent.row, extent.cols
            )));
        }
        let need = extent.span(spec.batch);
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
