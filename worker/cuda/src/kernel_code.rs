//! Which form NVRTC hands the driver for each kernel module (the compilation itself is in
//! `driver/nvrtc.rs`): PTX, which the driver compiles for the exact SM when loading (and keeps
//! in its JIT cache, so restarts skip that step), or a cubin that NVRTC compiled for the SM
//! itself.
//!
//! A driver compiles only PTX of its own CUDA version or older, so PTX from an NVRTC newer than
//! the driver fails to load (`CUDA_ERROR_UNSUPPORTED_PTX_VERSION`): a CUDA 12 machine on driver
//! 535 (CUDA 12.2) with a 12.4+ NVRTC, or a 13.0 driver with NVRTC 13.1. A cubin needs no JIT
//! and loads on any driver that knows the SM, so the engine compiles cubins exactly there.

use std::fmt;

use crate::driver::context::{driver_version, CudaVersion};
use crate::driver::nvrtc::{nvrtc_version, KernelCode};
use crate::error::Result;

/// The versions a [`KernelCode`] was chosen from, for logs and the device probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelBuild {
    pub code: KernelCode,
    pub nvrtc: CudaVersion,
    /// The newest CUDA version the driver supports.
    pub driver: CudaVersion,
}

impl KernelBuild {
    /// PTX where the driver can compile it (NVRTC no newer than the driver), a cubin otherwise.
    pub fn for_versions(nvrtc: CudaVersion, driver: CudaVersion) -> Self {
        let code = if nvrtc > driver {
            KernelCode::Cubin
        } else {
            KernelCode::Ptx
        };
        Self {
            code,
            nvrtc,
            driver,
        }
    }

    /// [`KernelBuild::for_versions`] for the NVRTC and driver libraries this process loaded.
    pub fn for_this_machine() -> Result<Self> {
        Ok(Self::for_versions(nvrtc_version()?, driver_version()?))
    }
}

impl fmt::Display for KernelBuild {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = match self.code {
            KernelCode::Ptx => "PTX",
            KernelCode::Cubin => "cubins",
        };
        write!(
            f,
            "kernels as {code} (NVRTC {}, driver CUDA {})",
            self.nvrtc, self.driver
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: i32, minor: i32) -> CudaVersion {
        CudaVersion { major, minor }
    }

    #[test]
    fn cubins_exactly_where_nvrtc_is_newer_than_the_driver() {
        let cases = [
            (v(13, 0), v(13, 0), KernelCode::Ptx),
            (v(12, 2), v(13, 0), KernelCode::Ptx),
            (v(12, 9), v(12, 2), KernelCode::Cubin),
            (v(13, 1), v(13, 0), KernelCode::Cubin),
            (v(13, 0), v(12, 8), KernelCode::Cubin),
            (v(12, 10), v(12, 9), KernelCode::Cubin),
        ];
        for (nvrtc, driver, code) in cases {
            assert_eq!(
                KernelBuild::for_versions(nvrtc, driver).code,
                code,
                "NVRTC {nvrtc}, driver {driver}"
            );
        }
    }
}
