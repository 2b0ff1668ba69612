//! `dispatcher`: the command users touch.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use telemetry::logs::LogFormat;

mod commands;

#[derive(Debug, Parser)]
#[command(name = "dispatcher", version, about)]
struct Cli {
    /// Log lines on stderr: `text`, or `json` (one object per line, for log shippers).
    #[arg(long, value_enum, default_value_t, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Transcribe local audio files on this machine and print (or write) the result.
    Transcribe(commands::transcribe::TranscribeArgs),
    /// Run the whole pipeline on this machine: a directory spool as the queue, a directory as
    /// the store. `--input-dir DIR` submits a folder of recordings first.
    Local(commands::local::LocalArgs),
    /// Consume jobs from SQS, read inputs from and write results to S3.
    Run(commands::run::RunArgs),
    /// Send job messages for `s3://bucket/key` inputs (to SQS or a local spool).
    Enqueue(commands::enqueue::EnqueueArgs),
    /// Enqueue every input under `s3://bucket/prefix` that has no result for this model.
    Backfill(commands::backfill::BackfillArgs),
    /// For every input under `s3://bucket/prefix`: one complete result, a failure record, or
    /// nothing (exit status 3 while any input has no result); `--enqueue-missing` sends jobs.
    Reconcile(commands::reconcile::ReconcileArgs),
    /// Serve OpenAI's transcription API (`POST /v1/audio/transcriptions`, `GET /v1/models`)
    /// with `/health` and `/metrics`, on the in-process engine or the worker fleet.
    Serve(commands::serve::ServeArgs),
}

/// The command line: the shared vocabulary (`cli`), and the settings' defaults where `--help`
/// shows them, local ones for the commands on a local spool and store.
fn command() -> clap::Command {
    let mut cmd = cli::command::<Cli>();
    for (name, local) in [("local", true), ("serve", true), ("run", false)] {
        let mut defaults = dispatcher::config::SettingsArgs::defaults();
        if local {
            defaults
                .retain(|(id, _)| !commands::local::LOCAL_DEFAULTS.iter().any(|(l, _)| l == id));
            defaults.extend(
                commands::local::LOCAL_DEFAULTS
                    .iter()
                    .map(|(id, v)| (*id, v.to_string())),
            );
        } else {
            // `run`'s receive wait depends on --exit-when-idle (commands::run): left unset
            // here so that the command can tell a chosen wait from none.
            defaults.retain(|(id, _)| *id != "wait_time_s");
        }
        cmd = cmd.mut_subcommand(name, |sub| {
            defaults.into_iter().fold(sub, |sub, (id, value)| {
                sub.mut_arg(id, |arg| arg.default_value(value))
            })
        });
    }
    cmd
}

fn main() -> ExitCode {
    cli::cpu::exit_if_unsupported();
    let parsed: Cli = cli::parse_command(command());
    // The audio decoders' own log lines (symphonia's "probe reached EOF", ...) repeat, in
    // their words, what the dispatcher reports once as a typed error: off unless RUST_LOG
    // asks for them.
    telemetry::logs::init(parsed.log_format, "info", &["symphonia"]);
    // Jobs in flight hold connections and files; the limit in force is logged with the
    // pipeline's limits and sizes them (dispatcher::open_files).
    if let Err(e) = dispatcher::open_files::raise() {
        tracing::warn!(error = %e, "could not raise the open-file limit");
    }
    let done = |r: anyhow::Result<()>| r.map(|()| ExitCode::SUCCESS);
    let result = match parsed.command {
        Command::Transcribe(args) => done(commands::transcribe::run(args)),
        Command::Local(args) => commands::run::block_on(commands::local::run(args)),
        Command::Run(args) => commands::run::block_on(commands::run::run(args)),
        Command::Enqueue(args) => done(commands::run::block_on(commands::enqueue::run(args))),
        Command::Backfill(args) => done(commands::run::block_on(commands::backfill::run(args))),
        Command::Reconcile(args) => commands::run::block_on(commands::reconcile::run(args)),
        Command::Serve(args) => done(commands::run::block_on(commands::serve::run(args))),
    };
    result.unwrap_or_else(|error| cli::report::exit_failure(error.as_ref()))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::FromArgMatches;

    use super::*;

    fn manifest(path: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
    }

    /// Flags, `PARAKEET_` variables and TOML keys of every subcommand, one name each. Sets
    /// variables: the only test here that does.
    #[test]
    fn every_setting_is_a_flag_a_variable_and_a_key() {
        assert_eq!(cli::conformance::violations(command), Vec::<String>::new());
    }

    #[test]
    fn the_settings_reference_is_current() {
        let path = manifest("../docs/settings/dispatcher.md");
        if let Err(e) = cli::reference::check_file(&command(), &path) {
            panic!("{e}");
        }
    }

    /// The example config as `run` reads it: its keys, under a flag, over the defaults.
    #[test]
    fn the_example_config_parses_under_flags() {
        let example = manifest("dispatcher.example.toml");
        let args = ["dispatcher", "run", "--receivers", "3", "--config"]
            .iter()
            .map(Into::into)
            .chain([example.into_os_string()])
            .collect();
        let matches = cli::matches_from(command(), args).expect("parse");
        let Command::Run(run) = Cli::from_arg_matches(&matches).expect("args").command else {
            panic!("not run");
        };
        let s = run.settings.resolve().expect("settings");
        assert_eq!(
            s.cloudwatch_namespace.as_deref(),
            Some("Transcription/Dispatcher")
        );
        assert_eq!((s.max_audio_duration_s, s.receivers), (43_200, Some(3)));
        assert_eq!(s.retry_max, 4, "a built-in default");
    }

    /// `run --exit-when-idle` receives for 1 s (it stops after a receive that finds nothing)
    /// unless a flag or a config key chose a wait; `run` alone long-polls for 20 s.
    #[test]
    fn a_batch_run_waits_briefly_unless_told_otherwise() {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("dispatcher.toml");
        std::fs::write(&config, "wait_time_s = 5\n").expect("config file");
        let wait = |extra: &[&str]| {
            let args = ["dispatcher", "run"]
                .iter()
                .chain(extra)
                .map(Into::into)
                .collect();
            let matches = cli::matches_from(command(), args).expect("parse");
            let Command::Run(run) = Cli::from_arg_matches(&matches).expect("args").command else {
                panic!("not run");
            };
            run.settings().expect("settings").wait_time_s
        };
        let config = config.to_str().expect("utf-8 path");
        assert_eq!(wait(&[]), 20);
        assert_eq!(wait(&["--exit-when-idle"]), 1);
        assert_eq!(wait(&["--exit-when-idle", "--wait-time-s", "20"]), 20);
        assert_eq!(wait(&["--exit-when-idle", "--config", config]), 5);
        assert_eq!(wait(&["--config", config]), 5);
    }

    /// `local` and `serve` default to the local store's result prefix and short receives.
    #[test]
    fn local_commands_have_local_defaults() {
        for name in ["local", "serve"] {
            let cmd = command();
            let sub = cmd.find_subcommand(name).expect(name);
            let default = |id: &str| {
                sub.get_arguments()
                    .find(|a| a.get_id() == id)
                    .and_then(|a| a.get_default_values().first().cloned())
                    .map(|v| v.to_string_lossy().into_owned())
            };
            assert_eq!(default("wait_time_s").as_deref(), Some("1"), "{name}");
            assert_eq!(
                default("output_uri").as_deref(),
                Some("s3://results/"),
                "{name}"
            );
        }
    }
}
