//! Re-enqueue a whole prefix (e.g. after a model update), skipping inputs whose result for
//! the current model already exists. Listing is paginated; sends are batched and rate-limited.
//! With a diarization model id the backfill is of diarized results: jobs ask for diarization
//! and only a result under both models' id counts as done.

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::job::{JobMessage, ObjectRef, Prefix};
use crate::model_id::diarized_model_id;
use crate::outputs::ResultLocation;
use crate::queue::Queue;
use crate::store::{ObjectStore, Pages};

#[derive(Debug, Clone)]
pub struct BackfillSettings {
    pub source: Prefix,
    pub output: Prefix,
    pub model_id: String,
    /// Backfill diarized results of this diarization model (`None`: plain transcripts).
    pub diarizer_model_id: Option<String>,
    /// Messages per second at most (0 = unlimited).
    pub max_messages_per_s: u32,
    /// Only look, do not send.
    pub dry_run: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackfillSummary {
    pub listed: u64,
    pub skipped_done: u64,
    pub enqueued: u64,
    pub send_failures: u64,
}

/// Lists `source`, enqueues every input without a manifest or failure record for
/// `model_id`, and calls `progress` after each page.
pub async fn backfill(
    store: &dyn ObjectStore,
    queue: &dyn Queue,
    settings: &BackfillSettings,
    mut progress: impl FnMut(&BackfillSummary),
) -> Result<BackfillSummary> {
    let mut summary = BackfillSummary::default();
    let mut pages = Pages::new(store, &settings.source);
    let mut sender = JobSender::new(settings.max_messages_per_s, settings.dry_run);
    let diarize = settings.diarizer_model_id.is_some();
    let result_model_id = match &settings.diarizer_model_id {
        Some(diarizer) => diarized_model_id(&settings.model_id, Some(diarizer)),
        None => settings.model_id.clone(),
    };
    while let Some(objects) = pages.next().await? {
        let mut inputs = Vec::new();
        for object in &objects {
            summary.listed += 1;
            let input = ObjectRef::new(&settings.source.bucket, &object.key);
            let loc = ResultLocation::new(&settings.output, &input, &object.etag, &result_model_id);
            let done = store
                .head(&ObjectRef::new(&loc.bucket, loc.manifest_key()))
                .await?
                .is_some()
                || store
                    .head(&ObjectRef::new(&loc.bucket, loc.failure_key()))
                    .await?
                    .is_some();
            if done {
                summary.skipped_done += 1;
            } else {
                inputs.push(input);
            }
        }
        let sent = sender
            .send(queue, &inputs, &settings.output, diarize)
            .await?;
        summary.enqueued += sent.enqueued;
        summary.send_failures += sent.send_failures;
        progress(&summary);
    }
    Ok(summary)
}

/// What one [`JobSender::send`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sent {
    pub enqueued: u64,
    pub send_failures: u64,
}

/// Sends job messages for inputs in batches of 10, at most `max_messages_per_s` over the
/// sender's life, with job ids unique to this run (`backfill-<run>-<n>`).
pub struct JobSender {
    run_id: String,
    started: Instant,
    sent: u64,
    max_messages_per_s: u32,
    dry_run: bool,
}

impl JobSender {
    /// `max_messages_per_s` 0 is unlimited; with `dry_run` nothing is sent but all counts.
    pub fn new(max_messages_per_s: u32, dry_run: bool) -> Self {
        Self {
            run_id: uuid::Uuid::new_v4().simple().to_string(),
            started: Instant::now(),
            sent: 0,
            max_messages_per_s,
            dry_run,
        }
    }

    /// Jobs for `inputs`, their results under `output`.
    pub async fn send(
        &mut self,
        queue: &dyn Queue,
        inputs: &[ObjectRef],
        output: &Prefix,
        diarize: bool,
    ) -> Result<Sent> {
        let mut sent = Sent::default();
        for chunk in inputs.chunks(10) {
            let bodies: Vec<String> = chunk
                .iter()
                .map(|input| {
                    self.sent += 1;
                    let mut msg =
                        JobMessage::new(format!("backfill-{}-{}", self.run_id, self.sent), input);
                    msg.output_prefix = Some(output.uri());
                    msg.diarize = diarize;
                    serde_json::to_string(&msg).expect("job message serializes (bug)")
                })
                .collect();
            if self.dry_run {
                sent.enqueued += bodies.len() as u64;
                continue;
            }
            pace(self.started, self.sent, self.max_messages_per_s).await;
            for result in queue.send_batch(&bodies).await? {
                match result {
                    Ok(()) => sent.enqueued += 1,
                    Err(e) => {
                        tracing::warn!(error = %e, "send failed");
                        sent.send_failures += 1;
                    }
                }
            }
        }
        Ok(sent)
    }
}

/// Sleeps until sending `sent_after` messages keeps within `per_s` since `started`.
async fn pace(started: Instant, sent_after: u64, per_s: u32) {
    if per_s == 0 {
        return;
    }
    let due = Duration::from_secs_f64(sent_after as f64 / per_s as f64);
    if let Some(wait) = due.checked_sub(started.elapsed()) {
        tokio::time::sleep(wait).await;
    }
}
