//! Device memory that several processes on one GPU map at once, through CUDA's virtual memory
//! management with POSIX file-descriptor handles (`driver/vmm.rs`). It is meant for one copy of
//! a model's weights per GPU, shared by the workers on it, instead of one copy per worker.
//!
//! The creating process exports a file descriptor. A process that receives it (over a Unix
//! socket, `SCM_RIGHTS`) maps the same physical memory. The memory lives while any process
//! holds a handle to it, so the creator may exit first.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use cudarc::driver::sys::CUdeviceptr;
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::device::CudaEngine;
use crate::driver::vmm::Mapping;
use crate::error::{CudaEngineError, Result};

/// One mapping of a shareable device allocation in this process.
pub struct SharedDeviceMemory(Mapping);

impl SharedDeviceMemory {
    /// Allocates at least `bytes` of shareable memory on the engine's device and maps it here.
    pub fn create(engine: &CudaEngine, bytes: usize) -> Result<Self> {
        Mapping::create(engine.context().clone(), bytes).map(Self)
    }

    /// A new file descriptor for this allocation, to send to another process on the same
    /// machine (it then calls [`SharedDeviceMemory::import`] with it and [`Self::bytes`]).
    pub fn export(&self) -> Result<OwnedFd> {
        self.0.export()
    }

    /// Maps memory another process exported ([`Self::export`]) into this process, on the
    /// engine's device. `bytes` is the exporter's [`Self::bytes`].
    pub fn import(engine: &CudaEngine, fd: BorrowedFd<'_>, bytes: usize) -> Result<Self> {
        Mapping::import(engine.context().clone(), fd, bytes).map(Self)
    }

    /// The mapped size in bytes (the requested size rounded up to the granularity).
    pub fn bytes(&self) -> usize {
        self.0.bytes()
    }

    /// The start of the mapping in this process's device address space.
    pub(crate) fn device_ptr(&self) -> CUdeviceptr {
        self.0.device_ptr()
    }

    /// Copies `data` to `offset` bytes into the allocation (synchronously; for tests and
    /// examples: feature `internals`).
    #[cfg(feature = "internals")]
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.0.write(offset, data)
    }

    /// Copies `out.len()` bytes from `offset` bytes into the allocation (synchronously; for
    /// tests and examples: feature `internals`).
    #[cfg(feature = "internals")]
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.0.read(offset, out)
    }
}

/// Sends `memory`'s exported descriptor and size over a connected Unix stream socket.
pub fn send_shared(socket: BorrowedFd<'_>, memory: &SharedDeviceMemory) -> Result<()> {
    let fd = memory.export()?;
    let size = (memory.bytes() as u64).to_le_bytes();
    let fds = [fd.as_fd()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(sharing_error(
            "sending a shareable memory descriptor",
            std::io::Error::other("no room for the descriptor in the control message (bug)"),
        ));
    }
    sendmsg(
        socket,
        &[IoSlice::new(&size)],
        &mut control,
        SendFlags::empty(),
    )
    .map_err(|errno| sharing_error("sending a shareable memory descriptor", errno.into()))?;
    Ok(())
}

/// Receives a descriptor and size sent by [`send_shared`] and maps the memory on the engine's
/// device.
pub fn receive_shared(engine: &CudaEngine, socket: BorrowedFd<'_>) -> Result<SharedDeviceMemory> {
    let mut size = [0u8; 8];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut iov = [IoSliceMut::new(&mut size)];
    let message = recvmsg(socket, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC)
        .map_err(|errno| sharing_error("receiving a shareable memory descriptor", errno.into()))?;
    let received = message.bytes;
    // The kernel installed the descriptors in this process for this message; each is owned here.
    let mut fds: Vec<OwnedFd> = Vec::new();
    for cmsg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(raw) = cmsg {
            fds.extend(raw);
        }
    }
    let (Some(fd), 8) = (fds.first(), received) else {
        return Err(sharing_error(
            "receiving a shareable memory descriptor",
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "expected one descriptor and 8 bytes of size, got {} and {received}",
                    fds.len()
                ),
            ),
        ));
    };
    SharedDeviceMemory::import(engine, fd.as_fd(), u64::from_le_bytes(size) as usize)
}

fn sharing_error(what: &str, source: std::io::Error) -> CudaEngineError {
    CudaEngineError::Sharing {
        context: what.into(),
        source,
    }
}
