//! The consumer: receivers pull messages while there is room, each message runs as a task
//! with a visibility heartbeat, and its fate follows the error class:
//! done or permanently failed (record written) → delete; transient → make it visible again
//! after a backoff; infrastructure → release it and stop taking work.
//! Stopping (SIGTERM, idle in batch mode, infrastructure) stops the receivers first; in-flight
//! jobs get `drain_grace` to finish, then are cancelled and their messages released.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::{DispatchError, ErrorClass, Result};
use crate::job::{parse_message, Parsed};
use crate::metrics::MetricEvent;
use crate::pipeline::{JobOutcome, Pipeline};
use crate::queue::{now_ms, Queue, Received};

pub mod deleter;
pub mod heartbeat;
pub mod interruption;
pub mod retry;

use deleter::Deleter;
use heartbeat::Heartbeat;

/// How often a paused receiver asks the engine again (a worker restart takes seconds).
const ENGINE_READY_POLL: Duration = Duration::from_millis(200);

#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    /// Concurrent long-polling receivers.
    pub receivers: usize,
    /// Messages per receive (SQS: at most 10).
    pub max_messages_per_receive: usize,
    /// Long-poll wait per receive (SQS: at most 20 s).
    pub wait: Duration,
    /// Visibility timeout asked for on receive; heartbeats extend it every third.
    pub visibility: Duration,
    /// Messages held at once (received and not yet deleted or released).
    pub max_in_flight: usize,
    /// After a stop, how long in-flight jobs may take before they are released.
    pub drain_grace: Duration,
    /// Stop once the queue is empty and nothing is in flight (batch runs of `local`).
    pub exit_when_idle: bool,
    /// Longest delay before a transiently failed message is visible again.
    pub max_retry_delay: Duration,
    /// How long one receive's lease can be kept, from the receive: SQS's 12 h
    /// ([`heartbeat::VISIBILITY_CAP`]); tests shorten it.
    pub visibility_cap: Duration,
}

/// What happened to the messages this consumer handled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    pub done: u64,
    pub already_done: u64,
    pub failed: u64,
    pub ignored: u64,
    /// Unreadable messages put back (the queue's dead-letter policy takes them eventually).
    pub bad_messages: u64,
    /// Messages made visible again (transient errors, drain, infrastructure).
    pub released: u64,
    /// True when the consumer stopped because of an infrastructure error.
    pub infrastructure_stop: bool,
    /// Times receiving paused because no worker was ready (per receiver).
    pub receive_pauses: u64,
}

enum Disposition {
    Delete,
    RetryLater(Duration),
    Release,
    ReleaseAndStop,
}

pub struct Consumer {
    queue: Arc<dyn Queue>,
    pipeline: Arc<Pipeline>,
    settings: ConsumerSettings,
    /// Cleared when the consumer stops taking work (read by `/health`).
    pub healthy: Arc<AtomicBool>,
    summary: Mutex<RunSummary>,
    jobs_in_flight: AtomicUsize,
    /// When the latest message was finished with (a run's end of work, before the idle wait).
    last_finished: Mutex<Option<std::time::Instant>>,
    /// A drain deadline earlier than the grace allows (an interruption notice's).
    drain_by: Mutex<Option<std::time::Instant>>,
}

impl Consumer {
    pub fn new(queue: Arc<dyn Queue>, pipeline: Arc<Pipeline>, settings: ConsumerSettings) -> Self {
        Self {
            queue,
            pipeline,
            settings,
            healthy: Arc::new(AtomicBool::new(true)),
            summary: Mutex::new(RunSummary::default()),
            jobs_in_flight: AtomicUsize::new(0),
            last_finished: Mutex::new(None),
            drain_by: Mutex::new(None),
        }
    }

    /// Stops taking work, like cancelling `stop`, and lets in-flight jobs run until
    /// `deadline` at most (or the drain grace, whichever ends first); the rest are released.
    pub fn stop_by(&self, stop: &CancellationToken, deadline: std::time::Instant) {
        {
            let mut drain_by = self.drain_by.lock().unwrap_or_else(|p| p.into_inner());
            *drain_by = Some(drain_by.map_or(deadline, |d| d.min(deadline)));
        }
        stop.cancel();
    }

    /// What has happened so far (progress displays poll it while [`Self::run`] runs).
    pub fn summary(&self) -> RunSummary {
        self.summary_mut().clone()
    }

    fn summary_mut(&self) -> std::sync::MutexGuard<'_, RunSummary> {
        self.summary.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs until `stop` fires (or idle/infrastructure stops it), then drains.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) -> RunSummary {
        let stop_receiving = stop.child_token();
        let abort = CancellationToken::new();
        let deleter = Deleter::spawn(self.queue.clone(), Duration::from_millis(20));
        let slots = Arc::new(Semaphore::new(self.settings.max_in_flight.max(1)));
        let jobs = TaskTracker::new();

        let mut receivers = tokio::task::JoinSet::new();
        for _ in 0..self.settings.receivers.max(1) {
            let this = self.clone();
            let (stop_receiving, abort, deleter, slots, jobs) = (
                stop_receiving.clone(),
                abort.clone(),
                deleter.clone(),
                slots.clone(),
                jobs.clone(),
            );
            receivers.spawn(async move {
                this.receive_loop(stop_receiving, abort, deleter, slots, jobs)
                    .await
            });
        }

        stop_receiving.cancelled().await;
        let grace_ends = std::time::Instant::now() + self.settings.drain_grace;
        let deadline = match *self.drain_by.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(by) => by.min(grace_ends),
            None => grace_ends,
        };
        tracing::info!(
            drain_s = deadline
                .saturating_duration_since(std::time::Instant::now())
                .as_secs_f64(),
            "no longer receiving; draining in-flight jobs"
        );
        // Receives in progress complete (the long-poll wait bounds them) and release what they got.
        while receivers.join_next().await.is_some() {}
        jobs.close();
        if tokio::time::timeout_at(deadline.into(), jobs.wait())
            .await
            .is_err()
        {
            tracing::warn!("drain grace elapsed; releasing unfinished messages");
            abort.cancel();
            jobs.wait().await;
        }
        self.summary_mut().clone()
    }

    async fn receive_loop(
        self: Arc<Self>,
        stop_receiving: CancellationToken,
        abort: CancellationToken,
        deleter: Deleter,
        slots: Arc<Semaphore>,
        jobs: TaskTracker,
    ) {
        let mut failures = 0u32;
        let max_batch = self.settings.max_messages_per_receive.clamp(1, 10);
        loop {
            // Stop first: no receive starts once the stop has come.
            let first = tokio::select! {
                biased;
                _ = stop_receiving.cancelled() => return,
                p = slots.clone().acquire_owned() => p.expect("slots semaphore is never closed (bug)"),
            };
            if !self.engine_ready(&stop_receiving).await {
                return;
            }
            let mut permits = vec![first];
            while permits.len() < max_batch {
                match slots.clone().try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            // Never dropped half-way: SQS may already have handed messages out for this call,
            // and a dropped call would leave them invisible for the whole visibility timeout.
            // The long-poll wait bounds it.
            let received = self
                .queue
                .receive(permits.len(), self.settings.wait, self.settings.visibility)
                .await;
            match received {
                Ok(messages) if stop_receiving.is_cancelled() => {
                    self.release_unstarted(messages).await;
                    return;
                }
                Ok(messages) => {
                    failures = 0;
                    if messages.is_empty() && self.settings.exit_when_idle && self.idle().await {
                        tracing::info!("queue empty and nothing in flight; stopping");
                        stop_receiving.cancel();
                        return;
                    }
                    for message in messages {
                        let Some(permit) = permits.pop() else { break };
                        self.jobs_in_flight.fetch_add(1, Ordering::SeqCst);
                        let this = self.clone();
                        let (abort, deleter, stop) =
                            (abort.clone(), deleter.clone(), stop_receiving.clone());
                        jobs.spawn(async move {
                            this.handle(message, permit, abort, deleter, stop).await;
                        });
                    }
                }
                Err(e) if e.class() == ErrorClass::Infrastructure => {
                    tracing::error!(error = %e, "receive failed; this node stops taking work");
                    self.stop_for_infrastructure(&stop_receiving);
                    return;
                }
                Err(e) => {
                    failures += 1;
                    let delay = backoff_delay(failures, Duration::from_secs(30));
                    tracing::warn!(error = %e, ?delay, "receive failed; backing off");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stop_receiving.cancelled() => return,
                    }
                }
            }
        }
    }

    /// Waits while the engine has no ready worker (every worker restarting, as a GPU group does
    /// after a fault): a message received then would only wait, its visibility running, and
    /// count a receive toward the dead-letter policy. False when the stop came meanwhile, or
    /// when the engine will never be ready (then this node stops taking work).
    async fn engine_ready(&self, stop_receiving: &CancellationToken) -> bool {
        let mut paused: Option<std::time::Instant> = None;
        loop {
            match self.pipeline.engine_ready() {
                Ok(true) => {
                    if let Some(since) = paused {
                        tracing::info!(
                            paused_s = since.elapsed().as_secs_f64(),
                            "a worker is ready again; receiving resumed"
                        );
                    }
                    return true;
                }
                Ok(false) if paused.is_none() => {
                    tracing::warn!("no worker is ready; receiving paused until one is");
                    self.summary_mut().receive_pauses += 1;
                    paused = Some(std::time::Instant::now());
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(error = %e, "the engine cannot take work; this node stops taking work");
                    self.stop_for_infrastructure(stop_receiving);
                    return false;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(ENGINE_READY_POLL) => {}
                _ = stop_receiving.cancelled() => return false,
            }
        }
    }

    /// Messages received after the stop: visible again at once, for another node.
    async fn release_unstarted(&self, messages: Vec<Received>) {
        if messages.is_empty() {
            return;
        }
        tracing::info!(
            messages = messages.len(),
            "a receive in progress at the stop returned messages; releasing them"
        );
        for message in messages {
            if let Err(e) = self.queue.release(&message.receipt).await {
                tracing::warn!(message_id = %message.message_id, error = %e,
                    "could not release; the message reappears when its visibility ends");
            }
            self.summary_mut().released += 1;
            self.pipeline.metrics().emit(MetricEvent::JobFinished {
                outcome: "released",
            });
        }
    }

    async fn idle(&self) -> bool {
        self.jobs_in_flight.load(Ordering::SeqCst) == 0
            && matches!(self.queue.pending().await, Ok(0))
    }

    fn stop_for_infrastructure(&self, stop_receiving: &CancellationToken) {
        self.healthy.store(false, Ordering::SeqCst);
        self.summary_mut().infrastructure_stop = true;
        stop_receiving.cancel();
    }

    async fn handle(
        self: Arc<Self>,
        message: Received,
        _permit: OwnedSemaphorePermit,
        abort: CancellationToken,
        deleter: Deleter,
        stop_receiving: CancellationToken,
    ) {
        if let Some(sent) = message.sent_at_ms {
            let age_s = now_ms().saturating_sub(sent) as f64 / 1000.0;
            self.pipeline
                .metrics()
                .emit(MetricEvent::MessageAgeSeconds(age_s));
        }
        // Cancelled when the lease is lost or the drain ends: a checkpointed job stops at its
        // next checkpoint (a blocking thread's work is not dropped with the future below).
        let job_stop = abort.child_token();
        let beat = Heartbeat::start(
            self.queue.clone(),
            message.receipt.clone(),
            message.received_at,
            self.settings.visibility,
            self.settings.visibility_cap,
            job_stop.clone(),
        );
        let disposition = tokio::select! {
            d = self.dispose(&message, &job_stop) => d,
            _ = abort.cancelled() => Disposition::Release,
        };
        if beat.lost() {
            tracing::warn!(message_id = %message.message_id, "lease was lost during the job");
        }
        drop(beat);
        let outcome = match disposition {
            Disposition::Delete => match deleter.delete(message.receipt.clone()).await {
                Ok(()) => return self.finish(),
                Err(e) => {
                    // The result is written; a redelivery will find it and delete again.
                    tracing::warn!(message_id = %message.message_id, error = %e, "delete failed");
                    return self.finish();
                }
            },
            Disposition::RetryLater(delay) => self.queue.extend(&message.receipt, delay).await,
            Disposition::Release => self.queue.release(&message.receipt).await,
            Disposition::ReleaseAndStop => {
                self.stop_for_infrastructure(&stop_receiving);
                self.queue.release(&message.receipt).await
            }
        };
        self.summary_mut().released += 1;
        self.pipeline.metrics().emit(MetricEvent::JobFinished {
            outcome: "released",
        });
        if let Err(e) = outcome {
            tracing::warn!(message_id = %message.message_id, error = %e,
                "could not release; the message reappears when its visibility ends");
        }
        self.finish();
    }

    fn finish(&self) {
        *self.last_finished.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(std::time::Instant::now());
        self.jobs_in_flight.fetch_sub(1, Ordering::SeqCst);
    }

    /// Threads decoding recordings (the pipeline's pool).
    pub fn decode_threads(&self) -> usize {
        self.pipeline.decode_threads()
    }

    /// When the latest message was finished with, if any was.
    pub fn last_finished(&self) -> Option<std::time::Instant> {
        *self.last_finished.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn dispose(&self, message: &Received, stop: &CancellationToken) -> Disposition {
        let jobs = match parse_message(&message.body) {
            Ok(Parsed::Ignore(why)) => {
                tracing::info!(message_id = %message.message_id, why, "ignoring message");
                self.summary_mut().ignored += 1;
                return Disposition::Delete;
            }
            Ok(Parsed::Jobs(jobs)) => jobs,
            Err(e) => {
                // Nothing in it says where a failure record would go: let the queue's
                // dead-letter policy take it after its receives run out.
                tracing::warn!(message_id = %message.message_id, receives = message.receive_count,
                    reason = e.reason_code(), error = %e, "unreadable message");
                self.summary_mut().bad_messages += 1;
                self.pipeline.metrics().emit(MetricEvent::Failure {
                    reason: e.reason_code(),
                });
                return Disposition::Release;
            }
        };
        for job in &jobs {
            match self.pipeline.process(job, stop).await {
                Ok(outcome) => self.count(&outcome),
                // Its lease is gone or going: visible at once for the next attempt to resume.
                Err(e @ DispatchError::Stopped { .. }) => {
                    tracing::info!(job_id = %job.job_id, error = %e, "job stopped at a checkpoint");
                    return Disposition::Release;
                }
                Err(e) => {
                    tracing::warn!(job_id = %job.job_id, class = ?e.class(), error = %e, "job not finished");
                    return match e.class() {
                        ErrorClass::Transient => Disposition::RetryLater(backoff_delay(
                            message.receive_count,
                            self.settings.max_retry_delay,
                        )),
                        ErrorClass::Permanent => Disposition::Release,
                        ErrorClass::Infrastructure => Disposition::ReleaseAndStop,
                    };
                }
            }
        }
        Disposition::Delete
    }

    fn count(&self, outcome: &JobOutcome) {
        let mut s = self.summary_mut();
        match outcome {
            JobOutcome::Done { .. } => s.done += 1,
            JobOutcome::AlreadyDone => s.already_done += 1,
            JobOutcome::Failed { .. } => s.failed += 1,
        }
        self.pipeline.metrics().emit(MetricEvent::JobFinished {
            outcome: outcome.label(),
        });
    }
}

/// Exponential in the attempt number (2^attempt s), capped, less up to 50 % jitter (so retries
/// spread): backon's jitter adds up to 100 % to its delay, so its delays are half of those.
fn backoff_delay(attempt: u32, cap: Duration) -> Duration {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500).min(cap / 2))
        .with_max_delay(cap / 2)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
        // Capped long before: 2^16 s is over 18 hours.
        .nth(attempt.min(16) as usize)
        .unwrap_or(cap)
}

/// Convenience for binaries: run until SIGTERM/SIGINT (or idle), draining on the way out.
pub async fn run_until_signal(
    consumer: Arc<Consumer>,
    stop: CancellationToken,
) -> Result<RunSummary> {
    let signal_stop = stop.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("stop signal received");
        signal_stop.cancel();
    });
    Ok(consumer.run(stop).await)
}

/// SIGTERM or Ctrl-C.
pub async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        let cap = Duration::from_secs(30);
        // (attempt, full delay in seconds): the delay is between half of it and all of it.
        for (attempt, secs) in [
            (0, 1),
            (1, 2),
            (2, 4),
            (3, 8),
            (4, 16),
            (5, 30),
            (u32::MAX, 30),
        ] {
            let full = Duration::from_secs(secs);
            for _ in 0..20 {
                let d = backoff_delay(attempt, cap);
                assert!(d >= full / 2 && d <= full, "attempt {attempt}: {d:?}");
            }
        }
        let small = Duration::from_millis(400);
        assert!(backoff_delay(0, small) <= small);
    }
}
