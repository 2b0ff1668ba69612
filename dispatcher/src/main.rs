//! `dispatcher`: the command users touch.

use clap::{Parser, Subcommand};

mod cli;

#[derive(Debug, Parser)]
#[command(name = "dispatcher", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Transcribe local audio files on this machine and print (or write) the result.
    Transcribe(cli::transcribe::TranscribeArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Transcribe(args) => cli::transcribe::run(args),
    }
}
