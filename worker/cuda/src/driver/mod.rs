//! The driver layer: every call into cudarc's raw `sys` and `result` modules (CUDA driver,
//! NVRTC, cuBLASLt), each behind a small wrapper that states why it is sound, and the record of
//! the errors that `Drop` cannot return.
//!
//! It sits under the engine's safe types (`device.rs`, `matmul/`, `shared_memory.rs`,
//! `weight_arena.rs`, ...): files here import only each other and `crate::error`, never an
//! engine file above them. What is left of `unsafe` above this layer are the kernel launches
//! (only the typed wrappers in `ops/`, `features/` and `decoder/` know a kernel's signature) and
//! the views of memory whose lifetime the engine tracks.

pub(crate) mod context;
pub(crate) mod cublaslt;
pub(crate) mod drop_errors;
pub(crate) mod launch;
pub(crate) mod memory;
pub(crate) mod nvrtc;
pub(crate) mod vmm;
