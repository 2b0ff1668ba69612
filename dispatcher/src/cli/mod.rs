//! One module per subcommand.

pub(crate) mod transcribe;

pub(crate) mod backfill;
pub(crate) mod enqueue;
pub(crate) mod local;
pub(crate) mod progress;
pub(crate) mod run;
