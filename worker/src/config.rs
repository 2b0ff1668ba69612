//! Command line and environment.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use worker_protocol::Task;

use crate::batch_policy::BatchPolicyConfig;
use crate::error::WorkerError;
use cuda_engine::{EncoderPrecision, FeatureLocation};
use engine::cuda::CudaSettings;
use engine::cuda_diarizer::CudaDiarSettings;
use engine::onnx::OnnxProvider;
use engine::{EngineKind, EngineSettings, OnnxSettings};
use model_core::long_audio::{LongAudio, DEFAULT_FULL_ATTENTION_MAX_S};

#[derive(Debug, Parser)]
#[command(
    name = "worker",
    version,
    about = "One Parakeet (or Sortformer) model instance serving a Unix socket"
)]
pub struct Cli {
    /// Log lines on stderr: `text`, or `json` (one object per line, for log shippers).
    #[arg(long, value_enum, default_value_t, global = true)]
    pub log_format: telemetry::logs::LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Load the model, warm up, then serve the socket.
    Serve(ServeArgs),
    /// Report what this build and machine can run: engines, and for CUDA a context, a kernel,
    /// the SMs this process gets and the MPS thread percentage it runs under.
    Probe(ProbeArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    /// CUDA device ordinal (after `CUDA_VISIBLE_DEVICES`).
    #[arg(long, default_value_t = 0)]
    pub cuda_device: usize,
    /// Exit non-zero unless the CUDA probe succeeds (for wedge checks and scripts).
    #[arg(long)]
    pub require_cuda: bool,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Unix socket to serve. It is created only after warm-up, so its existence means ready.
    #[arg(long)]
    pub socket: PathBuf,
    /// What this worker serves: Parakeet transcription, or Sortformer diarization (`--model`
    /// a Sortformer `.nemo`, `--engine cpu|cuda`; one recording at a time). Stated in the
    /// handshake; requests of the other task are refused with `BadRequest`.
    #[arg(long, value_enum, default_value = "transcribe")]
    pub task: TaskArg,
    /// The `.nemo` checkpoint (cpu engine) or the ONNX export directory (onnx engine).
    #[arg(long)]
    pub model: PathBuf,
    /// Engine. A requested engine that is unavailable is a startup error, never a fallback.
    #[arg(long, value_enum, default_value = "cpu")]
    pub engine: EngineKind,
    /// ONNX Runtime execution provider for `--engine onnx` (needs `ORT_DYLIB_PATH`). A GPU
    /// provider that cannot be registered is a startup error.
    #[arg(long, value_enum, default_value = "cpu")]
    pub onnx_provider: OnnxProvider,
    /// GPU ordinal (after `CUDA_VISIBLE_DEVICES`) of the CUDA engine, and of the ONNX
    /// CUDA/TensorRT providers.
    #[arg(long, default_value_t = 0)]
    pub cuda_device: usize,
    /// Longest segment (seconds) the CUDA engine's decoder graph is captured for at warm-up,
    /// with the largest preferred batch size; longer segments decode eagerly (same results).
    #[arg(long, default_value_t = CudaSettings::DEFAULT_GRAPH_MAX_S)]
    pub cuda_graph_max_s: f64,
    /// Where the CUDA engine computes log-mel features: `device` (the GPU path; the host only
    /// uploads PCM) or `host` (the reference code, one clip at a time on the worker's CPU).
    #[arg(long, value_enum, default_value = "device")]
    pub cuda_features: CudaFeaturesArg,
    /// How the CUDA engine waits for its GPU: `block` (the thread sleeps until the GPU is done,
    /// leaving the host's cores to audio decoding) or `spin` (polls on a core: microseconds
    /// sooner per batch, one core busy per worker while its GPU works).
    #[arg(long, value_enum, default_value = "block")]
    pub cuda_sync: CudaSyncArg,
    /// Utterances longer than this (seconds) run with local attention (128 encoder frames,
    /// 10.24 s, each side) instead of the checkpoint's full attention: NeMo's long-audio
    /// recipe. 1440 (24 minutes) is the model card's full-attention limit; every engine uses
    /// the same value, so a transcript does not depend on the engine.
    #[arg(long, default_value_t = DEFAULT_FULL_ATTENTION_MAX_S, value_parser = cli::positive_seconds)]
    pub full_attention_max_s: f64,
    /// The CUDA engine's encoder storage: `bf16` (fast) or `f32` (NeMo's fp32 results, about
    /// twice the weight memory).
    #[arg(long, value_enum, default_value = "bf16")]
    pub cuda_encoder_precision: CudaPrecisionArg,
    /// The CUDA diarization engine's storage (`--task diarize`): `f32` (the CPU engine's and
    /// NeMo's probabilities to ~1e-6, identical segments; 16 ms per 15 s chunk alone on an H200)
    /// or `bf16` (12 ms, probabilities ~2e-2 off, so a few frames near 0.5 flip).
    #[arg(long, value_enum, default_value = "f32")]
    pub cuda_diar_precision: CudaPrecisionArg,
    /// Caps each of the CUDA encoder's two subsampling scratch buffers (MiB); larger batches
    /// are subsampled in groups of utterances, saving GPU memory. 0: no cap. Default: groups of
    /// 5 × 30 s in bf16 (12.3 MB each); 192 runs a whole 16 × 30 s bf16 batch at once.
    #[arg(
        long,
        default_value_t = CudaSettings::DEFAULT_SUBSAMPLING_SCRATCH_MIB
    )]
    pub cuda_subsampling_scratch_mib: usize,
    /// A directory where the CUDA workers of a GPU share one copy of the encoder weights (each
    /// compares the shared copy with its own load before using it). Unset: private weights.
    /// The fleet sets it for its workers.
    #[arg(long)]
    pub cuda_weights_share_dir: Option<PathBuf>,
    /// Batch sizes the batcher fills to (it runs the largest one reached at once).
    #[arg(long, value_delimiter = ',', default_value = "4,8,16")]
    pub preferred_batch_sizes: Vec<usize>,
    /// Longest a request waits for companions before its batch runs anyway. 0 (the default):
    /// whenever the engine is free, what has queued runs at once; batches form from the
    /// requests that arrive while the previous batch runs, so a lone request never waits.
    #[arg(long, default_value_t = 0)]
    pub max_batch_wait_ms: u64,
    /// Budget of one batch in padded feature frames (longest member × members; 100 frames =
    /// 1 s). Default: 16 segments of 30 s. A single longer segment still runs, alone.
    #[arg(long, default_value_t = 48_000)]
    pub max_batch_padded_frames: usize,
    /// Requests allowed to wait; beyond this the worker answers `Overloaded`.
    #[arg(long, default_value_t = 1024)]
    pub max_queue: usize,
    /// Health reports `Wedged` once one batch has run this long plus its longest clip's
    /// duration (a long recording on a CPU engine is slow, not wedged).
    #[arg(long, default_value_t = 120_000)]
    pub wedge_after_ms: u64,
    /// Fault drills only: SIGUSR1 causes an illegal-address fault and SIGUSR2 takes all free
    /// device memory, before the next batch (the fleet's `--worker-arg=--fault-injection`).
    /// Off, those signals end the process as usual.
    #[arg(long)]
    pub fault_injection: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CudaFeaturesArg {
    Host,
    Device,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CudaSyncArg {
    Block,
    Spin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CudaPrecisionArg {
    Bf16,
    F32,
}

impl From<CudaPrecisionArg> for EncoderPrecision {
    fn from(arg: CudaPrecisionArg) -> Self {
        match arg {
            CudaPrecisionArg::Bf16 => Self::Bf16,
            CudaPrecisionArg::F32 => Self::F32,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TaskArg {
    Transcribe,
    Diarize,
}

impl TaskArg {
    pub fn task(self) -> Task {
        match self {
            Self::Transcribe => Task::Transcribe,
            Self::Diarize => Task::Diarize,
        }
    }
}

impl ServeArgs {
    pub fn engine_settings(&self) -> EngineSettings {
        EngineSettings {
            long_audio: LongAudio {
                full_attention_max_s: self.full_attention_max_s,
            },
            onnx: OnnxSettings {
                provider: self.onnx_provider,
                device_id: self.cuda_device as i32,
            },
            cuda: CudaSettings {
                device: self.cuda_device,
                graph_max_batch: self
                    .preferred_batch_sizes
                    .iter()
                    .copied()
                    .max()
                    .unwrap_or(1),
                graph_max_s: self.cuda_graph_max_s,
                features: match self.cuda_features {
                    CudaFeaturesArg::Host => FeatureLocation::Host,
                    CudaFeaturesArg::Device => FeatureLocation::Device,
                },
                subsampling_scratch_bytes: match self.cuda_subsampling_scratch_mib {
                    0 => usize::MAX,
                    mib => mib << 20,
                },
                precision: self.cuda_encoder_precision.into(),
                weights_share_dir: self.cuda_weights_share_dir.clone(),
                blocking_sync: self.cuda_sync == CudaSyncArg::Block,
            },
            cuda_diarizer: CudaDiarSettings {
                device: self.cuda_device,
                precision: self.cuda_diar_precision.into(),
            },
        }
    }

    /// The batcher's policy. Diarization runs each recording alone, as soon as the engine is
    /// free (its streaming state is per recording; there is nothing to batch).
    pub fn batch_policy(&self) -> Result<BatchPolicyConfig, WorkerError> {
        if self.task == TaskArg::Diarize {
            return BatchPolicyConfig::new(vec![1], Duration::ZERO, self.max_batch_padded_frames)
                .map_err(WorkerError::Config);
        }
        BatchPolicyConfig::new(
            self.preferred_batch_sizes.clone(),
            Duration::from_millis(self.max_batch_wait_ms),
            self.max_batch_padded_frames,
        )
        .map_err(WorkerError::Config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(extra: &[&str]) -> Result<ServeArgs, clap::Error> {
        let args = [
            "worker", "serve", "--socket", "s", "--model", "m", "--task", "diarize",
        ];
        match Cli::try_parse_from(args.iter().chain(extra))?.command {
            Command::Serve(serve) => Ok(serve),
            Command::Probe(_) => unreachable!("parsed `serve` (bug)"),
        }
    }

    #[test]
    fn diarization_precision_defaults_to_f32_and_takes_bf16() -> Result<(), clap::Error> {
        let default = serve(&[])?.engine_settings().cuda_diarizer;
        assert_eq!(default.precision, EncoderPrecision::F32);
        let args = serve(&["--cuda-diar-precision", "bf16", "--cuda-device", "3"])?;
        let settings = args.engine_settings().cuda_diarizer;
        assert_eq!(settings.precision, EncoderPrecision::Bf16);
        assert_eq!(settings.device, 3);
        // The transcription encoder's setting is separate.
        assert_eq!(
            args.engine_settings().cuda.precision,
            EncoderPrecision::Bf16
        );
        assert!(serve(&["--cuda-diar-precision", "fp16"]).is_err());
        Ok(())
    }

    #[test]
    fn weights_are_private_unless_a_share_directory_is_given() -> Result<(), clap::Error> {
        assert_eq!(serve(&[])?.engine_settings().cuda.weights_share_dir, None);
        let shared = serve(&["--cuda-weights-share-dir", "/run/f/weights"])?;
        assert_eq!(
            shared.engine_settings().cuda.weights_share_dir,
            Some(PathBuf::from("/run/f/weights"))
        );
        Ok(())
    }

    #[test]
    fn every_setting_is_a_flag_a_variable_and_a_key() {
        assert_eq!(
            cli::conformance::violations(cli::command::<Cli>),
            Vec::<String>::new()
        );
    }

    #[test]
    fn the_settings_reference_is_current() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/settings/worker.md");
        if let Err(e) = cli::reference::check_file(&cli::command::<Cli>(), &path) {
            panic!("{e}");
        }
    }
}
