//! The supervisor: worker slots, their lifecycle, request routing and re-sending.
//!
//! One mutex guards all state; a monitor thread ticks every few ms (start, health, stuck
//! detection, restart), one reader thread per connection delivers answers, and submitters wait
//! on a condvar. Requests are owned by the fleet until answered: a worker that dies only moves
//! them back to the front of the waiting queue.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::process::Child;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use worker_protocol::{ModelInfo, TranscribeResponse};

use crate::client::Connection;
use crate::config::FleetConfig;
use crate::error::FleetError;
use crate::load_lock::LoadLock;
use crate::mps;

mod routing;
mod supervise;

use routing::dispatch;
use supervise::monitor_loop;

const TICK: Duration = Duration::from_millis(20);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// Hop of the 16 kHz features: the routing cost of a request in feature frames.
const HOP_SAMPLES: usize = 160;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RestartCause {
    /// The process exited or its connection broke.
    Crashed,
    /// No answer to a request or a health ping in time (e.g. SIGSTOP, a hung kernel).
    Stuck,
    /// The worker reported itself wedged.
    Wedged,
    /// Restarted because another worker of its MPS group failed.
    Group,
    /// Did not become ready within the startup timeout.
    StartFailed,
}

/// One slot's state as seen from outside (tests, `/health`).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerStatus {
    pub group: String,
    pub slot: usize,
    pub ready: bool,
    pub pid: Option<u32>,
    pub outstanding: usize,
    pub restarts: u32,
}

enum Phase {
    Down { next_start: Instant },
    Starting { since: Instant, _lock: LoadLock },
    Ready,
}

struct Slot {
    group: usize,
    socket: PathBuf,
    generation: u64,
    phase: Phase,
    child: Option<Child>,
    conn: Option<Arc<Connection>>,
    /// Set when the connection failed; the monitor restarts the worker for this cause.
    broken: Option<RestartCause>,
    outstanding: HashSet<u64>,
    outstanding_frames: usize,
    failures: u32,
    restarts: u32,
    ping: Option<(u64, Instant)>,
    last_ping: Instant,
}

struct Request {
    pcm: Arc<Vec<f32>>,
    on: Option<(usize, u64)>,
    sent_at: Option<Instant>,
    attempts: u32,
    outcome: Option<Result<TranscribeResponse, FleetError>>,
}

#[derive(Default)]
struct State {
    slots: Vec<Slot>,
    requests: HashMap<u64, Request>,
    waiting: VecDeque<u64>,
    next_id: u64,
    shutting_down: bool,
    restarts: HashMap<RestartCause, u64>,
    model: Option<ModelInfo>,
    mps_started: Vec<(u32, mps::MpsDirs)>,
}

struct Shared {
    config: FleetConfig,
    state: Mutex<State>,
    changed: Condvar,
}

pub struct Fleet {
    shared: Arc<Shared>,
    monitor: Option<JoinHandle<()>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock would be a bug; keep serving rather than cascade.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Fleet {
    /// Starts MPS daemons where configured and the monitor thread, which starts the workers.
    pub fn start(config: FleetConfig) -> Result<Self, FleetError> {
        config.validate().map_err(FleetError::Config)?;
        std::fs::create_dir_all(&config.runtime_dir)
            .map_err(FleetError::io("creating runtime dir", &config.runtime_dir))?;
        let mut state = State::default();
        for (g, group) in config.groups.iter().enumerate() {
            if let (Some(gpu), Some(mps_cfg)) = (group.gpu, &group.mps) {
                let dirs = mps_cfg.dirs(gpu);
                if mps::ensure_daemon(gpu, &dirs)? {
                    state.mps_started.push((gpu, dirs));
                }
            }
            for i in 0..group.instances {
                state.slots.push(Slot {
                    group: g,
                    socket: config.runtime_dir.join(format!("{}-{i}.sock", group.name)),
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
                    restarts: 0,
                    ping: None,
                    last_ping: Instant::now(),
                });
            }
        }
        let shared = Arc::new(Shared {
            config,
            state: Mutex::new(state),
            changed: Condvar::new(),
        });
        let weak = Arc::downgrade(&shared);
        let monitor = std::thread::Builder::new()
            .name("fleet-monitor".into())
            .spawn(move || monitor_loop(weak))
            .map_err(FleetError::io("spawning monitor", "fleet-monitor"))?;
        Ok(Self {
            shared,
            monitor: Some(monitor),
        })
    }

    /// Waits until at least one worker is ready; returns the model it serves.
    pub fn wait_ready(&self, timeout: Duration) -> Result<ModelInfo, FleetError> {
        self.wait_for(timeout, |s| s.model.clone())
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
    /// One result per clip, in order.
    pub fn transcribe(&self, clips: &[&[f32]]) -> Vec<Result<TranscribeResponse, FleetError>> {
        let mut ids = Vec::with_capacity(clips.len());
        for clip in clips {
            match self.submit(clip) {
                Ok(id) => ids.push(Ok(id)),
                Err(e) => ids.push(Err(e)),
            }
        }
        ids.into_iter()
            .map(|id| id.and_then(|id| self.wait_result(id)))
            .collect()
    }

    fn submit(&self, clip: &[f32]) -> Result<u64, FleetError> {
        let cfg = &self.shared.config;
        let deadline = Instant::now() + cfg.submit_timeout;
        let mut state = self.shared.lock();
        while state.waiting.len() >= cfg.max_waiting {
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
                pcm: Arc::new(clip.to_vec()),
                on: None,
                sent_at: None,
                attempts: 0,
                outcome: None,
            },
        );
        state.waiting.push_back(id);
        dispatch(&self.shared, &mut state);
        Ok(id)
    }

    fn wait_result(&self, id: u64) -> Result<TranscribeResponse, FleetError> {
        let mut state = self.shared.lock();
        loop {
            let done = state.requests.get(&id).is_none_or(|r| r.outcome.is_some());
            if done {
                return match state.requests.remove(&id).and_then(|r| r.outcome) {
                    Some(outcome) => outcome,
                    None => Err(FleetError::ShuttingDown),
                };
            }
            state = self
                .shared
                .changed
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
        }
    }

    pub fn status(&self) -> Vec<WorkerStatus> {
        let state = self.shared.lock();
        state
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| WorkerStatus {
                group: self.shared.config.groups[s.group].name.clone(),
                slot: i,
                ready: matches!(s.phase, Phase::Ready),
                pid: s.child.as_ref().map(Child::id),
                outstanding: s.outstanding.len(),
                restarts: s.restarts,
            })
            .collect()
    }

    pub fn restarts(&self, cause: RestartCause) -> u64 {
        self.shared
            .lock()
            .restarts
            .get(&cause)
            .copied()
            .unwrap_or(0)
    }

    /// Stops every worker (SIGTERM, then SIGKILL after a grace period) and MPS daemons this
    /// fleet started. Waiting submitters get `ShuttingDown`.
    pub fn shutdown(&mut self) {
        let (children, daemons) = {
            let mut state = self.shared.lock();
            state.shutting_down = true;
            for req in state.requests.values_mut() {
                if req.outcome.is_none() {
                    req.outcome = Some(Err(FleetError::ShuttingDown));
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
        if let Some(monitor) = self.monitor.take() {
            let _ = monitor.join();
        }
        stop_children(children, Duration::from_secs(2));
        for (gpu, dirs) in daemons {
            if let Err(e) = mps::daemon_stop(gpu, &dirs).run() {
                tracing::warn!(gpu, error = %e, "stopping MPS daemon");
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn signal(child: &Child, sig: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, sig);
    }
}

fn stop_children(mut children: Vec<Child>, grace: Duration) {
    for c in &children {
        signal(c, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        children.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
        if children.is_empty() {
            return;
        }
        std::thread::sleep(TICK);
    }
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}
