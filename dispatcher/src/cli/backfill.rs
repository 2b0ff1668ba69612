//! `dispatcher backfill s3://bucket/prefix`: enqueue every input under a prefix that has no
//! result for the current model yet.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use dispatcher::backfill::{backfill, BackfillSettings};
use dispatcher::job::Prefix;
use dispatcher::queue::spool::SpoolQueue;
use dispatcher::queue::sqs::SqsQueue;
use dispatcher::queue::Queue;
use dispatcher::store::local::LocalStore;
use dispatcher::store::s3::S3Store;
use dispatcher::store::ObjectStore;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug, clap::Args)]
pub(crate) struct BackfillArgs {
    /// Inputs to re-enqueue: `s3://bucket/prefix`.
    pub(crate) source: String,
    /// Where results live (and go): `s3://bucket/prefix/`.
    #[arg(long, env = "OUTPUT_URI")]
    pub(crate) output_uri: String,
    /// Model id whose results count as done.
    #[arg(long, env = "MODEL_ID", required_unless_present = "model")]
    pub(crate) model_id: Option<String>,
    /// Or: derive the model id from the model file, as the dispatcher does.
    #[arg(long, env = "MODEL")]
    pub(crate) model: Option<PathBuf>,
    /// Backfill diarized results (jobs ask for speaker diarization): results count as done
    /// only under both models' id. Needs --diar-model-id or --diar-model.
    #[arg(long)]
    pub(crate) diarize: bool,
    /// Diarization model id of the results that count as done (with --diarize).
    #[arg(long, env = "DIAR_MODEL_ID")]
    pub(crate) diar_model_id: Option<String>,
    /// Or: derive it from the diarization model file, as the dispatcher does.
    #[arg(long, env = "DIAR_MODEL")]
    pub(crate) diar_model: Option<PathBuf>,
    /// SQS queue URL.
    #[arg(long, env = "QUEUE_URL", conflicts_with = "spool")]
    pub(crate) queue_url: Option<String>,
    /// Local mode: spool directory instead of SQS (needs --store).
    #[arg(long, requires = "store")]
    pub(crate) spool: Option<PathBuf>,
    /// Local mode: store directory instead of S3.
    #[arg(long)]
    pub(crate) store: Option<PathBuf>,
    /// At most this many messages per second (0 = unlimited).
    #[arg(long, default_value_t = 100)]
    pub(crate) max_messages_per_s: u32,
    /// List and count only; send nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
    /// Path-style S3 addressing (S3-compatible stores).
    #[arg(long, env = "S3_FORCE_PATH_STYLE")]
    pub(crate) s3_force_path_style: bool,
}

pub(crate) async fn run(args: BackfillArgs) -> anyhow::Result<()> {
    let model_id = match (&args.model_id, &args.model) {
        (Some(id), _) => id.clone(),
        (None, Some(path)) => dispatcher::model_id::model_id_for(path)?,
        (None, None) => anyhow::bail!("--model-id or --model is required"),
    };
    let diarizer_model_id = match (args.diarize, &args.diar_model_id, &args.diar_model) {
        (false, _, _) => None,
        (true, Some(id), _) => Some(id.clone()),
        (true, None, Some(path)) => Some(dispatcher::model_id::model_id_for(path)?),
        (true, None, None) => anyhow::bail!("--diarize needs --diar-model-id or --diar-model"),
    };
    let settings = BackfillSettings {
        source: Prefix::parse_uri(&args.source)?,
        output: Prefix::parse_uri(&args.output_uri)?,
        model_id,
        diarizer_model_id,
        max_messages_per_s: args.max_messages_per_s,
        dry_run: args.dry_run,
    };
    let (store, queue): (Box<dyn ObjectStore>, Box<dyn Queue>) = match (&args.spool, &args.store) {
        (Some(spool), Some(store)) => (
            Box::new(LocalStore::open(store)?),
            Box::new(SpoolQueue::open(spool, 5)?),
        ),
        _ => {
            let url = args
                .queue_url
                .clone()
                .context("--queue-url (or --spool and --store)")?;
            let aws = dispatcher::aws::load(None).await;
            (
                Box::new(S3Store::new(
                    dispatcher::aws::s3(&aws, args.s3_force_path_style),
                    None,
                )),
                Box::new(SqsQueue::new(dispatcher::aws::sqs(&aws), url)),
            )
        }
    };
    // A spinner on a terminal; off one, a plain line every 10 s (logs, cron).
    let bar = std::io::stderr()
        .is_terminal()
        .then(ProgressBar::new_spinner);
    if let Some(bar) = &bar {
        bar.set_style(
            ProgressStyle::with_template("{spinner} {elapsed} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
    }
    let mut last_line = Instant::now();
    let summary = backfill(store.as_ref(), queue.as_ref(), &settings, |s| {
        let counts = format!(
            "listed {} · already done {} · enqueued {} · failed {}",
            s.listed, s.skipped_done, s.enqueued, s.send_failures
        );
        match &bar {
            Some(bar) => {
                bar.set_message(counts);
                bar.tick();
            }
            None if last_line.elapsed() >= Duration::from_secs(10) => {
                last_line = Instant::now();
                eprintln!("progress: {counts}");
            }
            None => {}
        }
    })
    .await?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    println!(
        "listed {} · already done {} · enqueued {}{} · failed {}",
        summary.listed,
        summary.skipped_done,
        summary.enqueued,
        if args.dry_run { " (dry run)" } else { "" },
        summary.send_failures
    );
    if summary.send_failures > 0 {
        anyhow::bail!("{} messages were not sent", summary.send_failures);
    }
    Ok(())
}
