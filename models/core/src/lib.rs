//! The model's light types and rules, shared by every engine and by the crates that only carry
//! or render results (the worker protocol, the fleet, the dispatcher): the model config, the
//! transcript types, the TDT greedy loop (generic over the networks), timestamps, speaker
//! attribution and the output renderers. No engine, no checkpoint loading, no async.

pub mod config;
pub mod detokenize;
pub mod encoder;
pub mod error;
pub mod long_audio;
pub mod render;
pub mod scores;
pub mod speakers;
pub mod tdt;
pub mod timestamps;
pub mod transcript;

pub use error::CoreError;
