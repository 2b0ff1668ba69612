//! Worker lifecycle: spawn under the load lock, connect, health-check; failures go to `restart`.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use worker_protocol::{ClientMessage, Task};

use super::daemon_restart::restart_wedged_daemons;
use super::restart::fail_slot;
use super::routing::{dispatch, on_message, send};
use super::state::{Phase, Shared, Slot, State, HANDSHAKE_TIMEOUT, TICK};
use crate::client::{Opened, WriteFailure};
use crate::error::FleetError;
use crate::events::{FleetEvent, RestartCause};
use crate::load_lock::LoadLock;
use crate::mps;

/// Called only from the monitor thread: workers set `PR_SET_PDEATHSIG`, which Linux fires when
/// the *thread* that forked them exits, and the monitor thread lives exactly as long as the
/// fleet.
fn spawn_worker(shared: &Shared, slot: &Slot) -> std::io::Result<Child> {
    let cfg = &shared.config;
    let group = &cfg.groups[slot.group];
    let _ = std::fs::remove_file(&slot.socket);
    let mut command = crate::worker_command::worker_command(&cfg.worker_binary);
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
        .arg(engine.name())
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
        .stderr(Stdio::piped())
        // Its own process group: a Ctrl-C at the terminal reaches only the supervisor, which
        // then stops the workers before the MPS daemons, in that order.
        .process_group(0)
        .spawn()
        .map(|mut child| {
            forward_stderr(&mut child, &slot.stderr_tail);
            child
        })
}

/// Lines of a worker's stderr kept for the fleet's give-up message (room for a backtrace
/// after its error).
const STDERR_TAIL_LINES: usize = 200;

/// Copies the worker's stderr to ours line by line, keeping the last lines in `tail` (emptied
/// for each new process).
fn forward_stderr(child: &mut Child, tail: &Arc<Mutex<VecDeque<String>>>) {
    let Some(stderr) = child.stderr.take() else {
        return;
    };
    lock(tail).clear();
    let tail = Arc::clone(tail);
    let spawned = std::thread::Builder::new()
        .name("worker-stderr".into())
        .spawn(move || {
            let mut ours = std::io::stderr();
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(ours, "{line}");
                let mut tail = lock(&tail);
                if tail.len() == STDERR_TAIL_LINES {
                    tail.pop_front();
                }
                tail.push_back(line);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "worker stderr is not forwarded");
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a worker that never became ready last said: its usage error, or the error it exited
/// with (anyhow's `Error: ...` and its `Caused by:` lines, joined), else its last ERROR line,
/// else its last line.
fn last_words(tail: &Mutex<VecDeque<String>>) -> String {
    let tail = lock(tail);
    // A usage error (clap's `error: ...`) is one line.
    if let Some(usage) = tail.iter().rev().find(|l| l.starts_with("error: ")) {
        return usage.clone();
    }
    if let Some(start) = tail.iter().rposition(|l| l.starts_with("Error: ")) {
        return tail
            .iter()
            .skip(start)
            .map(|l| l.trim())
            .take_while(|l| *l != "Stack backtrace:")
            .map(|l| l.strip_prefix("Error: ").unwrap_or(l))
            .filter(|l| !l.is_empty() && *l != "Caused by:")
            .map(|l| {
                l.trim_start_matches(|c: char| c.is_ascii_digit() || c == ':')
                    .trim()
            })
            .collect::<Vec<_>>()
            .join(": ");
    }
    tail.iter()
        .rev()
        .find(|l| l.contains("ERROR"))
        .or_else(|| tail.back())
        .cloned()
        .unwrap_or_else(|| "it exited before it was ready, with nothing on stderr".into())
}

/// Gives up once every transcription slot has failed `max_start_failures` starts in a row:
/// requests fail with the last worker's error instead of waiting for workers that will not
/// come (a missing model, a GPU that cannot be used, a wedged MPS server).
fn give_up_if_nothing_can_start(shared: &Shared, state: &mut State) {
    let max = shared.config.max_start_failures;
    let transcribers = || state.slots.iter().filter(|s| s.task == Task::Transcribe);
    if state.gave_up.is_some() || !transcribers().all(|s| s.start_failures >= max) {
        return;
    }
    let detail = transcribers()
        .map(|s| last_words(&s.stderr_tail))
        .next_back()
        .unwrap_or_default();
    tracing::error!(tries = max, %detail, "no worker can start; the fleet gives up");
    for req in state.requests.values_mut() {
        if req.outcome.is_none() {
            req.finish(Err(FleetError::WorkersCannotStart {
                tries: max,
                detail: detail.clone(),
            }));
        }
    }
    state.gave_up = Some(detail);
    state.waiting = Default::default();
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
            let connect = tick(&shared, &mut state);
            restart_wedged_daemons(&shared, &mut state);
            give_up_if_nothing_can_start(&shared, &mut state);
            connect
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
                // A request may take its audio's duration on top of the timeout: a whole
                // recording of many minutes on a CPU engine is slow, not stuck.
                let overdue = s.outstanding.iter().any(|id| {
                    state.requests.get(id).is_some_and(|r| {
                        r.sent_at.is_some_and(|at| {
                            now - at > cfg.request_timeout + audio_duration(r.pcm.len())
                        })
                    })
                });
                if exited {
                    fail_slot(shared, state, i, RestartCause::Crashed);
                } else if let Some(cause) = s.broken {
                    fail_slot(shared, state, i, cause);
                } else if s.ping.is_some_and(|(_, at)| now - at > cfg.health_timeout) || overdue {
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
                if now < *next_start
                    || state.gave_up.is_some()
                    || s.start_failures >= cfg.max_start_failures
                {
                    continue;
                }
                // At most `concurrent_loads` model loads at a time, across every supervisor
                // sharing the lock files.
                let lock = match LoadLock::try_acquire_one_of(&cfg.load_lock, cfg.concurrent_loads)
                {
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
                        s.start_failures += 1;
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
            if state.shutting_down {
                // The fleet closed it: nothing to restart, nothing to warn about.
                tracing::debug!(slot, ?failure, %detail, "worker connection closed at shutdown");
                return;
            }
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
    s.start_failures = 0;
    let group_index = s.group;
    state.daemon_restarted.remove(&group_index);
    let s = &mut state.slots[slot];
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

/// Seconds of 16 kHz audio in `samples`.
fn audio_duration(samples: usize) -> Duration {
    Duration::from_secs_f64(samples as f64 / 16_000.0)
}
