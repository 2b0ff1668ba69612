//! Taking a worker down for a restart: its MPS group with it, its requests back to the queue.

use std::time::Instant;

use super::state::{Phase, Shared, State};
use crate::error::FleetError;
use crate::events::{FleetEvent, RestartCause};
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
    if let Some(m) = state.metrics.get(&(group, task)) {
        m.observe_restart(cause);
    }
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
    if cause == RestartCause::StartFailed {
        s.start_failures += 1;
    }
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
                state.waiting.of(req.task).push_front(id, req.priority);
            }
        }
    }
}
