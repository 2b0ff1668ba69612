//! `worker serve`: load, warm up, then serve the socket. `worker probe`: what can run here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::net::UnixListener;
use worker::batch_policy::BatchQueue;
use worker::batcher::{Batcher, QueueStats};
use worker::config::{Cli, Command, ProbeArgs, ServeArgs};
use worker::engine_thread::Served;
use worker::fault_injection::{self, PendingFault};
use worker::server::{accept_loop, ServerContext};
use worker::{engine_thread, WorkerError};
use worker_protocol::{Task, WorkerInfo};

/// How long a stopping worker waits for its engine to be released: under the 2 s the fleet
/// gives a worker between SIGTERM and SIGKILL.
const ENGINE_RELEASE_LIMIT: Duration = Duration::from_millis(1500);

fn main() -> std::process::ExitCode {
    cli::cpu::exit_if_unsupported();
    let cli = cli::parse::<Cli>();
    telemetry::logs::init(cli.log_format, "info", &[]);
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Probe(args) => probe(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => cli::report::exit_failure(error.as_ref()),
    }
}

fn probe(args: &ProbeArgs) -> Result<()> {
    println!("engine cpu: available (models crate f32 reference)");
    match models::onnx::dylib_from_env() {
        Some(path) => println!("engine onnx: ONNX Runtime from {}", path.display()),
        None => println!("engine onnx: unavailable until ORT_DYLIB_PATH names ONNX Runtime"),
    }
    let probed = cuda_engine::CudaEngine::new(args.cuda_device).and_then(|e| e.probe());
    match probed {
        Ok(probe) => {
            println!("engine cuda: available: {}", probe.summary());
            let report = engine::cuda::device_report(&probe);
            println!("device {}", serde_json::to_string(&report)?);
            Ok(())
        }
        Err(error) => {
            println!("engine cuda: unavailable: {error}");
            if args.require_cuda {
                anyhow::bail!("CUDA probe failed on device {}: {error}", args.cuda_device);
            }
            Ok(())
        }
    }
}

/// One second of a quiet tone: exercises features, encoder and decoder before ready.
fn warmup_clip() -> Vec<f32> {
    (0..16_000)
        .map(|i| 0.05 * (i as f32 * 440.0 * std::f32::consts::TAU / 16_000.0).sin())
        .collect()
}

/// Loads the task's engine and runs the warm-up clip through it.
fn load_and_warm_up(
    args: &ServeArgs,
    task: Task,
) -> Result<(Served, WorkerInfo, usize), WorkerError> {
    let started = Instant::now();
    let clip = warmup_clip();
    let (served, model, device, hop_samples) = match task {
        Task::Transcribe => {
            let mut engine = engine::load(args.engine, &args.model, &args.engine_settings())?;
            let loaded = started.elapsed();
            engine.transcribe(&[&clip])?;
            log_ready(engine.name(), task, started, loaded);
            let (model, device, hop) = (engine.model_info(), engine.device(), engine.hop_samples());
            (Served::Transcribe(engine), model, device, hop)
        }
        Task::Diarize => {
            let mut engine =
                engine::load_diarizer(args.engine, &args.model, &args.engine_settings())?;
            let loaded = started.elapsed();
            engine.diarize(&clip)?;
            log_ready(engine.name(), task, started, loaded);
            let (model, device, hop) = (engine.model_info(), engine.device(), engine.hop_samples());
            (Served::Diarize(engine), model, device, hop)
        }
    };
    let info = WorkerInfo {
        engine: served.name().into(),
        task,
        pid: std::process::id(),
        model,
        device,
    };
    Ok((served, info, hop_samples))
}

fn log_ready(engine: &str, task: Task, started: Instant, loaded: Duration) {
    tracing::info!(
        engine,
        task = task.label(),
        load_s = loaded.as_secs_f64(),
        warm_s = (started.elapsed() - loaded).as_secs_f64(),
        "engine ready"
    );
}

fn serve(args: ServeArgs) -> Result<()> {
    // If the supervisor dies (even by SIGKILL), stop too: an orphaned worker would keep its
    // GPU memory and MPS slot with nobody routing to it.
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))
        .context("setting the parent-death signal")?;
    let policy = args.batch_policy()?;
    let task = args.task.task();
    let (engine, info, hop_samples) = load_and_warm_up(&args, task).with_context(|| {
        format!(
            "starting the {} engine for {}",
            args.engine.name(),
            task.label()
        )
    })?;
    let faults = Arc::new(PendingFault::default());
    let (engine_tx, engine_status, engine_thread) =
        engine_thread::spawn(engine, faults.clone()).context("engine thread")?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let served = runtime.block_on(async move {
        if args.fault_injection {
            fault_injection::listen(faults).context("fault injection signal handlers")?;
        }
        let stats = Arc::new(QueueStats::default());
        let (batcher_tx, batcher_rx) = tokio::sync::mpsc::channel(1024);
        let batcher = Batcher::new(BatchQueue::new(policy), args.max_queue, Arc::clone(&stats));
        tokio::spawn(batcher.run(batcher_rx, engine_tx));
        let ctx = Arc::new(ServerContext::new(
            info,
            batcher_tx,
            stats,
            engine_status,
            hop_samples,
            Duration::from_millis(args.wedge_after_ms),
        ));

        // Bind under a temporary name and rename: clients never see a half-made socket, and a
        // stale socket from a killed predecessor is replaced atomically.
        let temp = args
            .socket
            .with_extension(format!("tmp{}", std::process::id()));
        let _ = std::fs::remove_file(&temp);
        let listener =
            UnixListener::bind(&temp).with_context(|| format!("binding {}", temp.display()))?;
        std::fs::rename(&temp, &args.socket)
            .with_context(|| format!("publishing {}", args.socket.display()))?;
        tracing::info!(socket = %args.socket.display(), "ready");

        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .context("SIGTERM handler")?;
        tokio::select! {
            () = accept_loop(listener, ctx) => {}
            _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
            _ = tokio::signal::ctrl_c() => tracing::info!("interrupted: stopping"),
        }
        let _ = std::fs::remove_file(&args.socket);
        anyhow::Ok(())
    });
    // Dropping the runtime drops the batcher and with it the engine thread's last sender: the
    // thread ends and releases the engine while the driver is still up.
    drop(runtime);
    engine_thread::join(engine_thread, ENGINE_RELEASE_LIMIT);
    served
}
