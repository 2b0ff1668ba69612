//! What the supervisor runs: groups of identical workers (one group per GPU).

use std::path::PathBuf;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

use crate::mps::MpsConfig;
use worker_protocol::EngineKind;

/// Requests one CUDA worker holds by default: 8 of its largest batches (16), so its batcher has
/// the next batch queued while the dispatcher's round trip (answer, next job's decode, new
/// request) runs. With 32 the main job on one H200 (one worker, the dispatcher's limits sized
/// from it) ran at 5 429 audio-s/s, GPU busy 30 % of the time; with 128, 6 517, and 6 890 in
/// another call (docs/benchmarks.md, session 27).
pub const DEFAULT_MAX_OUTSTANDING_PER_GPU_WORKER: usize = 128;
/// The same for a CPU worker: a request waiting inside a worker counts toward its request
/// timeout, and 128 segments of 30 s queued on a CPU engine could outlast it.
pub const DEFAULT_MAX_OUTSTANDING_PER_CPU_WORKER: usize = 32;

/// The default for workers of `engine`.
pub fn default_max_outstanding_per_worker(engine: EngineKind) -> usize {
    match engine {
        EngineKind::Cuda => DEFAULT_MAX_OUTSTANDING_PER_GPU_WORKER,
        EngineKind::Cpu | EngineKind::Onnx => DEFAULT_MAX_OUTSTANDING_PER_CPU_WORKER,
    }
}

#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The `worker` executable.
    pub worker_binary: PathBuf,
    /// The `.nemo` model every worker loads.
    pub model: PathBuf,
    /// `--engine` of the workers.
    pub engine: EngineKind,
    /// Extra `worker serve` arguments (batch sizes, budgets).
    pub worker_args: Vec<String>,
    pub groups: Vec<GroupConfig>,
    /// Sockets and the load lock live here.
    pub runtime_dir: PathBuf,
    /// The file lock that bounds model loading across workers (and supervisors): this path and
    /// `concurrent_loads - 1` numbered siblings.
    pub load_lock: PathBuf,
    /// Workers that may load their model at once (each holds its checkpoint in host memory
    /// while it loads); 1 loads them one after another.
    pub concurrent_loads: usize,
    /// Where the transcription workers of each GPU share one copy of the encoder weights
    /// (`worker --cuda-weights-share-dir`); `None`: every worker keeps its own.
    pub weights_share_dir: Option<PathBuf>,
    /// Requests sent to one worker and not yet answered, at most.
    pub max_outstanding_per_worker: usize,
    /// Requests waiting for a worker, at most; submitters block beyond this.
    pub max_waiting: usize,
    /// How long a submitter blocks for room before `Overloaded`.
    pub submit_timeout: Duration,
    /// A request unanswered this long marks its worker stuck.
    pub request_timeout: Duration,
    pub health_interval: Duration,
    /// A health ping unanswered this long marks the worker stuck.
    pub health_timeout: Duration,
    /// Spawn to first successful handshake, at most.
    pub startup_timeout: Duration,
    pub restart_backoff: Backoff,
    /// Attempts (workers lost while holding the request) before it is failed as poison.
    pub max_attempts: u32,
    /// Starts in a row that a worker slot may fail (exit, or not ready within the startup
    /// timeout) before the slot stops trying; when every transcription slot has stopped, the
    /// fleet gives up with the last worker's error instead of restarting forever.
    pub max_start_failures: u32,
    /// Sortformer diarization workers in every group, next to the transcription workers.
    pub diarization: Option<DiarizationPool>,
}

/// The diarization workers of each group (`worker serve --task diarize`). On a GPU they are
/// clients of that GPU's MPS daemon like the transcription workers, so they share its fate:
/// a failure of any client restarts all of them.
#[derive(Debug, Clone, PartialEq)]
pub struct DiarizationPool {
    /// The Sortformer `.nemo`.
    pub model: PathBuf,
    /// `--engine` of the diarization workers (`cpu` or `cuda`).
    pub engine: EngineKind,
    /// Workers per group.
    pub instances: usize,
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` of each diarization worker under MPS.
    pub mps_thread_percentage: u32,
}

impl FleetConfig {
    /// Defaults for a CPU fleet of `instances` workers in one group.
    pub fn cpu(
        worker_binary: PathBuf,
        model: PathBuf,
        runtime_dir: PathBuf,
        instances: usize,
    ) -> Self {
        Self {
            worker_binary,
            model,
            engine: EngineKind::Cpu,
            worker_args: Vec::new(),
            groups: vec![GroupConfig {
                name: "cpu".into(),
                gpu: None,
                instances,
                mps: None,
            }],
            load_lock: runtime_dir.join("model-load.lock"),
            concurrent_loads: 1,
            weights_share_dir: Some(runtime_dir.join("weights")),
            runtime_dir,
            max_outstanding_per_worker: DEFAULT_MAX_OUTSTANDING_PER_CPU_WORKER,
            max_waiting: 1024,
            submit_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(120),
            health_interval: Duration::from_millis(500),
            health_timeout: Duration::from_secs(5),
            startup_timeout: Duration::from_secs(300),
            restart_backoff: Backoff::default(),
            max_attempts: 3,
            max_start_failures: 8,
            diarization: None,
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.groups.is_empty() || self.groups.iter().any(|g| g.instances == 0) {
            return Err("every group needs at least one instance".into());
        }
        if self.max_outstanding_per_worker == 0 || self.max_waiting == 0 {
            return Err("max_outstanding_per_worker and max_waiting must be positive".into());
        }
        if self.max_attempts == 0 || self.max_start_failures == 0 {
            return Err("max_attempts and max_start_failures must be positive".into());
        }
        if let Some(pool) = &self.diarization {
            if pool.instances == 0 {
                return Err("a diarization pool needs at least one worker per group".into());
            }
            if !(1..=100).contains(&pool.mps_thread_percentage) {
                return Err("the diarization MPS thread percentage must be 1..=100".into());
            }
        }
        Ok(())
    }
}

/// Workers sharing one device. Under MPS a fault reaches every client of the GPU, so a failure
/// of one restarts the whole group.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    pub name: String,
    /// `CUDA_VISIBLE_DEVICES` for the group; `None` on the CPU.
    pub gpu: Option<u32>,
    pub instances: usize,
    pub mps: Option<MpsConfig>,
}

/// Exponential restart delay: `initial × factor^(failures-1)`, capped at `max`; no jitter
/// (backon's exponential backoff).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    pub factor: f32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(200),
            max: Duration::from_secs(30),
            factor: 2.0,
        }
    }
}

impl Backoff {
    /// Delay before restart after `failures` consecutive failures (0: start now).
    pub fn delay(&self, failures: u32) -> Duration {
        let Some(n) = failures.checked_sub(1) else {
            return Duration::ZERO;
        };
        let delays = ExponentialBuilder::default()
            .with_min_delay(self.initial)
            .with_max_delay(self.max)
            .with_factor(self.factor)
            .without_max_times()
            .build();
        // The nth delay, but the delays stay at `max` once there: stop walking then.
        (0..=n)
            .zip(delays)
            .find_map(|(i, d)| (i == n || d >= self.max).then_some(d))
            .map_or(self.max, |d| d.min(self.max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            factor: 2.0,
        };
        let ms: Vec<u128> = (0..7).map(|f| b.delay(f).as_millis()).collect();
        assert_eq!(ms, vec![0, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
    }
}
