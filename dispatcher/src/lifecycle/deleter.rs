//! Batches message deletes (up to 10 per request) and reports each entry's own result:
//! a batch can succeed as a whole while some entries fail.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::error::{DispatchError, ErrorClass, Result};
use crate::queue::Queue;

type Request = (String, oneshot::Sender<Result<()>>);

/// Delete requests in flight at once. Each job holds its in-flight slot until its delete is
/// answered, so one request at a time (a round trip each to SQS) capped the main job at about
/// ten jobs per round trip.
const MAX_BATCHES_IN_FLIGHT: usize = 4;

#[derive(Clone)]
pub struct Deleter {
    tx: mpsc::Sender<Request>,
}

impl Deleter {
    /// Spawns the batching task; it ends when every `Deleter` clone is dropped.
    pub fn spawn(queue: Arc<dyn Queue>, linger: Duration) -> Self {
        let (tx, mut rx) = mpsc::channel::<Request>(256);
        let in_flight = Arc::new(Semaphore::new(MAX_BATCHES_IN_FLIGHT));
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                let deadline = tokio::time::Instant::now() + linger;
                while batch.len() < 10 {
                    match tokio::time::timeout_at(deadline, rx.recv()).await {
                        Ok(Some(req)) => batch.push(req),
                        _ => break,
                    }
                }
                let permit = in_flight
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("the deleter's semaphore is never closed (bug)");
                let queue = queue.clone();
                tokio::spawn(async move {
                    send_batch(queue.as_ref(), batch).await;
                    drop(permit);
                });
            }
        });
        Self { tx }
    }

    /// Deletes one message (batched with others arriving at the same time).
    pub async fn delete(&self, receipt: String) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        let closed = || DispatchError::Queue {
            op: "DeleteMessageBatch",
            class: ErrorClass::Infrastructure,
            message: "deleter stopped".into(),
        };
        self.tx.send((receipt, reply)).await.map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

/// Deletes one batch and answers each request with its entry's result.
async fn send_batch(queue: &dyn Queue, batch: Vec<Request>) {
    let receipts: Vec<String> = batch.iter().map(|(r, _)| r.clone()).collect();
    let mut results = delete_with_one_retry(queue, &receipts).await;
    for (_, reply) in batch.into_iter().rev() {
        let result = results.pop().unwrap_or_else(|| {
            Err(DispatchError::Queue {
                op: "DeleteMessageBatch",
                class: ErrorClass::Transient,
                message: "no result for entry".into(),
            })
        });
        let _ = reply.send(result);
    }
}

/// Transient per-entry failures get one more try; a failure is never reported as success.
async fn delete_with_one_retry(queue: &dyn Queue, receipts: &[String]) -> Vec<Result<()>> {
    let mut results = match queue.delete_batch(receipts).await {
        Ok(results) => results,
        Err(e) if e.is_transient() => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            match queue.delete_batch(receipts).await {
                Ok(results) => results,
                Err(e) => return receipts.iter().map(|_| Err(clone_error(&e))).collect(),
            }
        }
        Err(e) => return receipts.iter().map(|_| Err(clone_error(&e))).collect(),
    };
    let retry: Vec<usize> = results
        .iter()
        .enumerate()
        .filter(|(_, r)| r.as_ref().is_err_and(|e| e.is_transient()))
        .map(|(i, _)| i)
        .collect();
    if !retry.is_empty() {
        let again: Vec<String> = retry.iter().map(|&i| receipts[i].clone()).collect();
        if let Ok(second) = queue.delete_batch(&again).await {
            for (i, r) in retry.into_iter().zip(second) {
                results[i] = r;
            }
        }
    }
    results
}

fn clone_error(e: &DispatchError) -> DispatchError {
    DispatchError::Queue {
        op: "DeleteMessageBatch",
        class: e.class(),
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::Received;
    use async_trait::async_trait;
    use std::sync::Mutex;

    /// A queue whose batch deletes partly fail: "flaky" fails transiently once, "gone" always
    /// fails permanently (as SQS reports a stale receipt).
    #[derive(Default)]
    struct PartlyFailing {
        flaky_failed: Mutex<bool>,
        deleted: Mutex<Vec<String>>,
    }

    fn entry_error(class: ErrorClass) -> DispatchError {
        DispatchError::Queue {
            op: "DeleteMessageBatch",
            class,
            message: "injected".into(),
        }
    }

    #[async_trait]
    impl Queue for PartlyFailing {
        async fn receive(&self, _: usize, _: Duration, _: Duration) -> Result<Vec<Received>> {
            Ok(Vec::new())
        }
        async fn extend(&self, _: &str, _: Duration) -> Result<()> {
            Ok(())
        }
        async fn delete_batch(&self, receipts: &[String]) -> Result<Vec<Result<()>>> {
            Ok(receipts
                .iter()
                .map(|r| match r.as_str() {
                    "gone" => Err(entry_error(ErrorClass::Permanent)),
                    "flaky"
                        if !std::mem::replace(
                            &mut *self.flaky_failed.lock().expect("lock"),
                            true,
                        ) =>
                    {
                        Err(entry_error(ErrorClass::Transient))
                    }
                    _ => {
                        self.deleted.lock().expect("lock").push(r.clone());
                        Ok(())
                    }
                })
                .collect())
        }
        async fn release(&self, _: &str) -> Result<()> {
            Ok(())
        }
        async fn send_batch(&self, _: &[String]) -> Result<Vec<Result<()>>> {
            Ok(Vec::new())
        }
        async fn pending(&self) -> Result<u64> {
            Ok(0)
        }
    }

    #[tokio::test]
    async fn partial_batch_failures_are_per_entry_and_never_success() {
        let queue = Arc::new(PartlyFailing::default());
        let deleter = Deleter::spawn(queue.clone(), Duration::from_millis(50));
        let (ok, flaky, gone) = tokio::join!(
            deleter.delete("ok".into()),
            deleter.delete("flaky".into()),
            deleter.delete("gone".into()),
        );
        assert!(ok.is_ok());
        assert!(flaky.is_ok(), "transient entry retried");
        assert!(gone.is_err(), "a failed entry is reported as failed");
        let mut deleted = queue.deleted.lock().expect("lock").clone();
        deleted.sort();
        assert_eq!(deleted, vec!["flaky".to_owned(), "ok".to_owned()]);
    }
}
