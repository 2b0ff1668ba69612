//! `dispatcher serve`: OpenAI's transcription API over HTTP, on the in-process engine or the
//! worker fleet (the same engine flags and settings as `local` and `run`). With `--spool` and
//! `--store` it also works through that local job queue (a backfill) on the same engine, the
//! API's segments first.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use dispatcher::app::{self, MetricsRuntime};
use dispatcher::config::SettingsArgs;
use dispatcher::lifecycle::{wait_for_signal, RunSummary};
use dispatcher::queue::spool::SpoolQueue;
use dispatcher::serve::{serve, ApiKeys, ServeOptions};
use dispatcher::store::local::LocalStore;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Address of the API, `/health` and `/metrics`.
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub(crate) listen: SocketAddr,
    /// File of API keys, one per line (`#` comments): requests must then send
    /// `Authorization: Bearer <key>`. Unset, with no `--api-keys`: no authentication.
    #[arg(long)]
    pub(crate) api_keys_file: Option<PathBuf>,
    /// API keys, comma-separated, with or instead of the file (prefer the variable or the
    /// file: a flag shows in the process list).
    #[arg(long, hide_env_values = true)]
    pub(crate) api_keys: Option<String>,
    /// The name clients give as `model` (default: the model file's name without `.nemo`).
    #[arg(long)]
    pub(crate) served_model_name: Option<String>,
    /// Other names accepted as `model` and listed by `/v1/models`, comma-separated (so clients
    /// written for OpenAI's `whisper-1` work unchanged); empty for none.
    #[arg(long, value_delimiter = ',', default_value = "whisper-1")]
    pub(crate) model_aliases: Vec<String>,
    /// Requests accepted and not yet answered; one more is answered 429 with `Retry-After`.
    #[arg(long, default_value_t = 512)]
    pub(crate) max_pending_requests: usize,
    /// Also consume this spool directory's jobs (as `local` does) on the same engine, once it
    /// is ready; the API's segments go to the workers first. Needs `--store`.
    #[arg(long, requires = "store")]
    pub(crate) spool: Option<PathBuf>,
    /// The store directory of `--spool`'s jobs (inputs and results, as for `local`).
    #[arg(long, requires = "spool")]
    pub(crate) store: Option<PathBuf>,
    /// Submit every file under this folder to `--spool` first (as `local --input-dir`).
    #[arg(long, requires = "spool")]
    pub(crate) input_dir: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) settings: SettingsArgs,
    #[command(flatten)]
    pub(crate) engine: dispatcher::fleet_engine::EngineArgs,
}

/// The names `model` may take: the served name first, then the aliases (deduplicated).
fn model_names(served: Option<String>, model: &Path, aliases: Vec<String>) -> Vec<String> {
    let served = served.unwrap_or_else(|| {
        model
            .file_stem()
            .map_or_else(|| "parakeet".into(), |s| s.to_string_lossy().into_owned())
    });
    let mut names = vec![served];
    for alias in aliases {
        let alias = alias.trim().to_owned();
        if !alias.is_empty() && !names.contains(&alias) {
            names.push(alias);
        }
    }
    names
}

pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<()> {
    // Everything is checked before the listener binds or a worker starts.
    let settings = args.settings.resolve()?;
    let model = settings
        .model
        .clone()
        .context("--model (or PARAKEET_MODEL, or `model` in the --config file) is required")?;
    if args.max_pending_requests == 0 {
        bail!("--max-pending-requests must be at least 1");
    }
    let keys = ApiKeys::load(args.api_keys_file.as_deref(), args.api_keys.as_deref())?;
    if !keys.is_enabled() && !args.listen.ip().is_loopback() {
        tracing::warn!(addr = %args.listen,
            "serving without authentication on a non-loopback address (set --api-keys-file)");
    }
    let options = ServeOptions {
        listen: args.listen,
        keys,
        model_names: model_names(args.served_model_name, &model, args.model_aliases),
        max_pending_requests: args.max_pending_requests,
        audio: app::audio_settings(&settings),
        segments_per_call: settings.segments_per_call,
        drain_grace: Duration::from_secs(settings.drain_grace_s),
    };
    let jobs = match (&args.spool, &args.store) {
        (Some(spool), Some(store)) => {
            let spool = SpoolQueue::open(spool, settings.max_receives)?;
            let store = LocalStore::open(store)?;
            if let Some(dir) = &args.input_dir {
                let n = super::local::submit_dir(&spool, &store, dir, false)?;
                eprintln!("submitted {n} files from {}", dir.display());
            }
            Some((spool, store))
        }
        _ => None,
    };
    let metrics = MetricsRuntime::start(&settings, None).await?;
    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            wait_for_signal().await;
            tracing::info!("stop signal received");
            stop.cancel();
        }
    });
    let engine_args = args.engine;
    let consuming: Arc<Mutex<Option<JoinHandle<RunSummary>>>> = Arc::default();
    let load = {
        let (metrics, healthy) = (metrics.metrics.clone(), metrics.healthy.clone());
        let (consuming, stop, runtime) = (consuming.clone(), stop.clone(), Handle::current());
        move || {
            let engine = dispatcher::fleet_engine::load_for(&engine_args, &settings, &model)?;
            if let Some((spool, store)) = jobs {
                let parts = app::ConsumerParts {
                    queue: Arc::new(spool),
                    store: Arc::new(store),
                    transcriber: engine.transcriber.clone(),
                    diarizer: engine.diarizer.clone(),
                };
                let consumer = app::consumer_with(&settings, parts, &metrics, healthy, false)?;
                tracing::info!("consuming the spool's jobs beside the API");
                let handle = runtime.spawn(consumer.run(stop));
                *consuming.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
            }
            Ok(engine)
        }
    };
    let served = serve(
        options,
        metrics.metrics.clone(),
        metrics.healthy.clone(),
        load,
        stop,
    )
    .await;
    let consumer = consuming.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(consumer) = consumer {
        let summary = consumer.await?;
        tracing::info!(?summary, "the spool's consumer stopped");
    }
    metrics.shutdown().await;
    Ok(served?)
}
