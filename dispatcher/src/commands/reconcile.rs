//! `dispatcher reconcile s3://bucket/prefix`: for every input under the prefix, whether it has
//! exactly one complete result for the model, a failure record, or nothing; the counts, the
//! inputs to re-enqueue, and (`--enqueue-missing`) their jobs sent.

use std::process::ExitCode;

use dispatcher::backfill::JobSender;
use dispatcher::job::Prefix;
use dispatcher::reconcile::{reconcile, ReconcileReport, ReconcileSettings};

use super::progress::Ticker;
use super::targets::{BackendArgs, ResultArgs};
use super::EXIT_PARTIAL;

#[derive(Debug, clap::Args)]
pub(crate) struct ReconcileArgs {
    /// Inputs to check: `s3://bucket/prefix` (with --store, the bucket is a folder of it).
    pub(crate) source: String,
    #[command(flatten)]
    pub(crate) results: ResultArgs,
    #[command(flatten)]
    pub(crate) backend: BackendArgs,
    /// Send a job for every input without a result (needs the queue).
    #[arg(long)]
    pub(crate) enqueue_missing: bool,
    /// With --enqueue-missing: at most this many messages per second (0 = unlimited, the
    /// default).
    #[arg(long, default_value_t = 0)]
    pub(crate) max_messages_per_s: u32,
    /// Print the whole report as JSON on stdout (counts, missing and incomplete inputs).
    #[arg(long)]
    pub(crate) json: bool,
}

pub(crate) async fn run(args: ReconcileArgs) -> anyhow::Result<ExitCode> {
    let settings = ReconcileSettings {
        source: Prefix::parse_uri(&args.source)?,
        output: args.results.output()?,
        result_model_id: args.results.result_model_id()?,
        diarize: args.results.diarize,
    };
    let opened = args.backend.open().await?;
    let queue = match (args.enqueue_missing, opened.queue) {
        (false, _) => None,
        (true, Some(queue)) => Some(queue),
        (true, None) => anyhow::bail!(
            "--enqueue-missing needs the queue: --queue-url (or --spool with --store)"
        ),
    };
    let mut sender = JobSender::new(args.max_messages_per_s, false);
    let enqueue = queue.as_deref().map(|q| (q, &mut sender));
    let mut ticker = Ticker::new();
    let report = reconcile(opened.store.as_ref(), enqueue, &settings, |r| {
        ticker.show(counts(r));
    })
    .await?;
    ticker.finish();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for key in &report.missing {
            println!("missing\t{key}");
        }
        for (key, why) in &report.incomplete {
            println!("incomplete\t{key}\t{why}");
        }
        println!("{}", counts(&report));
        for (reason, n) in &report.failed_by_reason {
            println!("  failed {reason}: {n}");
        }
    }
    if report.send_failures > 0 {
        anyhow::bail!("{} messages were not sent", report.send_failures);
    }
    // Scripts tell "all accounted for" from "some inputs still need work".
    Ok(if report.accounted_for() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_PARTIAL)
    })
}

fn counts(r: &ReconcileReport) -> String {
    format!(
        "inputs {} · complete {} · failed {} · missing {} · incomplete {} · enqueued {}",
        r.inputs,
        r.complete,
        r.failed,
        r.missing.len(),
        r.incomplete.len(),
        r.enqueued
    )
}
