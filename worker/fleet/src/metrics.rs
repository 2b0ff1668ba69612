//! Fleet metrics on the shared `telemetry` crate.
//!
//! Per-batch figures come from the workers' answers ([`worker_protocol::Timings`]): every
//! answer carries its batch's sequence number, and a batch is counted once, on its first
//! answer seen. Worker gauges are set from the supervisor's state at each render.

use telemetry::{
    gauge_value, register, Buckets, Counter, Family, Gauge, HistogramFamily, Registry,
};
use worker_protocol::{Task, Timings};

use crate::events::RestartCause;

const BATCH_SIZE_BUCKETS: [f64; 8] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];
/// Seconds: a short batch on a GPU to a long CPU batch.
const SECONDS_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// `group`, `task`.
type GroupLabels = [(&'static str, String); 2];
/// `group`, `task` and `slot`, or `group`, `task` and `cause`.
type ThreeLabels = [(&'static str, String); 3];

fn group_labels(group: &str, task: Task) -> GroupLabels {
    [("group", group.into()), ("task", task.label().into())]
}

/// Batch figures of one group and task: handles into the fleet's metric families.
#[derive(Debug, Clone)]
pub(crate) struct GroupMetrics {
    batch_size: telemetry::Histogram,
    batch_seconds: telemetry::Histogram,
    queue_wait_seconds: telemetry::Histogram,
    batch_frames: Counter,
    padding_frames: Counter,
    restarts: Vec<(RestartCause, Counter)>,
}

impl GroupMetrics {
    /// One answer; `new_batch` when it is the first answer of its batch seen.
    pub(crate) fn observe_answer(&self, timings: &Timings, new_batch: bool) {
        self.queue_wait_seconds
            .observe(timings.queue_us as f64 / 1e6);
        if new_batch {
            self.batch_size.observe(f64::from(timings.batch_size));
            self.batch_seconds.observe(timings.batch_us as f64 / 1e6);
            self.batch_frames.inc_by(timings.batch_frames);
            self.padding_frames
                .inc_by(timings.padded_frames.saturating_sub(timings.batch_frames));
        }
    }

    pub(crate) fn observe_restart(&self, cause: RestartCause) {
        if let Some((_, n)) = self.restarts.iter().find(|(c, _)| *c == cause) {
            n.inc();
        }
    }
}

/// A worker's gauges at render time.
#[derive(Debug, Clone)]
pub(crate) struct WorkerGauges {
    pub(crate) group: String,
    pub(crate) task: Task,
    pub(crate) slot: usize,
    pub(crate) ready: bool,
    pub(crate) outstanding: usize,
    /// From the worker's last health report.
    pub(crate) queue_depth: u32,
}

/// Every metric the fleet shows, registered in the order `/metrics` lists them.
#[derive(Debug)]
pub(crate) struct FleetMetrics {
    registry: Registry,
    waiting: Gauge,
    queue_depth: Family<ThreeLabels, Gauge>,
    outstanding: Family<ThreeLabels, Gauge>,
    ready: Family<ThreeLabels, Gauge>,
    batch_size: HistogramFamily<GroupLabels>,
    batch_seconds: HistogramFamily<GroupLabels>,
    queue_wait_seconds: HistogramFamily<GroupLabels>,
    batch_frames: Family<GroupLabels, Counter>,
    padding_frames: Family<GroupLabels, Counter>,
    restarts: Family<ThreeLabels, Counter>,
}

impl Default for FleetMetrics {
    fn default() -> Self {
        let mut r = Registry::default();
        let seconds = Buckets(&SECONDS_BUCKETS);
        // Fields initialise in this order: the registry lists its metrics in it.
        Self {
            waiting: register(
                &mut r,
                "fleet_waiting_requests",
                "Requests in the supervisor waiting for a worker with room",
                Gauge::default(),
            ),
            queue_depth: register(
                &mut r,
                "fleet_worker_queue_depth",
                "Requests queued inside each worker for a batch (last health report)",
                Family::default(),
            ),
            outstanding: register(
                &mut r,
                "fleet_worker_outstanding_requests",
                "Requests sent to each worker and not yet answered",
                Family::default(),
            ),
            ready: register(
                &mut r,
                "fleet_worker_ready",
                "1 while the worker is handshaken and serving",
                Family::default(),
            ),
            batch_size: register(
                &mut r,
                "fleet_batch_size",
                "Requests per batch run by the workers",
                HistogramFamily::new_with_constructor(Buckets(&BATCH_SIZE_BUCKETS)),
            ),
            batch_seconds: register(
                &mut r,
                "fleet_batch_seconds",
                "Engine time of one batch",
                HistogramFamily::new_with_constructor(seconds),
            ),
            queue_wait_seconds: register(
                &mut r,
                "fleet_queue_wait_seconds",
                "Time a request waited inside its worker before its batch started",
                HistogramFamily::new_with_constructor(seconds),
            ),
            batch_frames: register(
                &mut r,
                "fleet_batch_frames",
                "Feature frames of the batched requests themselves",
                Family::default(),
            ),
            padding_frames: register(
                &mut r,
                "fleet_padding_frames",
                "Frames computed only as padding (padded batch frames minus real frames)",
                Family::default(),
            ),
            restarts: register(
                &mut r,
                "fleet_restarts",
                "Worker restarts by cause",
                Family::default(),
            ),
            registry: r,
        }
    }
}

impl FleetMetrics {
    /// The figures of one group and task, shown from now on (at zero until something happens).
    pub(crate) fn group(&self, group: &str, task: Task) -> GroupMetrics {
        let labels = group_labels(group, task);
        let restarts = RestartCause::ALL
            .into_iter()
            .map(|cause| {
                let [group, task] = labels.clone();
                let counter = self.restarts.get_or_create_owned(&[
                    group,
                    task,
                    ("cause", cause.label().into()),
                ]);
                (cause, counter)
            })
            .collect();
        GroupMetrics {
            batch_size: self.batch_size.get_or_create_owned(&labels),
            batch_seconds: self.batch_seconds.get_or_create_owned(&labels),
            queue_wait_seconds: self.queue_wait_seconds.get_or_create_owned(&labels),
            batch_frames: self.batch_frames.get_or_create_owned(&labels),
            padding_frames: self.padding_frames.get_or_create_owned(&labels),
            restarts,
        }
    }

    /// Prometheus text, with the gauges set to `waiting` and the workers' state.
    pub(crate) fn render(&self, waiting: usize, workers: &[WorkerGauges]) -> String {
        self.waiting.set(gauge_value(waiting));
        for w in workers {
            let [group, task] = group_labels(&w.group, w.task);
            let labels = [group, task, ("slot", w.slot.to_string())];
            self.queue_depth
                .get_or_create(&labels)
                .set(i64::from(w.queue_depth));
            self.outstanding
                .get_or_create(&labels)
                .set(gauge_value(w.outstanding));
            self.ready.get_or_create(&labels).set(i64::from(w.ready));
        }
        telemetry::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timings(batch_size: u32, batch_frames: u64, padded_frames: u64, seq: u64) -> Timings {
        Timings {
            queue_us: 20_000,
            batch_us: 300_000,
            batch_size,
            padded_frames,
            batch_frames,
            batch_seq: seq,
        }
    }

    #[test]
    fn batches_count_once_and_padding_is_the_difference() {
        let metrics = FleetMetrics::default();
        let m = metrics.group("gpu0", Task::Transcribe);
        metrics.group("gpu0", Task::Diarize);
        let t = timings(4, 1000, 1600, 1);
        m.observe_answer(&t, true);
        for _ in 0..3 {
            m.observe_answer(&t, false);
        }
        m.observe_answer(&timings(1, 300, 300, 2), true);
        m.observe_restart(RestartCause::Stuck);
        let text = metrics.render(
            3,
            &[WorkerGauges {
                group: "gpu0".into(),
                task: Task::Diarize,
                slot: 0,
                ready: true,
                outstanding: 2,
                queue_depth: 5,
            }],
        );
        for line in [
            "fleet_waiting_requests 3",
            "fleet_worker_queue_depth{group=\"gpu0\",task=\"diarize\",slot=\"0\"} 5",
            "fleet_worker_outstanding_requests{group=\"gpu0\",task=\"diarize\",slot=\"0\"} 2",
            "fleet_worker_ready{group=\"gpu0\",task=\"diarize\",slot=\"0\"} 1",
            "fleet_batch_size_count{group=\"gpu0\",task=\"transcribe\"} 2",
            "fleet_batch_size_bucket{group=\"gpu0\",task=\"transcribe\",le=\"2\"} 1",
            "fleet_batch_size_bucket{group=\"gpu0\",task=\"transcribe\",le=\"4\"} 2",
            "fleet_batch_size_sum{group=\"gpu0\",task=\"transcribe\"} 5.0",
            "fleet_batch_seconds_bucket{group=\"gpu0\",task=\"transcribe\",le=\"0.25\"} 0",
            "fleet_batch_seconds_bucket{group=\"gpu0\",task=\"transcribe\",le=\"0.5\"} 2",
            "fleet_queue_wait_seconds_count{group=\"gpu0\",task=\"transcribe\"} 5",
            "fleet_batch_frames_total{group=\"gpu0\",task=\"transcribe\"} 1300",
            "fleet_padding_frames_total{group=\"gpu0\",task=\"transcribe\"} 600",
            "fleet_restarts_total{group=\"gpu0\",task=\"transcribe\",cause=\"stuck\"} 1",
            "fleet_restarts_total{group=\"gpu0\",task=\"transcribe\",cause=\"crashed\"} 0",
            "fleet_batch_size_count{group=\"gpu0\",task=\"diarize\"} 0",
            "fleet_restarts_total{group=\"gpu0\",task=\"diarize\",cause=\"stuck\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in\n{text}"
            );
        }
    }
}
