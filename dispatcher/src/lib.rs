//! The dispatcher library: queues, object stores, the job pipeline, lifecycle and metrics.
//! The binary (`src/main.rs`) only parses flags and wires these together.

pub mod app;
pub mod aws;
pub mod backfill;
pub mod checkpoint;
pub mod config;
pub mod decode;
pub mod decode_pool;
pub mod diarizer;
pub mod error;
pub mod fleet_engine;
pub mod in_process;
pub mod job;
pub mod lifecycle;
pub mod metrics;
pub mod model_id;
pub mod open_files;
pub mod outputs;
pub mod pipeline;
pub mod queue;
pub mod reconcile;
pub mod recording;
pub mod render;
pub mod serve;
pub mod store;
pub mod tenants;
pub mod transcriber;

pub use error::DispatchError;
