//! An exclusive advisory lock on a file (flock), held while one worker loads its model so that
//! N instances do not read the checkpoint and allocate device memory at the same time. Works
//! across processes and across open handles in one process.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;

use crate::error::FleetError;

/// Held until dropped.
#[derive(Debug)]
pub struct LoadLock {
    _file: File,
}

impl LoadLock {
    /// `Ok(None)` when someone else holds it.
    pub fn try_acquire(path: &Path) -> Result<Option<Self>, FleetError> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(FleetError::io("opening load lock", path))?;
        match file.try_lock() {
            Ok(()) => Ok(Some(Self { _file: file })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(FleetError::io("locking", path)(e)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    #[test]
    fn second_holder_waits_until_release() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("load.lock");
        let first = LoadLock::try_acquire(&path).unwrap().expect("free");
        assert!(LoadLock::try_acquire(&path).unwrap().is_none());
        drop(first);
        // A test on another thread that spawns a process forks with this descriptor open; the
        // child shares the lock until its exec closes it (close-on-exec), so the release may
        // lag the drop by that long. The supervisor retries on its next tick for the same reason.
        let deadline = Instant::now() + Duration::from_secs(5);
        while LoadLock::try_acquire(&path).unwrap().is_none() {
            assert!(
                Instant::now() < deadline,
                "lock still held 5 s after release"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
