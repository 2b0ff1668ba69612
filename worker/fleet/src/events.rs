//! What the supervisor did, as typed events: the standalone `fleet` binary prints each as one
//! JSON line on stdout (for operators and scripts to grep), tests assert on them.

use serde::Serialize;
use worker_protocol::{DeviceReport, Task};

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum FleetEvent {
    /// A GPU's MPS control daemon: `started` by this fleet, or found running (then left alone
    /// at shutdown).
    MpsDaemon {
        gpu: u32,
        pipe_directory: String,
        log_directory: String,
        started: bool,
    },
    /// A worker finished warm-up and handshook.
    WorkerReady {
        group: String,
        slot: usize,
        task: Task,
        pid: u32,
        engine: String,
        /// As the worker's engine probed it (`None` on CPU engines).
        device: Option<DeviceReport>,
        /// The MPS thread share the supervisor gave it (`None` without MPS).
        assigned_thread_percentage: Option<u32>,
    },
    /// A worker is being taken down and will be restarted after its backoff.
    WorkerRestart {
        group: String,
        slot: usize,
        task: Task,
        pid: Option<u32>,
        cause: RestartCause,
    },
    /// A worker process could not be spawned.
    WorkerSpawnFailed {
        group: String,
        slot: usize,
        error: String,
    },
    /// The GPU's daemon was asked to terminate a client before the client is killed.
    MpsClientTerminated {
        gpu: u32,
        server_pid: u32,
        client_pid: u32,
    },
    /// Asking the daemon failed; the clients are killed anyway.
    MpsTerminateFailed {
        gpu: u32,
        clients: Vec<u32>,
        error: String,
    },
    MpsDaemonStopped {
        gpu: u32,
    },
    /// The GPU's workers kept failing to start, so its daemon was stopped and started again
    /// (`error` when that failed).
    MpsDaemonRestarted {
        gpu: u32,
        error: Option<String>,
    },
    MpsDaemonStopFailed {
        gpu: u32,
        error: String,
    },
    /// Every worker is stopped.
    Stopped,
}

/// Why a worker was restarted (events, `/health`, the `fleet_restarts_total` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
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

impl RestartCause {
    pub const ALL: [Self; 5] = [
        Self::Crashed,
        Self::Stuck,
        Self::Wedged,
        Self::Group,
        Self::StartFailed,
    ];

    /// Metric label (the same as the JSON name).
    pub fn label(self) -> &'static str {
        match self {
            Self::Crashed => "crashed",
            Self::Stuck => "stuck",
            Self::Wedged => "wedged",
            Self::Group => "group",
            Self::StartFailed => "start_failed",
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn events_are_one_json_object_with_an_event_tag() {
        let line = serde_json::to_string(&FleetEvent::WorkerRestart {
            group: "gpu0".into(),
            slot: 2,
            task: Task::Diarize,
            pid: Some(41),
            cause: RestartCause::Stuck,
        })
        .unwrap();
        assert_eq!(
            line,
            r#"{"event":"worker_restart","group":"gpu0","slot":2,"task":"diarize","pid":41,"cause":"stuck"}"#
        );
    }
}
