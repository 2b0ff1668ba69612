//! CUDA layer of the native encoder.
//!
//! Layered like cudarc, bottom up:
//! - `error.rs`: the crate's error type;
//! - `driver/`: every raw CUDA driver, NVRTC and cuBLASLt call (kernel launches, VMM, plain
//!   device allocations, the cuBLASLt handle and descriptors) and the record of the errors that
//!   `Drop` cannot return ([`drop_errors`]); it imports nothing from the files above it;
//! - [`CudaEngine`] (`device.rs`) owns the context, one stream, the NVRTC-compiled kernel table
//!   (`kernels.rs`) and the cuBLASLt state (`matmul/`); `ops/` and `matmul/` are the typed,
//!   shape-checked operations launched on it;
//! - the models on top: `encoder/`, `decoder/`, `features/`, `sortformer/`, [`GpuParakeet`].
//!
//! Storage is bf16 with fp32 accumulation. Without a CUDA driver or libraries every entry
//! point returns [`CudaEngineError::NoDevice`] instead of panicking.
//!
//! The crate root exports what the worker, the fleet and the dispatcher use. The kernel
//! internals that only this crate's tests, examples and benches reach (the operations' shape
//! types, the matmul spec, batch-norm folding, shareable device memory) are in
//! `cuda_engine::internals`, which exists only with the cargo feature `internals`. Nothing else
//! enables it: this crate's own dev-dependency on itself does (`Cargo.toml`), so that
//! `cargo test -p cuda-engine` builds the tests with it while the other crates never see it (a
//! feature rather than a `#[doc(hidden)]` module, which they could still import). The typed
//! operations themselves stay `pub` methods of [`CudaEngine`]; without the feature their shape
//! types cannot be named outside this crate.
// Raw CUDA calls need `unsafe`; the workspace denies it everywhere else. Every unsafe block and
// function here states its safety argument.
#![allow(unsafe_code)]

// The CUDA API level the bindings are generated for: exactly one (Cargo.toml, `[features]`).
#[cfg(all(feature = "cuda-12", feature = "cuda-13"))]
compile_error!("features cuda-12 and cuda-13 exclude each other: build with --no-default-features --features cuda-12");
#[cfg(not(any(feature = "cuda-12", feature = "cuda-13")))]
compile_error!("choose the CUDA API level: feature cuda-13 (the default) or cuda-12");

// `fold`, `matmul`, `ops` and `shared_memory` hold `pub` items that only `internals` exports:
// without that feature they are crate-internal, which `unreachable_pub` would flag.
mod decoder;
mod device;
mod driver;
mod encoder;
mod error;
mod features;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
mod fold;
mod kernel_code;
mod kernels;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
mod matmul;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
mod ops;
mod parakeet;
mod probe;
#[cfg_attr(not(feature = "internals"), allow(unreachable_pub))]
mod shared_memory;
mod sortformer;
mod storage;
mod weight_arena;
mod weight_share;

pub use cudarc::driver::CudaSlice;
pub use decoder::{DecoderEnvelope, GpuDecoder, SCORED_TOKENS_PER_FRAME};
pub use device::{check_cuda_libraries, CudaEngine};
pub use driver::context::CudaVersion;
pub use driver::drop_errors::{drop_errors, DropErrors};
pub use driver::nvrtc::KernelCode;
pub use encoder::{
    EncoderInput, EncoderOutput, GpuEncoder, StageTimes, DEFAULT_SUBSAMPLING_SCRATCH_BYTES,
};
pub use error::{CudaEngineError, Result};
pub use features::{DeviceFeatures, FeatureLayout, GpuFeatures};
pub use half::bf16;
pub use kernel_code::KernelBuild;
pub use parakeet::{EncoderPrecision, FeatureLocation, GpuParakeet, PhaseTimes, WeightSharing};
pub use probe::DeviceProbe;
pub use sortformer::{GpuSortformer, GpuSpeakerNetwork};
pub use storage::{Storage, StorageKind};
pub use weight_share::{ShareServer, WeightShare};

/// Kernel internals for this crate's tests, examples and benches (feature `internals`; see the
/// crate documentation): the typed operations' shape types, the matmul spec, batch-norm
/// folding, and shareable device memory with its descriptor passing.
#[cfg(feature = "internals")]
pub mod internals {
    pub use crate::fold::{fold_batch_norm, BatchNorm, FoldedDepthwise};
    pub use crate::matmul::{BLayout, MatmulInput, MatmulOutput, MatmulSpec, MatmulStrides};
    pub use crate::ops::{
        stride2_out_len, AttentionShape, Conv2dShape, Conv3x3, DepthwiseShape, HeadShape,
        LayerNormWeights, QkvHeads, Residual, ResidualF32, RowShape, ScoreRows,
        FUSED_ATTENTION_HEAD_DIM, REL_POS_WARP_KEYS,
    };
    pub use crate::shared_memory::{receive_shared, send_shared, SharedDeviceMemory};
}
