//! Parakeet TDT (and Sortformer) independent of serving: checkpoints, features, the CPU f32
//! reference model, TDT decoding, timestamps and output renderers. No async, no cloud.

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod tdt;
pub mod tensor;
pub mod transcript;

pub use error::ModelError;
