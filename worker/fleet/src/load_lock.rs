//! Exclusive advisory locks on files (flock), one held by each worker while it loads its model,
//! so that no more workers than the host's memory holds read their checkpoints at the same time
//! (`FleetConfig::concurrent_loads` lock files: one means one load at a time). Works across
//! processes and across open handles in one process.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;

use crate::error::FleetError;

/// Held until dropped.
#[derive(Debug)]
pub struct LoadLock {
    _file: File,
}

impl LoadLock {
    /// One of `count` locks: `base` itself, then `base.1`, `base.2`, ...; `Ok(None)` when
    /// every one is held.
    pub fn try_acquire_one_of(base: &Path, count: usize) -> Result<Option<Self>, FleetError> {
        for k in 0..count.max(1) {
            let path = if k == 0 {
                base.to_owned()
            } else {
                let mut name = base.as_os_str().to_owned();
                name.push(format!(".{k}"));
                name.into()
            };
            if let Some(lock) = Self::try_acquire(&path)? {
                return Ok(Some(lock));
            }
        }
        Ok(None)
    }

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
    fn one_of_several_locks_goes_to_each_holder_until_all_are_held() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("load.lock");
        let first = LoadLock::try_acquire_one_of(&base, 2)
            .unwrap()
            .expect("free");
        let second = LoadLock::try_acquire_one_of(&base, 2)
            .unwrap()
            .expect("one left");
        assert!(LoadLock::try_acquire_one_of(&base, 2).unwrap().is_none());
        // The base lock alone is the one-at-a-time lock of a fleet allowing a single load.
        assert!(LoadLock::try_acquire(&base).unwrap().is_none());
        drop((first, second));
    }

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
