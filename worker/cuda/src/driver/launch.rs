//! Kernel launches: the launch shapes of the elementwise and per-row kernels, a function's
//! dynamic shared memory, and the launch itself (plain or cooperative) on a stream.

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaStream, LaunchArgs, LaunchConfig};

use crate::error::{CudaEngineError, DriverContext, Result};

/// Threads per block for the elementwise and per-row kernels.
pub(crate) const BLOCK_THREADS: u32 = 256;
/// Grid cap for grid-stride loops: enough blocks to fill any current GPU several times over.
const MAX_GRID_BLOCKS: u64 = 65_535 * 8;

/// Grid-stride launch shape for `n` independent elements.
pub(crate) fn elementwise_config(n: usize) -> LaunchConfig {
    let blocks = (n as u64)
        .div_ceil(u64::from(BLOCK_THREADS))
        .clamp(1, MAX_GRID_BLOCKS);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block per row. Rows must fit the grid's x dimension (checked by the caller).
pub(crate) fn per_row_config(rows: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows, 1, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Lets `function` (the kernel `name`) use as much dynamic shared memory per block as
/// `max_optin` (the device's opt-in limit per block) leaves next to its static shared memory.
/// Returns that many bytes and how many blocks of `threads` threads using them fit on one
/// multiprocessor.
pub(crate) fn allow_max_dynamic_shared(
    function: &CudaFunction,
    name: &'static str,
    max_optin: usize,
    threads: u32,
) -> Result<(usize, usize)> {
    let fixed = function
        .shared_size_bytes()
        .context(|| format!("reading the static shared memory of {name}"))?;
    let bytes = max_optin.saturating_sub(usize::try_from(fixed).unwrap_or(0));
    let limit = i32::try_from(bytes).map_err(|_| CudaEngineError::Shape {
        op: name,
        detail: format!("{bytes} bytes of shared memory"),
    })?;
    function
        .set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            limit,
        )
        .context(|| format!("allowing {bytes} bytes of shared memory for {name}"))?;
    let blocks = function
        .occupancy_max_active_blocks_per_multiprocessor(threads, bytes, None)
        .context(|| format!("querying the occupancy of {name}"))?;
    Ok((bytes, blocks as usize))
}

/// How the driver starts a launch's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LaunchMode {
    Plain,
    /// Only if every block can be resident at once, which a kernel whose blocks wait for each
    /// other relies on.
    Cooperative,
}

/// Launches `function` (the kernel `name`) on `stream` with the arguments `push` adds. A
/// refused launch's error names the kernel and the `shape` it was given.
///
/// # Safety
///
/// `push` must add exactly the arguments of the kernel's CUDA signature, in order and with the
/// same types, and every index the kernel computes from them must stay inside the buffers
/// passed.
pub(crate) unsafe fn launch<'a>(
    stream: &'a CudaStream,
    function: &'a CudaFunction,
    name: &'static str,
    mode: LaunchMode,
    config: LaunchConfig,
    shape: impl FnOnce() -> String,
    push: impl FnOnce(&mut LaunchArgs<'a>),
) -> Result<()> {
    let mut args = stream.launch_builder(function);
    push(&mut args);
    // SAFETY: forwarded from this function's contract.
    let launched = unsafe {
        match mode {
            LaunchMode::Plain => args.launch(config),
            LaunchMode::Cooperative => args.launch_cooperative(config),
        }
    };
    launched
        .map(|_| ())
        .map_err(|source| CudaEngineError::Launch {
            kernel: name,
            shape: shape(),
            source,
        })
}
