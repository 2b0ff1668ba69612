//! `dispatcher serve`: OpenAI's transcription API (`POST /v1/audio/transcriptions`,
//! `GET /v1/models`) on the same engines as `local` and `run` (in process, or the worker
//! fleet), with `/health` and `/metrics` on the same listener.
//!
//! A request is checked in this order, each failure answered at once: API key (401), engine
//! ready and not draining (503 with `Retry-After`), a pending-request slot (429 with
//! `Retry-After`), the form (400, 413), the audio (400, 413, 415). Then it is decoded on a
//! blocking thread, transcribed (the fleet batches concurrent requests together), rendered.
//! The listener binds before the engine loads, so a load balancer sees 503 while a fleet
//! starts. On SIGTERM it stops accepting connections and finishes what it accepted, within
//! the drain grace.

mod auth;
mod error;
mod form;
mod stats;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, Multipart, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use model_core::render::{render, OutputFormat, RenderOptions, MODEL_LANGUAGE};
use tokio_util::sync::CancellationToken;

pub use auth::ApiKeys;
pub use error::ApiError;
use form::TranscriptionForm;
pub use stats::{ApiState, ApiStats};

use crate::decode::{decode_segments, AudioSettings};
use crate::error::{DispatchError, Result};
use crate::fleet_engine::LoadedEngine;
use crate::metrics::Metrics;
use crate::recording::transcribe_recording;
use crate::transcriber::Priority;

/// How the API serves.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub keys: ApiKeys,
    /// The names `model` may take; the first is the model's own, the rest aliases (so a client
    /// written for OpenAI's `whisper-1` works unchanged).
    pub model_names: Vec<String>,
    /// Requests accepted and not yet answered; one more gets 429.
    pub max_pending_requests: usize,
    pub audio: AudioSettings,
    /// Segments per engine call; `None`: what the engine takes at once.
    pub segments_per_call: Option<usize>,
    /// After SIGTERM, how long accepted requests may take.
    pub drain_grace: Duration,
}

/// Form fields other than the file take little room; this much is allowed beside it.
const FORM_OVERHEAD_BYTES: u64 = 64 * 1024;

struct Api {
    options: ServeOptions,
    engine: OnceLock<LoadedEngine>,
    stats: Arc<ApiStats>,
    metrics: Metrics,
}

/// Serves until `stop` fires (or SIGTERM, if the caller wires it to `stop`) and what was
/// accepted is answered, or the drain grace runs out. `load` runs on a blocking thread after
/// the listener is bound; its failure ends the server with that error.
pub async fn serve(
    options: ServeOptions,
    metrics: Metrics,
    healthy: Arc<AtomicBool>,
    load: impl FnOnce() -> Result<LoadedEngine> + Send + 'static,
    stop: CancellationToken,
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|e| DispatchError::Config(format!("cannot listen on {}: {e}", options.listen)))?;
    let bound = listener
        .local_addr()
        .map_err(|e| DispatchError::Config(format!("listener address: {e}")))?;
    let stats = Arc::new(ApiStats::new(options.max_pending_requests));
    metrics.add_source(stats.clone());
    let body_limit = options
        .audio
        .limits
        .max_input_bytes
        .saturating_add(FORM_OVERHEAD_BYTES);
    let drain_grace = options.drain_grace;
    let api = Arc::new(Api {
        options,
        engine: OnceLock::new(),
        stats: stats.clone(),
        metrics: metrics.clone(),
    });
    let app = axum::Router::new()
        .route("/v1/audio/transcriptions", post(transcriptions))
        .route("/v1/models", get(models))
        .with_state(api.clone())
        .merge(crate::metrics::prometheus::router(metrics, healthy.clone()))
        .layer(DefaultBodyLimit::max(
            usize::try_from(body_limit).unwrap_or(usize::MAX),
        ));
    tracing::info!(addr = %bound, authentication = api.options.keys.is_enabled(),
        models = %api.options.model_names.join(", "),
        max_pending_requests = api.options.max_pending_requests,
        "serving the transcription API (503 until the engine is ready)");
    let stopping = CancellationToken::new();
    let server = tokio::spawn({
        let stopping = stopping.clone();
        async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(stopping.cancelled_owned())
                .await
        }
    });

    let loading = tokio::task::spawn_blocking(load);
    tokio::select! {
        loaded = loading => {
            let engine = loaded
                .map_err(|e| DispatchError::Inference(format!("engine load panicked: {e}")))
                .and_then(|r| r);
            match engine {
                Ok(engine) => {
                    if let Some(source) = engine.metrics_source.clone() {
                        api.metrics.add_source(source);
                    }
                    let _ = api.engine.set(engine);
                    stats.set_state(ApiState::Ready);
                    tracing::info!(addr = %bound, "the transcription API is ready");
                }
                Err(e) => {
                    stopping.cancel();
                    let _ = server.await;
                    return Err(e);
                }
            }
            stop.cancelled().await;
        }
        () = stop.cancelled() => {}
    }
    tracing::info!(
        pending = stats.pending.load(Ordering::Relaxed),
        grace_s = drain_grace.as_secs(),
        "stopping: no new connections; answering what was accepted"
    );
    stats.set_state(ApiState::Draining);
    healthy.store(false, Ordering::Relaxed);
    stopping.cancel();
    let abort = server.abort_handle();
    match tokio::time::timeout(drain_grace, server).await {
        Ok(_) => tracing::info!("every accepted request answered"),
        Err(_) => {
            abort.abort();
            tracing::warn!(
                unanswered = stats.pending.load(Ordering::Relaxed),
                "drain grace over; requests still open were dropped"
            );
        }
    }
    Ok(())
}

/// Times every answer, whatever it is.
async fn transcriptions(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    multipart: std::result::Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Response {
    let started = Instant::now();
    let response = match api.transcribe(&headers, multipart).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    };
    api.stats
        .observe(response.status().as_u16(), started.elapsed());
    response
}

/// Holds a pending-request slot for as long as it lives.
struct Pending<'a>(&'a ApiStats);

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Api {
    fn ready_engine(&self) -> std::result::Result<&LoadedEngine, ApiError> {
        let unavailable = |why: &str| {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", why).retry_after(5)
        };
        match (self.stats.state(), self.engine.get()) {
            (ApiState::Draining, _) => Err(unavailable("the server is stopping")),
            (_, None) => Err(unavailable("the model is loading")),
            (_, Some(engine)) => match &engine.metrics_source {
                Some(source) if !source.health().0 => Err(unavailable(
                    "no worker is ready (the fleet is starting or restarting a GPU group)",
                )),
                _ => Ok(engine),
            },
        }
    }

    fn admit(&self) -> std::result::Result<Pending<'_>, ApiError> {
        let max = self.options.max_pending_requests;
        let admitted = self
            .stats
            .pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok();
        if admitted {
            Ok(Pending(&self.stats))
        } else {
            Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_pending_requests",
                format!("{max} requests are already pending; retry shortly"),
            )
            .retry_after(1))
        }
    }

    async fn transcribe(
        &self,
        headers: &HeaderMap,
        multipart: std::result::Result<Multipart, axum::extract::multipart::MultipartRejection>,
    ) -> std::result::Result<Response, ApiError> {
        self.options.keys.check(headers)?;
        let engine = self.ready_engine()?;
        let _pending = self.admit()?;
        let multipart = multipart.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_multipart",
                format!("send the request as multipart/form-data: {e}"),
            )
        })?;
        let form = TranscriptionForm::read(multipart).await?;
        if !self.options.model_names.contains(&form.model) {
            return Err(ApiError::invalid(
                "model",
                "model_not_found",
                format!(
                    "model `{}` is not served here; use one of: {}",
                    form.model,
                    self.options.model_names.join(", ")
                ),
            ));
        }
        let diarizer = match (form.diarize, &engine.diarizer) {
            (false, _) => None,
            (true, Some(d)) => Some(d.clone()),
            (true, None) => {
                return Err(ApiError::invalid(
                    "diarize",
                    "diarization_unavailable",
                    "this server has no diarization model (start it with --diar-model)",
                ))
            }
        };
        let transcriber = engine.transcriber.clone();
        let audio = self.options.audio.clone();
        let per_call = self
            .options
            .segments_per_call
            .unwrap_or_else(|| transcriber.capacity().segments_per_call);
        let ext = form.extension();
        let file = form.file;
        let recording = tokio::task::spawn_blocking(move || {
            let decoded = decode_segments(&file, ext.as_deref(), &audio)?;
            drop(file);
            transcribe_recording(
                transcriber.as_ref(),
                diarizer.as_deref(),
                &decoded,
                per_call,
                Priority::Interactive,
                None,
            )
        })
        .await
        .map_err(|e| DispatchError::Inference(format!("transcription thread panicked: {e}")))??;
        let mut transcript = recording.transcript;
        if form.response_format == OutputFormat::VerboseJson {
            if !form.granularities.words {
                transcript.words.clear();
            }
            if !form.granularities.segments {
                transcript.segments.clear();
            }
        }
        let options = RenderOptions {
            language: form
                .language
                .as_deref()
                .and_then(form::language_name)
                .unwrap_or(MODEL_LANGUAGE)
                .to_owned()
                .into(),
            file_id: form
                .file_name
                .as_deref()
                .map(|n| n.rsplit_once('.').map_or(n, |(stem, _)| stem).to_owned()),
            speaker_turns: recording.speaker_turns.unwrap_or_default(),
            ..RenderOptions::default()
        };
        let document = render(&transcript, form.response_format, &options);
        let content_type = match form.response_format {
            OutputFormat::Json | OutputFormat::VerboseJson => "application/json",
            OutputFormat::Vtt => "text/vtt; charset=utf-8",
            OutputFormat::Text | OutputFormat::Srt | OutputFormat::Rttm => {
                "text/plain; charset=utf-8"
            }
        };
        Ok(([(header::CONTENT_TYPE, content_type)], document).into_response())
    }
}

/// `GET /v1/models`: the served model and its aliases, as OpenAI lists models.
async fn models(State(api): State<Arc<Api>>, headers: HeaderMap) -> Response {
    if let Err(e) = api.options.keys.check(&headers) {
        return e.into_response();
    }
    let data: Vec<_> = api
        .options
        .model_names
        .iter()
        .map(|id| serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "parakeet-fleet"}))
        .collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}
