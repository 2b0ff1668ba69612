//! Routing: waiting requests to the least-loaded ready worker, answers back to their requests.

use worker_protocol::{
    Audio, ClientMessage, TranscribeRequest, WireErrorKind, WorkerMessage, WorkerState,
};

use super::supervise::fail_slot;
use super::{Phase, RestartCause, Shared, State, HOP_SAMPLES};
use crate::client::Connection;
use crate::error::FleetError;
use std::time::Instant;

/// Sends waiting requests to the ready worker with the least outstanding work that has room.
pub(super) fn dispatch(shared: &Shared, state: &mut State) {
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
pub(super) fn send(conn: Option<&Connection>, message: ClientMessage) -> Result<(), RestartCause> {
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

pub(super) fn on_message(shared: &Shared, slot: usize, generation: u64, message: WorkerMessage) {
    let mut state = shared.lock();
    if state.slots[slot].generation != generation {
        return; // a message from a worker already replaced
    }
    match message {
        WorkerMessage::Result(response) => {
            let id = response.id;
            let s = &mut state.slots[slot];
            let new_batch = s.last_batch_seq != Some(response.timings.batch_seq);
            s.last_batch_seq = Some(response.timings.batch_seq);
            let group = s.group;
            state.metrics[group].observe_answer(&response.timings, new_batch);
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
            s.queue_depth = report.queue_depth;
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
