//! `dispatcher`: the command users touch.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use telemetry::logs::LogFormat;

mod cli;

#[derive(Debug, Parser)]
#[command(name = "dispatcher", version, about)]
struct Cli {
    /// Log lines on stderr: `text`, or `json` (one object per line, for log shippers).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Transcribe local audio files on this machine and print (or write) the result.
    Transcribe(cli::transcribe::TranscribeArgs),
    /// Run the whole pipeline on this machine: a directory spool as the queue, a directory as
    /// the store. `--input-dir DIR` submits a folder of recordings first.
    Local(cli::local::LocalArgs),
    /// Consume jobs from SQS, read inputs from and write results to S3.
    Run(cli::run::RunArgs),
    /// Send job messages for `s3://bucket/key` inputs (to SQS or a local spool).
    Enqueue(cli::enqueue::EnqueueArgs),
    /// Enqueue every input under `s3://bucket/prefix` that has no result for this model.
    Backfill(cli::backfill::BackfillArgs),
    /// For every input under `s3://bucket/prefix`: one complete result, a failure record, or
    /// nothing (exit status 3 while any input has no result); `--enqueue-missing` sends jobs.
    Reconcile(cli::reconcile::ReconcileArgs),
    /// Serve OpenAI's transcription API (`POST /v1/audio/transcriptions`, `GET /v1/models`)
    /// with `/health` and `/metrics`, on the in-process engine or the worker fleet.
    Serve(cli::serve::ServeArgs),
}

fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    // The audio decoders' own log lines (symphonia's "probe reached EOF", ...) repeat, in
    // their words, what the dispatcher reports once as a typed error: off unless RUST_LOG
    // asks for them.
    telemetry::logs::init(cli.log_format, "info", &["symphonia"]);
    match cli.command {
        Command::Transcribe(args) => cli::transcribe::run(args),
        Command::Local(args) => return cli::run::block_on(cli::local::run(args)),
        Command::Run(args) => cli::run::block_on(cli::run::run(args)),
        Command::Enqueue(args) => cli::run::block_on(cli::enqueue::run(args)),
        Command::Backfill(args) => cli::run::block_on(cli::backfill::run(args)),
        Command::Reconcile(args) => return cli::run::block_on(cli::reconcile::run(args)),
        Command::Serve(args) => cli::run::block_on(cli::serve::run(args)),
    }?;
    Ok(ExitCode::SUCCESS)
}
