//! The engine on its own OS thread: batches in over a capacity-1 channel (so the batcher can
//! prepare exactly one batch ahead), results out through a oneshot per batch. The thread runs
//! either task's engine ([`Served`]); a diarization engine takes its batch's recordings one
//! at a time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use model_core::speakers::SpeakerSegment;
use model_core::transcript::Hypothesis;
use tokio::sync::{mpsc, oneshot};

use engine::{DiarizationEngine, Engine, EngineError, Fault};

use crate::error::{EXIT_CUDA_FATAL, EXIT_CUDA_OUT_OF_MEMORY};
use crate::fault_injection::PendingFault;

/// The engine a worker serves with: one task per process.
pub enum Served {
    Transcribe(Box<dyn Engine>),
    Diarize(Box<dyn DiarizationEngine>),
}

/// A batch's answers, one per clip, in order.
#[derive(Debug)]
pub enum Answers {
    Hypotheses(Vec<Hypothesis>),
    Segments(Vec<Vec<SpeakerSegment>>),
}

impl Served {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Transcribe(e) => e.name(),
            Self::Diarize(e) => e.name(),
        }
    }

    fn inject_fault(&mut self, fault: Fault) -> Result<(), EngineError> {
        match self {
            Self::Transcribe(e) => e.inject_fault(fault),
            Self::Diarize(e) => Err(EngineError::Unavailable {
                engine: e.name().to_owned(),
                reason: format!("fault injection ({fault:?}) is for transcription workers"),
            }),
        }
    }

    fn run(&mut self, clips: &[&[f32]]) -> Result<Answers, EngineError> {
        match self {
            Self::Transcribe(e) => e.transcribe(clips).map(Answers::Hypotheses),
            Self::Diarize(e) => clips
                .iter()
                .map(|pcm| e.diarize(pcm))
                .collect::<Result<_, _>>()
                .map(Answers::Segments),
        }
    }
}

pub struct EngineJob {
    pub clips: Vec<Arc<Vec<f32>>>,
    pub reply: oneshot::Sender<EngineOutcome>,
}

pub struct EngineOutcome {
    pub result: Result<Answers, EngineError>,
    pub elapsed: Duration,
}

/// What the engine is doing, readable from any thread (for health reports).
#[derive(Debug, Default)]
pub struct EngineStatus {
    /// Milliseconds since `epoch` when the current batch started; 0 when idle.
    busy_since_ms: AtomicU64,
    /// Milliseconds of audio in the current batch (its longest clip).
    busy_audio_ms: AtomicU64,
    batches_done: AtomicU64,
    epoch: Option<Instant>,
}

impl EngineStatus {
    fn new() -> Self {
        Self {
            epoch: Some(Instant::now()),
            ..Self::default()
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch
            .map_or(0, |e| e.elapsed().as_millis() as u64)
            .max(1)
    }

    /// How long the current batch has been running (zero when idle).
    pub fn busy_for(&self) -> Duration {
        match self.busy_since_ms.load(Ordering::Acquire) {
            0 => Duration::ZERO,
            since => Duration::from_millis(self.now_ms().saturating_sub(since)),
        }
    }

    /// The current batch's longest clip: a batch may run that long beyond the wedge limit (a
    /// whole recording of many minutes on a CPU engine is slow, not wedged).
    pub fn busy_audio(&self) -> Duration {
        Duration::from_millis(self.busy_audio_ms.load(Ordering::Acquire))
    }

    pub fn batches_done(&self) -> u64 {
        self.batches_done.load(Ordering::Acquire)
    }
}

/// Exits for a restart when `error` leaves nothing to answer with: a poisoned context, or no
/// device memory (the restart frees it). In-flight requests are re-sent by the supervisor.
fn exit_if_unrecoverable(error: &EngineError) {
    if error.is_fatal() {
        tracing::error!(%error, "fatal CUDA fault: exiting for a restart");
        std::process::exit(EXIT_CUDA_FATAL);
    }
    if error.is_out_of_memory() {
        tracing::error!(%error, "out of device memory: exiting for a restart");
        std::process::exit(EXIT_CUDA_OUT_OF_MEMORY);
    }
}

/// Starts the engine thread. It ends when every sender of the returned channel is dropped,
/// dropping the engine on its way out: join it before the process exits, or the engine's device
/// memory is freed while the CUDA driver shuts down (every free then fails, and says so).
/// A fault `faults` asks for is caused before the next batch (fault drills only).
pub fn spawn(
    mut engine: Served,
    faults: Arc<PendingFault>,
) -> std::io::Result<(
    mpsc::Sender<EngineJob>,
    Arc<EngineStatus>,
    std::thread::JoinHandle<()>,
)> {
    let (tx, mut rx) = mpsc::channel::<EngineJob>(1);
    let status = Arc::new(EngineStatus::new());
    let thread_status = Arc::clone(&status);
    let thread = std::thread::Builder::new()
        .name(format!("engine-{}", engine.name()))
        .spawn(move || {
            while let Some(job) = rx.blocking_recv() {
                let started = Instant::now();
                let longest = job.clips.iter().map(|c| c.len()).max().unwrap_or(0);
                // 16 samples per millisecond at 16 kHz.
                thread_status
                    .busy_audio_ms
                    .store(longest as u64 / 16, Ordering::Release);
                thread_status
                    .busy_since_ms
                    .store(thread_status.now_ms(), Ordering::Release);
                if let Some(fault) = faults.take() {
                    match engine.inject_fault(fault) {
                        Ok(()) => tracing::warn!(?fault, "fault injected"),
                        Err(error) => {
                            tracing::warn!(?fault, %error, "fault injected");
                            exit_if_unrecoverable(&error);
                        }
                    }
                }
                let clips: Vec<&[f32]> = job.clips.iter().map(|c| c.as_slice()).collect();
                let result = engine.run(&clips);
                if let Err(error) = &result {
                    // Nothing on this context can run again; answering would only delay the
                    // group restart.
                    exit_if_unrecoverable(error);
                }
                thread_status.busy_since_ms.store(0, Ordering::Release);
                thread_status.batches_done.fetch_add(1, Ordering::AcqRel);
                // The batcher may have gone (shutdown): nothing to answer then.
                let _ = job.reply.send(EngineOutcome {
                    result,
                    elapsed: started.elapsed(),
                });
            }
        })?;
    Ok((tx, status, thread))
}

/// Waits up to `limit` for the engine thread to end (its current batch, then the engine's
/// release); past that the process exits without it.
pub fn join(thread: std::thread::JoinHandle<()>, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !thread.is_finished() {
        if Instant::now() >= deadline {
            tracing::warn!(
                limit_s = limit.as_secs_f64(),
                "engine thread still busy at shutdown; exiting without releasing the engine"
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if thread.join().is_err() {
        tracing::warn!("engine thread panicked while stopping");
    }
}
