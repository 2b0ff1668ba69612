//! The engine's cuBLASLt state: the handle, the workspace, and the algorithm chosen per problem.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::cublaslt::result::CublasError;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream};

use super::spec::BLayout;
use crate::driver::cublaslt::{Desc, Handle, Layout, Pref};
use crate::error::{CudaEngineError, DriverContext, Result};

/// The engine's cuBLASLt handle and its workspace, sized once.
pub(crate) struct Blas {
    pub(super) handle: Handle,
    pub(super) workspace: CudaSlice<u8>,
    pub(super) stream: Arc<CudaStream>,
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
    pub(super) sm_count_target: i32,
}

/// Cached algorithms per engine before the cache starts over (~1 MB of host memory).
const MAX_CACHED_ALGOS: usize = 8192;

/// Everything the heuristic's answer depends on. Pointers are whole device allocations here,
/// always 256-byte aligned (the heuristic's default assumption).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct AlgoKey {
    pub(super) batch: usize,
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) b_layout: BLayout,
    pub(super) b_batch: usize,
    pub(super) a_row: usize,
    pub(super) b_row: usize,
    pub(super) out_row: usize,
    pub(super) input: sys::cudaDataType,
    pub(super) output: sys::cudaDataType,
    pub(super) bias: bool,
}

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
        let handle = Handle::new().map_err(|source| CudaEngineError::Cublas {
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
    pub(super) fn algo(
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
        let accepted = pinned.filter(|algo| {
            self.handle
                .check_algo(desc, [layout_a, layout_b, layout_d], algo)
                .is_ok_and(|workspace_bytes| workspace_bytes <= self.workspace.len())
        });
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
        self.handle
            .heuristic(desc, [layout_a, layout_b, layout_d], &pref)
            .map_err(|e| ("cublasLtMatmulAlgoGetHeuristic", e))
    }
}
