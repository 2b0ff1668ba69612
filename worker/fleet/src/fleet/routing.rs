//! Routing: waiting requests to the least-loaded ready worker of their task, answers back to
//! their requests.

use worker_protocol::{
    Audio, ClientMessage, DiarizeRequest, Task, Timings, TranscribeRequest, WireErrorKind,
    WorkerMessage, WorkerState,
};

use super::restart::fail_slot;
use super::state::{Answer, Phase, Shared, State, HOP_SAMPLES};
use crate::client::Connection;
use crate::error::FleetError;
use crate::events::RestartCause;
use std::time::Instant;

/// Sends waiting requests to the ready worker of their task with the least outstanding work
/// that has room.
pub(super) fn dispatch(shared: &Shared, state: &mut State) {
    for task in Task::ALL {
        dispatch_task(shared, state, task);
    }
}

/// Recordings in flight on one diarization worker, at most: it runs one at a time, so one
/// running and one ready to start keep it busy. The rest wait here, free to go to whichever
/// worker frees first, and a worker's oldest request never waits behind a long queue inside
/// it (which `request_timeout` would take for a stuck worker).
const DIARIZE_MAX_OUTSTANDING: usize = 2;

fn dispatch_task(shared: &Shared, state: &mut State, task: Task) {
    let max = match task {
        Task::Transcribe => shared.config.max_outstanding_per_worker,
        Task::Diarize => shared
            .config
            .max_outstanding_per_worker
            .min(DIARIZE_MAX_OUTSTANDING),
    };
    while let Some(&id) = state.waiting.of(task).front() {
        let target = state
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.task == task)
            .filter(|(_, s)| matches!(s.phase, Phase::Ready) && s.broken.is_none())
            .filter(|(_, s)| s.outstanding.len() < max)
            .min_by_key(|(_, s)| (s.outstanding_frames, s.outstanding.len()))
            .map(|(i, _)| i);
        let Some(slot_index) = target else {
            return;
        };
        state.waiting.of(task).pop_front();
        let Some(req) = state.requests.get_mut(&id) else {
            continue;
        };
        if req.outcome.is_some() {
            continue;
        }
        let slot = &mut state.slots[slot_index];
        let audio = Audio::Pcm16k(req.pcm.clone());
        let message = match task {
            Task::Transcribe => ClientMessage::Transcribe(TranscribeRequest {
                id,
                audio,
                deadline_ms: None,
                priority: req.priority,
            }),
            Task::Diarize => ClientMessage::Diarize(DiarizeRequest {
                id,
                audio,
                deadline_ms: None,
            }),
        };
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
            let (id, timings) = (response.id, response.timings);
            let answer = Answer::Transcribed(response);
            answered(shared, &mut state, (slot, generation), id, &timings, answer);
        }
        WorkerMessage::Diarized(response) => {
            let (id, timings) = (response.id, response.timings);
            let answer = Answer::Diarized(response);
            answered(shared, &mut state, (slot, generation), id, &timings, answer);
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
                        if let Some((task, priority)) =
                            state.requests.get(&id).map(|r| (r.task, r.priority))
                        {
                            state.waiting.of(task).push_front(id, priority);
                        }
                    }
                    kind => {
                        if let Some(req) = state.requests.get_mut(&id) {
                            req.finish(Err(FleetError::Rejected {
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

/// A result for request `id` from `(slot, generation)`: metrics, then the request's outcome if
/// the request is still this worker's. An answer of the wrong task means the worker is not
/// what its handshake said: it is restarted and the request re-sent.
fn answered(
    shared: &Shared,
    state: &mut State,
    (slot, generation): (usize, u64),
    id: u64,
    timings: &Timings,
    answer: Answer,
) {
    let s = &mut state.slots[slot];
    let new_batch = s.last_batch_seq != Some(timings.batch_seq);
    s.last_batch_seq = Some(timings.batch_seq);
    let (group, task) = (s.group, s.task);
    let answer_task = match answer {
        Answer::Transcribed(_) => Task::Transcribe,
        Answer::Diarized(_) => Task::Diarize,
    };
    if answer_task != task {
        tracing::error!(
            slot,
            task = task.label(),
            answer = answer_task.label(),
            "worker answered with another task's result; restarting it"
        );
        fail_slot(shared, state, slot, RestartCause::Crashed);
        return;
    }
    if let Some(m) = state.metrics.get(&(group, task)) {
        m.observe_answer(timings, new_batch);
    }
    let ours = state
        .requests
        .get(&id)
        .is_some_and(|r| r.on == Some((slot, generation)));
    if ours {
        unassign(state, id);
        state.slots[slot].failures = 0;
        if let Some(req) = state.requests.get_mut(&id) {
            req.finish(Ok(answer));
        }
    }
}
