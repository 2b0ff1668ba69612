//! The CUDA libraries as a whole and one context: which libraries load, the driver's CUDA
//! version, and the multiprocessors a context may use.

use std::ffi::c_int;
use std::fmt;

use cudarc::driver::sys::{self, CUexecAffinityType};
use cudarc::driver::CudaContext;

use crate::error::{DriverContext, Result};

/// A CUDA release, e.g. 12.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CudaVersion {
    pub major: i32,
    pub minor: i32,
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Whether the driver, NVRTC and cuBLASLt libraries can be loaded, by name, without loading any
/// symbol (cudarc panics on a missing library once a symbol is used, so this must come first).
pub(crate) fn libraries_present() -> [(&'static str, bool); 3] {
    // SAFETY: each call only dlopens the vendor library by its usual names and closes it again;
    // the libraries' load-time initialisers have no preconditions on our side.
    unsafe {
        [
            ("libcuda (driver)", sys::is_culib_present()),
            ("libnvrtc", cudarc::nvrtc::sys::is_culib_present()),
            ("libcublasLt", cudarc::cublaslt::sys::is_culib_present()),
        ]
    }
}

/// Whether libnvrtc alone can be loaded (it compiles kernels without a GPU).
#[cfg(test)]
pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: only dlopens libnvrtc by its usual names and closes it again.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The newest CUDA version the loaded driver supports (12020 = 12.2).
pub(crate) fn driver_version() -> Result<CudaVersion> {
    let mut version: c_int = 0;
    // SAFETY: cuDriverGetVersion only writes the int it is given a pointer to; it needs no
    // context or prior cuInit.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .context(|| "reading the driver's CUDA version".into())?;
    Ok(CudaVersion {
        major: version / 1000,
        minor: version % 1000 / 10,
    })
}

/// SMs `ctx` may use: the whole device's, or under MPS the active thread percentage's share
/// (the device attribute keeps reporting the whole device).
pub(crate) fn context_sm_count(ctx: &CudaContext) -> Result<u32> {
    ctx.bind_to_thread()
        .context(|| "binding the context".into())?;
    let mut affinity = std::mem::MaybeUninit::<sys::CUexecAffinityParam>::zeroed();
    // SAFETY: the context is current on this thread (bound above) and `affinity` is a
    // writable CUexecAffinityParam; the driver fills it for the SM-count type we ask for.
    let status = unsafe {
        sys::cuCtxGetExecAffinity(
            affinity.as_mut_ptr(),
            CUexecAffinityType::CU_EXEC_AFFINITY_TYPE_SM_COUNT,
        )
    };
    status
        .result()
        .context(|| "reading the context's SM affinity".into())?;
    // SAFETY: the call succeeded, so the driver initialised the SM-count variant.
    Ok(unsafe { affinity.assume_init().param.smCount.val })
}
