//! Runs and supervises `worker` processes and routes requests to them.
//!
//! - [`Fleet`]: starts N workers per group (a GPU, or the CPU), serialises their model loading
//!   with a file lock, health-pings them, restarts crashed or stuck ones with backoff (the whole
//!   group when the group runs under MPS, whose faults hit every client of the GPU), and re-sends
//!   the requests a dead worker held. Routing: least outstanding work; backpressure when full.
//! - [`FleetTranscriber`]: hypotheses to transcripts, shaped like the dispatcher's `Transcriber`.
//! - [`mps`]: the environment and control-daemon commands of CUDA MPS, as data.
//!
//! Synchronous (threads, not async): the dispatcher calls transcribers on blocking threads.

mod client;
pub mod config;
mod error;
mod fleet;
mod load_lock;
pub mod mps;
mod transcriber;

pub use config::{Backoff, FleetConfig, GroupConfig};
pub use error::FleetError;
pub use fleet::{Fleet, RestartCause, WorkerStatus};
pub use load_lock::LoadLock;
pub use transcriber::FleetTranscriber;
