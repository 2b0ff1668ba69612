//! Parakeet TDT ONNX exports (NeMo, onnx-asr, sherpa-onnx layouts) on ONNX Runtime through
//! `ort`, loaded at run time from `ORT_DYLIB_PATH` (never downloaded at build time).
//!
//! The encoder runs as one batched graph; the prediction and joint networks are wrapped in a
//! [`model_core::tdt::TransducerNet`] so decoding follows exactly the native engine's rules.
//!
//! ```no_run
//! # fn main() -> Result<(), models::ModelError> {
//! use models::onnx::{OnnxModel, OnnxOptions};
//! // ORT_DYLIB_PATH=.../site-packages/onnxruntime/capi/libonnxruntime.so.1.32.0
//! let mut model = OnnxModel::load("export-dir".as_ref(), &OnnxOptions::default())?;
//! let pcm = vec![0.0f32; 16_000];
//! let hyps = model.transcribe_batch(&[&pcm])?;
//! # Ok(()) }
//! ```

mod encoder;
mod layout;
mod model;
mod options;
mod preprocessor;
mod runtime;
mod session;
mod settings;
mod state;
mod transducer;
mod vocab;

pub use layout::{Layout, LayoutKind, TransducerGraphs};
pub use model::OnnxModel;
pub use options::{ExecutionProvider, FeatureSource, OnnxOptions};
pub use runtime::{dylib_from_env, find_dylib, ORT_DYLIB_PATH};
