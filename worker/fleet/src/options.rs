//! A fleet on the command line: the flags shared by the standalone `fleet` supervisor and the
//! dispatcher (whose engine runs in a fleet when `--gpus` or `--cpu-instances` is given). The worker engine and
//! the models (transcription and diarization) are not here: each program names those its own
//! way.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::{DiarizationPool, FleetConfig, GroupConfig};
use crate::error::FleetError;
use crate::layout;
use crate::mps::MpsConfig;
use worker_protocol::EngineKind;

#[derive(Debug, Clone, Default, clap::Args)]
pub struct FleetOptions {
    /// GPU ordinals, one worker group and one MPS domain each, e.g. `0,1`.
    #[arg(long, value_delimiter = ',', conflicts_with = "cpu_instances")]
    pub gpus: Vec<u32>,
    /// Workers per GPU (default: chosen per GPU from its SMs and memory and the host's cores,
    /// at most 4; see `layout::auto_instances`; the start-up log says what was chosen and why).
    #[arg(long)]
    pub instances_per_gpu: Option<usize>,
    /// CPU mode: this many workers in one group, no GPU, no MPS.
    #[arg(long)]
    pub cpu_instances: Option<usize>,
    /// Plain time-slicing: no MPS daemon, no thread percentage (also the default when a GPU
    /// runs one worker).
    #[arg(long)]
    pub no_mps: bool,
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` of every worker (default: 100 / instances per GPU).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub mps_thread_percentage: Option<u32>,
    /// MPS pipe directories are `<root>/gpu<N>` (default: `<runtime-dir>/mps/pipe`).
    #[arg(long)]
    pub mps_pipe_root: Option<PathBuf>,
    /// MPS log directories are `<root>/gpu<N>` (default: `<runtime-dir>/mps/log`).
    #[arg(long)]
    pub mps_log_root: Option<PathBuf>,
    /// The `worker` executable (default: `worker` next to this program).
    #[arg(long)]
    pub worker_binary: Option<PathBuf>,
    /// Worker sockets and the model-load lock (default: `<temp dir>/parakeet-fleet`). One
    /// fleet per directory.
    #[arg(long)]
    pub runtime_dir: Option<PathBuf>,
    /// Every transcription worker keeps its own copy of the encoder weights (by default the
    /// CUDA workers of a GPU share one, under `<runtime-dir>/weights`).
    #[arg(long)]
    pub no_weight_sharing: bool,
    /// Extra `worker serve` argument, repeatable: `--worker-arg=--max-batch-wait-ms=20`.
    #[arg(long = "worker-arg", value_delimiter = ' ', allow_hyphen_values = true)]
    pub worker_args: Vec<String>,
    /// Requests in flight on one worker, at most (beyond: wait in the supervisor). Default: 128
    /// for CUDA workers (their next batch always queued), 32 for CPU ones (a slow worker's
    /// queue must not outlast `--request-timeout-s`).
    #[arg(long)]
    pub max_outstanding_per_worker: Option<usize>,
    /// A request unanswered this long, plus its audio's duration (a long recording on a CPU
    /// engine is slow, not stuck), marks its worker stuck.
    #[arg(long, default_value_t = 120)]
    pub request_timeout_s: u64,
    /// A health ping unanswered this long marks the worker stuck.
    #[arg(long, default_value_t = 5000)]
    pub health_timeout_ms: u64,
    /// Spawn to ready (model load and warm-up), at most.
    #[arg(long, default_value_t = 300)]
    pub startup_timeout_s: u64,
    /// Failed starts in a row (the worker exits, or is not ready within the startup timeout)
    /// after which a worker slot stops trying; once every transcription slot has stopped, the
    /// fleet gives up with the last worker's error (restarts back off from 0.2 s to 30 s).
    #[arg(long, default_value_t = 8,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_start_failures: u32,
    /// Sortformer diarization workers per GPU (in CPU mode: in the CPU group), when a
    /// diarization model is given. Under MPS they are clients of the GPU's daemon. 0: no
    /// diarization pool (the dispatcher then diarizes in its own process).
    #[arg(long, default_value_t = 8)]
    pub diar_workers_per_gpu: usize,
    /// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` of each diarization worker.
    #[arg(long, default_value_t = 12,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub diar_mps_percentage: u32,
    /// Engine of the diarization workers, `cpu` or `cuda` (default: the transcription
    /// workers' engine).
    #[arg(long, value_enum)]
    pub diar_engine: Option<EngineKind>,
}

impl FleetOptions {
    /// The fleet running `worker serve --engine <engine> --model <model>`.
    pub fn to_config(&self, engine: EngineKind, model: &Path) -> Result<FleetConfig, FleetError> {
        self.to_config_with_diarization(engine, model, None)
    }

    /// [`Self::to_config`] plus, with `diar_model`, a diarization pool in every group.
    pub fn to_config_with_diarization(
        &self,
        engine: EngineKind,
        model: &Path,
        diar_model: Option<&Path>,
    ) -> Result<FleetConfig, FleetError> {
        let runtime_dir = self
            .runtime_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("parakeet-fleet"));
        let worker_binary = match &self.worker_binary {
            Some(path) => path.clone(),
            None => sibling_worker()?,
        };
        let groups = match (self.cpu_instances, self.gpus.is_empty()) {
            (Some(n), true) => {
                FleetConfig::cpu(PathBuf::new(), PathBuf::new(), PathBuf::new(), n).groups
            }
            (None, false) => {
                let mps = MpsConfig {
                    pipe_root: self
                        .mps_pipe_root
                        .clone()
                        .unwrap_or_else(|| runtime_dir.join("mps/pipe")),
                    log_root: self
                        .mps_log_root
                        .clone()
                        .unwrap_or_else(|| runtime_dir.join("mps/log")),
                    active_thread_percentage: self.mps_thread_percentage,
                };
                let mut groups = gpu_groups(&self.gpus, self.instances_per_gpu.unwrap_or(1), None)?;
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                let cores_per_gpu = cores / self.gpus.len().max(1);
                for group in &mut groups {
                    let gpu = group.gpu.unwrap_or_default();
                    let chosen_by_us = self.instances_per_gpu.is_none();
                    if chosen_by_us {
                        let device = layout::probe_gpu(&worker_binary, gpu)?;
                        let layout = layout::auto_instances(&device, cores_per_gpu);
                        group.instances = layout.instances;
                        tracing::info!(gpu, instances = layout.instances, why = %layout.reason,
                            "workers per GPU chosen (--instances-per-gpu overrides)");
                    }
                    // A worker the layout rule leaves alone on its GPU has nothing to share it
                    // with, so no MPS daemon; an explicit --instances-per-gpu or thread
                    // percentage gets MPS as before.
                    let alone = group.instances == 1 && self.mps_thread_percentage.is_none();
                    let mps_wanted = !self.no_mps && (!alone || !chosen_by_us);
                    group.mps = mps_wanted.then(|| mps.clone());
                }
                groups
            }
            _ => {
                return Err(FleetError::Config(
                    "give either --gpus (GPU groups) or --cpu-instances (CPU mode)".into(),
                ))
            }
        };
        let workers: usize = groups.iter().map(|g| g.instances).sum();
        let mut config = FleetConfig::cpu(worker_binary, model.to_owned(), runtime_dir, 1);
        config.engine = engine;
        config.groups = groups;
        if let (Ok(meta), Some(available)) =
            (std::fs::metadata(model), layout::available_memory_bytes())
        {
            config.concurrent_loads = layout::concurrent_loads(meta.len(), available, workers);
            tracing::info!(
                loads = config.concurrent_loads,
                workers,
                checkpoint_mib = meta.len() >> 20,
                available_mib = available >> 20,
                "model loads at once (host memory at {}x the checkpoint each)",
                layout::LOAD_MEMORY_PER_CHECKPOINT_BYTE
            );
        }
        config.worker_args = self.worker_args.clone();
        if self.no_weight_sharing {
            config.weights_share_dir = None;
        }
        config.max_outstanding_per_worker = self
            .max_outstanding_per_worker
            .unwrap_or_else(|| crate::config::default_max_outstanding_per_worker(engine));
        config.request_timeout = Duration::from_secs(self.request_timeout_s);
        config.health_timeout = Duration::from_millis(self.health_timeout_ms);
        config.startup_timeout = Duration::from_secs(self.startup_timeout_s);
        config.max_start_failures = self.max_start_failures;
        let pool_model = diar_model.filter(|_| self.diar_workers_per_gpu > 0);
        config.diarization = pool_model.map(|path| DiarizationPool {
            model: path.to_owned(),
            engine: self.diar_engine.unwrap_or(engine),
            instances: self.diar_workers_per_gpu,
            mps_thread_percentage: self.diar_mps_percentage,
        });
        config.validate().map_err(FleetError::Config)?;
        Ok(config)
    }
}

/// One group per GPU, named `gpu<N>`, each with its own MPS domain when `mps` is given.
pub fn gpu_groups(
    gpus: &[u32],
    instances: usize,
    mps: Option<&MpsConfig>,
) -> Result<Vec<GroupConfig>, FleetError> {
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = gpus.iter().find(|g| !seen.insert(**g)) {
        return Err(FleetError::Config(format!("GPU {dup} is listed twice")));
    }
    Ok(gpus
        .iter()
        .map(|&gpu| GroupConfig {
            name: format!("gpu{gpu}"),
            gpu: Some(gpu),
            instances,
            mps: mps.cloned(),
        })
        .collect())
}

fn sibling_worker() -> Result<PathBuf, FleetError> {
    let exe = std::env::current_exe().map_err(FleetError::io("locating", "current executable"))?;
    Ok(exe.with_file_name("worker"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        fleet: FleetOptions,
    }

    fn parse(args: &[&str]) -> Result<FleetOptions, clap::Error> {
        Cli::try_parse_from(std::iter::once("fleet").chain(args.iter().copied())).map(|c| c.fleet)
    }

    #[test]
    fn workers_share_weights_under_the_runtime_dir_unless_told_not_to() {
        let base = [
            "--gpus",
            "0",
            "--instances-per-gpu",
            "1",
            "--runtime-dir",
            "/run/f",
            "--worker-binary",
            "/w",
        ];
        let share_dir = |extra: &[&str]| {
            let args: Vec<&str> = base.iter().chain(extra).copied().collect();
            let options = parse(&args).unwrap();
            options
                .to_config(EngineKind::Cuda, Path::new("/m.nemo"))
                .unwrap()
                .weights_share_dir
        };
        assert_eq!(share_dir(&[]), Some(PathBuf::from("/run/f/weights")));
        assert_eq!(share_dir(&["--no-weight-sharing"]), None);
    }

    #[test]
    fn gpus_become_one_mps_group_each() {
        let opts = parse(&[
            "--gpus",
            "0,1",
            "--instances-per-gpu",
            "4",
            "--runtime-dir",
            "/run/f",
            "--worker-binary",
            "/bin/worker",
            "--worker-arg=--max-batch-wait-ms=20",
        ])
        .unwrap();
        let cfg = opts
            .to_config(EngineKind::Cuda, Path::new("/m.nemo"))
            .unwrap();
        assert_eq!(cfg.engine, EngineKind::Cuda);
        assert_eq!(cfg.worker_args, vec!["--max-batch-wait-ms=20"]);
        let names: Vec<&str> = cfg.groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, vec!["gpu0", "gpu1"]);
        let mps = cfg.groups[1].mps.as_ref().unwrap();
        assert_eq!(mps.dirs(1).pipe, PathBuf::from("/run/f/mps/pipe/gpu1"));
        assert_eq!(mps.dirs(0).log, PathBuf::from("/run/f/mps/log/gpu0"));
        assert_eq!(mps.thread_percentage(4), 25);
        assert!(cfg.groups.iter().all(|g| g.instances == 4));
        // Each GPU's daemon and workers: its own ordinal and pipe directory, nothing shared.
        let env_of = |gpu: u32| {
            let group = &cfg.groups[gpu as usize];
            let mps = group.mps.as_ref().unwrap();
            let daemon = crate::mps::daemon_start(gpu, &mps.dirs(gpu)).env;
            let worker = crate::mps::worker_env(group.gpu, group.instances, Some(mps));
            (daemon, worker)
        };
        let ((d0, w0), (d1, w1)) = (env_of(0), env_of(1));
        let pipe = |env: &[(String, String)]| {
            env.iter()
                .find(|(k, _)| k == "CUDA_MPS_PIPE_DIRECTORY")
                .map(|(_, v)| v.clone())
        };
        assert_eq!(pipe(&d0).as_deref(), Some("/run/f/mps/pipe/gpu0"));
        assert_eq!(pipe(&d1).as_deref(), Some("/run/f/mps/pipe/gpu1"));
        assert_eq!((pipe(&w0), pipe(&w1)), (pipe(&d0), pipe(&d1)));
        assert!(d1.contains(&("CUDA_VISIBLE_DEVICES".into(), "1".into())));
        // Under MPS the daemon pins the GPU; a client setting CUDA_VISIBLE_DEVICES=1 would find
        // no device (the server remaps GPU 1 to ordinal 0).
        assert!(!w1.iter().any(|(k, _)| k == "CUDA_VISIBLE_DEVICES"));
        assert!(w0.contains(&("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "25".into())));
    }

    #[test]
    fn diarization_pool_defaults_to_8_workers_at_12_percent() {
        let opts = parse(&[
            "--gpus",
            "0",
            "--instances-per-gpu",
            "1",
            "--worker-binary",
            "w",
        ])
        .unwrap();
        assert!(opts
            .to_config(EngineKind::Cuda, Path::new("m"))
            .unwrap()
            .diarization
            .is_none());
        let cfg = opts
            .to_config_with_diarization(
                EngineKind::Cuda,
                Path::new("m"),
                Some(Path::new("/s.nemo")),
            )
            .unwrap();
        let pool = cfg.diarization.as_ref().unwrap();
        assert_eq!(pool.model, PathBuf::from("/s.nemo"));
        assert_eq!((pool.engine, pool.instances), (EngineKind::Cuda, 8));
        assert_eq!(pool.mps_thread_percentage, 12);
        let mps = cfg.groups[0].mps.as_ref();
        let env = crate::mps::client_env(Some(0), pool.mps_thread_percentage, mps);
        assert!(env.contains(&("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "12".into())));

        let opts = parse(&[
            "--cpu-instances",
            "1",
            "--diar-workers-per-gpu",
            "2",
            "--diar-engine",
            "cpu",
            "--diar-mps-percentage",
            "20",
            "--worker-binary",
            "w",
        ])
        .unwrap();
        let cfg = opts
            .to_config_with_diarization(EngineKind::Onnx, Path::new("m"), Some(Path::new("s")))
            .unwrap();
        let pool = cfg.diarization.unwrap();
        assert_eq!((pool.engine, pool.instances), (EngineKind::Cpu, 2));
        assert_eq!(pool.mps_thread_percentage, 20);
        assert!(parse(&["--diar-mps-percentage", "0"]).is_err());
        let zero = parse(&["--cpu-instances", "1", "--diar-workers-per-gpu", "0"]).unwrap();
        let cfg = zero
            .to_config_with_diarization(EngineKind::Cpu, Path::new("m"), Some(Path::new("s")))
            .unwrap();
        assert!(cfg.diarization.is_none(), "0 workers: no pool");
    }

    #[test]
    fn no_mps_and_cpu_modes() {
        let opts = parse(&[
            "--gpus",
            "0",
            "--instances-per-gpu",
            "2",
            "--no-mps",
            "--worker-binary",
            "w",
        ])
        .unwrap();
        let cfg = opts.to_config(EngineKind::Cuda, Path::new("m")).unwrap();
        assert!(cfg.groups[0].mps.is_none());
        let opts = parse(&["--cpu-instances", "3", "--worker-binary", "w"]).unwrap();
        let cfg = opts.to_config(EngineKind::Cpu, Path::new("m")).unwrap();
        assert_eq!(cfg.groups.len(), 1);
        assert_eq!((cfg.groups[0].gpu, cfg.groups[0].instances), (None, 3));
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(parse(&["--gpus", "0", "--cpu-instances", "2"]).is_err());
        assert!(parse(&["--gpus", "0", "--mps-thread-percentage", "0"]).is_err());
        let neither = parse(&["--worker-binary", "w"]).unwrap();
        assert!(neither.to_config(EngineKind::Cpu, Path::new("m")).is_err());
        let twice = parse(&["--gpus", "1,1", "--worker-binary", "w"]).unwrap();
        assert!(twice.to_config(EngineKind::Cuda, Path::new("m")).is_err());
        // No --instances-per-gpu: the GPU is probed through the worker binary, whose failure
        // stops the start with the GPU named.
        let unprobed = parse(&["--gpus", "2", "--worker-binary", "false"]).unwrap();
        let error = unprobed
            .to_config(EngineKind::Cuda, Path::new("m"))
            .unwrap_err();
        assert!(
            matches!(error, FleetError::GpuProbe { gpu: 2, .. }),
            "{error}"
        );
        let zero = parse(&[
            "--gpus",
            "0",
            "--instances-per-gpu",
            "0",
            "--worker-binary",
            "w",
        ])
        .unwrap();
        assert!(zero.to_config(EngineKind::Cuda, Path::new("m")).is_err());
    }
}
