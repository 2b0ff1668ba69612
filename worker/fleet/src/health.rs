//! The fleet's `/health` verdict: per group, how many workers are ready.
//!
//! Healthy means every group has at least one ready transcription worker and, when the fleet
//! has a diarization pool, at least one ready diarization worker. A group with none (all crashed,
//! or restarting together after an MPS fault) cannot serve its GPU's share of the work, which
//! is what an orchestrator's readiness check should see; the other groups keep serving
//! meanwhile, so a caller that only needs *some* capacity reads `any_ready`.

use serde::Serialize;
use worker_protocol::Task;

use crate::config::FleetConfig;
use crate::fleet::WorkerStatus;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupHealth {
    pub name: String,
    pub gpu: Option<u32>,
    pub mps: bool,
    /// Transcription workers.
    pub instances: usize,
    pub ready: usize,
    /// Diarization workers (0 without a diarization pool).
    pub diarization_instances: usize,
    pub diarization_ready: usize,
}

impl GroupHealth {
    fn serves(&self) -> bool {
        self.ready > 0 && (self.diarization_instances == 0 || self.diarization_ready > 0)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetHealth {
    /// Every group has a ready worker.
    pub healthy: bool,
    /// Some worker is ready (the fleet can make progress).
    pub any_ready: bool,
    pub groups: Vec<GroupHealth>,
    pub workers: Vec<WorkerStatus>,
}

impl FleetHealth {
    pub fn from_status(config: &FleetConfig, workers: Vec<WorkerStatus>) -> Self {
        let groups: Vec<GroupHealth> = config
            .groups
            .iter()
            .map(|g| {
                let ready = |task| {
                    workers
                        .iter()
                        .filter(|w| w.group == g.name && w.task == task && w.ready)
                        .count()
                };
                GroupHealth {
                    name: g.name.clone(),
                    gpu: g.gpu,
                    mps: g.mps.is_some(),
                    instances: g.instances,
                    ready: ready(Task::Transcribe),
                    diarization_instances: config.diarization.as_ref().map_or(0, |d| d.instances),
                    diarization_ready: ready(Task::Diarize),
                }
            })
            .collect();
        Self {
            healthy: groups.iter().all(GroupHealth::serves),
            any_ready: groups.iter().any(|g| g.ready > 0),
            groups,
            workers,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::config::GroupConfig;
    use crate::fleet::WorkerPhase;

    fn worker(group: &str, slot: usize, ready: bool) -> WorkerStatus {
        WorkerStatus {
            group: group.into(),
            gpu: None,
            slot,
            task: Task::Transcribe,
            phase: if ready {
                WorkerPhase::Ready
            } else {
                WorkerPhase::Starting
            },
            ready,
            pid: None,
            outstanding: 0,
            queue_depth: 0,
            restarts: 0,
            last_restart: None,
            engine: None,
            device: None,
        }
    }

    #[test]
    fn healthy_only_when_every_group_has_a_ready_worker() {
        let mut config = FleetConfig::cpu(PathBuf::new(), PathBuf::new(), PathBuf::new(), 2);
        config.groups.push(GroupConfig {
            name: "gpu1".into(),
            gpu: Some(1),
            instances: 1,
            mps: None,
        });
        let h = FleetHealth::from_status(
            &config,
            vec![
                worker("cpu", 0, true),
                worker("cpu", 1, false),
                worker("gpu1", 2, false),
            ],
        );
        assert!(!h.healthy);
        assert!(h.any_ready);
        assert_eq!(h.groups[0].ready, 1);
        assert_eq!(h.groups[1].ready, 0);
        let h = FleetHealth::from_status(
            &config,
            vec![
                worker("cpu", 0, false),
                worker("cpu", 1, true),
                worker("gpu1", 2, true),
            ],
        );
        assert!(h.healthy);

        // With a diarization pool, a group also needs a ready diarization worker.
        config.diarization = Some(crate::config::DiarizationPool {
            model: PathBuf::new(),
            engine: worker_protocol::EngineKind::Cpu,
            instances: 1,
            mps_thread_percentage: 12,
        });
        let diarizer = |group: &str, slot, ready| WorkerStatus {
            task: Task::Diarize,
            ..worker(group, slot, ready)
        };
        let mut workers = vec![
            worker("cpu", 0, true),
            worker("gpu1", 1, true),
            diarizer("cpu", 2, true),
            diarizer("gpu1", 3, false),
        ];
        let h = FleetHealth::from_status(&config, workers.clone());
        assert!(!h.healthy && h.any_ready);
        assert_eq!((h.groups[1].ready, h.groups[1].diarization_ready), (1, 0));
        workers[3].ready = true;
        assert!(FleetHealth::from_status(&config, workers).healthy);
    }
}
