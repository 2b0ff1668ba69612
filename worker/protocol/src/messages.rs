//! Every message on the wire. Adding a variant or field changes the encoding: bump
//! [`PROTOCOL_VERSION`] with it (postcard is not self-describing, so there is no silent skew).

use model_core::speakers::SpeakerSegment;
use model_core::timestamps::{FrameTiming, TimestampOptions, Timestamper};
use model_core::transcript::Hypothesis;
use serde::{Deserialize, Serialize};

use crate::SharedPcm;

/// Version 1: PCM requests, hypotheses with optional confidences, health pings.
/// Version 2: the handshake's optional [`DeviceReport`]; batch sequence number and real
/// (unpadded) frames in [`Timings`], so a client can aggregate per-batch metrics.
/// Version 3: the [`Task`] a worker serves in its handshake; diarization requests and
/// answers ([`DiarizeRequest`], [`DiarizeResponse`]).
/// Version 4: PCM as one byte string of little-endian `f32` samples (was one postcard `f32` per
/// sample).
/// Version 5: the [`Priority`] of a [`TranscribeRequest`].
/// Version 6: hypotheses carry the decoder's scores (`Hypothesis::scores`: token
/// log-probabilities, blank probabilities per frame); the never-filled per-token `confidences`
/// are gone.
pub const PROTOCOL_VERSION: u16 = 6;

/// Chosen by the client, unique per connection; the worker echoes it.
pub type RequestId = u64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ClientMessage {
    Hello {
        version: u16,
        client: String,
    },
    Transcribe(TranscribeRequest),
    /// Drop the request if not yet started; an answer (result or `Cancelled`) still follows.
    Cancel {
        id: RequestId,
    },
    Health {
        nonce: u64,
    },
    /// Speaker turns of one whole recording (only a [`Task::Diarize`] worker accepts it).
    Diarize(DiarizeRequest),
}

/// What a worker process serves; fixed for its lifetime and stated in its handshake. A
/// request of the other kind is answered with [`WireErrorKind::BadRequest`].
/// (JSON, e.g. in fleet events: `"transcribe"`, `"diarize"`; postcard encodes the index.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    Transcribe,
    Diarize,
}

impl Task {
    pub const ALL: [Self; 2] = [Self::Transcribe, Self::Diarize];

    /// Label for logs, metrics and health (`transcribe`, `diarize`).
    pub fn label(self) -> &'static str {
        match self {
            Self::Transcribe => "transcribe",
            Self::Diarize => "diarize",
        }
    }
}

/// A whole recording: the model streams over it with per-recording state, so it is never cut
/// into segments by the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiarizeRequest {
    pub id: RequestId,
    pub audio: Audio,
    /// Give up (answering `DeadlineExceeded`) if not started within this many ms of arrival.
    pub deadline_ms: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiarizeResponse {
    pub id: RequestId,
    /// Speaker turns after post-processing, in seconds from the recording's start.
    pub segments: Vec<SpeakerSegment>,
    /// As for transcription; a diarization "batch" is always one recording.
    pub timings: Timings,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscribeRequest {
    pub id: RequestId,
    pub audio: Audio,
    /// Give up (answering `DeadlineExceeded`) if not started within this many ms of arrival.
    pub deadline_ms: Option<u32>,
    /// Interactive requests are batched before waiting batch ones.
    pub priority: Priority,
}

/// Who waits for a request: a person at an API (`Interactive`, served first) or a queue of
/// jobs (`Batch`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    #[default]
    Batch,
    Interactive,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Audio {
    /// Mono PCM at 16 kHz, nominally in [-1, 1]. (Precomputed features: a later version.)
    /// Shared ([`SharedPcm`]): a sender never copies a clip out of its recording, nor under
    /// its own locks, however often it sends it.
    Pcm16k(#[serde(with = "crate::pcm_bytes")] SharedPcm),
}

impl Audio {
    pub fn num_samples(&self) -> usize {
        match self {
            Self::Pcm16k(pcm) => pcm.len(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerMessage {
    Hello {
        version: u16,
        worker: WorkerInfo,
    },
    Result(TranscribeResponse),
    /// `id` is `None` for connection-level errors (bad handshake, undecodable frame).
    Error {
        id: Option<RequestId>,
        error: WireError,
    },
    Health(HealthReport),
    Diarized(DiarizeResponse),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// `cpu`, `onnx`, `cuda`.
    pub engine: String,
    /// Which requests this worker accepts.
    pub task: Task,
    pub pid: u32,
    pub model: ModelInfo,
    /// The GPU this worker runs on, as its engine probed it; `None` on the CPU engines.
    pub device: Option<DeviceReport>,
}

/// What the worker's engine found when it created its device context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceReport {
    /// CUDA ordinal inside this process (after `CUDA_VISIBLE_DEVICES`).
    pub ordinal: u32,
    pub name: String,
    pub sm_count: u32,
    /// (major, minor).
    pub compute_capability: (u32, u32),
    pub memory_bytes: u64,
    /// Present when the context is an MPS client.
    pub mps: Option<MpsReport>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpsReport {
    /// The SM share this client runs under (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`), in percent.
    pub active_thread_percentage: u32,
}

/// What a client needs to turn hypotheses into timed text without loading the weights
/// (the fields of `model_core::timestamps::FrameTiming`, plus the vocabulary). A diarization
/// worker sends its model's path, feature hop and subsampling with an empty vocabulary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// The model's path as the worker was given it.
    pub path: String,
    /// SentencePiece pieces by id (blank excluded).
    pub vocabulary: Vec<String>,
    /// Feature hop in seconds (`preprocessor.window_stride`).
    pub window_stride_s: f64,
    pub subsampling_factor: u32,
    pub sample_rate_hz: u32,
}

impl ModelInfo {
    /// The frame timing of this model's hypotheses.
    pub fn frame_timing(&self) -> FrameTiming {
        FrameTiming {
            window_stride_s: self.window_stride_s,
            subsampling_factor: self.subsampling_factor as usize,
            sample_rate_hz: self.sample_rate_hz,
        }
    }

    /// NeMo's timestamps for this model's hypotheses: the same whether the engine runs in this
    /// process or in a worker (whose handshake carries this description).
    pub fn timestamper(&self) -> Timestamper {
        Timestamper::new(
            &self.vocabulary,
            self.frame_timing(),
            TimestampOptions::default(),
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscribeResponse {
    pub id: RequestId,
    pub hypothesis: Hypothesis,
    pub timings: Timings,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Timings {
    /// Arrival to the start of its batch.
    pub queue_us: u64,
    /// Engine time of the whole batch.
    pub batch_us: u64,
    pub batch_size: u32,
    /// Longest member's feature frames × batch size.
    pub padded_frames: u64,
    /// Sum of the members' own feature frames (`padded_frames - batch_frames` is padding).
    pub batch_frames: u64,
    /// The worker process's batch counter (from 1): answers of one batch share it, so a client
    /// counts each batch once.
    pub batch_seq: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireErrorKind {
    VersionMismatch,
    /// The message was understood but its content is unusable (e.g. empty audio).
    BadRequest,
    /// The queue is full: retry elsewhere or later.
    Overloaded,
    DeadlineExceeded,
    Cancelled,
    /// The engine failed on this batch; retrying on the same worker may fail again.
    Inference,
    ShuttingDown,
    /// The frame could not be decoded; the worker closes the connection after this.
    Malformed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireError {
    pub kind: WireErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerState {
    Ready,
    /// The engine has been running one batch for longer than the worker's own limit, or it
    /// reported an unrecoverable device error: restart this worker (and its GPU group).
    Wedged,
    ShuttingDown,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HealthReport {
    pub nonce: u64,
    pub state: WorkerState,
    /// Requests waiting for a batch.
    pub queue_depth: u32,
    /// Milliseconds the engine has spent on its current batch (0 when idle).
    pub engine_busy_ms: u64,
    pub batches_done: u64,
}
