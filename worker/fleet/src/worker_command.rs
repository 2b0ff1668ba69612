//! How the fleet starts a `worker` program (to serve, or to probe a GPU).

use std::path::Path;
use std::process::Command;

/// A command for the worker binary without the supervisor's `PARAKEET_*` variables: workers
/// take their settings from the fleet's arguments only. The supervisor's own variables (its
/// config file, its engine, a dispatcher's model) share the workers' names and would otherwise
/// reach them unasked.
pub(crate) fn worker_command(binary: &Path) -> Command {
    let mut command = Command::new(binary);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with(cli::ENV_PREFIX) {
            command.env_remove(name);
        }
    }
    command
}
