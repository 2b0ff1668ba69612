//! The wire protocol between a `worker` process and its clients (the fleet supervisor, tests,
//! operators): frames of `u32` big-endian length + postcard body over a Unix socket.
//!
//! A connection starts with [`ClientMessage::Hello`] carrying [`PROTOCOL_VERSION`]; the worker
//! answers [`WorkerMessage::Hello`] (or a typed error, then closes), which names the [`Task`]
//! it serves. After that the client sends requests of that task (transcription or
//! diarization), cancels and health pings in any order and the worker answers each request
//! exactly once, in completion order, keyed by the client's request id.
//!
//! Decoding never trusts the peer: a length above the frame limit is refused before anything is
//! allocated, and a body that does not decode is a [`ProtocolError`], never a panic.

mod engine_kind;
mod error;
mod frame;
mod messages;
mod pcm_bytes;
mod shared_pcm;

pub use engine_kind::{EngineKind, UnknownEngine};
pub use error::ProtocolError;
pub use frame::{
    decode_body, encode_frame, encode_frame_into, read_frame, write_frame, write_frame_reusing,
    KEPT_BUFFER_BYTES, MAX_FRAME_BYTES, MAX_REQUEST_SAMPLES,
};
#[cfg(feature = "tokio")]
pub use frame::{read_frame_async, read_frame_async_reusing, write_frame_async};
pub use messages::{
    Audio, ClientMessage, DeviceReport, DiarizeRequest, DiarizeResponse, HealthReport, ModelInfo,
    MpsReport, Priority, RequestId, Task, Timings, TranscribeRequest, TranscribeResponse,
    WireError, WireErrorKind, WorkerInfo, WorkerMessage, WorkerState, PROTOCOL_VERSION,
};
pub use shared_pcm::SharedPcm;

#[cfg(test)]
mod tests;
