//! One model instance serving transcription (or, with `--task diarize`, diarization) requests
//! over a Unix socket: an async accept loop, a batcher actor whose policy
//! ([`batch_policy::BatchQueue`]) is a plain struct, and the engine on its own OS thread.

pub mod batch_policy;
pub mod batcher;
pub mod config;
pub mod engine_thread;
pub mod error;
pub mod fault_injection;
pub mod server;

pub use error::WorkerError;
