//! Retries of transient errors with capped, jittered exponential backoff (one layer only:
//! the SDK's own retries are on top, so keep this short).

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};

use crate::error::Result;

#[derive(Debug, Clone, Copy)]
pub struct RetrySettings {
    pub first_delay: Duration,
    pub max_delay: Duration,
    /// Retries after the first attempt.
    pub max_retries: usize,
}

impl Default for RetrySettings {
    fn default() -> Self {
        Self {
            first_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(10),
            max_retries: 4,
        }
    }
}

/// Runs `op`, retrying while it fails with a transient error.
pub async fn retry_transient<T, F, Fut>(settings: RetrySettings, what: &str, op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let backoff = ExponentialBuilder::default()
        .with_min_delay(settings.first_delay)
        .with_max_delay(settings.max_delay)
        .with_max_times(settings.max_retries)
        .with_jitter();
    op.retry(backoff)
        .when(|e| e.is_transient())
        .notify(
            |e, delay| tracing::warn!(error = %e, ?delay, "{what}: transient failure, retrying"),
        )
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{DispatchError, ErrorClass};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn quick() -> RetrySettings {
        RetrySettings {
            first_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
            max_retries: 3,
        }
    }

    fn store_error(class: ErrorClass) -> DispatchError {
        DispatchError::Store {
            bucket: "b".into(),
            key: "k".into(),
            class,
            message: "x".into(),
        }
    }

    #[tokio::test]
    async fn retries_transient_then_succeeds() {
        let calls = AtomicUsize::new(0);
        let out = retry_transient(quick(), "t", || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(store_error(ErrorClass::Transient))
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(out.expect("ok"), 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn permanent_is_not_retried() {
        let calls = AtomicUsize::new(0);
        let out: Result<()> = retry_transient(quick(), "t", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(store_error(ErrorClass::Permanent))
        })
        .await;
        assert!(out.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
