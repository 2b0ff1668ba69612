//! `--fault-injection` (off by default; for fault drills only): SIGUSR1 makes the engine cause
//! an illegal-address fault before its next batch, SIGUSR2 makes it take all free device memory.
//! Without the switch the signals keep their default action (the process ends), so a stray
//! signal can never be mistaken for a drill.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use engine::Fault;
use tokio::signal::unix::{signal, SignalKind};

/// A fault asked for and not yet caused.
#[derive(Debug, Default)]
pub struct PendingFault(AtomicU8);

const NONE: u8 = 0;
const ILLEGAL_ADDRESS: u8 = 1;
const OUT_OF_MEMORY: u8 = 2;

impl PendingFault {
    pub fn request(&self, fault: Fault) {
        let code = match fault {
            Fault::IllegalAddress => ILLEGAL_ADDRESS,
            Fault::OutOfMemory => OUT_OF_MEMORY,
        };
        self.0.store(code, Ordering::SeqCst);
    }

    /// The fault asked for, once.
    pub fn take(&self) -> Option<Fault> {
        match self.0.swap(NONE, Ordering::SeqCst) {
            ILLEGAL_ADDRESS => Some(Fault::IllegalAddress),
            OUT_OF_MEMORY => Some(Fault::OutOfMemory),
            _ => None,
        }
    }
}

/// Turns SIGUSR1 / SIGUSR2 into requests, until the runtime stops.
pub fn listen(pending: Arc<PendingFault>) -> std::io::Result<()> {
    let mut illegal = signal(SignalKind::user_defined1())?;
    let mut memory = signal(SignalKind::user_defined2())?;
    tracing::warn!("fault injection enabled: SIGUSR1 = illegal address, SIGUSR2 = out of memory");
    tokio::spawn(async move {
        loop {
            let fault = tokio::select! {
                Some(()) = illegal.recv() => Fault::IllegalAddress,
                Some(()) = memory.recv() => Fault::OutOfMemory,
                else => return,
            };
            tracing::warn!(?fault, "fault injection requested: before the next batch");
            pending.request(fault);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_taken_once() {
        let pending = PendingFault::default();
        assert_eq!(pending.take(), None);
        pending.request(Fault::OutOfMemory);
        assert_eq!(pending.take(), Some(Fault::OutOfMemory));
        assert_eq!(pending.take(), None);
        pending.request(Fault::IllegalAddress);
        assert_eq!(pending.take(), Some(Fault::IllegalAddress));
    }
}
