//! What `dispatcher`, `worker` and `fleet` share on the command line.
//!
//! One vocabulary: every setting is a long flag `--max-in-flight`, an environment variable
//! `PARAKEET_MAX_IN_FLIGHT` and a key `max_in_flight` of the TOML file named by `--config`
//! (`PARAKEET_CONFIG`), derived here from the flag so no binary can name them differently.
//! Precedence: flag > variable > file > built-in default. [`reference`] renders the settings
//! as Markdown (docs/settings/), [`conformance`] checks the three ways in for every setting,
//! and [`report`] prints an error chain with each cause once.

mod config_file;
pub mod conformance;
pub mod cpu;
mod error;
pub mod reference;
pub mod report;
mod vocabulary;

pub use error::CliError;
pub use vocabulary::{env_name, key_of, ENV_PREFIX};

use std::ffi::OsString;

use clap::{ArgMatches, Command, CommandFactory, FromArgMatches};

/// `C`'s command with the shared vocabulary applied: a variable for every setting and the
/// global `--config` flag.
pub fn command<C: CommandFactory>() -> Command {
    vocabulary::apply(C::command())
}

/// Parses the process's arguments into `C` (flags, variables, then the `--config` file); on a
/// usage or config-file error prints it and exits with status 2, as clap does.
pub fn parse<C: clap::Parser>() -> C {
    parse_command(command::<C>())
}

/// [`parse`] with a command the binary adjusted after [`command`] (defaults it computes).
pub fn parse_command<C: FromArgMatches>(cmd: Command) -> C {
    let parsed = matches_from(cmd, std::env::args_os().collect())
        .and_then(|m| C::from_arg_matches(&m).map_err(CliError::Usage));
    match parsed {
        Ok(parsed) => parsed,
        Err(CliError::Usage(error)) => error.exit(),
        Err(error) => {
            eprintln!("error: {error}");
            std::process::exit(2)
        }
    }
}

/// [`parse`] on given arguments, returning the error instead of exiting.
pub fn try_parse_from<C: clap::Parser>(args: Vec<OsString>) -> Result<C, CliError> {
    let matches = matches_from(command::<C>(), args)?;
    C::from_arg_matches(&matches).map_err(CliError::Usage)
}

/// Matches of `args` against `cmd` (already through [`command`]), the `--config` file's keys
/// acting as defaults under flags and variables.
pub fn matches_from(cmd: Command, args: Vec<OsString>) -> Result<ArgMatches, CliError> {
    let cmd = config_file::apply(cmd, &args)?;
    cmd.try_get_matches_from(args).map_err(CliError::Usage)
}

/// A clap value parser for a length of time in seconds that must be positive and finite
/// (`--full-attention-max-s 1440`).
pub fn positive_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{text}` is not a positive number of seconds")),
    }
}
