//! What the fleet shows outside: per-worker status, the health verdict, Prometheus metrics.

use std::process::Child;

use super::state::Phase;
use super::{Fleet, WorkerPhase, WorkerStatus};
use crate::config::FleetConfig;
use crate::events::RestartCause;
use crate::metrics::WorkerGauges;

impl Fleet {
    pub fn status(&self) -> Vec<WorkerStatus> {
        let state = self.shared.lock();
        state
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let group = &self.shared.config.groups[s.group];
                let phase = match s.phase {
                    Phase::Down { .. } => WorkerPhase::Down,
                    Phase::Starting { .. } => WorkerPhase::Starting,
                    Phase::Ready => WorkerPhase::Ready,
                };
                WorkerStatus {
                    group: group.name.clone(),
                    gpu: group.gpu,
                    slot: i,
                    task: s.task,
                    phase,
                    ready: phase == WorkerPhase::Ready,
                    pid: s.child.as_ref().map(Child::id),
                    outstanding: s.outstanding.len(),
                    queue_depth: s.queue_depth,
                    restarts: s.restarts,
                    last_restart: s.last_restart,
                    engine: s.info.as_ref().map(|i| i.engine.clone()),
                    device: s.info.as_ref().and_then(|i| i.device.clone()),
                }
            })
            .collect()
    }

    pub fn config(&self) -> &FleetConfig {
        &self.shared.config
    }

    /// Per-worker readiness and the group verdict (see [`crate::FleetHealth`]).
    pub fn health(&self) -> crate::FleetHealth {
        crate::FleetHealth::from_status(&self.shared.config, self.status())
    }

    /// Prometheus text of the fleet's metrics (queue depths, batch sizes and latency, padding,
    /// restarts by cause), for `/metrics` of the supervisor or the dispatcher.
    pub fn render_prometheus(&self) -> String {
        let state = self.shared.lock();
        let groups = &self.shared.config.groups;
        let workers: Vec<WorkerGauges> = state
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| WorkerGauges {
                group: groups[s.group].name.clone(),
                task: s.task,
                slot: i,
                ready: matches!(s.phase, Phase::Ready),
                outstanding: s.outstanding.len(),
                queue_depth: s.queue_depth,
            })
            .collect();
        // Under the lock: two scrapes at once each show one moment.
        self.shared.metrics.render(state.waiting.len(), &workers)
    }

    pub fn restarts(&self, cause: RestartCause) -> u64 {
        self.shared
            .lock()
            .restarts
            .get(&cause)
            .copied()
            .unwrap_or(0)
    }
}

/// The standalone supervisor's `/health` and `/metrics`: 200 when every group has a ready
/// worker, else 503; the body lists every worker.
impl telemetry::Endpoints for Fleet {
    fn metrics(&self) -> String {
        self.render_prometheus()
    }

    fn health(&self) -> telemetry::Health {
        let report = self.health();
        telemetry::Health::json(report.healthy, &report)
    }
}
