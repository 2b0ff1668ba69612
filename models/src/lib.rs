//! Parakeet TDT (and Sortformer) independent of serving: checkpoints, features, the CPU f32
//! reference model, TDT decoding, timestamps and output renderers. No async, no cloud.

pub mod checkpoint;
pub mod config;
pub mod detokenize;
mod encoder;
pub mod error;
pub mod features;
mod linalg;
pub mod model;
pub mod onnx;
pub mod prediction;
pub mod render;
pub mod sortformer;
pub mod speakers;
pub mod tdt;
pub mod tensor;
pub mod timestamps;
pub mod transcript;

pub use error::ModelError;
pub use features::{FeatureExtractor, Features};
pub use model::ParakeetModel;
