//! The one engine seam. A transcription engine takes 16 kHz mono clips and returns one TDT
//! hypothesis per clip ([`Engine`]); a diarization engine takes one whole recording and returns
//! speaker turns ([`DiarizationEngine`]). [`load`] and [`load_diarizer`] pick the
//! implementation by [`EngineKind`] (`cpu`, `onnx`, `cuda`), with the device and the other
//! choices in [`EngineSettings`]. The `worker` process serves these over a socket; the
//! dispatcher runs them in-process.
//!
//! Layering: the traits ([`transcription`], [`diarization`]) import no implementation; each
//! backend file imports its trait; only [`load`](mod@load) names the backends.

pub mod cpu;
pub mod cuda;
pub mod cuda_diarizer;
pub mod diarization;
pub mod error;
pub mod load;
pub mod model_info;
pub mod onnx;
pub mod transcription;

pub use cuda_engine::EncoderPrecision;
pub use diarization::DiarizationEngine;
pub use error::EngineError;
pub use load::{load, load_diarizer, EngineSettings, OnnxSettings};
pub use transcription::{Engine, Fault};
pub use worker_protocol::EngineKind;
