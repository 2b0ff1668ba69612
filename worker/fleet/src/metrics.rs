//! Fleet metrics in the Prometheus text format, rendered by hand like the dispatcher's
//! (`dispatcher/src/metrics/prometheus.rs`): one small histogram type, no metrics framework.
//!
//! Per-batch figures come from the workers' answers ([`worker_protocol::Timings`]): every
//! answer carries its batch's sequence number, and a batch is counted once, on its first
//! answer seen.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use worker_protocol::{Task, Timings};

use crate::events::RestartCause;

const BATCH_SIZE_BUCKETS: [f64; 8] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];
/// Seconds: a short batch on a GPU to a long CPU batch.
const SECONDS_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Debug, Clone)]
pub(crate) struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub(crate) fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    pub(crate) fn observe(&mut self, value: f64) {
        if !value.is_finite() {
            return;
        }
        for (bound, count) in self.bounds.iter().zip(self.counts.iter_mut()) {
            if value <= *bound {
                *count += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

/// Batch figures of one group.
#[derive(Debug, Clone)]
pub(crate) struct GroupMetrics {
    batch_size: Histogram,
    batch_seconds: Histogram,
    queue_wait_seconds: Histogram,
    batch_frames: u64,
    padded_frames: u64,
    restarts: BTreeMap<&'static str, u64>,
}

impl Default for GroupMetrics {
    fn default() -> Self {
        Self {
            batch_size: Histogram::new(&BATCH_SIZE_BUCKETS),
            batch_seconds: Histogram::new(&SECONDS_BUCKETS),
            queue_wait_seconds: Histogram::new(&SECONDS_BUCKETS),
            batch_frames: 0,
            padded_frames: 0,
            restarts: BTreeMap::new(),
        }
    }
}

impl GroupMetrics {
    /// One answer; `new_batch` when it is the first answer of its batch seen.
    pub(crate) fn observe_answer(&mut self, timings: &Timings, new_batch: bool) {
        self.queue_wait_seconds
            .observe(timings.queue_us as f64 / 1e6);
        if new_batch {
            self.batch_size.observe(f64::from(timings.batch_size));
            self.batch_seconds.observe(timings.batch_us as f64 / 1e6);
            self.batch_frames += timings.batch_frames;
            self.padded_frames += timings.padded_frames.max(timings.batch_frames);
        }
    }

    pub(crate) fn observe_restart(&mut self, cause: RestartCause) {
        *self.restarts.entry(cause.label()).or_default() += 1;
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

/// Everything `/metrics` shows, gathered under the fleet's lock.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) waiting: usize,
    /// Per group and task (a task without workers is left out).
    pub(crate) groups: Vec<(String, Task, GroupMetrics)>,
    pub(crate) workers: Vec<WorkerGauges>,
}

fn help(out: &mut String, name: &str, kind: &str, text: &str) {
    let _ = writeln!(out, "# HELP {name} {text}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

impl Snapshot {
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        help(
            &mut out,
            "fleet_waiting_requests",
            "gauge",
            "Requests in the supervisor waiting for a worker with room.",
        );
        let _ = writeln!(out, "fleet_waiting_requests {}", self.waiting);
        help(
            &mut out,
            "fleet_worker_queue_depth",
            "gauge",
            "Requests queued inside each worker for a batch (last health report).",
        );
        for w in &self.workers {
            let _ = writeln!(
                out,
                "fleet_worker_queue_depth{{group=\"{}\",task=\"{}\",slot=\"{}\"}} {}",
                w.group,
                w.task.label(),
                w.slot,
                w.queue_depth
            );
        }
        help(
            &mut out,
            "fleet_worker_outstanding_requests",
            "gauge",
            "Requests sent to each worker and not yet answered.",
        );
        for w in &self.workers {
            let _ = writeln!(
                out,
                "fleet_worker_outstanding_requests{{group=\"{}\",task=\"{}\",slot=\"{}\"}} {}",
                w.group,
                w.task.label(),
                w.slot,
                w.outstanding
            );
        }
        help(
            &mut out,
            "fleet_worker_ready",
            "gauge",
            "1 while the worker is handshaken and serving.",
        );
        for w in &self.workers {
            let _ = writeln!(
                out,
                "fleet_worker_ready{{group=\"{}\",task=\"{}\",slot=\"{}\"}} {}",
                w.group,
                w.task.label(),
                w.slot,
                u8::from(w.ready)
            );
        }
        help(
            &mut out,
            "fleet_batch_size",
            "histogram",
            "Requests per batch run by the workers.",
        );
        for (group, task, m) in &self.groups {
            let labels = format!("group=\"{group}\",task=\"{}\"", task.label());
            m.batch_size.render(&mut out, "fleet_batch_size", &labels);
        }
        help(
            &mut out,
            "fleet_batch_seconds",
            "histogram",
            "Engine time of one batch.",
        );
        for (group, task, m) in &self.groups {
            let labels = format!("group=\"{group}\",task=\"{}\"", task.label());
            m.batch_seconds
                .render(&mut out, "fleet_batch_seconds", &labels);
        }
        help(
            &mut out,
            "fleet_queue_wait_seconds",
            "histogram",
            "Time a request waited inside its worker before its batch started.",
        );
        for (group, task, m) in &self.groups {
            let labels = format!("group=\"{group}\",task=\"{}\"", task.label());
            m.queue_wait_seconds
                .render(&mut out, "fleet_queue_wait_seconds", &labels);
        }
        help(
            &mut out,
            "fleet_batch_frames_total",
            "counter",
            "Feature frames of the batched requests themselves.",
        );
        for (group, task, m) in &self.groups {
            let labels = format!("group=\"{group}\",task=\"{}\"", task.label());
            let _ = writeln!(
                out,
                "fleet_batch_frames_total{{{labels}}} {}",
                m.batch_frames
            );
        }
        help(
            &mut out,
            "fleet_padding_frames_total",
            "counter",
            "Frames computed only as padding (padded batch frames minus real frames).",
        );
        for (group, task, m) in &self.groups {
            let labels = format!("group=\"{group}\",task=\"{}\"", task.label());
            let _ = writeln!(
                out,
                "fleet_padding_frames_total{{{labels}}} {}",
                m.padded_frames - m.batch_frames
            );
        }
        help(
            &mut out,
            "fleet_restarts_total",
            "counter",
            "Worker restarts by cause.",
        );
        for (group, task, m) in &self.groups {
            let labels = format!("group=\"{group}\",task=\"{}\"", task.label());
            for cause in RestartCause::ALL {
                let n = m.restarts.get(cause.label()).copied().unwrap_or(0);
                let _ = writeln!(
                    out,
                    "fleet_restarts_total{{{labels},cause=\"{}\"}} {n}",
                    cause.label()
                );
            }
        }
        out
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
        let mut m = GroupMetrics::default();
        let t = timings(4, 1000, 1600, 1);
        m.observe_answer(&t, true);
        for _ in 0..3 {
            m.observe_answer(&t, false);
        }
        m.observe_answer(&timings(1, 300, 300, 2), true);
        m.observe_restart(RestartCause::Stuck);
        let text = Snapshot {
            waiting: 3,
            groups: vec![
                ("gpu0".into(), Task::Transcribe, m),
                ("gpu0".into(), Task::Diarize, GroupMetrics::default()),
            ],
            workers: vec![WorkerGauges {
                group: "gpu0".into(),
                task: Task::Diarize,
                slot: 0,
                ready: true,
                outstanding: 2,
                queue_depth: 5,
            }],
        }
        .render();
        for line in [
            "fleet_waiting_requests 3",
            "fleet_worker_queue_depth{group=\"gpu0\",task=\"diarize\",slot=\"0\"} 5",
            "fleet_worker_outstanding_requests{group=\"gpu0\",task=\"diarize\",slot=\"0\"} 2",
            "fleet_worker_ready{group=\"gpu0\",task=\"diarize\",slot=\"0\"} 1",
            "fleet_batch_size_count{group=\"gpu0\",task=\"transcribe\"} 2",
            "fleet_batch_size_bucket{group=\"gpu0\",task=\"transcribe\",le=\"2\"} 1",
            "fleet_batch_size_bucket{group=\"gpu0\",task=\"transcribe\",le=\"4\"} 2",
            "fleet_batch_size_sum{group=\"gpu0\",task=\"transcribe\"} 5",
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

    #[test]
    fn non_finite_observations_are_dropped() {
        let mut h = Histogram::new(&SECONDS_BUCKETS);
        h.observe(f64::NAN);
        h.observe(0.002);
        assert_eq!((h.count, h.counts[0], h.counts[1]), (1, 0, 1));
    }
}
