use std::path::PathBuf;

use thiserror::Error;
use worker_protocol::{ProtocolError, WireErrorKind};

#[derive(Debug, Error)]
pub enum FleetError {
    #[error("invalid fleet configuration: {0}")]
    Config(String),
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("worker protocol: {0}")]
    Protocol(#[from] ProtocolError),
    /// Every worker's queue is full and the wait for room ran out.
    #[error("overloaded: no worker had room within {waited_ms} ms")]
    Overloaded { waited_ms: u64 },
    /// The worker answered this request with an error (not retried: it would fail again).
    #[error("worker rejected the request ({kind:?}): {message}")]
    Rejected {
        kind: WireErrorKind,
        message: String,
    },
    /// The request was in flight on workers that died this many times: it is likely what
    /// kills them, so it is failed instead of taking down more workers.
    #[error("request lost {attempts} workers; giving up on it")]
    PoisonRequest { attempts: u32 },
    /// Audio longer than one worker request carries (refused before it is sent).
    #[error("{samples} samples of audio exceed the {max} one worker request carries (about {max_h:.1} h at 16 kHz): cut it shorter (max_segment_s, max_audio_duration_s)", max_h = *max as f64 / 16_000.0 / 3600.0)]
    TooLong { samples: usize, max: usize },
    #[error("no worker became ready within {waited_ms} ms")]
    NotReady { waited_ms: u64 },
    #[error("the fleet is shutting down")]
    ShuttingDown,
    /// Every transcription worker failed to start `tries` times in a row.
    #[error("no worker could start ({tries} tries each); the last worker said: {detail}")]
    WorkersCannotStart { tries: u32, detail: String },
    #[error("timestamps: {0}")]
    Timestamps(#[from] model_core::CoreError),
    /// `worker probe` could not open this GPU (host ordinal), so no worker could either.
    #[error("GPU {gpu} cannot be used: {detail} (check `nvidia-smi` and the CUDA driver, or run CPU workers with --cpu-instances)")]
    GpuProbe { gpu: u32, detail: String },
    #[error("MPS control command `{command}` failed: {detail}")]
    Mps { command: String, detail: String },
}

impl FleetError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io {
            action,
            path,
            source,
        }
    }
}
