//! Device memory that several processes on one GPU map at once, through CUDA's virtual memory
//! management with POSIX file-descriptor handles. It is meant for one copy of a model's weights
//! per GPU, shared by the workers on it, instead of one copy per worker.
//!
//! The creating process exports a file descriptor. A process that receives it (over a Unix
//! socket, `SCM_RIGHTS`) maps the same physical memory. The memory lives while any process
//! holds a handle to it, so the creator may exit first.

use std::ffi::c_void;
use std::io::{IoSlice, IoSliceMut};
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use cudarc::driver::sys::{
    self, CUdeviceptr, CUmemAccess_flags, CUmemAllocationGranularity_flags,
    CUmemAllocationHandleType, CUmemAllocationType, CUmemGenericAllocationHandle,
    CUmemLocationType,
};
use cudarc::driver::CudaContext;
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::error::{CudaEngineError, DriverContext, Result};
use crate::CudaEngine;

const HANDLE_TYPE: CUmemAllocationHandleType =
    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// One mapping of a shareable device allocation in this process.
pub struct SharedDeviceMemory {
    ctx: Arc<CudaContext>,
    handle: CUmemGenericAllocationHandle,
    ptr: CUdeviceptr,
    /// The mapped size: the requested size rounded up to the allocation granularity.
    bytes: usize,
}

impl SharedDeviceMemory {
    /// Allocates at least `bytes` of shareable memory on the engine's device and maps it here.
    pub fn create(engine: &CudaEngine, bytes: usize) -> Result<Self> {
        let ctx = engine.context().clone();
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

    /// A new file descriptor for this allocation, to send to another process on the same
    /// machine (it then calls [`SharedDeviceMemory::import`] with it and [`Self::bytes`]).
    pub fn export(&self) -> Result<OwnedFd> {
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

    /// Maps memory another process exported ([`Self::export`]) into this process, on the
    /// engine's device. `bytes` is the exporter's [`Self::bytes`].
    pub fn import(engine: &CudaEngine, fd: BorrowedFd<'_>, bytes: usize) -> Result<Self> {
        let ctx = engine.context().clone();
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
            unsafe { sys::cuMemRelease(handle) };
            return Err(CudaEngineError::Driver {
                context: format!("reserving {bytes} bytes of device address space"),
                source,
            });
        }
        // From here on Drop undoes whatever was done (unmapping an unmapped range only fails).
        let memory = Self {
            ctx,
            handle,
            ptr,
            bytes,
        };
        // SAFETY: `ptr..ptr + bytes` is the range just reserved, `handle` an allocation of
        // `bytes` bytes (the caller's contract).
        unsafe { sys::cuMemMap(ptr, bytes, 0, handle, 0) }
            .result()
            .context(|| format!("mapping {bytes} bytes of shareable device memory"))?;
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
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The start of the mapping in this process's device address space.
    pub(crate) fn device_ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Copies `data` to `offset` bytes into the allocation (synchronously).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
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
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
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

impl Drop for SharedDeviceMemory {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return; // the context is gone: so is its address space
        }
        // Work still queued may read the memory (e.g. weights of a model being dropped).
        let _ = self.ctx.synchronize();
        // SAFETY: the range was reserved (and possibly mapped) by `map` for this value only;
        // nothing else refers to it once the value is dropped. Failures (e.g. a range that was
        // never mapped) leave nothing to undo.
        unsafe {
            sys::cuMemUnmap(self.ptr, self.bytes);
            sys::cuMemAddressFree(self.ptr, self.bytes);
            sys::cuMemRelease(self.handle);
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

/// Sends `memory`'s exported descriptor and size over a connected Unix stream socket.
pub fn send_shared(socket: BorrowedFd<'_>, memory: &SharedDeviceMemory) -> Result<()> {
    let fd = memory.export()?;
    let size = (memory.bytes() as u64).to_le_bytes();
    let fds = [fd.as_raw_fd()];
    sendmsg::<()>(
        socket.as_raw_fd(),
        &[IoSlice::new(&size)],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(|errno| socket_error("sending a shareable memory descriptor", errno))?;
    Ok(())
}

/// Receives a descriptor and size sent by [`send_shared`] and maps the memory on the engine's
/// device.
pub fn receive_shared(engine: &CudaEngine, socket: BorrowedFd<'_>) -> Result<SharedDeviceMemory> {
    let mut size = [0u8; 8];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut size)];
    let message = recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(|errno| socket_error("receiving a shareable memory descriptor", errno))?;
    let received = message.bytes;
    let mut fds = Vec::new();
    for cmsg in message
        .cmsgs()
        .map_err(|errno| socket_error("reading the control messages", errno))?
    {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            // SAFETY: the kernel installed these descriptors in this process for this message;
            // nothing else owns them.
            fds.extend(
                raw.into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    let (Some(fd), 8) = (fds.first(), received) else {
        return Err(CudaEngineError::Sharing {
            context: "receiving a shareable memory descriptor".into(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "expected one descriptor and 8 bytes of size, got {} and {received}",
                    fds.len()
                ),
            ),
        });
    };
    SharedDeviceMemory::import(engine, fd.as_fd(), u64::from_le_bytes(size) as usize)
}

fn socket_error(what: &str, errno: nix::errno::Errno) -> CudaEngineError {
    CudaEngineError::Sharing {
        context: what.into(),
        source: errno.into(),
    }
}
