//! Parakeet TDT (and Sortformer) engines independent of serving: checkpoints, features, the CPU
//! f32 reference model and the ONNX engine. The light types they share with the rest of the
//! workspace (config, transcripts, the TDT loop, timestamps, renderers) are in `model_core`.
//! No async, no cloud.

pub mod checkpoint;
mod encoder;
pub mod error;
pub mod features;
mod linalg;
pub mod model;
pub mod onnx;
pub mod prediction;
pub mod sortformer;
pub mod tensor;

pub use error::ModelError;
// Interim: worker/cuda still names these through `models`.
pub use features::{FeatureExtractor, Features};
pub use model::ParakeetModel;
pub use model_core::{config, detokenize, render, speakers, tdt, timestamps, transcript};
