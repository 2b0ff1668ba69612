//! `dispatcher backfill s3://bucket/prefix`: enqueue every input under a prefix that has no
//! result for the current model yet.

use dispatcher::backfill::{backfill, BackfillSettings};
use dispatcher::job::Prefix;

use super::progress::Ticker;
use super::targets::{BackendArgs, ResultArgs};

#[derive(Debug, clap::Args)]
pub(crate) struct BackfillArgs {
    /// Inputs to re-enqueue: `s3://bucket/prefix`.
    pub(crate) source: String,
    #[command(flatten)]
    pub(crate) results: ResultArgs,
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
    /// At most this many messages per second (0 = unlimited, the default: a standard queue takes
    /// any rate, and one GPU transcribes some 300 short recordings a second).
    #[arg(long, default_value_t = 0)]
    pub(crate) max_messages_per_s: u32,
    /// List and count only; send nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

pub(crate) async fn run(args: BackfillArgs) -> anyhow::Result<()> {
    let (model_id, diarizer_model_id) = args.results.model_ids()?;
    let settings = BackfillSettings {
        source: Prefix::parse_uri(&args.source)?,
        output: args.results.output()?,
        model_id,
        diarizer_model_id,
        max_messages_per_s: args.max_messages_per_s,
        dry_run: args.dry_run,
    };
    let (store, queue) = args.backend.open_with_queue().await?;
    let mut ticker = Ticker::new();
    let summary = backfill(store.as_ref(), queue.as_ref(), &settings, |s| {
        ticker.show(format!(
            "listed {} · already done {} · enqueued {} · failed {}",
            s.listed, s.skipped_done, s.enqueued, s.send_failures
        ));
    })
    .await?;
    ticker.finish();
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
