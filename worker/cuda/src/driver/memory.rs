//! Device memory outside cudarc's stream-ordered allocator: allocations of their own
//! (`cuMemAlloc`), typed views of raw device addresses, and the allocator pool's trimming.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, DriverError};

use super::drop_errors::record_drop_error;
use crate::error::{DriverContext, Result};

/// `len` elements of `S` in a device allocation of their own (`cuMemAlloc`, outside the
/// stream-ordered pool), as a view on `stream`. `stream`'s context must be current. Never drop
/// the view (cudarc would hand it to the stream-ordered free): release it with [`free_own`].
pub(crate) fn alloc_own<S: DeviceRepr>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> std::result::Result<ManuallyDrop<CudaSlice<S>>, DriverError> {
    let bytes = (len * std::mem::size_of::<S>()).max(1);
    // SAFETY: allocates `bytes` of device memory in the current context, owned by the returned
    // view from here on.
    let ptr = unsafe { cudarc::driver::result::malloc_sync(bytes) }?;
    // SAFETY: `ptr` holds `bytes` >= `len` elements of S on this context; the view is never
    // dropped by cudarc (`ManuallyDrop`; `free_own` releases it).
    Ok(ManuallyDrop::new(unsafe {
        stream.upgrade_device_ptr::<S>(ptr, len)
    }))
}

/// Frees a view from [`alloc_own`] once the work queued on its stream is done. It runs in
/// `Drop`: failures are recorded ([`record_drop_error`]), not returned.
///
/// # Safety
///
/// `slice` must come from [`alloc_own`], and nothing else may refer to its memory.
pub(crate) unsafe fn free_own<S>(slice: CudaSlice<S>) {
    let stream = slice.stream().clone();
    let ptr = slice.leak();
    record_drop_error(
        "synchronizing the stream before freeing a weight",
        stream.synchronize(),
    );
    // SAFETY: `ptr` came from `malloc_sync` in `alloc_own` (the caller's contract), nothing else
    // refers to it, and the stream that used it is drained.
    record_drop_error("freeing a weight", unsafe {
        cudarc::driver::result::free_sync(ptr)
    });
}

/// A typed view of `len` elements at device address `ptr`, for memory cudarc did not allocate.
/// Never drop it: leak it ([`CudaSlice::leak`]) when done.
///
/// # Safety
///
/// `ptr .. ptr + len * size_of::<S>()` must be device memory of `stream`'s context that stays
/// mapped for as long as the view is used.
pub(crate) unsafe fn view<S>(
    stream: &Arc<CudaStream>,
    ptr: CUdeviceptr,
    len: usize,
) -> ManuallyDrop<CudaSlice<S>> {
    // SAFETY: the range is mapped memory of this context (the caller's contract); the view is
    // wrapped so that cudarc never frees it.
    ManuallyDrop::new(unsafe { stream.upgrade_device_ptr::<S>(ptr, len) })
}

/// Device memory in use by every process, in bytes (total minus free, as the driver sees it).
pub(crate) fn used_bytes(ctx: &CudaContext) -> Result<usize> {
    ctx.bind_to_thread()
        .context(|| "binding the context to read memory use".into())?;
    let (free, total) =
        cudarc::driver::result::mem_get_info().context(|| "reading free memory".into())?;
    Ok(total - free)
}

/// Returns the memory that freed buffers left in the device's stream-ordered pool to the device.
pub(crate) fn trim_pool(ctx: &CudaContext) -> Result<()> {
    let mut pool = std::ptr::null_mut();
    // SAFETY: `pool` is writable; the ordinal is this context's device.
    unsafe { sys::cuDeviceGetMemPool(&mut pool, ctx.cu_device()) }
        .result()
        .context(|| "reading the device's memory pool".into())?;
    // SAFETY: `pool` is the device's current pool; trimming frees only unused memory.
    unsafe { sys::cuMemPoolTrimTo(pool, 0) }
        .result()
        .context(|| "trimming the memory pool".into())
}
