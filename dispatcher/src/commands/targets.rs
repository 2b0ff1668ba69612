//! Flags shared by the commands that look at a prefix's results (`backfill`, `reconcile`):
//! which results count, and where the queue and the store are.

use std::path::PathBuf;

use anyhow::Context;
use dispatcher::job::Prefix;
use dispatcher::model_id::{diarized_model_id, model_id_for};
use dispatcher::queue::spool::SpoolQueue;
use dispatcher::queue::sqs::SqsQueue;
use dispatcher::queue::Queue;
use dispatcher::store::local::LocalStore;
use dispatcher::store::s3::S3Store;
use dispatcher::store::ObjectStore;

/// Whose results count.
#[derive(Debug, clap::Args)]
pub(crate) struct ResultArgs {
    /// Where results live (and go): `s3://bucket/prefix/`.
    #[arg(long)]
    pub(crate) output_uri: String,
    /// Model id whose results count as done.
    #[arg(long, required_unless_present = "model")]
    pub(crate) model_id: Option<String>,
    /// Or: derive the model id from the model file, as the dispatcher does.
    #[arg(long)]
    pub(crate) model: Option<PathBuf>,
    /// Diarized results (jobs ask for speaker diarization): results count as done only under
    /// both models' id. Needs --diar-model-id or --diar-model.
    #[arg(long)]
    pub(crate) diarize: bool,
    /// Diarization model id of the results that count as done (with --diarize).
    #[arg(long)]
    pub(crate) diar_model_id: Option<String>,
    /// Or: derive it from the diarization model file, as the dispatcher does.
    #[arg(long)]
    pub(crate) diar_model: Option<PathBuf>,
}

impl ResultArgs {
    pub(crate) fn output(&self) -> anyhow::Result<Prefix> {
        Ok(Prefix::parse_uri(&self.output_uri)?)
    }

    /// The transcription model's id and, with `--diarize`, the diarization model's.
    pub(crate) fn model_ids(&self) -> anyhow::Result<(String, Option<String>)> {
        let model_id = match (&self.model_id, &self.model) {
            (Some(id), _) => id.clone(),
            (None, Some(path)) => model_id_for(path)?,
            (None, None) => anyhow::bail!("--model-id or --model is required"),
        };
        let diarizer = match (self.diarize, &self.diar_model_id, &self.diar_model) {
            (false, _, _) => None,
            (true, Some(id), _) => Some(id.clone()),
            (true, None, Some(path)) => Some(model_id_for(path)?),
            (true, None, None) => anyhow::bail!("--diarize needs --diar-model-id or --diar-model"),
        };
        Ok((model_id, diarizer))
    }

    /// The id in the result keys.
    pub(crate) fn result_model_id(&self) -> anyhow::Result<String> {
        let (model_id, diarizer) = self.model_ids()?;
        Ok(match diarizer {
            Some(diarizer) => diarized_model_id(&model_id, Some(&diarizer)),
            None => model_id,
        })
    }
}

/// SQS and S3, or a local spool and store.
#[derive(Debug, clap::Args)]
pub(crate) struct BackendArgs {
    /// SQS queue URL.
    #[arg(long, conflicts_with = "spool")]
    pub(crate) queue_url: Option<String>,
    /// Local mode: spool directory instead of SQS (needs --store).
    #[arg(long, requires = "store")]
    pub(crate) spool: Option<PathBuf>,
    /// Local mode: store directory instead of S3.
    #[arg(long)]
    pub(crate) store: Option<PathBuf>,
    /// Use path-style S3 URLs (for S3-compatible stores such as MinIO or moto).
    #[arg(long)]
    pub(crate) s3_force_path_style: bool,
}

/// The opened store, and the queue when one was named.
pub(crate) struct Opened {
    pub(crate) store: Box<dyn ObjectStore>,
    pub(crate) queue: Option<Box<dyn Queue>>,
}

impl BackendArgs {
    pub(crate) async fn open(&self) -> anyhow::Result<Opened> {
        if let Some(store) = &self.store {
            let queue = match &self.spool {
                Some(spool) => Some(Box::new(SpoolQueue::open(spool, 5)?) as Box<dyn Queue>),
                None => None,
            };
            return Ok(Opened {
                store: Box::new(LocalStore::open(store)?),
                queue,
            });
        }
        let aws = dispatcher::aws::load(None).await;
        Ok(Opened {
            store: Box::new(S3Store::new(
                dispatcher::aws::s3(&aws, self.s3_force_path_style),
                None,
            )),
            queue: self.queue_url.as_ref().map(|url| {
                Box::new(SqsQueue::new(dispatcher::aws::sqs(&aws), url.clone())) as Box<dyn Queue>
            }),
        })
    }

    /// [`Self::open`], with a queue required.
    pub(crate) async fn open_with_queue(
        &self,
    ) -> anyhow::Result<(Box<dyn ObjectStore>, Box<dyn Queue>)> {
        let opened = self.open().await?;
        let queue = opened
            .queue
            .context("a queue is needed: --queue-url (or --spool with --store)")?;
        Ok((opened.store, queue))
    }
}
