//! The storage type of the encoder's weights and activations: bf16 (the fast path) or f32 (the
//! exact path, for token-for-token parity with NeMo's fp32 inference). Accumulation is fp32 in
//! both. The same kernel sources serve both: `kernels/common.cuh` maps `bf16_t` to `float` and
//! its conversions to identities when a module is compiled for f32 storage.

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use half::bf16;

use crate::matmul::{MatmulInput, MatmulOutput};

/// Which build of the storage-dependent kernel modules a launch uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StorageKind {
    Bf16,
    F32,
}

impl StorageKind {
    /// "bf16" or "f32".
    pub fn name(self) -> &'static str {
        match self {
            Self::Bf16 => "bf16",
            Self::F32 => "f32",
        }
    }
}

/// An element type the encoder can store weights and activations in.
pub trait Storage:
    DeviceRepr + ValidAsZeroBits + MatmulInput + MatmulOutput + bytemuck::Pod + Send + Sync + 'static
{
    const KIND: StorageKind;
    /// Rounds an f32 to this type (bf16: round to nearest even).
    fn from_f32(value: f32) -> Self;
}

impl Storage for bf16 {
    const KIND: StorageKind = StorageKind::Bf16;
    fn from_f32(value: f32) -> Self {
        bf16::from_f32(value)
    }
}

impl Storage for f32 {
    const KIND: StorageKind = StorageKind::F32;
    fn from_f32(value: f32) -> Self {
        value
    }
}
