//! Runs and supervises `worker` processes and routes requests to them.
//!
//! - [`Fleet`]: starts N workers per group (a GPU, or the CPU), serialises their model loading
//!   with a file lock, health-pings them, restarts crashed or stuck ones with backoff (the whole
//!   group when the group runs under MPS, whose faults hit every client of the GPU), and re-sends
//!   the requests a dead worker held. Routing: least outstanding work; backpressure when full.
//! - [`FleetTranscriber`]: hypotheses to transcripts, shaped like the dispatcher's `Transcriber`.
//! - Diarization: with a [`DiarizationPool`], every group also runs Sortformer workers
//!   (`worker serve --task diarize`); [`Fleet::diarize`] sends a whole recording to the
//!   least-loaded one. They share their GPU's MPS daemon, hence its group restarts.
//! - [`mps`]: the environment and control-daemon commands of CUDA MPS, as data, and the
//!   `terminate_client` exchange run before an MPS client is killed.
//! - [`FleetOptions`]: the command-line shape of a fleet, shared by the standalone `fleet`
//!   supervisor binary and the dispatcher (a fleet when `--gpus` or `--cpu-instances` is given).
//! - Observability: [`FleetEvent`]s, [`FleetHealth`], [`Fleet::render_prometheus`].
//!
//! Synchronous (threads, not async): the dispatcher calls transcribers on blocking threads.

mod client;
pub mod config;
mod error;
mod events;
mod fleet;
mod health;
pub mod layout;
mod load_lock;
mod metrics;
pub mod mps;
mod options;
mod transcriber;
mod worker_command;

pub use config::{Backoff, DiarizationPool, FleetConfig, GroupConfig};
pub use error::FleetError;
pub use events::{FleetEvent, RestartCause};
pub use fleet::{Fleet, FleetHooks, Priority, WorkerPhase, WorkerStatus};
pub use health::{FleetHealth, GroupHealth};
pub use load_lock::LoadLock;
pub use options::{gpu_groups, FleetOptions};
pub use transcriber::FleetTranscriber;
/// The kinds of [`FleetError::Rejected`].
pub use worker_protocol::WireErrorKind;
/// What a worker serves, in statuses and events.
pub use worker_protocol::{DiarizeResponse, SharedPcm, Task};
