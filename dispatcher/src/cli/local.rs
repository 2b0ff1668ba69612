//! `dispatcher local`: the whole pipeline on one machine, no cloud account. A directory spool
//! is the queue, a directory store holds inputs and results. With `--input-dir`, every file
//! in that folder is submitted first; then jobs run until the queue is empty (or forever with
//! `--follow`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use dispatcher::app::{self, MetricsRuntime};
use dispatcher::config::SettingsArgs;
use dispatcher::job::{JobMessage, ObjectRef};
use dispatcher::lifecycle::run_until_signal;
use dispatcher::queue::spool::SpoolQueue;
use dispatcher::queue::Queue;
use dispatcher::store::local::LocalStore;
use dispatcher::store::ObjectStore;
use tokio_util::sync::CancellationToken;

/// Bucket (store subdirectory) that `--input-dir` files are copied into.
pub(crate) const LOCAL_INPUT_BUCKET: &str = "inputs";
/// Default result prefix in local mode.
pub(crate) const LOCAL_OUTPUT_URI: &str = "s3://results/";

#[derive(Debug, clap::Args)]
pub(crate) struct LocalArgs {
    /// Spool directory: the durable local queue (created if missing).
    #[arg(long, env = "DISPATCHER_SPOOL")]
    pub(crate) spool: PathBuf,
    /// Store directory: one subdirectory per bucket (created if missing). Results land in
    /// `<store>/results/` unless `--output-uri` says otherwise.
    #[arg(long, env = "DISPATCHER_STORE")]
    pub(crate) store: PathBuf,
    /// Submit every file under this folder (copied to `<store>/inputs/`) before processing.
    #[arg(long)]
    pub(crate) input_dir: Option<PathBuf>,
    /// Submit the `--input-dir` files as diarized jobs (speaker labels and transcript.rttm);
    /// needs `--diar-model`.
    #[arg(long, requires = "input_dir")]
    pub(crate) diarize: bool,
    /// Keep waiting for new messages instead of exiting once the queue is empty.
    #[arg(long)]
    pub(crate) follow: bool,
    /// TOML file with any of the settings below.
    #[arg(long, env = "DISPATCHER_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) settings: SettingsArgs,
    #[command(flatten)]
    pub(crate) engine: dispatcher::fleet_engine::EngineArgs,
}

pub(crate) async fn run(args: LocalArgs) -> anyhow::Result<()> {
    let local_defaults = SettingsArgs {
        output_uri: Some(LOCAL_OUTPUT_URI.into()),
        wait_time_s: Some(1),
        receivers: Some(1),
        ..SettingsArgs::default()
    };
    let settings = args
        .settings
        .over(local_defaults)
        .resolve(args.config.as_deref())?;
    let spool = SpoolQueue::open(&args.spool, settings.max_receives)?;
    let store = LocalStore::open(&args.store)?;
    if let Some(dir) = &args.input_dir {
        if args.diarize && settings.diar_model.is_none() {
            anyhow::bail!("--diarize needs --diar-model (or DIAR_MODEL, or `diar_model`)");
        }
        let n = submit_dir(&spool, &store, dir, args.diarize)?;
        eprintln!("submitted {n} files from {}", dir.display());
    }
    let model = settings
        .model
        .clone()
        .context("--model (or MODEL, or `model` in the config file) is required to process jobs")?;
    let engine = dispatcher::fleet_engine::load_for(&args.engine, &settings, &model)?;
    let transcriber = engine.transcriber;
    let diarizer = engine.diarizer;
    let metrics = MetricsRuntime::start(&settings, None).await?;
    if let Some(source) = engine.metrics_source {
        metrics.metrics.add_source(source);
    }
    let queue: Arc<dyn Queue> = Arc::new(spool.clone());
    let store_dyn: Arc<dyn ObjectStore> = Arc::new(store.clone());
    let consumer = app::consumer_with_diarizer(
        &settings,
        queue,
        store_dyn,
        transcriber,
        diarizer,
        &metrics,
        !args.follow,
    )?;
    let summary = run_until_signal(consumer, CancellationToken::new()).await?;
    metrics.shutdown().await;
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
    Ok(())
}

/// Copies every visible file under `dir` into the store and enqueues one job per file.
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
