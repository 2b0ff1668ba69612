//! CUDA layer of the native encoder.
//!
//! Layered like cudarc: [`CudaEngine`] (`device.rs`) owns the context, one stream, the
//! NVRTC-compiled kernel table and the cuBLASLt handle; `ops/` and `matmul.rs` are the typed,
//! shape-checked operations launched on it. Storage is bf16 with fp32 accumulation.
//!
//! Without a CUDA driver or libraries every entry point returns
//! [`CudaEngineError::NoDevice`] instead of panicking.
// Raw CUDA calls need `unsafe`; the workspace denies it everywhere else. Every unsafe block and
// function here states its safety argument.
#![allow(unsafe_code)]

// The CUDA API level the bindings are generated for: exactly one (Cargo.toml, `[features]`).
#[cfg(all(feature = "cuda-12", feature = "cuda-13"))]
compile_error!("features cuda-12 and cuda-13 exclude each other: build with --no-default-features --features cuda-12");
#[cfg(not(any(feature = "cuda-12", feature = "cuda-13")))]
compile_error!("choose the CUDA API level: feature cuda-13 (the default) or cuda-12");

mod decoder;
mod device;
mod encoder;
mod error;
mod features;
mod fold;
mod kernel_code;
mod kernels;
mod matmul;
mod ops;
mod parakeet;
mod probe;
mod shared_memory;
mod sortformer;
mod storage;
mod weight_arena;
mod weight_share;

pub use cudarc::driver::CudaSlice;
pub use decoder::{DecoderEnvelope, GpuDecoder};
pub use device::{check_cuda_libraries, CudaEngine};
pub use encoder::{
    EncoderInput, EncoderOutput, GpuEncoder, StageTimes, DEFAULT_SUBSAMPLING_SCRATCH_BYTES,
};
pub use error::{CudaEngineError, Result};
pub use features::{DeviceFeatures, FeatureLayout, GpuFeatures};
pub use fold::{fold_batch_norm, BatchNorm, FoldedDepthwise};
pub use half::bf16;
pub use kernel_code::{CudaVersion, KernelBuild, KernelCode};
pub use matmul::{BLayout, MatmulInput, MatmulOutput, MatmulSpec, MatmulStrides};
pub use ops::{
    stride2_out_len, AttentionShape, Conv2dShape, Conv3x3, DepthwiseShape, HeadShape,
    LayerNormWeights, QkvHeads, Residual, ResidualF32, RowShape, ScoreRows,
    FUSED_ATTENTION_HEAD_DIM, REL_POS_WARP_KEYS,
};
pub use parakeet::{EncoderPrecision, FeatureLocation, GpuParakeet, PhaseTimes, WeightSharing};
pub use probe::DeviceProbe;
pub use shared_memory::{receive_shared, send_shared, SharedDeviceMemory};
pub use sortformer::{GpuSortformer, GpuSpeakerNetwork};
pub use storage::{Storage, StorageKind};
pub use weight_share::{ShareServer, WeightShare};
