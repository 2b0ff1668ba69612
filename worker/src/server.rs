//! The accept loop and one task pair (reader, writer) per connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::{unix::OwnedWriteHalf, UnixListener, UnixStream};
use tokio::sync::mpsc;
use worker_protocol::{
    read_frame_async, read_frame_async_reusing, write_frame_async, Audio, ClientMessage,
    DiarizeRequest, HealthReport, Priority, ProtocolError, RequestId, Task, TranscribeRequest,
    WireError, WireErrorKind, WorkerInfo, WorkerMessage, WorkerState, PROTOCOL_VERSION,
};

use crate::batcher::{error_message, BatcherCommand, Pending, QueueStats};
use crate::engine_thread::EngineStatus;

pub struct ServerContext {
    pub info: WorkerInfo,
    pub batcher: mpsc::Sender<BatcherCommand>,
    pub queue: Arc<QueueStats>,
    pub engine: Arc<EngineStatus>,
    pub hop_samples: usize,
    pub wedge_after: Duration,
    next_conn: AtomicU64,
}

impl ServerContext {
    pub fn new(
        info: WorkerInfo,
        batcher: mpsc::Sender<BatcherCommand>,
        queue: Arc<QueueStats>,
        engine: Arc<EngineStatus>,
        hop_samples: usize,
        wedge_after: Duration,
    ) -> Self {
        Self {
            info,
            batcher,
            queue,
            engine,
            hop_samples: hop_samples.max(1),
            wedge_after,
            next_conn: AtomicU64::new(0),
        }
    }

    fn health(&self, nonce: u64) -> HealthReport {
        let busy = self.engine.busy_for();
        HealthReport {
            nonce,
            state: if !busy.is_zero() && busy >= self.wedge_after + self.engine.busy_audio() {
                WorkerState::Wedged
            } else {
                WorkerState::Ready
            },
            queue_depth: self.queue.depth.load(Ordering::Acquire) as u32,
            engine_busy_ms: busy.as_millis() as u64,
            batches_done: self.engine.batches_done(),
        }
    }
}

pub async fn accept_loop(listener: UnixListener, ctx: Arc<ServerContext>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let conn = ctx.next_conn.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(serve_connection(stream, conn, Arc::clone(&ctx)));
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn write_loop(
    mut writer: OwnedWriteHalf,
    mut outbox: mpsc::UnboundedReceiver<WorkerMessage>,
) {
    while let Some(message) = outbox.recv().await {
        if let Err(e) = write_frame_async(&mut writer, &message).await {
            tracing::debug!(error = %e, "connection write failed");
            return;
        }
    }
}

async fn serve_connection(stream: UnixStream, conn: u64, ctx: Arc<ServerContext>) {
    let (mut reader, writer) = stream.into_split();
    let (outbox, rx) = mpsc::unbounded_channel();
    let writer_task = tokio::spawn(write_loop(writer, rx));
    match read_loop(&mut reader, conn, &ctx, &outbox).await {
        Ok(()) | Err(ProtocolError::Closed) => {}
        Err(e) => {
            tracing::warn!(conn, error = %e, kind = e.error_type(), "dropping connection");
            let _ = outbox.send(WorkerMessage::Error {
                id: None,
                error: WireError {
                    kind: match e {
                        ProtocolError::VersionMismatch { .. } => WireErrorKind::VersionMismatch,
                        _ => WireErrorKind::Malformed,
                    },
                    message: e.to_string(),
                },
            });
        }
    }
    // Queued requests of this connection see their reply channel closed once the last
    // sender (ours and theirs) is gone; the batcher prunes them.
    // The client is gone or misbehaved: give the writer a moment to flush the error, then drop
    // it, which closes the reply channel of this connection's queued requests (the batcher
    // prunes them instead of computing answers nobody reads).
    drop(outbox);
    let mut writer_task = writer_task;
    if tokio::time::timeout(Duration::from_millis(200), &mut writer_task)
        .await
        .is_err()
    {
        writer_task.abort();
    }
}

async fn read_loop(
    reader: &mut tokio::net::unix::OwnedReadHalf,
    conn: u64,
    ctx: &ServerContext,
    outbox: &mpsc::UnboundedSender<WorkerMessage>,
) -> Result<(), ProtocolError> {
    match read_frame_async::<ClientMessage>(reader).await? {
        ClientMessage::Hello { version, .. } if version == PROTOCOL_VERSION => {
            let _ = outbox.send(WorkerMessage::Hello {
                version: PROTOCOL_VERSION,
                worker: ctx.info.clone(),
            });
        }
        ClientMessage::Hello { version, .. } => {
            return Err(ProtocolError::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: version,
            })
        }
        other => return Err(ProtocolError::Unexpected(format!("{other:?} before Hello"))),
    }
    let mut body = Vec::new();
    loop {
        match read_frame_async_reusing::<ClientMessage>(reader, &mut body).await? {
            ClientMessage::Transcribe(TranscribeRequest {
                id,
                audio,
                deadline_ms,
                priority,
            }) => {
                let request = (id, audio, deadline_ms, priority);
                submit(Task::Transcribe, request, conn, ctx, outbox).await;
            }
            ClientMessage::Diarize(DiarizeRequest {
                id,
                audio,
                deadline_ms,
            }) => {
                // One recording per diarization batch: nothing to reorder.
                let request = (id, audio, deadline_ms, Priority::Batch);
                submit(Task::Diarize, request, conn, ctx, outbox).await;
            }
            ClientMessage::Cancel { id } => {
                let _ = ctx.batcher.send(BatcherCommand::Cancel { conn, id }).await;
            }
            ClientMessage::Health { nonce } => {
                let _ = outbox.send(WorkerMessage::Health(ctx.health(nonce)));
            }
            ClientMessage::Hello { .. } => {
                return Err(ProtocolError::Unexpected("second Hello".into()))
            }
        }
    }
}

/// Queues a request of `task`; one of the other task is refused (`BadRequest`), never run on
/// the wrong model.
async fn submit(
    task: Task,
    (id, audio, deadline_ms, priority): (RequestId, Audio, Option<u32>, Priority),
    conn: u64,
    ctx: &ServerContext,
    outbox: &mpsc::UnboundedSender<WorkerMessage>,
) {
    if task != ctx.info.task {
        let message = format!(
            "this worker serves {} requests, not {}",
            ctx.info.task.label(),
            task.label()
        );
        let _ = outbox.send(error_message(id, WireErrorKind::BadRequest, message));
        return;
    }
    let Audio::Pcm16k(pcm) = audio;
    // Just decoded, so the only owner: no copy.
    let pcm = pcm.into_vec();
    let problem = if pcm.is_empty() {
        Some("empty audio")
    } else if pcm.iter().any(|s| !s.is_finite()) {
        Some("non-finite samples")
    } else {
        None
    };
    if let Some(problem) = problem {
        let _ = outbox.send(error_message(id, WireErrorKind::BadRequest, problem.into()));
        return;
    }
    let frames = pcm.len() / ctx.hop_samples + 1;
    let command = BatcherCommand::Submit {
        pending: Pending {
            conn,
            id,
            pcm: Arc::new(pcm),
            reply: outbox.clone(),
        },
        frames,
        deadline: deadline_ms.map(|ms| Instant::now() + Duration::from_millis(u64::from(ms))),
        priority,
    };
    if ctx.batcher.send(command).await.is_err() {
        let _ = outbox.send(error_message(
            id,
            WireErrorKind::ShuttingDown,
            "batcher stopped".into(),
        ));
    }
}
