//! The fleet's `/health` verdict: per group, how many workers are ready.
//!
//! Healthy means every group has at least one ready worker. A group with none (all crashed,
//! or restarting together after an MPS fault) cannot serve its GPU's share of the work, which
//! is what an orchestrator's readiness check should see; the other groups keep serving
//! meanwhile, so a caller that only needs *some* capacity reads `any_ready`.

use serde::Serialize;

use crate::config::FleetConfig;
use crate::fleet::WorkerStatus;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupHealth {
    pub name: String,
    pub gpu: Option<u32>,
    pub mps: bool,
    pub instances: usize,
    pub ready: usize,
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
            .map(|g| GroupHealth {
                name: g.name.clone(),
                gpu: g.gpu,
                mps: g.mps.is_some(),
                instances: g.instances,
                ready: workers
                    .iter()
                    .filter(|w| w.group == g.name && w.ready)
                    .count(),
            })
            .collect();
        Self {
            healthy: groups.iter().all(|g| g.ready > 0),
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
    }
}
