//! Typed, shape-checked wrappers over the NVRTC kernels, one file per kernel family.

mod activation;
mod attention;
mod convert;
mod depthwise_conv;
mod fault;
mod layer_norm;
mod residual_norm;
mod softmax;
mod subsampling;

pub use attention::{HeadShape, QkvHeads, ScoreRows};
#[cfg(feature = "internals")]
pub use attention::{FUSED_ATTENTION_HEAD_DIM, REL_POS_WARP_KEYS};
pub use depthwise_conv::DepthwiseShape;
#[cfg(feature = "internals")]
pub use layer_norm::Residual;
pub use layer_norm::{LayerNormWeights, RowShape};
pub use residual_norm::ResidualF32;
pub use softmax::AttentionShape;
pub use subsampling::{stride2_out_len, Conv2dShape, Conv3x3};

use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};

use crate::device::CudaEngine;
use crate::driver::launch::elementwise_config;
use crate::error::{CudaEngineError, Result};
use crate::kernels::Kernel;
use crate::storage::StorageKind;

impl CudaEngine {
    /// Launches an elementwise kernel with signature `(const A*, B*, long long n)` over
    /// `n = x.len()` elements, one thread per `per_thread` elements (a grid-stride kernel covers
    /// every element whatever the grid).
    ///
    /// # Safety
    /// `kernel` must have exactly that signature and touch only indices `< n`.
    pub(crate) unsafe fn launch_unary_as<A: DeviceRepr, B: DeviceRepr>(
        &self,
        storage: StorageKind,
        op: &'static str,
        kernel: Kernel,
        per_thread: usize,
        x: &CudaSlice<A>,
        y: &mut CudaSlice<B>,
    ) -> Result<()> {
        let n = x.len();
        check_len(op, "y", y.len(), n)?;
        let count = to_i64(op, "n", n)?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: forwarded from this function's contract; both buffers hold n elements.
        unsafe {
            self.launch_as(
                storage,
                kernel,
                elementwise_config(n.div_ceil(per_thread.max(1))),
                || format!("n={n}"),
                |args| {
                    args.arg(x).arg(y).arg(&count);
                },
            )
        }
    }
}

/// Fails unless `have >= need` elements; nothing is launched on failure.
pub(crate) fn check_len(op: &'static str, buffer: &str, have: usize, need: usize) -> Result<()> {
    if have < need {
        return Err(CudaEngineError::Shape {
            op,
            detail: format!("{buffer} holds {have} elements, needs {need}"),
        });
    }
    Ok(())
}

/// Converts a size to the kernel's `int`, or fails with the op's name.
pub(crate) fn to_i32(op: &'static str, what: &str, value: usize) -> Result<i32> {
    i32::try_from(value).map_err(|_| CudaEngineError::Shape {
        op,
        detail: format!("{what} = {value} does not fit a 32-bit kernel argument"),
    })
}

/// Converts an element count to the kernel's `long long`.
pub(crate) fn to_i64(op: &'static str, what: &str, value: usize) -> Result<i64> {
    i64::try_from(value).map_err(|_| CudaEngineError::Shape {
        op,
        detail: format!("{what} = {value} does not fit a 64-bit kernel argument"),
    })
}

/// Grid x dimension for one block per row.
pub(crate) fn rows_for_grid(op: &'static str, rows: usize) -> Result<u32> {
    u32::try_from(rows)
        .ok()
        .filter(|&r| r >= 1 && r <= i32::MAX as u32)
        .ok_or_else(|| CudaEngineError::Shape {
            op,
            detail: format!("{rows} rows: need 1 ..= 2^31-1 (one block per row)"),
        })
}
