//! The supervisor's shared state: slots, requests, the waiting queues, and the constants the
//! monitor, routing and stopping code share.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::process::Child;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use worker_protocol::{
    DiarizeResponse, ModelInfo, SharedPcm, Task, TranscribeResponse, WorkerInfo,
};

use crate::client::Connection;
use crate::config::FleetConfig;
use crate::error::FleetError;
use crate::events::{FleetEvent, RestartCause};
use crate::load_lock::LoadLock;
use crate::metrics::{FleetMetrics, GroupMetrics};
use crate::mps::{self, MpsControl};
use worker_protocol::Priority;

pub(super) const TICK: Duration = Duration::from_millis(20);
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// Hop of the 16 kHz features: the routing cost of a request in feature frames.
pub(super) const HOP_SAMPLES: usize = 160;

pub(super) enum Phase {
    Down { next_start: Instant },
    Starting { since: Instant, _lock: LoadLock },
    Ready,
}

pub(super) struct Slot {
    pub(super) group: usize,
    pub(super) task: Task,
    pub(super) socket: PathBuf,
    pub(super) generation: u64,
    pub(super) phase: Phase,
    pub(super) child: Option<Child>,
    pub(super) conn: Option<Arc<Connection>>,
    /// Set when the connection failed; the monitor restarts the worker for this cause.
    pub(super) broken: Option<RestartCause>,
    pub(super) outstanding: HashSet<u64>,
    pub(super) outstanding_frames: usize,
    pub(super) failures: u32,
    /// Failed starts since this slot was last ready.
    pub(super) start_failures: u32,
    /// The last lines its current or last process wrote to stderr (forwarded to ours).
    pub(super) stderr_tail: Arc<Mutex<VecDeque<String>>>,
    pub(super) restarts: u32,
    pub(super) ping: Option<(u64, Instant)>,
    pub(super) last_ping: Instant,
    /// The current process's handshake.
    pub(super) info: Option<WorkerInfo>,
    /// The last batch counted in the metrics (a new process starts again from 1).
    pub(super) last_batch_seq: Option<u64>,
    pub(super) queue_depth: u32,
    pub(super) last_restart: Option<RestartCause>,
}

pub(super) struct Request {
    pub(super) task: Task,
    pub(super) priority: Priority,
    pub(super) pcm: SharedPcm,
    pub(super) on: Option<(usize, u64)>,
    pub(super) sent_at: Option<Instant>,
    pub(super) attempts: u32,
    pub(super) outcome: Option<Result<Answer, FleetError>>,
    /// Signalled when `outcome` is set: only this request's caller waits on it, so an answer
    /// wakes one thread, not every caller with a request in flight.
    pub(super) done: Arc<Condvar>,
}

impl Request {
    /// Records the outcome and wakes the caller waiting for it.
    pub(super) fn finish(&mut self, outcome: Result<Answer, FleetError>) {
        self.outcome = Some(outcome);
        self.done.notify_all();
    }
}

/// A worker's answer, of the request's task.
pub(super) enum Answer {
    Transcribed(TranscribeResponse),
    Diarized(DiarizeResponse),
}

/// Requests waiting for a worker, one queue per task (a full diarization pool never holds up
/// transcription, nor the reverse).
#[derive(Default)]
pub(super) struct Waiting {
    transcribe: Lanes,
    diarize: Lanes,
}

impl Waiting {
    pub(super) fn of(&mut self, task: Task) -> &mut Lanes {
        match task {
            Task::Transcribe => &mut self.transcribe,
            Task::Diarize => &mut self.diarize,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.transcribe.len() + self.diarize.len()
    }

    /// Waiting requests of this priority (what the submit cap counts for it).
    pub(super) fn len_of(&self, priority: Priority) -> usize {
        self.transcribe.lane(priority).len() + self.diarize.lane(priority).len()
    }
}

/// One task's waiting requests: every interactive one goes to a worker before any batch one
/// (each lane oldest first), so a backfill queued here does not delay an API request.
#[derive(Default)]
pub(super) struct Lanes {
    interactive: VecDeque<u64>,
    batch: VecDeque<u64>,
}

impl Lanes {
    fn lane(&self, priority: Priority) -> &VecDeque<u64> {
        match priority {
            Priority::Interactive => &self.interactive,
            Priority::Batch => &self.batch,
        }
    }

    fn lane_mut(&mut self, priority: Priority) -> &mut VecDeque<u64> {
        match priority {
            Priority::Interactive => &mut self.interactive,
            Priority::Batch => &mut self.batch,
        }
    }

    /// The next request to send.
    pub(super) fn front(&self) -> Option<&u64> {
        self.interactive.front().or(self.batch.front())
    }

    pub(super) fn pop_front(&mut self) -> Option<u64> {
        self.interactive
            .pop_front()
            .or_else(|| self.batch.pop_front())
    }

    /// A new request, behind the others of its priority.
    pub(super) fn push_back(&mut self, id: u64, priority: Priority) {
        self.lane_mut(priority).push_back(id);
    }

    /// A request sent back (its worker failed or was full): first of its priority again.
    pub(super) fn push_front(&mut self, id: u64, priority: Priority) {
        self.lane_mut(priority).push_front(id);
    }

    pub(super) fn len(&self) -> usize {
        self.interactive.len() + self.batch.len()
    }
}

#[derive(Default)]
pub(super) struct State {
    pub(super) slots: Vec<Slot>,
    pub(super) requests: HashMap<u64, Request>,
    pub(super) waiting: Waiting,
    pub(super) next_id: u64,
    pub(super) shutting_down: bool,
    /// `Stopped` was reported (shutdown runs again on drop).
    pub(super) stopped: bool,
    pub(super) restarts: HashMap<RestartCause, u64>,
    /// Batch figures by group index and task (a task without workers has none).
    pub(super) metrics: HashMap<(usize, Task), GroupMetrics>,
    /// The transcription model, from the first transcription worker's handshake.
    pub(super) model: Option<ModelInfo>,
    pub(super) mps_started: Vec<(u32, mps::MpsDirs)>,
    /// Set when every transcription slot has failed `max_start_failures` starts in a row:
    /// the last worker's error. Nothing is started again; requests fail with it.
    pub(super) gave_up: Option<String>,
    /// Groups whose MPS daemon was restarted since one of their workers was last ready.
    pub(super) daemon_restarted: HashSet<usize>,
}

impl State {
    pub(super) fn cannot_start(&self, tries: u32) -> Option<FleetError> {
        self.gave_up
            .as_ref()
            .map(|detail| FleetError::WorkersCannotStart {
                tries,
                detail: detail.clone(),
            })
    }
}

pub(super) struct Shared {
    pub(super) config: FleetConfig,
    pub(super) metrics: FleetMetrics,
    pub(super) state: Mutex<State>,
    pub(super) changed: Condvar,
    pub(super) mps: Arc<dyn MpsControl>,
    pub(super) events: Option<Sender<FleetEvent>>,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock would be a bug; keep serving rather than cascade.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn emit(&self, event: FleetEvent) {
        if let Some(events) = &self.events {
            let _ = events.send(event);
        }
    }
}
