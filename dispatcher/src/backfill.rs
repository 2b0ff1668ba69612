//! Re-enqueue a whole prefix (e.g. after a model update), skipping inputs whose result for
//! the current model already exists. Listing is paginated; sends are batched and rate-limited.
//! With a diarization model id the backfill is of diarized results: jobs ask for diarization
//! and only a result under both models' id counts as done.

use std::time::{Duration, Instant};

use futures_util::{stream, StreamExt, TryStreamExt};

use crate::error::Result;
use crate::job::{JobMessage, ObjectRef, Prefix};
use crate::model_id::diarized_model_id;
use crate::outputs::ResultLocation;
use crate::queue::Queue;
use crate::store::{inspect_at_once, ObjectStore, Pages};

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
        summary.listed += objects.len() as u64;
        let checked = inspect_at_once(&objects, |object| async {
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
            Ok((input, done))
        })
        .await?;
        let mut inputs = Vec::new();
        for (input, done) in checked {
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

/// Batches of 10 messages in flight at once: one at a time, SQS's 10-30 ms per batch would cap
/// a backfill near what one GPU transcribes.
const BATCHES_SENT_AT_ONCE: usize = 8;

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
        // Ids and pacing deadlines in input order; the batches then go out several at a time,
        // each no earlier than its deadline (so the rate limit holds as before).
        let mut batches = Vec::new();
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
            batches.push((self.sent, bodies));
        }
        if self.dry_run {
            sent.enqueued = inputs.len() as u64;
            return Ok(sent);
        }
        let (started, per_s) = (self.started, self.max_messages_per_s);
        let mut answers = stream::iter(batches)
            .map(|(sent_after, bodies)| async move {
                pace(started, sent_after, per_s).await;
                queue.send_batch(&bodies).await
            })
            .buffered(BATCHES_SENT_AT_ONCE);
        while let Some(results) = answers.try_next().await? {
            for result in results {
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    use async_trait::async_trait;
    use bytes::Bytes;

    use super::*;
    use crate::queue::Received;
    use crate::store::local::LocalStore;
    use crate::store::INPUTS_INSPECTED_AT_ONCE;
    use crate::store::{ListPage, ObjectMeta, PutOutcome};

    /// Counts requests at once, each held for a while (as a remote store's would be).
    #[derive(Default)]
    struct AtOnce {
        now: AtomicUsize,
        most: AtomicUsize,
    }

    impl AtOnce {
        async fn hold(&self) {
            let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            self.now.fetch_sub(1, Ordering::SeqCst);
        }
    }

    struct SlowStore {
        inner: LocalStore,
        heads: AtOnce,
    }

    #[async_trait]
    impl ObjectStore for SlowStore {
        async fn head(&self, object: &ObjectRef) -> Result<Option<ObjectMeta>> {
            self.heads.hold().await;
            self.inner.head(object).await
        }
        async fn get(&self, object: &ObjectRef, max: u64, etag: Option<&str>) -> Result<Bytes> {
            self.inner.get(object, max, etag).await
        }
        async fn put_if_absent(
            &self,
            bucket: &str,
            key: &str,
            body: Bytes,
            content_type: &str,
        ) -> Result<PutOutcome> {
            self.inner
                .put_if_absent(bucket, key, body, content_type)
                .await
        }
        async fn list_page(
            &self,
            bucket: &str,
            prefix: &str,
            continuation: Option<String>,
        ) -> Result<ListPage> {
            self.inner.list_page(bucket, prefix, continuation).await
        }
    }

    #[derive(Default)]
    struct SlowQueue {
        sends: AtOnce,
        bodies: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl Queue for SlowQueue {
        async fn receive(&self, _: usize, _: Duration, _: Duration) -> Result<Vec<Received>> {
            Ok(Vec::new())
        }
        async fn extend(&self, _: &str, _: Duration) -> Result<()> {
            Ok(())
        }
        async fn delete_batch(&self, receipts: &[String]) -> Result<Vec<Result<()>>> {
            Ok(receipts.iter().map(|_| Ok(())).collect())
        }
        async fn release(&self, _: &str) -> Result<()> {
            Ok(())
        }
        async fn send_batch(&self, bodies: &[String]) -> Result<Vec<Result<()>>> {
            self.sends.hold().await;
            self.bodies.lock().expect("lock").extend_from_slice(bodies);
            Ok(bodies.iter().map(|_| Ok(())).collect())
        }
        async fn pending(&self) -> Result<u64> {
            Ok(0)
        }
    }

    /// Inputs are checked and their jobs sent many at a time (a remote store answers each
    /// request in milliseconds), yet every input is checked, the done ones skipped, and job n
    /// names the n-th input to send in listing order.
    #[tokio::test]
    async fn checks_and_sends_many_at_once_in_listing_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SlowStore {
            inner: LocalStore::open(dir.path()).expect("store"),
            heads: AtOnce::default(),
        };
        let settings = BackfillSettings {
            source: Prefix::parse_uri("s3://inputs/calls/").expect("source"),
            output: Prefix::parse_uri("s3://outputs/results/").expect("output"),
            model_id: "model".into(),
            diarizer_model_id: None,
            max_messages_per_s: 0,
            dry_run: false,
        };
        let keys: Vec<String> = (0..1500).map(|i| format!("calls/{i:05}.wav")).collect();
        let mut pending = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let body = Bytes::from(key.clone());
            store
                .put_if_absent("inputs", key, body, "audio/wav")
                .await
                .expect("input");
            if i % 3 == 0 {
                // Done before: its manifest is there.
                let etag = store
                    .inner
                    .head(&ObjectRef::new("inputs", key))
                    .await
                    .expect("head")
                    .expect("exists")
                    .etag;
                let input = ObjectRef::new("inputs", key);
                let loc = ResultLocation::new(&settings.output, &input, &etag, "model");
                store
                    .put_if_absent(
                        "outputs",
                        &loc.manifest_key(),
                        Bytes::new(),
                        "application/json",
                    )
                    .await
                    .expect("manifest");
            } else {
                pending.push(key.clone());
            }
        }
        let queue = SlowQueue::default();
        let summary = backfill(&store, &queue, &settings, |_| {})
            .await
            .expect("backfill");
        assert_eq!(
            (summary.listed, summary.skipped_done, summary.enqueued),
            (1500, 500, 1000),
            "{summary:?}"
        );
        assert_eq!(
            store.heads.most.load(Ordering::SeqCst),
            INPUTS_INSPECTED_AT_ONCE
        );
        assert_eq!(
            queue.sends.most.load(Ordering::SeqCst),
            BATCHES_SENT_AT_ONCE
        );
        let mut sent: Vec<(u64, String)> = queue
            .bodies
            .lock()
            .expect("lock")
            .iter()
            .map(|body| {
                let msg: JobMessage = serde_json::from_str(body).expect("job");
                let n = msg.job_id.rsplit('-').next().expect("n");
                (n.parse().expect("number"), msg.input)
            })
            .collect();
        sent.sort();
        let expected: Vec<(u64, String)> = (1..)
            .zip(pending.iter().map(|key| format!("s3://inputs/{key}")))
            .collect();
        assert_eq!(sent, expected);
    }
}
