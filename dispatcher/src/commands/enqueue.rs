//! `dispatcher enqueue`: send job messages for objects (SQS, or a local spool).

use std::path::PathBuf;

use anyhow::Context;
use dispatcher::job::{JobMessage, ObjectRef, OutputFormat, Prefix};
use dispatcher::queue::spool::SpoolQueue;
use dispatcher::queue::sqs::SqsQueue;
use dispatcher::queue::Queue;

#[derive(Debug, clap::Args)]
pub(crate) struct EnqueueArgs {
    /// Inputs as `s3://bucket/key` (key written raw, no percent-encoding).
    #[arg(required = true)]
    pub(crate) inputs: Vec<String>,
    /// SQS queue URL.
    #[arg(long, conflicts_with = "spool")]
    pub(crate) queue_url: Option<String>,
    /// Local spool directory instead of SQS.
    #[arg(long)]
    pub(crate) spool: Option<PathBuf>,
    /// Result prefix `s3://bucket/prefix/` (default: the dispatcher's `output_uri`).
    #[arg(long)]
    pub(crate) output_uri: Option<String>,
    /// Input object version (only with a single input).
    #[arg(long)]
    pub(crate) version_id: Option<String>,
    /// Output formats (default: all).
    #[arg(long, value_delimiter = ',', value_parser = super::output_format())]
    pub(crate) formats: Vec<OutputFormat>,
    /// Ask for speaker diarization.
    #[arg(long)]
    pub(crate) diarize: bool,
    #[arg(long, default_value_t = 0)]
    pub(crate) priority: i32,
}

pub(crate) async fn run(args: EnqueueArgs) -> anyhow::Result<()> {
    if args.version_id.is_some() && args.inputs.len() != 1 {
        anyhow::bail!("--version-id needs exactly one input");
    }
    if let Some(uri) = &args.output_uri {
        Prefix::parse_uri(uri)?;
    }
    let mut bodies = Vec::new();
    for uri in &args.inputs {
        let mut input = ObjectRef::parse_uri(uri)?;
        input.version_id = args.version_id.clone();
        let mut msg = JobMessage::new(uuid::Uuid::new_v4().to_string(), &input);
        msg.output_prefix = args.output_uri.clone();
        if !args.formats.is_empty() {
            msg.formats = args.formats.clone();
        }
        msg.diarize = args.diarize;
        msg.priority = args.priority;
        bodies.push(serde_json::to_string(&msg)?);
    }
    let queue: Box<dyn Queue> = match (&args.queue_url, &args.spool) {
        (Some(url), _) => {
            let aws = dispatcher::aws::load(None).await;
            Box::new(SqsQueue::new(dispatcher::aws::sqs(&aws), url.clone()))
        }
        (None, Some(dir)) => Box::new(SpoolQueue::open(dir, 5)?),
        (None, None) => anyhow::bail!("--queue-url or --spool is required"),
    };
    let results = queue.send_batch(&bodies).await.context("sending")?;
    let failed = results.iter().filter(|r| r.is_err()).count();
    for (uri, result) in args.inputs.iter().zip(&results) {
        match result {
            Ok(()) => println!("enqueued {uri}"),
            Err(e) => eprintln!("FAILED {uri}: {e}"),
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} messages were not sent", bodies.len());
    }
    Ok(())
}
