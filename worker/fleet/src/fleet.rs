//! The supervisor: worker slots, their lifecycle, request routing and re-sending.
//!
//! One mutex guards all state; a monitor thread ticks every few ms (start, health, stuck
//! detection, restart), one reader thread per connection delivers answers, and submitters wait
//! on a condvar. Requests are owned by the fleet until answered: a worker that dies only moves
//! them back to the front of the waiting queue.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use worker_protocol::{
    Audio, ClientMessage, ModelInfo, TranscribeRequest, TranscribeResponse, WireErrorKind,
    WorkerMessage, WorkerState,
};

use crate::client::{Connection, Opened, WriteFailure};
use crate::config::FleetConfig;
use crate::error::FleetError;
use crate::load_lock::LoadLock;
use crate::mps;

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

/// Sends waiting requests to the ready worker with the least outstanding work that has room.
fn dispatch(shared: &Shared, state: &mut State) {
    let max = shared.config.max_outstanding_per_worker;
    while let Some(&id) = state.waiting.front() {
        let target = state
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s.phase, Phase::Ready) && s.broken.is_none())
            .filter(|(_, s)| s.outstanding.len() < max)
            .min_by_key(|(_, s)| (s.outstanding_frames, s.outstanding.len()))
            .map(|(i, _)| i);
        let Some(slot_index) = target else {
            return;
        };
        state.waiting.pop_front();
        let Some(req) = state.requests.get_mut(&id) else {
            continue;
        };
        if req.outcome.is_some() {
            continue;
        }
        let slot = &mut state.slots[slot_index];
        let message = ClientMessage::Transcribe(TranscribeRequest {
            id,
            audio: Audio::Pcm16k(req.pcm.to_vec()),
            deadline_ms: None,
        });
        req.on = Some((slot_index, slot.generation));
        req.sent_at = Some(Instant::now());
        slot.outstanding.insert(id);
        slot.outstanding_frames += req.pcm.len() / HOP_SAMPLES + 1;
        if let Err(cause) = send(slot.conn.as_deref(), message) {
            // The monitor restarts it and re-queues what it held, this request included.
            slot.broken = Some(cause);
        }
    }
}

/// Queues a message for a worker's writer thread (never blocks).
fn send(conn: Option<&Connection>, message: ClientMessage) -> Result<(), RestartCause> {
    conn.ok_or(RestartCause::Crashed)?
        .send(message)
        .map_err(|_| RestartCause::Crashed)
}

/// Takes a request off its slot's books.
fn unassign(state: &mut State, id: u64) {
    let Some(req) = state.requests.get_mut(&id) else {
        return;
    };
    if let Some((slot, _)) = req.on.take() {
        let s = &mut state.slots[slot];
        if s.outstanding.remove(&id) {
            s.outstanding_frames = s
                .outstanding_frames
                .saturating_sub(req.pcm.len() / HOP_SAMPLES + 1);
        }
    }
}

fn on_message(shared: &Shared, slot: usize, generation: u64, message: WorkerMessage) {
    let mut state = shared.lock();
    if state.slots[slot].generation != generation {
        return; // a message from a worker already replaced
    }
    match message {
        WorkerMessage::Result(response) => {
            let id = response.id;
            let ours = state
                .requests
                .get(&id)
                .is_some_and(|r| r.on == Some((slot, generation)));
            if ours {
                unassign(&mut state, id);
                state.slots[slot].failures = 0;
                if let Some(req) = state.requests.get_mut(&id) {
                    req.outcome = Some(Ok(response));
                }
            }
        }
        WorkerMessage::Error {
            id: Some(id),
            error,
        } => {
            let ours = state
                .requests
                .get(&id)
                .is_some_and(|r| r.on == Some((slot, generation)));
            if ours {
                unassign(&mut state, id);
                match error.kind {
                    // Not this request's fault: try again elsewhere.
                    WireErrorKind::Overloaded | WireErrorKind::ShuttingDown => {
                        state.waiting.push_front(id)
                    }
                    kind => {
                        if let Some(req) = state.requests.get_mut(&id) {
                            req.outcome = Some(Err(FleetError::Rejected {
                                kind,
                                message: error.message,
                            }));
                        }
                    }
                }
            }
        }
        WorkerMessage::Error { id: None, error } => {
            tracing::warn!(slot, ?error.kind, message = %error.message, "worker dropped us");
            state.slots[slot].broken = Some(RestartCause::Crashed);
        }
        WorkerMessage::Health(report) => {
            let s = &mut state.slots[slot];
            if s.ping.is_some_and(|(nonce, _)| nonce == report.nonce) {
                s.ping = None;
            }
            if report.state == WorkerState::Wedged {
                fail_slot(shared, &mut state, slot, RestartCause::Wedged);
            }
        }
        WorkerMessage::Hello { .. } => state.slots[slot].broken = Some(RestartCause::Crashed),
    }
    dispatch(shared, &mut state);
    drop(state);
    shared.changed.notify_all();
}

/// Kills the slot's worker, re-queues what it held and schedules a restart with backoff. In an
/// MPS group the other workers of the GPU go too: the fault reached them as well.
fn fail_slot(shared: &Shared, state: &mut State, slot: usize, cause: RestartCause) {
    let group = state.slots[slot].group;
    let whole_group = shared.config.groups[group].mps.is_some() && cause != RestartCause::Group;
    take_down(shared, state, slot, cause);
    if whole_group {
        for other in 0..state.slots.len() {
            if other != slot
                && state.slots[other].group == group
                && !matches!(state.slots[other].phase, Phase::Down { .. })
            {
                take_down(shared, state, other, RestartCause::Group);
            }
        }
    }
}

fn take_down(shared: &Shared, state: &mut State, slot: usize, cause: RestartCause) {
    tracing::warn!(slot, ?cause, "restarting worker");
    *state.restarts.entry(cause).or_default() += 1;
    let s = &mut state.slots[slot];
    if let Some(conn) = s.conn.take() {
        conn.close();
    }
    if let Some(mut child) = s.child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let _ = std::fs::remove_file(&s.socket);
    s.generation += 1;
    s.broken = None;
    s.ping = None;
    s.failures += 1;
    s.restarts += 1;
    s.phase = Phase::Down {
        next_start: Instant::now() + shared.config.restart_backoff.delay(s.failures),
    };
    let held: Vec<u64> = s.outstanding.drain().collect();
    s.outstanding_frames = 0;
    let max_attempts = shared.config.max_attempts;
    // Oldest first back to the front of the queue.
    let mut held: Vec<u64> = held;
    held.sort_unstable_by(|a, b| b.cmp(a));
    for id in held {
        if let Some(req) = state.requests.get_mut(&id) {
            req.on = None;
            req.attempts += 1;
            if req.attempts >= max_attempts {
                req.outcome = Some(Err(FleetError::PoisonRequest {
                    attempts: req.attempts,
                }));
            } else {
                state.waiting.push_front(id);
            }
        }
    }
}

fn spawn_worker(shared: &Shared, slot: &Slot) -> std::io::Result<Child> {
    let cfg = &shared.config;
    let group = &cfg.groups[slot.group];
    let _ = std::fs::remove_file(&slot.socket);
    Command::new(&cfg.worker_binary)
        .arg("serve")
        .arg("--socket")
        .arg(&slot.socket)
        .arg("--model")
        .arg(&cfg.model)
        .arg("--engine")
        .arg(&cfg.engine)
        .args(&cfg.worker_args)
        .envs(mps::worker_env(
            group.gpu,
            group.instances,
            group.mps.as_ref(),
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
}

fn monitor_loop(shared: Weak<Shared>) {
    loop {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let connect = {
            let mut state = shared.lock();
            if state.shutting_down {
                return;
            }
            tick(&shared, &mut state)
        };
        for (slot, generation, socket) in connect {
            try_connect(&shared, slot, generation, &socket);
        }
        {
            let mut state = shared.lock();
            dispatch(&shared, &mut state);
        }
        shared.changed.notify_all();
        drop(shared);
        std::thread::sleep(TICK);
    }
}

/// One pass over the slots; returns the starting slots whose socket has appeared (connected
/// outside the lock).
fn tick(shared: &Shared, state: &mut State) -> Vec<(usize, u64, PathBuf)> {
    let cfg = &shared.config;
    let now = Instant::now();
    let mut connect = Vec::new();
    for i in 0..state.slots.len() {
        let exited = state.slots[i]
            .child
            .as_mut()
            .is_some_and(|c| !matches!(c.try_wait(), Ok(None)));
        let s = &state.slots[i];
        match &s.phase {
            Phase::Ready => {
                let oldest = s
                    .outstanding
                    .iter()
                    .filter_map(|id| state.requests.get(id).and_then(|r| r.sent_at))
                    .min();
                if exited {
                    fail_slot(shared, state, i, RestartCause::Crashed);
                } else if let Some(cause) = s.broken {
                    fail_slot(shared, state, i, cause);
                } else if s.ping.is_some_and(|(_, at)| now - at > cfg.health_timeout)
                    || oldest.is_some_and(|at| now - at > cfg.request_timeout)
                {
                    fail_slot(shared, state, i, RestartCause::Stuck);
                } else if s.ping.is_none() && now - s.last_ping >= cfg.health_interval {
                    let nonce = now.elapsed().as_nanos() as u64 ^ (i as u64) << 48 ^ s.generation;
                    let sent = send(s.conn.as_deref(), ClientMessage::Health { nonce });
                    let s = &mut state.slots[i];
                    s.last_ping = now;
                    s.ping = Some((nonce, now));
                    if let Err(cause) = sent {
                        s.broken = Some(cause);
                    }
                }
            }
            Phase::Starting { since, .. } => {
                if exited || now - *since > cfg.startup_timeout {
                    fail_slot(shared, state, i, RestartCause::StartFailed);
                } else if s.socket.exists() {
                    connect.push((i, s.generation, s.socket.clone()));
                }
            }
            Phase::Down { next_start } => {
                if now < *next_start {
                    continue;
                }
                // One model load at a time, across every supervisor sharing the lock file.
                let lock = match LoadLock::try_acquire(&cfg.load_lock) {
                    Ok(Some(lock)) => lock,
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::error!(error = %e, "load lock");
                        continue;
                    }
                };
                match spawn_worker(shared, s) {
                    Ok(child) => {
                        let s = &mut state.slots[i];
                        s.child = Some(child);
                        s.phase = Phase::Starting {
                            since: now,
                            _lock: lock,
                        };
                    }
                    Err(e) => {
                        tracing::error!(error = %e, binary = %cfg.worker_binary.display(),
                            "spawning worker");
                        let s = &mut state.slots[i];
                        s.failures += 1;
                        s.phase = Phase::Down {
                            next_start: now + cfg.restart_backoff.delay(s.failures),
                        };
                    }
                }
            }
        }
    }
    connect
}

fn try_connect(shared: &Arc<Shared>, slot: usize, generation: u64, socket: &std::path::Path) {
    let opened = Opened::connect(socket, HANDSHAKE_TIMEOUT);
    let mut state = shared.lock();
    let current = state.slots[slot].generation == generation
        && matches!(state.slots[slot].phase, Phase::Starting { .. });
    let opened = match opened {
        Ok(opened) if current => opened,
        Ok(stale) => return stale.close(),
        Err(e) => {
            tracing::debug!(slot, error = %e, "worker not accepting yet");
            return;
        }
    };
    let info = opened.info.clone();
    let (on_msg, on_end) = (Arc::downgrade(shared), Arc::downgrade(shared));
    let started = opened.start(
        &format!("fleet-{slot}"),
        move |message| {
            if let Some(shared) = on_msg.upgrade() {
                on_message(&shared, slot, generation, message);
            }
        },
        move |failure, detail| {
            let Some(shared) = on_end.upgrade() else {
                return;
            };
            let mut state = shared.lock();
            let s = &mut state.slots[slot];
            if s.generation == generation && s.broken.is_none() {
                tracing::warn!(slot, ?failure, %detail, "worker connection ended");
                s.broken = Some(match failure {
                    WriteFailure::Stalled => RestartCause::Stuck,
                    WriteFailure::Broken => RestartCause::Crashed,
                });
            }
        },
    );
    let conn = match started {
        Ok(conn) => conn,
        Err(e) => {
            tracing::error!(slot, error = %e, "starting connection threads");
            return;
        }
    };
    let s = &mut state.slots[slot];
    s.conn = Some(Arc::new(conn));
    s.phase = Phase::Ready; // drops the load lock: the next worker may load
    s.last_ping = Instant::now();
    if state.model.is_none() {
        state.model = Some(info.model);
    }
    tracing::info!(slot, pid = info.pid, "worker ready");
}
