//! The consumer receives nothing while its engine has no ready worker (a GPU group restarting
//! after a fault): a message taken then would only wait with its visibility running and count
//! a receive toward the dead-letter policy. Once a worker is ready it receives again; when the
//! engine gives up (no worker can start), the node stops taking work and leaves every message
//! in the queue. Both backends.

mod common;

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::{clip, records, Backend};
use dispatcher::app::{self, MetricsRuntime};
use dispatcher::error::{DispatchError, Result};
use dispatcher::job::JobMessage;
use dispatcher::queue::{Queue, Received};
use dispatcher::transcriber::Transcriber;
use model_core::transcript::Transcript;
use tokio_util::sync::CancellationToken;

const READY: u8 = 0;
const RESTARTING: u8 = 1;
const GAVE_UP: u8 = 2;

/// The real engine behind a switch that says whether a worker is ready.
struct Switched {
    inner: Arc<dyn Transcriber>,
    state: AtomicU8,
}

impl Transcriber for Switched {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }
    fn frame_duration_s(&self) -> f64 {
        self.inner.frame_duration_s()
    }
    fn transcribe(&self, segments: &[&[f32]]) -> Result<Vec<Transcript>> {
        assert_eq!(
            self.state.load(Ordering::SeqCst),
            READY,
            "a segment reached an engine with no ready worker"
        );
        self.inner.transcribe(segments)
    }
    fn ready(&self) -> Result<bool> {
        match self.state.load(Ordering::SeqCst) {
            READY => Ok(true),
            RESTARTING => Ok(false),
            _ => Err(DispatchError::Inference(
                "no worker can start (test)".to_owned(),
            )),
        }
    }
}

/// Counts receive calls.
struct Counted {
    inner: Arc<dyn Queue>,
    receives: AtomicUsize,
}

#[async_trait]
impl Queue for Counted {
    async fn receive(
        &self,
        max_messages: usize,
        wait: Duration,
        visibility: Duration,
    ) -> Result<Vec<Received>> {
        self.receives.fetch_add(1, Ordering::SeqCst);
        self.inner.receive(max_messages, wait, visibility).await
    }
    async fn extend(&self, receipt: &str, visibility: Duration) -> Result<()> {
        self.inner.extend(receipt, visibility).await
    }
    async fn delete_batch(&self, receipts: &[String]) -> Result<Vec<Result<()>>> {
        self.inner.delete_batch(receipts).await
    }
    async fn release(&self, receipt: &str) -> Result<()> {
        self.inner.release(receipt).await
    }
    async fn send_batch(&self, bodies: &[String]) -> Result<Vec<Result<()>>> {
        self.inner.send_batch(bodies).await
    }
    async fn pending(&self) -> Result<u64> {
        self.inner.pending().await
    }
}

async fn enqueue(backend: &Backend, jobs: usize) {
    let audio = clip("espeak_us.wav");
    for i in 0..jobs {
        let key = format!("ready/{i}.wav");
        backend.put_input(&key, &audio).await;
        let message = JobMessage::new(format!("ready-{i}"), &backend.input(&key));
        backend
            .send(&serde_json::to_string(&message).expect("json"))
            .await;
    }
}

/// A consumer that exits when idle, over the counted queue and the switched engine.
async fn start(
    backend: &Backend,
    state: u8,
) -> (
    Arc<Counted>,
    Arc<Switched>,
    tokio::task::JoinHandle<dispatcher::lifecycle::RunSummary>,
    MetricsRuntime,
) {
    let queue = Arc::new(Counted {
        inner: backend.queue.clone(),
        receives: AtomicUsize::new(0),
    });
    let engine = Arc::new(Switched {
        inner: common::engine(),
        state: AtomicU8::new(state),
    });
    let settings = common::settings(backend, |_| {});
    let metrics = MetricsRuntime::start(&settings, None)
        .await
        .expect("metrics");
    let parts = app::ConsumerParts {
        queue: queue.clone(),
        store: backend.store.clone(),
        transcriber: engine.clone(),
        diarizer: None,
    };
    let consumer = app::consumer(&settings, parts, &metrics, true).expect("consumer");
    let run = tokio::spawn(consumer.run(CancellationToken::new()));
    (queue, engine, run, metrics)
}

async fn receiving_waits_for_a_ready_worker(backend: Backend) {
    enqueue(&backend, 3).await;
    let (queue, engine, run, metrics) = start(&backend, RESTARTING).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        queue.receives.load(Ordering::SeqCst),
        0,
        "received while no worker was ready"
    );
    assert!(!run.is_finished());
    engine.state.store(READY, Ordering::SeqCst);
    let summary = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("finished once a worker was ready")
        .expect("consumer task");
    metrics.shutdown().await;
    assert_eq!(summary.done, 3, "{summary:?}");
    assert!(summary.receive_pauses >= 1, "{summary:?}");
    assert_eq!(summary.released, 0, "{summary:?}");
    assert!(!summary.infrastructure_stop);
    assert_eq!(records(&backend).await.0.len(), 3);
    assert_eq!(backend.pending().await, 0);
}
both_backends!(receiving_waits_for_a_ready_worker, 3);

async fn an_engine_that_gave_up_stops_the_node_and_keeps_the_messages(backend: Backend) {
    enqueue(&backend, 2).await;
    let (queue, _engine, run, metrics) = start(&backend, GAVE_UP).await;
    let summary = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the node stopped")
        .expect("consumer task");
    metrics.shutdown().await;
    assert!(summary.infrastructure_stop, "{summary:?}");
    assert_eq!(queue.receives.load(Ordering::SeqCst), 0);
    assert_eq!(summary.done + summary.failed, 0, "{summary:?}");
    assert_eq!(records(&backend).await, (vec![], vec![]));
    // Untouched: both still waiting for a node that can transcribe, none toward the DLQ.
    assert_eq!(backend.pending().await, 2);
    assert!(backend.dead_letters().await.is_empty());
}
both_backends!(
    an_engine_that_gave_up_stops_the_node_and_keeps_the_messages,
    3
);
