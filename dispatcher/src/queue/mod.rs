//! Message queues with SQS semantics: SQS itself and a durable local directory spool.

use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::error::Result;

pub mod spool;
pub mod sqs;

/// One delivery of a message. The receipt is only good for this delivery.
#[derive(Debug, Clone)]
pub struct Received {
    pub message_id: String,
    pub receipt: String,
    pub body: String,
    /// 1 on the first delivery; SQS's `ApproximateReceiveCount`.
    pub receive_count: u32,
    /// When the message was first sent (epoch milliseconds), for the message-age metric.
    pub sent_at_ms: Option<u64>,
    pub received_at: Instant,
}

/// The queue operations the lifecycle needs. Errors say whether retrying makes sense.
#[async_trait]
pub trait Queue: Send + Sync {
    /// Up to `max_messages` (≤ 10) messages, waiting up to `wait` for the first; each stays
    /// invisible to other receivers for `visibility`.
    async fn receive(
        &self,
        max_messages: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<Received>>;

    /// Keeps a message invisible for `visibility` from now (a heartbeat). Fails with
    /// `LeaseLost` once the message has become visible again or been received by someone else.
    async fn extend(&self, receipt: &str, visibility: Duration) -> Result<()>;

    /// Deletes messages; one result per receipt, in order (batches can partly fail).
    async fn delete_batch(&self, receipts: &[String]) -> Result<Vec<Result<()>>>;

    /// Makes a message visible again now, for another receiver.
    async fn release(&self, receipt: &str) -> Result<()>;

    /// Sends messages; one result per body, in order.
    async fn send_batch(&self, bodies: &[String]) -> Result<Vec<Result<()>>>;

    /// Messages waiting plus messages in flight (approximate on SQS).
    async fn pending(&self) -> Result<u64>;
}

/// Milliseconds since the Unix epoch (0 if the clock is before 1970).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
