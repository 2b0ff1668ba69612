//! The names: a setting's TOML key is its long flag with `_` for `-`, its variable the key in
//! upper case after [`ENV_PREFIX`].

use clap::{Arg, ArgAction, Command};

/// The one prefix of every variable our binaries read.
pub const ENV_PREFIX: &str = "PARAKEET_";

/// The id of the `--config` flag every binary gets.
pub(crate) const CONFIG: &str = "config";

/// The TOML key of a setting (`max_in_flight` for `--max-in-flight`); `None` for positional
/// arguments, help, version and `--config` itself.
pub fn key_of(arg: &Arg) -> Option<String> {
    if matches!(
        arg.get_action(),
        ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version
    ) || arg.get_id() == CONFIG
    {
        return None;
    }
    arg.get_long().map(|long| long.replace('-', "_"))
}

/// The variable of a setting key: `PARAKEET_MAX_IN_FLIGHT` for `max_in_flight`.
pub fn env_name(key: &str) -> String {
    format!("{ENV_PREFIX}{}", key.to_uppercase())
}

/// Gives every setting of `cmd` and its subcommands its variable, and `cmd` the global
/// `--config` flag.
pub(crate) fn apply(cmd: Command) -> Command {
    let cmd = cmd.arg(
        Arg::new(CONFIG)
            .long("config")
            .global(true)
            .value_name("FILE")
            .env(env_name(CONFIG))
            .value_parser(clap::value_parser!(std::path::PathBuf))
            .help(
                "TOML file of settings: any flag as a key, `-` written `_` \
                 (`max_in_flight = 64`); flags and variables win over it",
            ),
    );
    with_variables(cmd)
}

fn with_variables(cmd: Command) -> Command {
    let cmd = cmd.mut_args(|arg| match key_of(&arg) {
        Some(key) => arg.env(env_name(&key)),
        None => arg,
    });
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    names
        .into_iter()
        .fold(cmd, |cmd, name| cmd.mut_subcommand(name, with_variables))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_flag() {
        let cmd = apply(
            Command::new("t")
                .arg(Arg::new("max_in_flight").long("max-in-flight"))
                .arg(Arg::new("worker_args").long("worker-arg"))
                .arg(Arg::new("input")),
        );
        let env = |id: &str| {
            cmd.get_arguments()
                .find(|a| a.get_id() == id)
                .and_then(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned())
        };
        assert_eq!(
            env("max_in_flight").as_deref(),
            Some("PARAKEET_MAX_IN_FLIGHT")
        );
        assert_eq!(env("worker_args").as_deref(), Some("PARAKEET_WORKER_ARG"));
        assert_eq!(env("config").as_deref(), Some("PARAKEET_CONFIG"));
        assert_eq!(env("input"), None);
    }
}
