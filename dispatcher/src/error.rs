//! The dispatcher's one error type, and how each error is handled (its class).

use std::path::PathBuf;

/// What the lifecycle does with a failed job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Worth retrying soon (network blip, throttling, 5xx, conditional-write conflict).
    Transient,
    /// Retrying cannot help (bad audio, bad message, missing source): record it and delete.
    Permanent,
    /// This node cannot work right now (credentials, permissions, full disk): release the
    /// message for another node and stop taking work.
    Infrastructure,
}

#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    // ── messages ──
    #[error("message is not valid JSON: {0}")]
    BadJson(String),
    #[error("message schema version {found} is not supported (expected {expected})")]
    UnknownSchema { found: u64, expected: u64 },
    #[error("message is invalid: {0}")]
    BadMessage(String),
    #[error("bad object URI `{uri}`: {why}")]
    BadUri { uri: String, why: &'static str },
    /// The job reaches outside its tenant's buckets and prefixes (tenants file).
    #[error("tenant check failed: {why}")]
    TenantViolation { why: String },

    // ── objects ──
    #[error("object s3://{bucket}/{key} not found")]
    ObjectMissing { bucket: String, key: String },
    #[error("object s3://{bucket}/{key} is {size_bytes} bytes, over the {limit_bytes}-byte limit")]
    ObjectTooLarge {
        bucket: String,
        key: String,
        size_bytes: u64,
        limit_bytes: u64,
    },
    #[error("object key `{key}` is not allowed here: {why}")]
    UnsafeKey { key: String, why: &'static str },
    #[error("store request for s3://{bucket}/{key} failed ({class:?}): {message}")]
    Store {
        bucket: String,
        key: String,
        class: ErrorClass,
        message: String,
    },
    #[error("existing result at s3://{bucket}/{key} does not match this job: {why}")]
    ResultMismatch {
        bucket: String,
        key: String,
        why: String,
    },

    // ── queue ──
    #[error("queue request {op} failed ({class:?}): {message}")]
    Queue {
        op: &'static str,
        class: ErrorClass,
        message: String,
    },
    #[error("lease on message {message_id} was lost")]
    LeaseLost { message_id: String },
    /// A checkpointed job stopped part-way (its lease ran out or it was cancelled); the next
    /// delivery resumes after the saved checkpoints.
    #[error("job stopped with {saved} of {checkpoints} checkpoints saved; it resumes from there")]
    Stopped { saved: usize, checkpoints: usize },
    #[error("instance metadata request {path} failed: {message}")]
    InstanceMetadata { path: String, message: String },

    // ── audio and inference ──
    #[error("audio rejected ({reason}): {message}")]
    Audio {
        reason: &'static str,
        message: String,
    },
    #[error("inference failed: {0}")]
    Inference(String),
    /// The in-process engine failed on a batch (the cause kept).
    #[error("inference failed: {0}")]
    Engine(#[source] Box<engine::EngineError>),
    #[error("diarization was requested but no diarization model is configured")]
    DiarizationUnavailable,

    // ── local files and config ──
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config: {0}")]
    Config(String),
    /// A model the in-process engine could not load (missing file, bad checkpoint, no GPU);
    /// the engine's error already names the model.
    #[error(transparent)]
    EngineLoad(Box<engine::EngineError>),
}

impl DispatchError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    pub fn class(&self) -> ErrorClass {
        match self {
            Self::BadJson(_)
            | Self::UnknownSchema { .. }
            | Self::BadMessage(_)
            | Self::BadUri { .. }
            | Self::TenantViolation { .. }
            | Self::ObjectMissing { .. }
            | Self::ObjectTooLarge { .. }
            | Self::UnsafeKey { .. }
            | Self::Audio { .. }
            | Self::DiarizationUnavailable => ErrorClass::Permanent,
            Self::Store { class, .. } | Self::Queue { class, .. } => *class,
            // Someone else's result under our deterministic key, or a model that fails on
            // this node: let another node (or a human, via the DLQ) look at it.
            Self::ResultMismatch { .. } | Self::Inference(_) | Self::Engine(_) => {
                ErrorClass::Infrastructure
            }
            Self::LeaseLost { .. } | Self::Stopped { .. } | Self::InstanceMetadata { .. } => {
                ErrorClass::Transient
            }
            Self::Io { .. } | Self::Config(_) | Self::EngineLoad(_) => ErrorClass::Infrastructure,
        }
    }

    pub fn is_transient(&self) -> bool {
        self.class() == ErrorClass::Transient
    }

    /// Stable snake_case code for failure records and metric labels.
    pub fn reason_code(&self) -> &'static str {
        match self {
            Self::BadJson(_) => "bad_json",
            Self::UnknownSchema { .. } => "unknown_schema_version",
            Self::BadMessage(_) => "bad_message",
            Self::BadUri { .. } => "bad_uri",
            Self::TenantViolation { .. } => "tenant_violation",
            Self::ObjectMissing { .. } => "source_missing",
            Self::ObjectTooLarge { .. } => "file_too_large",
            Self::UnsafeKey { .. } => "unsafe_key",
            Self::Store { .. } => "store_error",
            Self::ResultMismatch { .. } => "result_mismatch",
            Self::Queue { .. } => "queue_error",
            Self::LeaseLost { .. } => "lease_lost",
            Self::Stopped { .. } => "stopped",
            Self::InstanceMetadata { .. } => "instance_metadata_error",
            Self::Audio { reason, .. } => reason,
            Self::Inference(_) | Self::Engine(_) => "inference_error",
            Self::DiarizationUnavailable => "diarization_unavailable",
            Self::Io { .. } => "io_error",
            Self::Config(_) | Self::EngineLoad(_) => "config_error",
        }
    }
}

pub type Result<T, E = DispatchError> = std::result::Result<T, E>;
