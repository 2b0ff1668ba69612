//! The supervisor: worker slots, their lifecycle, request routing and re-sending.
//!
//! One mutex guards all state; a monitor thread ticks every few ms (start, health, stuck
//! detection, restart), one reader thread per connection delivers answers, and submitters wait
//! on a condvar. Requests are owned by the fleet until answered: a worker that dies only moves
//! them back to the front of the waiting queue.
//!
//! Every slot serves one [`Task`]: a group holds its transcription workers and, with a
//! diarization pool, its diarization workers. Each task has its own waiting queue and a request
//! only ever goes to a worker of its task whose handshake said so.

use std::collections::HashSet;
use std::process::Child;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
pub use worker_protocol::Priority;
use worker_protocol::{
    DeviceReport, DiarizeResponse, ModelInfo, SharedPcm, Task, TranscribeResponse,
    MAX_REQUEST_SAMPLES,
};

use crate::config::FleetConfig;
use crate::error::FleetError;
use crate::events::{FleetEvent, RestartCause};
use crate::metrics::FleetMetrics;
use crate::mps::{self, MpsControl, SystemMps};

mod daemon_restart;
mod observe;
mod restart;
mod routing;
mod state;
mod stop;
mod supervise;

use routing::dispatch;
use state::{Answer, Phase, Request, Shared, Slot, State};
use stop::{stop_children, stop_daemons};
use supervise::monitor_loop;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerPhase {
    /// Not running: waiting for its restart backoff (or the load lock).
    Down,
    /// Spawned, loading and warming up.
    Starting,
    /// Handshaken and serving.
    Ready,
}

/// One slot's state as seen from outside (tests, `/health`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerStatus {
    pub group: String,
    pub gpu: Option<u32>,
    pub slot: usize,
    /// What the slot serves (`transcribe`, `diarize`).
    pub task: Task,
    pub phase: WorkerPhase,
    pub ready: bool,
    pub pid: Option<u32>,
    pub outstanding: usize,
    /// Requests queued inside the worker (its last health report).
    pub queue_depth: u32,
    pub restarts: u32,
    /// Why it was last restarted (a wedge shows here once it has been replaced).
    pub last_restart: Option<RestartCause>,
    /// From the current process's handshake.
    pub engine: Option<String>,
    pub device: Option<DeviceReport>,
}

/// What a fleet runs MPS commands with and where it reports events.
#[derive(Clone)]
pub struct FleetHooks {
    /// [`SystemMps`] in production; tests record the commands instead.
    pub mps: Arc<dyn MpsControl>,
    /// Every [`FleetEvent`], in order (dropped silently once the receiver is gone).
    pub events: Option<Sender<FleetEvent>>,
}

impl Default for FleetHooks {
    fn default() -> Self {
        Self {
            mps: Arc::new(SystemMps::default()),
            events: None,
        }
    }
}

pub struct Fleet {
    shared: Arc<Shared>,
    /// Taken by the first shutdown.
    monitor: Mutex<Option<JoinHandle<()>>>,
}

impl Fleet {
    /// Starts MPS daemons where configured and the monitor thread, which starts the workers.
    pub fn start(config: FleetConfig) -> Result<Self, FleetError> {
        Self::start_with(config, FleetHooks::default())
    }

    /// [`Self::start`] with the given MPS runner and event channel.
    pub fn start_with(config: FleetConfig, hooks: FleetHooks) -> Result<Self, FleetError> {
        config.validate().map_err(FleetError::Config)?;
        std::fs::create_dir_all(&config.runtime_dir)
            .map_err(FleetError::io("creating runtime dir", &config.runtime_dir))?;
        let emit = |event| {
            if let Some(events) = &hooks.events {
                let _ = events.send(event);
            }
        };
        let metrics = FleetMetrics::default();
        // Every group's transcription figures, and its diarization ones with a pool.
        let tasks: &[Task] = match config.diarization {
            Some(_) => &Task::ALL,
            None => &[Task::Transcribe],
        };
        let mut state = State {
            metrics: (config.groups.iter().enumerate())
                .flat_map(|(g, group)| tasks.iter().map(move |&task| (g, group, task)))
                .map(|(g, group, task)| ((g, task), metrics.group(&group.name, task)))
                .collect(),
            ..State::default()
        };
        for (g, group) in config.groups.iter().enumerate() {
            if let (Some(gpu), Some(mps_cfg)) = (group.gpu, &group.mps) {
                let dirs = mps_cfg.dirs(gpu);
                let started = match mps::ensure_daemon(&*hooks.mps, gpu, &dirs) {
                    Ok(started) => started,
                    Err(e) => {
                        // Daemons this call already started are not left behind.
                        stop_daemons(&*hooks.mps, &hooks.events, state.mps_started);
                        return Err(e);
                    }
                };
                tracing::info!(gpu, pipe = %dirs.pipe.display(), started, "MPS control daemon");
                emit(FleetEvent::MpsDaemon {
                    gpu,
                    pipe_directory: dirs.pipe.display().to_string(),
                    log_directory: dirs.log.display().to_string(),
                    started,
                });
                if started {
                    state.mps_started.push((gpu, dirs));
                }
            }
            let diarizers = config.diarization.as_ref().map_or(0, |d| d.instances);
            let transcribers = (0..group.instances).map(|i| (Task::Transcribe, i, ""));
            let diarizers = (0..diarizers).map(|i| (Task::Diarize, i, "diar-"));
            for (task, i, prefix) in transcribers.chain(diarizers) {
                state.slots.push(Slot {
                    group: g,
                    task,
                    socket: config
                        .runtime_dir
                        .join(format!("{}-{prefix}{i}.sock", group.name)),
                    generation: 0,
                    phase: Phase::Down {
                        next_start: Instant::now(),
                    },
                    child: None,
                    conn: None,
                    broken: None,
                    outstanding: HashSet::new(),
                    outstanding_frames: 0,
                    failures: 0,
                    start_failures: 0,
                    stderr_tail: Arc::default(),
                    restarts: 0,
                    ping: None,
                    last_ping: Instant::now(),
                    info: None,
                    last_batch_seq: None,
                    queue_depth: 0,
                    last_restart: None,
                });
            }
        }
        let shared = Arc::new(Shared {
            config,
            metrics,
            state: Mutex::new(state),
            changed: Condvar::new(),
            mps: hooks.mps,
            events: hooks.events,
        });
        let weak = Arc::downgrade(&shared);
        let monitor = std::thread::Builder::new()
            .name("fleet-monitor".into())
            .spawn(move || monitor_loop(weak))
            .map_err(FleetError::io("spawning monitor", "fleet-monitor"))?;
        Ok(Self {
            shared,
            monitor: Mutex::new(Some(monitor)),
        })
    }

    /// Waits until at least one transcription worker is ready; returns the model it serves.
    pub fn wait_ready(&self, timeout: Duration) -> Result<ModelInfo, FleetError> {
        self.wait_for(timeout, |s| s.model.clone())
    }

    /// The error the fleet gave up with, once no worker can start.
    pub fn gave_up(&self) -> Option<FleetError> {
        self.shared
            .lock()
            .cannot_start(self.shared.config.max_start_failures)
    }

    /// Transcription workers ready now (0 while every one restarts, as a GPU group does after
    /// a fault), or the error the fleet gave up with.
    pub fn ready_transcribers(&self) -> Result<usize, FleetError> {
        let state = self.shared.lock();
        if let Some(e) = state.cannot_start(self.shared.config.max_start_failures) {
            return Err(e);
        }
        Ok(state
            .slots
            .iter()
            .filter(|s| s.task == Task::Transcribe && matches!(s.phase, Phase::Ready))
            .count())
    }

    /// Whether this fleet runs diarization workers.
    pub fn has_diarization(&self) -> bool {
        self.shared.config.diarization.is_some()
    }

    /// Waits until at least one diarization worker is ready; returns its model.
    pub fn wait_diarization_ready(&self, timeout: Duration) -> Result<ModelInfo, FleetError> {
        if !self.has_diarization() {
            return Err(no_diarization_pool());
        }
        self.wait_for(timeout, |s| {
            s.slots
                .iter()
                .filter(|slot| slot.task == Task::Diarize && matches!(slot.phase, Phase::Ready))
                .find_map(|slot| slot.info.as_ref().map(|i| i.model.clone()))
        })
    }

    /// Waits until every worker is ready.
    pub fn wait_all_ready(&self, timeout: Duration) -> Result<(), FleetError> {
        self.wait_for(timeout, |s| {
            s.slots
                .iter()
                .all(|slot| matches!(slot.phase, Phase::Ready))
                .then_some(())
        })
    }

    fn wait_for<T>(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&State) -> Option<T>,
    ) -> Result<T, FleetError> {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        loop {
            if let Some(v) = done(&state) {
                return Ok(v);
            }
            if let Some(e) = state.cannot_start(self.shared.config.max_start_failures) {
                return Err(e);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(FleetError::NotReady {
                    waited_ms: timeout.as_millis() as u64,
                });
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Transcribes each clip on some worker; blocks while every worker is full.
    /// One result per clip, in order. Batch priority: see [`Fleet::transcribe_with`]. Each clip
    /// is copied once; [`Fleet::transcribe_with`] takes clips that share their recording.
    pub fn transcribe(&self, clips: &[&[f32]]) -> Vec<Result<TranscribeResponse, FleetError>> {
        let clips: Vec<SharedPcm> = clips.iter().map(|clip| clip.to_vec().into()).collect();
        self.transcribe_with(&clips, Priority::Batch)
    }

    /// As [`Fleet::transcribe`], at `priority`: interactive clips go to a worker before every
    /// waiting batch clip, and the waiting cap (`max_waiting`) counts each priority apart, so a
    /// backfill filling the queue never blocks an interactive submission.
    pub fn transcribe_with(
        &self,
        clips: &[SharedPcm],
        priority: Priority,
    ) -> Vec<Result<TranscribeResponse, FleetError>> {
        let mut ids = Vec::with_capacity(clips.len());
        for clip in clips {
            ids.push(self.submit(Task::Transcribe, priority, clip.clone()));
        }
        ids.into_iter()
            .map(|id| match self.wait_result(id?)? {
                Answer::Transcribed(response) => Ok(response),
                Answer::Diarized(_) => Err(wrong_answer(Task::Transcribe)),
            })
            .collect()
    }

    /// Speaker turns of one whole recording, on the least-loaded diarization worker; blocks
    /// while every diarization worker is full. Re-sent after a worker (or group) restart like a
    /// transcription request.
    pub fn diarize(&self, pcm_16k: SharedPcm) -> Result<DiarizeResponse, FleetError> {
        if !self.has_diarization() {
            return Err(no_diarization_pool());
        }
        let id = self.submit(Task::Diarize, Priority::Batch, pcm_16k)?;
        match self.wait_result(id)? {
            Answer::Diarized(response) => Ok(response),
            Answer::Transcribed(_) => Err(wrong_answer(Task::Diarize)),
        }
    }

    fn submit(&self, task: Task, priority: Priority, pcm: SharedPcm) -> Result<u64, FleetError> {
        // Sent, it would end the connection (and cost the worker a restart) for nothing.
        if pcm.len() > MAX_REQUEST_SAMPLES {
            return Err(FleetError::TooLong {
                samples: pcm.len(),
                max: MAX_REQUEST_SAMPLES,
            });
        }
        let cfg = &self.shared.config;
        let deadline = Instant::now() + cfg.submit_timeout;
        let mut state = self.shared.lock();
        if let Some(e) = state.cannot_start(cfg.max_start_failures) {
            return Err(e);
        }
        while state.waiting.len_of(priority) >= cfg.max_waiting {
            let now = Instant::now();
            if state.shutting_down {
                return Err(FleetError::ShuttingDown);
            }
            if now >= deadline {
                return Err(FleetError::Overloaded {
                    waited_ms: cfg.submit_timeout.as_millis() as u64,
                });
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        state.next_id += 1;
        let id = state.next_id;
        state.requests.insert(
            id,
            Request {
                task,
                priority,
                pcm,
                on: None,
                sent_at: None,
                attempts: 0,
                outcome: None,
                done: Arc::new(Condvar::new()),
            },
        );
        state.waiting.of(task).push_back(id, priority);
        dispatch(&self.shared, &mut state);
        Ok(id)
    }

    fn wait_result(&self, id: u64) -> Result<Answer, FleetError> {
        let mut state = self.shared.lock();
        let Some(done) = state.requests.get(&id).map(|r| r.done.clone()) else {
            return Err(FleetError::ShuttingDown);
        };
        loop {
            let finished = state.requests.get(&id).is_none_or(|r| r.outcome.is_some());
            if finished {
                return match state.requests.remove(&id).and_then(|r| r.outcome) {
                    Some(outcome) => outcome,
                    None => Err(FleetError::ShuttingDown),
                };
            }
            state = done.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Fleet {
    /// Stops every worker (SIGTERM, then SIGKILL after a grace period) and MPS daemons this
    /// fleet started. Waiting submitters get `ShuttingDown`.
    pub fn shutdown(&self) {
        let (children, daemons) = {
            let mut state = self.shared.lock();
            state.shutting_down = true;
            for req in state.requests.values_mut() {
                if req.outcome.is_none() {
                    req.finish(Err(FleetError::ShuttingDown));
                }
            }
            let children: Vec<Child> = state
                .slots
                .iter_mut()
                .filter_map(|s| {
                    if let Some(c) = s.conn.take() {
                        c.close();
                    }
                    s.child.take()
                })
                .collect();
            (children, std::mem::take(&mut state.mps_started))
        };
        self.shared.changed.notify_all();
        let monitor = self
            .monitor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(monitor) = monitor {
            let _ = monitor.join();
        }
        stop_children(children, Duration::from_secs(2));
        stop_daemons(&*self.shared.mps, &self.shared.events, daemons);
        if !std::mem::replace(&mut self.shared.lock().stopped, true) {
            self.shared.emit(FleetEvent::Stopped);
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn no_diarization_pool() -> FleetError {
    FleetError::Config("this fleet has no diarization workers (no diarization model)".into())
}

/// Routing only matches a request with a worker of its task, and each answer is checked
/// against the request's task on arrival; this is the typed error should that ever break.
fn wrong_answer(task: Task) -> FleetError {
    FleetError::Rejected {
        kind: worker_protocol::WireErrorKind::BadRequest,
        message: format!("a {} request got another task's answer (bug)", task.label()),
    }
}
