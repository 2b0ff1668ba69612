//! Worker lifecycle: spawn under the load lock, connect, health-check, take down and restart.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Weak};
use std::time::Instant;

use worker_protocol::{ClientMessage, Task};

use super::routing::{dispatch, on_message, send};
use super::{metrics_index, Phase, RestartCause, Shared, Slot, State, HANDSHAKE_TIMEOUT, TICK};
use crate::client::{Opened, WriteFailure};
use crate::error::FleetError;
use crate::events::FleetEvent;
use crate::load_lock::LoadLock;
use crate::mps;

/// Kills the slot's worker, re-queues what it held and schedules a restart with backoff. In an
/// MPS group the other workers of the GPU go too, diarization and transcription workers alike
/// (all are clients of the GPU's one daemon): the fault reached them as well. Under MPS,
/// the GPU's daemon is first asked to terminate every client about to be killed (NVIDIA: a
/// client killed with work outstanding can leave the server hung or corrupt).
pub(super) fn fail_slot(shared: &Shared, state: &mut State, slot: usize, cause: RestartCause) {
    let group = state.slots[slot].group;
    let whole_group = shared.config.groups[group].mps.is_some() && cause != RestartCause::Group;
    let mut victims = vec![(slot, cause)];
    if whole_group {
        for other in 0..state.slots.len() {
            if other != slot
                && state.slots[other].group == group
                && !matches!(state.slots[other].phase, Phase::Down { .. })
            {
                victims.push((other, RestartCause::Group));
            }
        }
    }
    terminate_mps_clients(shared, state, group, &victims);
    for (victim, cause) in victims {
        take_down(shared, state, victim, cause);
    }
}

/// `terminate_client` for each victim still running, on its GPU's own daemon. A failure is
/// reported and the kill goes ahead: the group restart is the fallback either way.
fn terminate_mps_clients(
    shared: &Shared,
    state: &mut State,
    group: usize,
    victims: &[(usize, RestartCause)],
) {
    let cfg = &shared.config.groups[group];
    let (Some(gpu), Some(mps_cfg)) = (cfg.gpu, &cfg.mps) else {
        return;
    };
    let mut alive = Vec::new();
    for &(slot, _) in victims {
        if let Some(child) = state.slots[slot].child.as_mut() {
            if matches!(child.try_wait(), Ok(None)) {
                alive.push(child.id());
            }
        }
    }
    if alive.is_empty() {
        return;
    }
    match mps::terminate_clients(&*shared.mps, gpu, &mps_cfg.dirs(gpu), &alive) {
        Ok(done) => {
            for t in done {
                tracing::warn!(
                    gpu,
                    server = t.server_pid,
                    client = t.client_pid,
                    "MPS client terminated"
                );
                shared.emit(FleetEvent::MpsClientTerminated {
                    gpu,
                    server_pid: t.server_pid,
                    client_pid: t.client_pid,
                });
            }
        }
        Err(e) => {
            tracing::error!(gpu, error = %e, "MPS terminate_client failed; killing anyway");
            shared.emit(FleetEvent::MpsTerminateFailed {
                gpu,
                clients: alive,
                error: e.to_string(),
            });
        }
    }
}

fn take_down(shared: &Shared, state: &mut State, slot: usize, cause: RestartCause) {
    let group = state.slots[slot].group;
    let task = state.slots[slot].task;
    let group_name = shared.config.groups[group].name.clone();
    let pid = state.slots[slot]
        .child
        .as_ref()
        .map(std::process::Child::id);
    tracing::warn!(group = %group_name, slot, task = task.label(), pid, ?cause,
        "restarting worker");
    shared.emit(FleetEvent::WorkerRestart {
        group: group_name,
        slot,
        task,
        pid,
        cause,
    });
    *state.restarts.entry(cause).or_default() += 1;
    state.metrics[metrics_index(group, task)].observe_restart(cause);
    let s = &mut state.slots[slot];
    s.info = None;
    s.last_batch_seq = None;
    s.queue_depth = 0;
    s.last_restart = Some(cause);
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
                req.finish(Err(FleetError::PoisonRequest {
                    attempts: req.attempts,
                }));
            } else {
                state.waiting.of(req.task).push_front(id);
            }
        }
    }
}

/// Called only from the monitor thread: workers set `PR_SET_PDEATHSIG`, which Linux fires when
/// the *thread* that forked them exits, and the monitor thread lives exactly as long as the
/// fleet.
fn spawn_worker(shared: &Shared, slot: &Slot) -> std::io::Result<Child> {
    let cfg = &shared.config;
    let group = &cfg.groups[slot.group];
    let _ = std::fs::remove_file(&slot.socket);
    let mut command = Command::new(&cfg.worker_binary);
    if group.mps.is_some() {
        for name in mps::WORKER_ENV_REMOVE_UNDER_MPS {
            command.env_remove(name);
        }
    }
    let (model, engine, env) = match (slot.task, &cfg.diarization) {
        (Task::Diarize, Some(pool)) => (
            &pool.model,
            &pool.engine,
            mps::client_env(group.gpu, pool.mps_thread_percentage, group.mps.as_ref()),
        ),
        _ => (
            &cfg.model,
            &cfg.engine,
            mps::worker_env(group.gpu, group.instances, group.mps.as_ref()),
        ),
    };
    command
        .arg("serve")
        .arg("--socket")
        .arg(&slot.socket)
        .arg("--task")
        .arg(slot.task.label())
        .arg("--model")
        .arg(model)
        .arg("--engine")
        .arg(engine)
        .args(&cfg.worker_args)
        .envs(env)
        .envs(
            cfg.weights_share_dir
                .iter()
                .filter(|_| slot.task == Task::Transcribe)
                .map(|dir| ("WORKER_CUDA_WEIGHTS_SHARE_DIR", dir)),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        // Its own process group: a Ctrl-C at the terminal reaches only the supervisor, which
        // then stops the workers before the MPS daemons, in that order.
        .process_group(0)
        .spawn()
}

pub(super) fn monitor_loop(shared: Weak<Shared>) {
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
                        shared.emit(FleetEvent::WorkerSpawnFailed {
                            group: cfg.groups[s.group].name.clone(),
                            slot: i,
                            error: format!("{}: {e}", cfg.worker_binary.display()),
                        });
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
    let task = state.slots[slot].task;
    if info.task != task {
        // Never route a job to the wrong kind of worker: a worker that is not what this slot
        // spawned (a stale or foreign process on the socket) is replaced.
        tracing::error!(
            slot,
            expected = task.label(),
            got = info.task.label(),
            pid = info.pid,
            "worker serves another task; restarting the slot"
        );
        opened.close();
        fail_slot(shared, &mut state, slot, RestartCause::StartFailed);
        return;
    }
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
    s.info = Some(info.clone());
    let group = &shared.config.groups[s.group];
    let assigned = group.mps.as_ref().filter(|_| group.gpu.is_some()).map(|m| {
        match (task, &shared.config.diarization) {
            (Task::Diarize, Some(pool)) => pool.mps_thread_percentage,
            _ => m.thread_percentage(group.instances),
        }
    });
    tracing::info!(group = %group.name, slot, task = task.label(), pid = info.pid,
        engine = %info.engine, device = ?info.device, "worker ready");
    shared.emit(FleetEvent::WorkerReady {
        group: group.name.clone(),
        slot,
        task,
        pid: info.pid,
        engine: info.engine.clone(),
        device: info.device.clone(),
        assigned_thread_percentage: assigned,
    });
    if state.model.is_none() && task == Task::Transcribe {
        state.model = Some(info.model);
    }
}
