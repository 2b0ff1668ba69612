//! `fleet`: the worker supervisor on its own, for systemd units and containers.
//!
//! Starts one MPS control daemon per GPU (unless one already serves that GPU's pipe
//! directory), the worker groups, and a `/health` + `/metrics` listener; prints every
//! supervisor event as one JSON line on stdout; on SIGTERM or SIGINT stops the workers and the
//! daemons it started, and exits 0.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use worker_fleet::{Fleet, FleetEvent, FleetHooks, FleetOptions};
use worker_protocol::EngineKind;

#[derive(Debug, Parser)]
#[command(
    name = "fleet",
    version,
    about = "Supervise Parakeet worker processes: per-GPU groups under CUDA MPS, or CPU workers"
)]
struct Args {
    /// The engine every worker runs (`worker serve --engine`).
    #[arg(long, value_enum)]
    engine: EngineKind,
    /// The model every transcription worker loads (`.nemo`, or an ONNX export directory).
    #[arg(long)]
    model: PathBuf,
    /// A Sortformer `.nemo`: run a diarization pool next to the transcription workers of
    /// every group (`--diar-workers-per-gpu`, `--diar-mps-percentage`, `--diar-engine`).
    #[arg(long)]
    diar_model: Option<PathBuf>,
    /// Serve `/health` (JSON; 200 when every group has a ready worker) and `/metrics`
    /// (Prometheus text) here.
    #[arg(long, default_value = "127.0.0.1:9410")]
    metrics_listen: SocketAddr,
    /// Log lines on stderr: `text`, or `json` (one object per line, for log shippers).
    #[arg(long, value_enum, default_value_t)]
    log_format: telemetry::logs::LogFormat,
    #[command(flatten)]
    fleet: FleetOptions,
}

fn main() -> std::process::ExitCode {
    cli::cpu::exit_if_unsupported();
    let args = cli::parse::<Args>();
    telemetry::logs::init(args.log_format, "info", &[]);
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => cli::report::exit_failure(error.as_ref()),
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let config = args
        .fleet
        .to_config_with_diarization(args.engine, &args.model, args.diar_model.as_deref())
        .context("fleet options")?;
    let (events, printed) = std::sync::mpsc::channel::<FleetEvent>();
    let printer = std::thread::Builder::new()
        .name("fleet-events".into())
        .spawn(move || print_events(printed))
        .context("event printer thread")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let served = runtime.block_on(async move {
        let hooks = FleetHooks {
            events: Some(events),
            ..FleetHooks::default()
        };
        let fleet = Arc::new(Fleet::start_with(config, hooks).context("starting the fleet")?);
        let result = serve_until_signal(Arc::clone(&fleet), args.metrics_listen).await;
        // Workers first, then the daemons they were clients of (Fleet::shutdown's order).
        tokio::task::spawn_blocking(move || fleet.shutdown())
            .await
            .context("shutdown task")?;
        result
    });
    // Dropping the runtime drops the listener's tasks and their handles on the fleet; with the
    // fleet gone, so is the event sender: the printer drains and ends.
    drop(runtime);
    let _ = printer.join();
    served
}

async fn serve_until_signal(fleet: Arc<Fleet>, addr: SocketAddr) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let bound = telemetry::serve(addr, Arc::clone(&fleet), async move {
        let _ = http_stopped.await;
    })
    .await?;
    tracing::info!(addr = %bound, "serving /health and /metrics");
    // On stdout too, so a script that asked for port 0 learns the port.
    println!(
        "{}",
        serde_json::json!({"event": "listening", "addr": bound.to_string()})
    );
    let gave_up = async {
        loop {
            if let Some(error) = fleet.gave_up() {
                return error;
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    };
    let result = tokio::select! {
        _ = terminate.recv() => {
            tracing::info!("SIGTERM: stopping the fleet");
            Ok(())
        }
        _ = interrupt.recv() => {
            tracing::info!("SIGINT: stopping the fleet");
            Ok(())
        }
        error = gave_up => Err(anyhow::Error::new(error)),
    };
    let _ = stop_http.send(());
    result
}

/// One JSON object per line, flushed at once (operators and scripts grep stdout).
fn print_events(events: std::sync::mpsc::Receiver<FleetEvent>) {
    let stdout = std::io::stdout();
    for event in events {
        match serde_json::to_string(&event) {
            Ok(line) => {
                let mut out = stdout.lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            }
            Err(e) => tracing::warn!(error = %e, ?event, "event not printable"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_is_a_flag_a_variable_and_a_key() {
        assert_eq!(
            cli::conformance::violations(cli::command::<Args>),
            Vec::<String>::new()
        );
    }

    #[test]
    fn the_settings_reference_is_current() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/settings/fleet.md");
        if let Err(e) = cli::reference::check_file(&cli::command::<Args>(), &path) {
            panic!("{e}");
        }
    }
}
