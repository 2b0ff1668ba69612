//! Fault injection for the fleet's fault drills (the worker's `--fault-injection` switch):
//! the two GPU failures a supervisor must survive, caused on purpose.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use crate::device::CudaEngine;
use crate::error::Result;
use crate::kernels::Kernel;

/// An address in the first page, which no allocation covers.
const UNMAPPED_ADDRESS: u64 = 0x8;
/// Allocation size while exhausting memory: small enough to leave little free at the end.
const HOG_CHUNK_BYTES: usize = 64 << 20;

impl CudaEngine {
    /// Stores to an unmapped address and waits: the context takes the sticky
    /// `CUDA_ERROR_ILLEGAL_ADDRESS` (returned here, and by every later call on it).
    pub fn inject_illegal_address(&self) -> Result<()> {
        // SAFETY: inject_illegal_address is (unsigned long long); one thread stores to that
        // device address. It is unmapped, so the store faults on the device: the fault poisons
        // this context (its purpose), and no host memory is touched.
        unsafe {
            self.launch(
                Kernel::InjectIllegalAddress,
                LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (1, 1, 1),
                    shared_mem_bytes: 0,
                },
                || "1 thread".into(),
                |args| {
                    args.arg(&UNMAPPED_ADDRESS);
                },
            )?;
        }
        self.synchronize()
    }

    /// Allocates device memory until the device has none left and returns it (held until
    /// dropped), so this process's and its MPS siblings' next allocations fail.
    pub fn hold_free_memory(&self) -> Result<Vec<CudaSlice<u8>>> {
        let mut held = Vec::new();
        loop {
            match self.zeros::<u8>(HOG_CHUNK_BYTES) {
                Ok(chunk) => held.push(chunk),
                Err(e) if e.is_out_of_memory() => return Ok(held),
                Err(e) => return Err(e),
            }
        }
    }
}
