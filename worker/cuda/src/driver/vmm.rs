//! CUDA virtual memory management (`cuMem*`) with POSIX file-descriptor handles: device memory
//! that several processes on one GPU map at once. The creating process exports a descriptor; a
//! process that receives it maps the same physical memory. The memory lives while any process
//! holds a handle to it.

use std::ffi::c_void;
use std::mem;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::sys::{
    self, CUdeviceptr, CUmemAccess_flags, CUmemAllocationGranularity_flags,
    CUmemAllocationHandleType, CUmemAllocationType, CUmemGenericAllocationHandle,
    CUmemLocationType,
};
use cudarc::driver::CudaContext;

use super::drop_errors::record_drop_error;
use crate::error::{CudaEngineError, DriverContext, Result};

const HANDLE_TYPE: CUmemAllocationHandleType =
    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// One mapping of a shareable allocation in this process, unmapped and released on drop.
pub(crate) struct Mapping {
    ctx: Arc<CudaContext>,
    handle: CUmemGenericAllocationHandle,
    ptr: CUdeviceptr,
    /// The mapped size: the requested size rounded up to the allocation granularity.
    bytes: usize,
    /// Whether `ptr .. ptr + bytes` is mapped (else only reserved: a failed `map`).
    mapped: bool,
}

impl Mapping {
    /// Allocates at least `bytes` of shareable memory on `ctx`'s device and maps it here.
    pub(crate) fn create(ctx: Arc<CudaContext>, bytes: usize) -> Result<Self> {
        ctx.bind_to_thread()
            .context(|| "binding the context to allocate shareable memory".into())?;
        let prop = allocation_prop(&ctx);
        let mut granularity = 0usize;
        // SAFETY: `prop` is a fully initialized property struct; `granularity` is writable.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        }
        .result()
        .context(|| "reading the allocation granularity for shareable memory".into())?;
        let bytes = bytes.max(1).div_ceil(granularity) * granularity;
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` is initialized and `bytes` a multiple of its granularity; `handle` is
        // writable. The handle is released by `map` on failure or by Drop.
        unsafe { sys::cuMemCreate(&mut handle, bytes, &prop, 0) }
            .result()
            .context(|| format!("creating {bytes} bytes of shareable device memory"))?;
        Self::map(ctx, handle, bytes)
    }

    /// A new file descriptor for this allocation, for another process on the same machine.
    pub(crate) fn export(&self) -> Result<OwnedFd> {
        // Exports may come from a thread that serves other processes.
        self.ctx
            .bind_to_thread()
            .context(|| "binding the context to export shareable memory".into())?;
        let mut fd: i32 = -1;
        // SAFETY: the handle is alive (owned by self) and was created with the POSIX
        // file-descriptor handle type; for that type the output is one `int`.
        unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut i32).cast::<c_void>(),
                self.handle,
                HANDLE_TYPE,
                0,
            )
        }
        .result()
        .context(|| "exporting shareable device memory as a file descriptor".into())?;
        if fd < 0 {
            return Err(CudaEngineError::Shape {
                op: "SharedDeviceMemory::export",
                detail: format!("the driver returned file descriptor {fd}"),
            });
        }
        // SAFETY: the driver just opened `fd` for the caller, who now owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Maps memory another process exported into this process, on `ctx`'s device. `bytes` is
    /// the exporter's size.
    pub(crate) fn import(ctx: Arc<CudaContext>, fd: BorrowedFd<'_>, bytes: usize) -> Result<Self> {
        ctx.bind_to_thread()
            .context(|| "binding the context to import shareable memory".into())?;
        let mut handle: CUmemGenericAllocationHandle = 0;
        // SAFETY: for the POSIX file-descriptor type the driver takes the descriptor's value in
        // place of the pointer and does not take ownership of it; `handle` is writable.
        unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as usize as *mut c_void,
                HANDLE_TYPE,
            )
        }
        .result()
        .context(|| format!("importing shareable device memory from descriptor {fd:?}"))?;
        Self::map(ctx, handle, bytes)
    }

    /// Reserves an address range for `handle`, maps it and grants this device read and write
    /// access. Takes ownership of `handle` (released on failure).
    fn map(
        ctx: Arc<CudaContext>,
        handle: CUmemGenericAllocationHandle,
        bytes: usize,
    ) -> Result<Self> {
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: reserves a fresh virtual range; `ptr` is writable.
        let reserved = unsafe { sys::cuMemAddressReserve(&mut ptr, bytes, 0, 0, 0) }.result();
        if let Err(source) = reserved {
            // SAFETY: the handle is owned here and mapped nowhere.
            let released = unsafe { sys::cuMemRelease(handle) }.result();
            record_drop_error(
                "releasing shareable memory that got no address range",
                released,
            );
            return Err(CudaEngineError::Driver {
                context: format!("reserving {bytes} bytes of device address space"),
                source,
            });
        }
        // From here on Drop undoes whatever was done.
        let mut memory = Self {
            ctx,
            handle,
            ptr,
            bytes,
            mapped: false,
        };
        // SAFETY: `ptr..ptr + bytes` is the range just reserved, `handle` an allocation of
        // `bytes` bytes (the caller's contract).
        unsafe { sys::cuMemMap(ptr, bytes, 0, handle, 0) }
            .result()
            .context(|| format!("mapping {bytes} bytes of shareable device memory"))?;
        memory.mapped = true;
        let access = sys::CUmemAccessDesc {
            location: device_location(&memory.ctx),
            flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range is mapped; `access` is one initialized descriptor.
        unsafe { sys::cuMemSetAccess(ptr, bytes, &access, 1) }
            .result()
            .context(|| "granting the device access to shareable memory".into())?;
        Ok(memory)
    }

    /// The mapped size in bytes (the requested size rounded up to the granularity).
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The start of the mapping in this process's device address space.
    pub(crate) fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Copies `data` to `offset` bytes into the allocation (synchronously).
    #[cfg(feature = "internals")]
    pub(crate) fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check_range("SharedDeviceMemory::write", offset, data.len())?;
        self.ctx
            .bind_to_thread()
            .context(|| "binding the context to write shareable memory".into())?;
        // SAFETY: the destination range lies inside the mapped allocation (checked above) and
        // `data` is a valid host slice of that length.
        unsafe {
            sys::cuMemcpyHtoD_v2(
                self.ptr + offset as u64,
                data.as_ptr().cast::<c_void>(),
                data.len(),
            )
        }
        .result()
        .context(|| format!("copying {} bytes into shareable memory", data.len()))
    }

    /// Copies `out.len()` bytes from `offset` bytes into the allocation (synchronously).
    #[cfg(feature = "internals")]
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range("SharedDeviceMemory::read", offset, out.len())?;
        self.ctx
            .bind_to_thread()
            .context(|| "binding the context to read shareable memory".into())?;
        // SAFETY: the source range lies inside the mapped allocation (checked above) and `out`
        // is a valid, writable host slice of that length.
        unsafe {
            sys::cuMemcpyDtoH_v2(
                out.as_mut_ptr().cast::<c_void>(),
                self.ptr + offset as u64,
                out.len(),
            )
        }
        .result()
        .context(|| format!("copying {} bytes out of shareable memory", out.len()))
    }

    #[cfg(feature = "internals")]
    fn check_range(&self, op: &'static str, offset: usize, len: usize) -> Result<()> {
        if offset.checked_add(len).is_some_and(|end| end <= self.bytes) {
            Ok(())
        } else {
            Err(CudaEngineError::Shape {
                op,
                detail: format!(
                    "{len} bytes at offset {offset} do not fit in {} bytes",
                    self.bytes
                ),
            })
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let bound = self.ctx.bind_to_thread();
        if bound.is_err() {
            record_drop_error("binding the context to unmap shareable memory", bound);
            return;
        }
        // Work still queued may read the memory (e.g. weights of a model being dropped).
        record_drop_error(
            "synchronizing before unmapping shareable memory",
            self.ctx.synchronize(),
        );
        // SAFETY: the range was reserved (and, where `mapped`, mapped) by `map` for this value
        // only, and the handle is owned by it; nothing else refers to them once the value is
        // dropped, and each is undone once.
        unsafe {
            if self.mapped {
                let unmapped = sys::cuMemUnmap(self.ptr, self.bytes).result();
                record_drop_error("unmapping shareable memory", unmapped);
            }
            let freed = sys::cuMemAddressFree(self.ptr, self.bytes).result();
            record_drop_error("freeing shareable memory's address range", freed);
            let released = sys::cuMemRelease(self.handle).result();
            record_drop_error("releasing shareable memory", released);
        }
    }
}

fn device_location(ctx: &CudaContext) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ctx.ordinal() as i32,
    }
}

fn allocation_prop(ctx: &CudaContext) -> sys::CUmemAllocationProp {
    // SAFETY: the property struct is plain data for which all-zero is a valid value (null
    // Windows metadata, no allocation flags); the fields that matter are set below.
    let mut prop: sys::CUmemAllocationProp = unsafe { mem::zeroed() };
    prop.type_ = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = HANDLE_TYPE;
    prop.location = device_location(ctx);
    prop
}
