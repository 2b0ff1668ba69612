//! `dispatcher run`: consume SQS, read inputs from S3, write results to S3.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use dispatcher::app::{self, MetricsRuntime};
use dispatcher::config::{Settings, SettingsArgs};
use dispatcher::lifecycle::interruption::{self, InstanceMetadata};
use dispatcher::lifecycle::run_until_signal;
use dispatcher::metrics::{CloudWatchSink, Sink};
use dispatcher::queue::sqs::SqsQueue;
use dispatcher::queue::Queue;
use dispatcher::store::s3::S3Store;
use dispatcher::store::ObjectStore;
use tokio_util::sync::CancellationToken;

#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// Exit once the queue is empty and nothing is in flight (batch runs, tests), with the
    /// closing report `local` prints (wall time, audio, stages) and exit status 3 when any job
    /// failed. Receives then wait 1 s unless --wait-time-s says otherwise.
    #[arg(long)]
    pub(crate) exit_when_idle: bool,
    #[command(flatten)]
    pub(crate) settings: SettingsArgs,
    #[command(flatten)]
    pub(crate) engine: dispatcher::fleet_engine::EngineArgs,
}

/// `run --exit-when-idle`'s receive wait when no flag, variable or config key sets one: the
/// run stops after a receive finds nothing, so a long poll would keep it up to 20 s after its
/// last job.
pub(crate) const EXIT_WHEN_IDLE_WAIT_TIME_S: u64 = 1;

impl RunArgs {
    /// The settings, with --exit-when-idle's receive wait where none was chosen.
    pub(crate) fn settings(&self) -> dispatcher::error::Result<Settings> {
        let mut settings = self.settings.clone();
        if self.exit_when_idle {
            settings
                .wait_time_s
                .get_or_insert(EXIT_WHEN_IDLE_WAIT_TIME_S);
        }
        settings.resolve()
    }
}

pub(crate) async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let settings = args.settings()?;
    let queue_url = settings
        .queue_url
        .clone()
        .context("--queue-url is required")?;
    let model = settings.model.clone().context("--model is required")?;
    // Checked before anything starts: a bad URL is a config error, not a late surprise.
    let instance_metadata = settings
        .instance_metadata_url
        .as_deref()
        .map(InstanceMetadata::new)
        .transpose()?;
    let aws = dispatcher::aws::load(None).await;
    let engine = dispatcher::fleet_engine::load_for(&args.engine, &settings, &model)?;
    let transcriber = engine.transcriber;
    let diarizer = engine.diarizer;
    let sink: Option<Arc<dyn Sink>> = settings.cloudwatch_namespace.as_ref().map(|ns| {
        Arc::new(CloudWatchSink::new(
            dispatcher::aws::cloudwatch(&aws),
            ns.clone(),
        )) as Arc<dyn Sink>
    });
    let metrics = MetricsRuntime::start(&settings, sink).await?;
    if let Some(source) = engine.metrics_source {
        metrics.metrics.add_source(source);
    }
    let queue: Arc<dyn Queue> = Arc::new(SqsQueue::new(dispatcher::aws::sqs(&aws), queue_url));
    let store: Arc<dyn ObjectStore> = Arc::new(S3Store::new(
        dispatcher::aws::s3(&aws, settings.s3_force_path_style),
        settings.sse_kms_key_id.clone(),
    ));
    let parts = app::ConsumerParts {
        queue,
        store,
        transcriber,
        diarizer,
    };
    let consumer = app::consumer(&settings, parts, &metrics, args.exit_when_idle)?;
    let stop = CancellationToken::new();
    let watcher = instance_metadata.map(|metadata| {
        let every = Duration::from_secs(settings.instance_metadata_poll_s);
        tokio::spawn(interruption::watch(
            metadata,
            consumer.clone(),
            stop.clone(),
            every,
        ))
    });
    let started = Instant::now();
    let summary = run_until_signal(consumer.clone(), stop.clone()).await?;
    let wall_s = super::summary::wall_s(&consumer, started);
    stop.cancel();
    if let Some(watcher) = watcher {
        if let Ok(Some(notice)) = watcher.await {
            tracing::info!(?notice, "drained for an interruption notice");
        }
    }
    let totals = metrics.metrics.clone();
    // Shutting down folds the last events into the totals.
    metrics.shutdown().await;
    tracing::info!(?summary, "stopped");
    if summary.infrastructure_stop {
        anyhow::bail!("stopped after an infrastructure error (see log)");
    }
    if !args.exit_when_idle {
        return Ok(ExitCode::SUCCESS);
    }
    eprint!(
        "{}",
        super::summary::stage_table(&totals, wall_s, consumer.decode_threads())
    );
    eprintln!(
        "done {} · already done {} · failed {} · ignored {} · unreadable {} · released {}",
        summary.done,
        summary.already_done,
        summary.failed,
        summary.ignored,
        summary.bad_messages,
        summary.released,
    );
    if summary.failed > 0 {
        eprintln!(
            "{} jobs failed: each has a failure record (failure.json) under its output prefix",
            summary.failed
        );
        return Ok(ExitCode::from(super::EXIT_PARTIAL));
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs an async subcommand on a multi-threaded runtime.
pub(crate) fn block_on<T, F: std::future::Future<Output = anyhow::Result<T>>>(
    fut: F,
) -> anyhow::Result<T> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(fut);
    // A blocking task still running once the command is done (a fleet still starting when
    // `serve` was stopped) must not hold the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    result
}
