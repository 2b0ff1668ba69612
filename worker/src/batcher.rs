//! The batcher actor: owns the [`BatchQueue`], hands a batch to the engine thread when the
//! engine is free (not while it still runs the previous one, so requests that arrive meanwhile
//! join the next batch), and fans the results out to the connections that asked.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::OwnedPermit;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use worker_protocol::{
    DiarizeResponse, Priority, RequestId, Timings, TranscribeResponse, WireError, WireErrorKind,
    WorkerMessage,
};

use crate::batch_policy::{BatchQueue, Decision, Queued};
use crate::engine_thread::{Answers, EngineJob, EngineOutcome};

/// A request waiting for a batch.
pub struct Pending {
    pub conn: u64,
    pub id: RequestId,
    pub pcm: Arc<Vec<f32>>,
    pub reply: mpsc::UnboundedSender<WorkerMessage>,
}

pub enum BatcherCommand {
    Submit {
        pending: Pending,
        frames: usize,
        deadline: Option<Instant>,
        priority: Priority,
    },
    Cancel {
        conn: u64,
        id: RequestId,
    },
}

pub fn error_message(id: RequestId, kind: WireErrorKind, message: String) -> WorkerMessage {
    WorkerMessage::Error {
        id: Some(id),
        error: WireError { kind, message },
    }
}

/// Shared counters for health reports.
#[derive(Debug, Default)]
pub struct QueueStats {
    pub depth: AtomicUsize,
}

pub struct Batcher {
    queue: BatchQueue<Pending>,
    max_queue: usize,
    next_key: u64,
    /// Batches handed to the engine so far (the `batch_seq` of the answers).
    batches_sent: u64,
    stats: Arc<QueueStats>,
}

impl Batcher {
    pub fn new(queue: BatchQueue<Pending>, max_queue: usize, stats: Arc<QueueStats>) -> Self {
        Self {
            queue,
            max_queue,
            next_key: 0,
            batches_sent: 0,
            stats,
        }
    }

    fn apply(&mut self, command: BatcherCommand) {
        match command {
            BatcherCommand::Submit {
                pending,
                frames,
                deadline,
                priority,
            } => {
                if self.queue.len() >= self.max_queue {
                    let msg = error_message(
                        pending.id,
                        WireErrorKind::Overloaded,
                        format!("queue full ({} requests)", self.max_queue),
                    );
                    let _ = pending.reply.send(msg);
                    return;
                }
                self.next_key += 1;
                self.queue.push(Queued {
                    key: self.next_key,
                    frames,
                    arrived: Instant::now(),
                    deadline,
                    priority,
                    payload: pending,
                });
            }
            BatcherCommand::Cancel { conn, id } => {
                for q in self
                    .queue
                    .retain(|q| !(q.payload.conn == conn && q.payload.id == id))
                {
                    let msg = error_message(id, WireErrorKind::Cancelled, "cancelled".into());
                    let _ = q.payload.reply.send(msg);
                }
            }
        }
    }

    /// Drops requests whose connection is gone and answers expired ones.
    fn prune(&mut self, now: Instant) {
        self.queue.retain(|q| !q.payload.reply.is_closed());
        for q in self.queue.take_expired(now) {
            let msg = error_message(
                q.payload.id,
                WireErrorKind::DeadlineExceeded,
                "deadline passed before the request was batched".into(),
            );
            let _ = q.payload.reply.send(msg);
        }
    }

    /// Runs until every command sender is dropped.
    pub async fn run(
        mut self,
        mut commands: mpsc::Receiver<BatcherCommand>,
        engine: mpsc::Sender<EngineJob>,
    ) {
        // One permit: held from forming a batch until its answers are back.
        let engine_free = Arc::new(Semaphore::new(1));
        let mut permit = None;
        loop {
            self.stats.depth.store(self.queue.len(), Ordering::Release);
            let Some((free, slot)) = permit.take() else {
                // Wait for the engine to be free, still taking commands.
                tokio::select! {
                    reserved = reserve(&engine_free, &engine) => match reserved {
                        Some(p) => permit = Some(p),
                        None => return, // engine thread gone
                    },
                    command = commands.recv() => match command {
                        Some(c) => self.apply(c),
                        None => return,
                    },
                }
                continue;
            };
            let now = Instant::now();
            self.prune(now);
            match self.queue.next_batch(now) {
                Decision::Run(batch) => {
                    let (reply, outcome) = oneshot::channel();
                    let clips = batch.iter().map(|q| Arc::clone(&q.payload.pcm)).collect();
                    slot.send(EngineJob { clips, reply });
                    self.batches_sent += 1;
                    tokio::spawn(fan_out(batch, self.batches_sent, outcome, free));
                }
                Decision::WaitUntil(due) => {
                    permit = Some((free, slot));
                    tokio::select! {
                        command = commands.recv() => match command {
                            Some(c) => self.apply(c),
                            None => return,
                        },
                        () = tokio::time::sleep_until(due.into()) => {}
                    }
                }
                Decision::Empty => {
                    permit = Some((free, slot));
                    match commands.recv().await {
                        Some(c) => self.apply(c),
                        None => return,
                    }
                }
            }
        }
    }
}

/// The engine-free permit, then the engine channel's slot (free by then). `None`: the engine
/// thread is gone.
async fn reserve(
    engine_free: &Arc<Semaphore>,
    engine: &mpsc::Sender<EngineJob>,
) -> Option<(OwnedSemaphorePermit, OwnedPermit<EngineJob>)> {
    let free = Arc::clone(engine_free).acquire_owned().await.ok()?;
    let slot = engine.clone().reserve_owned().await.ok()?;
    Some((free, slot))
}

async fn fan_out(
    batch: Vec<Queued<Pending>>,
    batch_seq: u64,
    outcome: oneshot::Receiver<EngineOutcome>,
    engine_free: OwnedSemaphorePermit,
) {
    let started = Instant::now();
    let outcome = outcome.await;
    // The engine is free again: the batcher may form the next batch now.
    drop(engine_free);
    let Ok(outcome) = outcome else {
        // The engine thread died mid-batch: this process can no longer serve. Exiting lets the
        // supervisor restart it and re-send these requests elsewhere.
        tracing::error!("engine thread ended without answering a batch; exiting");
        std::process::exit(70);
    };
    let longest = batch.iter().map(|q| q.frames).max().unwrap_or(0);
    let batch_frames: usize = batch.iter().map(|q| q.frames).sum();
    let timings = |q: &Queued<Pending>| Timings {
        queue_us: started.saturating_duration_since(q.arrived).as_micros() as u64,
        batch_us: outcome.elapsed.as_micros() as u64,
        batch_size: batch.len() as u32,
        padded_frames: (longest * batch.len()) as u64,
        batch_frames: batch_frames as u64,
        batch_seq,
    };
    match outcome.result {
        Ok(Answers::Segments(per_clip)) => {
            for (q, segments) in batch.iter().zip(per_clip) {
                let response = DiarizeResponse {
                    id: q.payload.id,
                    segments,
                    timings: timings(q),
                };
                let _ = q.payload.reply.send(WorkerMessage::Diarized(response));
            }
        }
        Ok(Answers::Hypotheses(hyps)) => {
            for (q, hypothesis) in batch.iter().zip(hyps) {
                let response = TranscribeResponse {
                    id: q.payload.id,
                    hypothesis,
                    timings: timings(q),
                };
                let _ = q.payload.reply.send(WorkerMessage::Result(response));
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, size = batch.len(), "batch failed");
            for q in &batch {
                let msg = error_message(q.payload.id, WireErrorKind::Inference, e.to_string());
                let _ = q.payload.reply.send(msg);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a panic is the failure report

    use std::time::Duration;

    use model_core::transcript::Hypothesis;

    use super::*;
    use crate::batch_policy::BatchPolicyConfig;

    fn submit(id: u64, reply: &mpsc::UnboundedSender<WorkerMessage>) -> BatcherCommand {
        BatcherCommand::Submit {
            pending: Pending {
                conn: 1,
                id,
                pcm: Arc::new(vec![0.0; 1600]),
                reply: reply.clone(),
            },
            frames: 11,
            deadline: None,
            priority: Priority::Batch,
        }
    }

    /// With no batch wait, requests that arrive while the engine runs a batch wait for it to
    /// finish and then go together; none is handed over early in a batch of its own.
    #[tokio::test]
    async fn the_next_batch_forms_when_the_engine_is_free() {
        let config = BatchPolicyConfig::new(vec![4, 8, 16], Duration::ZERO, 1_000_000).unwrap();
        let batcher = Batcher::new(BatchQueue::new(config), 64, Arc::default());
        let (commands, command_rx) = mpsc::channel(64);
        let (engine_tx, mut engine_rx) = mpsc::channel::<EngineJob>(1);
        tokio::spawn(batcher.run(command_rx, engine_tx));
        let (reply, mut answers) = mpsc::unbounded_channel();

        commands.send(submit(0, &reply)).await.unwrap();
        let first = engine_rx.recv().await.unwrap();
        assert_eq!(first.clips.len(), 1, "a lone request runs at once");
        for id in 1..8 {
            commands.send(submit(id, &reply)).await.unwrap();
        }
        let early = tokio::time::timeout(Duration::from_millis(200), engine_rx.recv()).await;
        assert!(
            early.is_err(),
            "a batch was handed over while the engine was busy"
        );

        let outcome = EngineOutcome {
            result: Ok(Answers::Hypotheses(vec![Hypothesis::default()])),
            elapsed: Duration::ZERO,
        };
        assert!(first.reply.send(outcome).is_ok());
        assert!(matches!(
            answers.recv().await,
            Some(WorkerMessage::Result(r)) if r.id == 0
        ));
        let second = engine_rx.recv().await.unwrap();
        assert_eq!(
            second.clips.len(),
            7,
            "everything that queued meanwhile, together"
        );
    }
}
