//! Errors that `Drop` cannot return: a failed free, unmap, synchronisation or destroy of a
//! CUDA, NVRTC or cuBLASLt object. Each one is counted, kept as the last message and logged
//! (`tracing`, warn level), so that an operator or a test sees that a release failed instead of
//! the error vanishing. [`drop_errors`] reads the process's record.

use std::fmt::Display;
use std::sync::{Mutex, PoisonError};

/// The releases this process's `Drop` impls saw fail.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DropErrors {
    /// Failures since the process started.
    pub count: u64,
    /// The latest one: what was being released, and the error.
    pub last: Option<String>,
}

/// A record of drop failures: the process's one ([`RECORD`]), or a test's own.
pub(crate) struct DropErrorRecord(Mutex<DropErrors>);

impl DropErrorRecord {
    pub(crate) const fn new() -> Self {
        Self(Mutex::new(DropErrors {
            count: 0,
            last: None,
        }))
    }

    /// Records `result`'s error, if any, as a failure to do `what`.
    pub(crate) fn check<T, E: Display>(&self, what: &str, result: Result<T, E>) {
        if let Err(error) = result {
            tracing::warn!(what, %error, "a release in Drop failed");
            let mut record = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            record.count += 1;
            record.last = Some(format!("{what}: {error}"));
        }
    }

    pub(crate) fn snapshot(&self) -> DropErrors {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The process's record.
static RECORD: DropErrorRecord = DropErrorRecord::new();

/// The failures this process's `Drop` impls could not return so far (a free, unmap or destroy
/// the driver refused): how many, and the last one's message.
pub fn drop_errors() -> DropErrors {
    RECORD.snapshot()
}

/// Records `result`'s error, if any, in the process's record as a failure to do `what` (for
/// `Drop` impls, which have no caller to return it to).
pub(crate) fn record_drop_error<T, E: Display>(what: &str, result: Result<T, E>) {
    RECORD.check(what, result);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_counted_and_the_last_one_kept() {
        let record = DropErrorRecord::new();
        assert_eq!(record.snapshot(), DropErrors::default());
        record.check("destroying a matrix layout", Ok::<(), &str>(()));
        assert_eq!(
            record.snapshot(),
            DropErrors::default(),
            "a success is no failure"
        );
        record.check("freeing a weight", Err::<(), _>("CUDA_ERROR_INVALID_VALUE"));
        record.check(
            "destroying the cuBLASLt handle",
            Err::<(), _>("NOT_INITIALIZED"),
        );
        assert_eq!(
            record.snapshot(),
            DropErrors {
                count: 2,
                last: Some("destroying the cuBLASLt handle: NOT_INITIALIZED".into()),
            }
        );
    }

    #[test]
    fn the_process_record_is_public() {
        let before = drop_errors().count;
        record_drop_error("unmapping a test range", Err::<(), _>("a test failure"));
        // Other tests of this binary may record failures concurrently: at least ours counts.
        assert!(drop_errors().count > before);
    }
}
