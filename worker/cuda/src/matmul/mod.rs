//! Batched matrix products through cuBLASLt: bf16 operands, fp32 accumulation, bf16 or f32
//! output, optional bias epilogue. The workspace is allocated once when the engine starts.
//!
//! Our tensors are row-major; cuBLASLt is column-major. A row-major `[r, c]` buffer is the
//! column-major `c x r` matrix, so `out[M,N] = a[M,K] . op(b)` is computed as the column-major
//! product `outᵀ (N x M) = op(b)ᵀ . aᵀ`, i.e. cuBLASLt's A is our `b` and its B is our `a`.
//!
//! `spec.rs` says what a product computes over which buffers; `blas.rs` holds the engine's
//! cuBLASLt state (the raw calls are in `driver/cublaslt.rs`).

mod blas;
mod spec;

pub(crate) use blas::Blas;
pub use spec::{BLayout, MatmulInput, MatmulOutput, MatmulSpec, MatmulStrides};

use cudarc::cublas::sys::cublasOperation_t;
use cudarc::cublaslt::result::CublasError;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

use crate::device::CudaEngine;
use crate::driver::cublaslt::{Desc, Layout};
use crate::error::{CudaEngineError, DriverContext, Result};
use blas::AlgoKey;
use spec::validate;

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
        let (a_ptr, _a_sync) = b.device_ptr(stream);
        let (b_ptr, _b_sync) = a.device_ptr(stream);
        let (d_ptr, _d_sync) = out.device_ptr_mut(stream);
        let (w_ptr, _w_sync) = blas.workspace.device_ptr(stream);
        // SAFETY: `validate` checked that every buffer holds at least what the layouts address;
        // the buffers and the workspace are the engine's, ordered on its stream, whose context
        // is current (bound above); `algo` is the one cuBLASLt gave or accepted for these
        // descriptors within the workspace's size.
        unsafe {
            blas.handle.matmul(
                &desc,
                alpha,
                (a_ptr, &layout_a),
                (b_ptr, &layout_b),
                (d_ptr, &layout_d),
                &algo,
                (w_ptr, workspace_bytes),
                stream,
            )
        }
        .map_err(fail("cublasLtMatmul"))
    }
}
