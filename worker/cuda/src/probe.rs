//! `worker probe` on a GPU: open a context, run a kernel, and report what this process gets:
//! the device, its SMs, and (under MPS) the SMs its context is provisioned with.

use cudarc::driver::sys::CUdevice_attribute;
use half::bf16;

use crate::device::CudaEngine;
use crate::driver::context;
use crate::error::{CudaEngineError, DriverContext, Result};
use crate::kernel_code::KernelBuild;

/// What one process sees of its GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceProbe {
    pub ordinal: u32,
    pub name: String,
    pub compute_capability: (i32, i32),
    /// SMs of the whole device.
    pub device_sm_count: u32,
    /// SMs this context may use (the MPS active thread percentage's share under MPS).
    pub context_sm_count: u32,
    /// Contexts on this device go through an MPS server (the driver says so; the cuda-12 build
    /// infers it, see `probe`).
    pub mps_enabled: bool,
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` as this process was started with.
    pub mps_thread_percentage: Option<u32>,
    pub total_memory_bytes: u64,
    /// PTX or cubins, and the NVRTC and driver versions that decided it.
    pub kernel_build: KernelBuild,
}

impl DeviceProbe {
    /// One line for logs and operators.
    pub fn summary(&self) -> String {
        let (major, minor) = self.compute_capability;
        let mps = if self.mps_enabled {
            match self.mps_thread_percentage {
                Some(p) => format!("MPS client at {p}% active threads"),
                None => "MPS client (no thread limit set)".into(),
            }
        } else {
            "no MPS".into()
        };
        format!(
            "GPU {} {} (sm_{major}{minor}, {:.1} GiB): {} of {} SMs for this context, {mps}, {}",
            self.ordinal,
            self.name,
            self.total_memory_bytes as f64 / (1u64 << 30) as f64,
            self.context_sm_count,
            self.device_sm_count,
            self.kernel_build,
        )
    }
}

impl CudaEngine {
    /// SMs this context may use: the whole device's, or under MPS the active thread
    /// percentage's share (the device attribute keeps reporting the whole device).
    pub fn context_sm_count(&self) -> Result<u32> {
        context::context_sm_count(self.context())
    }

    /// Runs a conversion kernel on a few values and checks the result, then reads the device's
    /// and the context's properties.
    pub fn probe(&self) -> Result<DeviceProbe> {
        let values = [1.0f32, -2.5, 0.15625, 65504.0];
        let x = self.upload(&values)?;
        let mut y = self.zeros::<bf16>(values.len())?;
        self.f32_to_storage(&x, &mut y)?;
        let got = self.download(&y)?;
        let want: Vec<bf16> = values.iter().map(|v| bf16::from_f32(*v)).collect();
        if got != want {
            return Err(CudaEngineError::Decoder(format!(
                "probe kernel returned {got:?}, expected {want:?}"
            )));
        }
        let attribute = |attr: CUdevice_attribute, what: &str| {
            self.context()
                .attribute(attr)
                .context(|| format!("reading {what}"))
        };
        let device_sm_count = attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            "the SM count",
        )? as u32;
        let context_sm_count = self.context_sm_count()?;
        // The driver says whether MPS is on from CUDA 12.3; the 12.2 API of the cuda-12 build
        // has no such attribute, so there a context limited to fewer SMs than the device's is
        // taken as an MPS client (one at 100 % reads as no MPS).
        #[cfg(not(feature = "cuda-12"))]
        let mps_enabled = attribute(
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED,
            "whether MPS is enabled",
        )? != 0;
        #[cfg(feature = "cuda-12")]
        let mps_enabled = context_sm_count < device_sm_count;
        let total_memory_bytes =
            self.context()
                .total_mem()
                .context(|| "reading the device memory size".into())? as u64;
        Ok(DeviceProbe {
            ordinal: self.context().ordinal() as u32,
            name: self.device_name()?,
            compute_capability: self.compute_capability(),
            device_sm_count,
            context_sm_count,
            mps_enabled,
            mps_thread_percentage: std::env::var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
                .ok()
                .and_then(|v| v.trim().parse().ok()),
            total_memory_bytes,
            kernel_build: self.kernel_build(),
        })
    }
}
