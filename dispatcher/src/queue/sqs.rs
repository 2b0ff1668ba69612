//! Amazon SQS (or anything that speaks its API) through aws-sdk-sqs.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageSystemAttributeName, QueueAttributeName,
    SendMessageBatchRequestEntry,
};

use super::{Queue, Received};
use crate::error::{DispatchError, ErrorClass, Result};
use crate::store::s3::class_of;

/// SQS's limits: 10 messages per receive/batch, 20 s long-poll wait, 12 h visibility.
pub const MAX_BATCH: usize = 10;
pub const MAX_WAIT: Duration = Duration::from_secs(20);
pub const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

#[derive(Debug, Clone)]
pub struct SqsQueue {
    client: aws_sdk_sqs::Client,
    queue_url: String,
}

impl SqsQueue {
    pub fn new(client: aws_sdk_sqs::Client, queue_url: impl Into<String>) -> Self {
        Self {
            client,
            queue_url: queue_url.into(),
        }
    }

    pub fn queue_url(&self) -> &str {
        &self.queue_url
    }
}

fn queue_error<E: ProvideErrorMetadata + std::error::Error + 'static>(
    op: &'static str,
    err: &SdkError<E, aws_sdk_sqs::config::http::HttpResponse>,
) -> DispatchError {
    let message = match err {
        SdkError::ServiceError(ctx) => format!(
            "{} {}",
            ctx.err().code().unwrap_or("?"),
            ctx.err().message().unwrap_or_default()
        ),
        other => crate::aws::error_chain(other),
    };
    DispatchError::Queue {
        op,
        class: class_of(err),
        message,
    }
}

fn secs_i32(d: Duration) -> i32 {
    d.as_secs().min(i32::MAX as u64) as i32
}

#[async_trait]
impl Queue for SqsQueue {
    async fn receive(
        &self,
        max_messages: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<Received>> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(max_messages.clamp(1, MAX_BATCH) as i32)
            .wait_time_seconds(secs_i32(wait.min(MAX_WAIT)))
            .visibility_timeout(secs_i32(visibility.min(MAX_VISIBILITY)))
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .send()
            .await
            .map_err(|e| queue_error("ReceiveMessage", &e))?;
        let received_at = Instant::now();
        Ok(out
            .messages()
            .iter()
            .filter_map(|m| {
                let attr = |name| m.attributes().and_then(|a| a.get(&name));
                Some(Received {
                    message_id: m.message_id()?.to_owned(),
                    receipt: m.receipt_handle()?.to_owned(),
                    body: m.body().unwrap_or_default().to_owned(),
                    receive_count: attr(MessageSystemAttributeName::ApproximateReceiveCount)
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(1),
                    sent_at_ms: attr(MessageSystemAttributeName::SentTimestamp)
                        .and_then(|v| v.parse().ok()),
                    received_at,
                })
            })
            .collect())
    }

    async fn extend(&self, receipt: &str, visibility: Duration) -> Result<()> {
        let result = self
            .client
            .change_message_visibility()
            .queue_url(&self.queue_url)
            .receipt_handle(receipt)
            .visibility_timeout(secs_i32(visibility.min(MAX_VISIBILITY)))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            // MessageNotInflight / ReceiptHandleIsInvalid / over the 12 h cap: the lease is gone.
            Err(SdkError::ServiceError(ctx)) if ctx.raw().status().as_u16() == 400 => {
                Err(DispatchError::LeaseLost {
                    message_id: format!(
                        "{} ({})",
                        receipt.chars().take(16).collect::<String>(),
                        ctx.err().code().unwrap_or("?")
                    ),
                })
            }
            Err(e) => Err(queue_error("ChangeMessageVisibility", &e)),
        }
    }

    async fn delete_batch(&self, receipts: &[String]) -> Result<Vec<Result<()>>> {
        let mut results: Vec<Result<()>> = Vec::with_capacity(receipts.len());
        for (chunk_no, chunk) in receipts.chunks(MAX_BATCH).enumerate() {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, receipt)| {
                    DeleteMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .receipt_handle(receipt)
                        .build()
                        .expect("id and receipt are set (bug)")
                })
                .collect();
            let out = self
                .client
                .delete_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| queue_error("DeleteMessageBatch", &e))?;
            // A 200 can still carry failed entries: match every id, and treat an id that is
            // in neither list as failed too.
            let base = chunk_no * MAX_BATCH;
            let mut chunk_results: Vec<Result<()>> = (0..chunk.len())
                .map(|_| {
                    Err(DispatchError::Queue {
                        op: "DeleteMessageBatch",
                        class: ErrorClass::Transient,
                        message: "entry missing from the response".into(),
                    })
                })
                .collect();
            for ok in out.successful() {
                if let Ok(i) = ok.id().parse::<usize>() {
                    if i < chunk_results.len() {
                        chunk_results[i] = Ok(());
                    }
                }
            }
            for failed in out.failed() {
                if let Ok(i) = failed.id().parse::<usize>() {
                    if i < chunk_results.len() {
                        chunk_results[i] = Err(DispatchError::Queue {
                            op: "DeleteMessageBatch",
                            class: if failed.sender_fault() {
                                ErrorClass::Permanent
                            } else {
                                ErrorClass::Transient
                            },
                            message: format!(
                                "entry {}: {} {}",
                                base + i,
                                failed.code(),
                                failed.message().unwrap_or_default()
                            ),
                        });
                    }
                }
            }
            results.extend(chunk_results);
        }
        Ok(results)
    }

    async fn release(&self, receipt: &str) -> Result<()> {
        self.extend(receipt, Duration::ZERO).await
    }

    async fn send_batch(&self, bodies: &[String]) -> Result<Vec<Result<()>>> {
        let mut results = Vec::with_capacity(bodies.len());
        for chunk in bodies.chunks(MAX_BATCH) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(i, body)| {
                    SendMessageBatchRequestEntry::builder()
                        .id(i.to_string())
                        .message_body(body)
                        .build()
                        .expect("id and body are set (bug)")
                })
                .collect();
            let out = self
                .client
                .send_message_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(|e| queue_error("SendMessageBatch", &e))?;
            let mut chunk_results: Vec<Result<()>> = (0..chunk.len()).map(|_| Ok(())).collect();
            for failed in out.failed() {
                if let Ok(i) = failed.id().parse::<usize>() {
                    if i < chunk_results.len() {
                        chunk_results[i] = Err(DispatchError::Queue {
                            op: "SendMessageBatch",
                            class: if failed.sender_fault() {
                                ErrorClass::Permanent
                            } else {
                                ErrorClass::Transient
                            },
                            message: format!(
                                "{} {}",
                                failed.code(),
                                failed.message().unwrap_or_default()
                            ),
                        });
                    }
                }
            }
            results.extend(chunk_results);
        }
        Ok(results)
    }

    async fn pending(&self) -> Result<u64> {
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .map_err(|e| queue_error("GetQueueAttributes", &e))?;
        let get = |name| {
            out.attributes()
                .and_then(|a| a.get(&name))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Ok(get(QueueAttributeName::ApproximateNumberOfMessages)
            + get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible))
    }
}
