//! `dispatcher local`: the whole pipeline on one machine, no cloud account. A directory spool
//! is the queue, a directory store holds inputs and results. With `--input-dir`, every file
//! in that folder is submitted first; then jobs run until the queue is empty (or forever with
//! `--follow`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use dispatcher::app::{self, MetricsRuntime};
use dispatcher::config::SettingsArgs;
use dispatcher::job::{JobMessage, ObjectRef};
use dispatcher::lifecycle::{run_until_signal, Consumer};
use dispatcher::metrics::Metrics;
use dispatcher::queue::spool::SpoolQueue;
use dispatcher::queue::Queue;
use dispatcher::store::local::LocalStore;
use dispatcher::store::ObjectStore;
use tokio_util::sync::CancellationToken;

use super::progress::{Progress, Snapshot};
use super::EXIT_PARTIAL;

/// Bucket (store subdirectory) that `--input-dir` files are copied into.
pub(crate) const LOCAL_INPUT_BUCKET: &str = "inputs";
/// Default result prefix in local mode.
pub(crate) const LOCAL_OUTPUT_URI: &str = "s3://results/";

#[derive(Debug, clap::Args)]
pub(crate) struct LocalArgs {
    /// Spool directory: the durable local queue (created if missing).
    #[arg(long)]
    pub(crate) spool: PathBuf,
    /// Store directory: one subdirectory per bucket (created if missing). Results land in
    /// `<store>/results/` unless `--output-uri` says otherwise.
    #[arg(long)]
    pub(crate) store: PathBuf,
    /// Submit every file under this folder (hard-linked into `<store>/inputs/`, or copied where
    /// the two are on different file systems) before processing.
    #[arg(long)]
    pub(crate) input_dir: Option<PathBuf>,
    /// Submit the `--input-dir` files as diarized jobs (speaker labels and transcript.rttm);
    /// needs `--diar-model`.
    #[arg(long, requires = "input_dir")]
    pub(crate) diarize: bool,
    /// Keep waiting for new messages instead of exiting once the queue is empty.
    #[arg(long)]
    pub(crate) follow: bool,
    /// Off a terminal (where no progress bar is drawn), seconds between progress lines.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) progress_interval_s: f64,
    #[command(flatten)]
    pub(crate) settings: SettingsArgs,
    #[command(flatten)]
    pub(crate) engine: dispatcher::fleet_engine::EngineArgs,
}

/// What a local spool and store change in the defaults (`local` and `serve`): results under
/// `<store>/results/`, and short receives (a directory answers at once; there is no long poll
/// to wait out).
pub(crate) const LOCAL_DEFAULTS: &[(&str, &str)] =
    &[("output_uri", LOCAL_OUTPUT_URI), ("wait_time_s", "1")];

pub(crate) async fn run(args: LocalArgs) -> anyhow::Result<ExitCode> {
    if !(args.progress_interval_s.is_finite() && args.progress_interval_s > 0.0) {
        anyhow::bail!(
            "--progress-interval-s must be a positive number of seconds, got {}",
            args.progress_interval_s
        );
    }
    let settings = args.settings.resolve()?;
    let model = settings.model.clone().context(
        "--model (or PARAKEET_MODEL, or `model` in the --config file) is required to process jobs",
    )?;
    if args.diarize && settings.diar_model.is_none() {
        anyhow::bail!("--diarize needs --diar-model (or PARAKEET_DIAR_MODEL, or `diar_model` in the --config file)");
    }
    let spool = SpoolQueue::open(&args.spool, settings.max_receives)?;
    let store = LocalStore::open(&args.store)?;
    let submitted = match &args.input_dir {
        Some(dir) => {
            let n = submit_dir(&spool, &store, dir, args.diarize)?;
            eprintln!("submitted {n} files from {}", dir.display());
            Some(n as u64)
        }
        None => None,
    };
    let engine = dispatcher::fleet_engine::load_for(&args.engine, &settings, &model)?;
    let transcriber = engine.transcriber;
    let diarizer = engine.diarizer;
    let metrics = MetricsRuntime::start(&settings, None).await?;
    if let Some(source) = engine.metrics_source {
        metrics.metrics.add_source(source);
    }
    let queue: Arc<dyn Queue> = Arc::new(spool.clone());
    let store_dyn: Arc<dyn ObjectStore> = Arc::new(store.clone());
    let parts = app::ConsumerParts {
        queue,
        store: store_dyn,
        transcriber,
        diarizer,
    };
    let consumer = app::consumer(&settings, parts, &metrics, !args.follow)?;
    // Jobs in the spool from before (no --input-dir): the total is unknown.
    let total = submitted.filter(|_| !args.follow);
    let progress = Progress::new(
        "files",
        total,
        Duration::from_secs_f64(args.progress_interval_s),
    );
    let watching = CancellationToken::new();
    let watcher = tokio::spawn(watch(
        progress,
        consumer.clone(),
        metrics.metrics.clone(),
        watching.clone(),
    ));
    let started = Instant::now();
    let summary = run_until_signal(consumer.clone(), CancellationToken::new()).await?;
    let wall_s = super::summary::wall_s(&consumer, started);
    watching.cancel();
    let progress = watcher.await?;
    let totals = metrics.metrics.clone();
    // Shutting down folds the last events into the totals.
    metrics.shutdown().await;
    progress.finish(
        snapshot(&consumer, &totals),
        Duration::from_secs_f64(wall_s),
    );
    eprint!(
        "{}",
        super::summary::stage_table(&totals, wall_s, consumer.decode_threads())
    );
    let counts = spool.counts()?;
    eprintln!(
        "done {} · already done {} · failed {} · ignored {} · unreadable {} · released {} · \
         dead-lettered total {} · results under {}",
        summary.done,
        summary.already_done,
        summary.failed,
        summary.ignored,
        summary.bad_messages,
        summary.released,
        counts.dead,
        args.store.join("results").display()
    );
    if summary.infrastructure_stop {
        anyhow::bail!("stopped after an infrastructure error (see log)");
    }
    if summary.failed > 0 {
        eprintln!(
            "{} jobs failed: each has a failure record (failure.json) naming the reason under {}",
            summary.failed,
            args.store.join("results").display()
        );
        return Ok(ExitCode::from(EXIT_PARTIAL));
    }
    Ok(ExitCode::SUCCESS)
}

/// Updates `progress` four times a second until `stop`, then hands it back.
async fn watch(
    mut progress: Progress,
    consumer: Arc<Consumer>,
    metrics: Metrics,
    stop: CancellationToken,
) -> Progress {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = tick.tick() => progress.update(snapshot(&consumer, &metrics)),
            _ = stop.cancelled() => return progress,
        }
    }
}

fn snapshot(consumer: &Consumer, metrics: &Metrics) -> Snapshot {
    let summary = consumer.summary();
    let registry = metrics.registry();
    let audio_s = registry
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .audio_seconds_total();
    Snapshot {
        done: summary.done + summary.already_done,
        failed: summary.failed,
        audio_s,
    }
}

/// Puts every visible file under `dir` into the store and enqueues one job per file.
pub(crate) fn submit_dir(
    spool: &SpoolQueue,
    store: &LocalStore,
    dir: &Path,
    diarize: bool,
) -> anyhow::Result<usize> {
    let mut files = Vec::new();
    walk(dir, dir, &mut files)?;
    files.sort();
    for (path, key) in &files {
        store
            .put_replace(LOCAL_INPUT_BUCKET, key, path)
            .with_context(|| format!("submitting {}", path.display()))?;
        let mut job = JobMessage::new(
            format!("local-{}", uuid::Uuid::new_v4()),
            &ObjectRef::new(LOCAL_INPUT_BUCKET, key.as_str()),
        );
        job.diarize = diarize;
        spool.send_one(&serde_json::to_string(&job)?)?;
    }
    Ok(files.len())
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<(PathBuf, String)>) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            eprintln!("skipping {} (name is not UTF-8)", entry.path().display());
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        let kind = entry.file_type()?;
        if kind.is_dir() {
            walk(root, &entry.path(), out)?;
        } else if kind.is_file() {
            let rel = entry.path();
            let rel = rel.strip_prefix(root).unwrap_or(&rel);
            let key = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            out.push((entry.path(), key));
        }
    }
    Ok(())
}
