//! Keeps a received message invisible while its job runs: `ChangeMessageVisibility` every
//! third of the visibility timeout, never asking past SQS's 12 h cap from the receive (SQS
//! rejects such a request rather than clamping it). When the lease is lost or reaches the cap,
//! it cancels the job's stop token: a checkpointed job stops at its next checkpoint and the
//! message's next delivery resumes from there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::DispatchError;
use crate::queue::Queue;

/// SQS's total visibility cap, counted from the receive.
pub const VISIBILITY_CAP: Duration = Duration::from_secs(12 * 3600);
/// Margin kept below the cap for clock skew between us and SQS (at most a tenth of the cap).
const CAP_MARGIN: Duration = Duration::from_secs(30);

/// Stops heartbeating when dropped.
pub struct Heartbeat {
    task: JoinHandle<()>,
    lost: Arc<AtomicBool>,
}

impl Heartbeat {
    pub fn start(
        queue: Arc<dyn Queue>,
        receipt: String,
        received_at: Instant,
        visibility: Duration,
        cap: Duration,
        job_stop: CancellationToken,
    ) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let flag = lost.clone();
        let task = tokio::spawn(async move {
            let period = (visibility / 3).max(Duration::from_millis(200));
            let margin = CAP_MARGIN.min(cap / 10);
            loop {
                tokio::time::sleep(period).await;
                let left = cap
                    .saturating_sub(received_at.elapsed())
                    .saturating_sub(margin);
                let next = visibility.min(left);
                if next.is_zero() || next < visibility.min(Duration::from_secs(1)) {
                    tracing::warn!(cap_s = cap.as_secs_f64(),
                        "visibility cap reached; the job stops at its next checkpoint and the message reappears");
                    flag.store(true, Ordering::SeqCst);
                    job_stop.cancel();
                    return;
                }
                match queue.extend(&receipt, next).await {
                    Ok(()) => tracing::debug!(?next, "visibility extended"),
                    Err(DispatchError::LeaseLost { message_id }) => {
                        tracing::warn!(%message_id, "lease lost; another receiver may have the message");
                        flag.store(true, Ordering::SeqCst);
                        job_stop.cancel();
                        return;
                    }
                    // Try again next period; the remaining two thirds are the slack for this.
                    Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
                }
            }
        });
        Self { task, lost }
    }

    /// Whether the message's lease is known to be gone (it may be redelivered elsewhere).
    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::spool::SpoolQueue;

    #[tokio::test]
    async fn heartbeats_outlast_the_visibility_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spool = SpoolQueue::open(dir.path(), 5).expect("open");
        spool.send_one("long job").expect("send");
        let queue: Arc<dyn Queue> = Arc::new(spool);
        let vt = Duration::from_millis(600);
        let got = queue.receive(1, Duration::ZERO, vt).await.expect("rx");
        let beat = Heartbeat::start(
            queue.clone(),
            got[0].receipt.clone(),
            got[0].received_at,
            vt,
            VISIBILITY_CAP,
            CancellationToken::new(),
        );
        tokio::time::sleep(vt * 3).await;
        assert!(queue
            .receive(1, Duration::ZERO, vt)
            .await
            .expect("rx")
            .is_empty());
        assert!(!beat.lost());
        drop(beat);
        tokio::time::sleep(vt + Duration::from_millis(200)).await;
        let again = queue.receive(1, Duration::ZERO, vt).await.expect("rx");
        assert_eq!(
            again[0].receive_count, 2,
            "redelivered once heartbeats stopped"
        );
    }

    /// At the cap the heartbeat gives the lease up and stops the job (at its next checkpoint).
    #[tokio::test]
    async fn the_cap_stops_the_job() {
        let dir = tempfile::tempdir().expect("tempdir");
        let spool = SpoolQueue::open(dir.path(), 5).expect("open");
        spool.send_one("very long job").expect("send");
        let queue: Arc<dyn Queue> = Arc::new(spool);
        let vt = Duration::from_millis(600);
        let got = queue.receive(1, Duration::ZERO, vt).await.expect("rx");
        let stop = CancellationToken::new();
        let beat = Heartbeat::start(
            queue.clone(),
            got[0].receipt.clone(),
            got[0].received_at,
            vt,
            Duration::from_secs(3),
            stop.clone(),
        );
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(!stop.is_cancelled() && !beat.lost(), "before the cap");
        tokio::time::timeout(Duration::from_secs(5), stop.cancelled())
            .await
            .expect("stopped at the cap");
        assert!(beat.lost());
    }
}
