//! One job, start to finish: look up the input, skip it if a result exists, fetch, decode,
//! transcribe (and diarize, at the same time, when asked), write the outputs and then the
//! manifest. Permanent failures become a failure record in the result location; other errors
//! go back to the caller, which releases the message.

use std::sync::Arc;
use std::time::Instant;

use model_core::render::RenderOptions;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::checkpoint::StoreCheckpoints;
use crate::decode::{self, AudioSettings, Decoded};
use crate::decode_pool::DecodePool;
use crate::diarizer::Diarizer;
use crate::error::{DispatchError, ErrorClass, Result};
use crate::job::{Job, OutputFormat, Prefix};
use crate::lifecycle::retry::{retry_transient, RetrySettings};
use crate::metrics::{MetricEvent, Metrics, Stage};
use crate::model_id::diarized_model_id;
use crate::outputs::{
    Existing, FailureRecord, InputInfo, Manifest, ResultLocation, WriteOutcome, Writer,
    MISSING_TAG, RECORD_SCHEMA_VERSION,
};
use crate::queue::now_ms;
use crate::recording::{checkpoint_runs, transcribe_recording, Checkpoints};
use crate::render;
use crate::store::{ObjectMeta, ObjectStore};
use crate::tenants::Tenants;
use crate::transcriber::{Priority, Transcriber};

#[derive(Debug, Clone)]
pub struct PipelineSettings {
    /// Where results go when a job names no output prefix (S3 events never do).
    pub default_output: Option<Prefix>,
    /// Inputs above this size are refused before they are downloaded.
    pub max_input_bytes: u64,
    pub audio: AudioSettings,
    pub retry: RetrySettings,
    /// Segments handed to the model per call (bounds the model's working memory).
    pub segments_per_call: usize,
    /// Jobs allowed to run inference at the same time.
    pub inference_slots: usize,
    /// Recordings decoded at once: the bounded CPU pool (one OS thread each, outside the async
    /// runtime's threads), sized to the host's cores.
    pub decode_threads: usize,
    /// Who may read and write where; `None`: no tenant checks.
    pub tenants: Option<Tenants>,
    /// Recordings longer than this (seconds of audio) are transcribed in checkpoints of about
    /// this much audio each, saved in the result location as they finish, so a job that stops
    /// (its 12 h lease, a crash, a drain) resumes after the last one saved.
    pub checkpoint_every_s: f64,
}

/// How a job ended, when it ended cleanly (the message can be deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// Outputs and manifest written at `manifest_key`.
    Done { manifest_key: String },
    /// A manifest or failure record for this input and model already existed.
    AlreadyDone,
    /// A failure record with this reason code is in the result location.
    Failed { reason: &'static str },
}

impl JobOutcome {
    pub fn label(&self) -> &'static str {
        match self {
            Self::Done { .. } => "done",
            Self::AlreadyDone => "already_done",
            Self::Failed { .. } => "failed",
        }
    }
}

pub struct Pipeline {
    store: Arc<dyn ObjectStore>,
    transcriber: Arc<dyn Transcriber>,
    /// Runs when a job asks for diarization; without one such jobs fail permanently.
    diarizer: Option<Arc<dyn Diarizer>>,
    metrics: Metrics,
    settings: PipelineSettings,
    inference: Arc<Semaphore>,
    decoding: DecodePool,
}

impl Pipeline {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        transcriber: Arc<dyn Transcriber>,
        metrics: Metrics,
        settings: PipelineSettings,
    ) -> Result<Self> {
        let inference = Arc::new(Semaphore::new(settings.inference_slots.max(1)));
        let decoding = DecodePool::new(settings.decode_threads)
            .map_err(|e| DispatchError::Config(format!("cannot start a decode thread: {e}")))?;
        Ok(Self {
            store,
            transcriber,
            diarizer: None,
            metrics,
            settings,
            inference,
            decoding,
        })
    }

    /// Serves diarization requests with `diarizer`.
    pub fn with_diarizer(mut self, diarizer: Option<Arc<dyn Diarizer>>) -> Self {
        self.diarizer = diarizer;
        self
    }

    pub fn model_id(&self) -> &str {
        self.transcriber.model_id()
    }

    /// The model id in this job's result keys and records: the transcriber's, joined with
    /// the diarizer's when the job asks for diarization (see [`diarized_model_id`]).
    pub fn result_model_id(&self, job: &Job) -> String {
        if job.diarize {
            diarized_model_id(
                self.model_id(),
                self.diarizer.as_ref().map(|d| d.model_id()),
            )
        } else {
            self.model_id().to_owned()
        }
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// Threads of the decode pool.
    pub fn decode_threads(&self) -> usize {
        self.settings.decode_threads
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Whether the engine can take work now (see [`Transcriber::ready`]).
    pub fn engine_ready(&self) -> Result<bool> {
        self.transcriber.ready()
    }

    fn writer(&self) -> Writer<'_> {
        Writer {
            store: self.store.as_ref(),
            retry: self.settings.retry,
        }
    }

    /// The result location this job would write to (for its input's current content).
    pub fn output_prefix(&self, job: &Job) -> Result<Prefix> {
        job.output_prefix
            .clone()
            .or_else(|| self.settings.default_output.clone())
            .ok_or_else(|| {
                DispatchError::BadMessage(
                    "job names no output prefix and none is configured".into(),
                )
            })
    }

    /// Runs one job. `Ok` means the message can be deleted; `Err` means it must not be.
    /// A checkpointed job stops at its next checkpoint once `stop` is cancelled.
    pub async fn process(&self, job: &Job, stop: &CancellationToken) -> Result<JobOutcome> {
        let started = Instant::now();
        tracing::debug!(job_id = %job.job_id, input = %job.input.uri(), "job started");
        let output = self.output_prefix(job)?;
        if let Some(tenants) = &self.settings.tenants {
            // Before any read or write: a failure record would itself be a write outside.
            if let Err(e) = tenants.check(job.tenant.as_deref(), &job.input, &output) {
                tracing::error!(job_id = %job.job_id, input = %job.input.uri(), error = %e,
                    "job refused by the tenant check; its message goes to the dead-letter queue");
                self.metrics.emit(MetricEvent::Failure {
                    reason: e.reason_code(),
                });
                return Err(e);
            }
        }
        let model_id = self.result_model_id(job);
        let head = retry_transient(self.settings.retry, "head input", || {
            self.store.head(&job.input)
        })
        .await;
        let meta = match head {
            Ok(Some(meta)) => meta,
            Ok(None) => {
                let error = DispatchError::ObjectMissing {
                    bucket: job.input.bucket.clone(),
                    key: job.input.key.clone(),
                };
                let loc = ResultLocation::new(&output, &job.input, MISSING_TAG, &model_id);
                return self.record_failure(job, &loc, None, error).await;
            }
            Err(e) if e.class() == ErrorClass::Permanent => {
                let loc = ResultLocation::new(&output, &job.input, MISSING_TAG, &model_id);
                return self.record_failure(job, &loc, None, e).await;
            }
            Err(e) => return Err(e),
        };
        let loc = ResultLocation::new(&output, &job.input, &meta.etag, &model_id);
        if let Some(existing) = self.writer().existing(&loc).await? {
            if let Existing::Manifest(m) = &existing {
                if m.input.etag.as_deref() != Some(meta.etag.as_str()) {
                    return Err(DispatchError::ResultMismatch {
                        bucket: loc.bucket.clone(),
                        key: loc.manifest_key(),
                        why: "manifest names other input content".into(),
                    });
                }
            }
            tracing::info!(job_id = %job.job_id, dir = %loc.dir, "result already exists; skipping");
            return Ok(JobOutcome::AlreadyDone);
        }
        let outcome = match self.transcribe_into(job, &meta, &loc, started, stop).await {
            Ok(outcome) => outcome,
            Err(e) if e.class() == ErrorClass::Permanent => {
                return self.record_failure(job, &loc, Some(&meta), e).await;
            }
            Err(e) => return Err(e),
        };
        self.metrics.emit(MetricEvent::StageSeconds {
            stage: Stage::EndToEnd,
            seconds: started.elapsed().as_secs_f64(),
        });
        Ok(outcome)
    }

    async fn record_failure(
        &self,
        job: &Job,
        loc: &ResultLocation,
        meta: Option<&ObjectMeta>,
        error: DispatchError,
    ) -> Result<JobOutcome> {
        let reason = error.reason_code();
        tracing::warn!(job_id = %job.job_id, input = %job.input.uri(), reason, error = %error,
            "job failed permanently; writing a failure record");
        let record = FailureRecord::new(
            job,
            InputInfo::new(&job.input, meta),
            &self.result_model_id(job),
            &error,
        );
        self.writer().write_failure(loc, &record).await?;
        self.metrics.emit(MetricEvent::Failure { reason });
        Ok(JobOutcome::Failed { reason })
    }

    async fn transcribe_into(
        &self,
        job: &Job,
        meta: &ObjectMeta,
        loc: &ResultLocation,
        started: Instant,
        stop: &CancellationToken,
    ) -> Result<JobOutcome> {
        let diarizer = match (job.diarize, &self.diarizer) {
            (false, _) => None,
            (true, Some(d)) => Some(d.clone()),
            (true, None) => return Err(DispatchError::DiarizationUnavailable),
        };
        // Empty or oversized inputs are refused before the download.
        audio::check_input_size(meta.size_bytes, &self.settings.audio.limits).map_err(|e| {
            DispatchError::Audio {
                reason: e.reason_code(),
                message: e.to_string(),
            }
        })?;

        let t = Instant::now();
        let bytes = retry_transient(self.settings.retry, "fetch input", || {
            self.store
                .get(&job.input, self.settings.max_input_bytes, Some(&meta.etag))
        })
        .await?;
        self.stage(Stage::Fetch, t);

        let ext = extension_of(&job.input.key);
        let audio = self.settings.audio.clone();
        let ran = self
            .decoding
            .run(move || {
                let t = Instant::now();
                let decoded = decode::decode_segments(&bytes, ext.as_deref(), &audio);
                drop(bytes);
                (decoded, t.elapsed().as_secs_f64())
            })
            .await
            .map_err(|e| DispatchError::Audio {
                reason: "decoder_crashed",
                message: e.0,
            })?;
        self.metrics.emit(MetricEvent::StageSeconds {
            stage: Stage::DecodeWait,
            seconds: ran.waited.as_secs_f64(),
        });
        let (decoded, decode_s) = ran.value;
        let decoded: Decoded = decoded?;
        self.metrics.emit(MetricEvent::StageSeconds {
            stage: Stage::Decode,
            seconds: decode_s,
        });
        self.metrics.emit(MetricEvent::StageSeconds {
            stage: Stage::Resample,
            seconds: decoded.resample_s,
        });

        let t = Instant::now();
        let _slot = self
            .inference
            .acquire()
            .await
            .expect("inference semaphore is never closed (bug)");
        self.stage(Stage::QueueWait, t);

        let transcriber = self.transcriber.clone();
        let per_call = self.settings.segments_per_call;
        let recording = decoded.clone();
        let diarizing = diarizer.clone();
        let checkpoints = self.checkpoints(&decoded, loc, stop).map(Arc::new);
        let saving = checkpoints.clone();
        let result = tokio::task::spawn_blocking(move || {
            transcribe_recording(
                transcriber.as_ref(),
                diarizing.as_deref(),
                &recording,
                per_call,
                Priority::Batch,
                saving.as_deref().map(|c| c as &dyn Checkpoints),
            )
        })
        .await
        .map_err(|e| DispatchError::Inference(format!("inference thread panicked: {e}")))?;
        drop(_slot);
        if let Some(c) = &checkpoints {
            if c.loaded() > 0 {
                tracing::info!(job_id = %job.job_id, dir = %loc.dir, resumed_checkpoints = c.loaded(),
                    "resumed after the checkpoints an earlier attempt saved");
            }
        }
        let result = result?;
        self.metrics.emit(MetricEvent::StageSeconds {
            stage: Stage::Inference,
            seconds: result.inference_s,
        });
        if diarizer.is_some() {
            self.metrics.emit(MetricEvent::StageSeconds {
                stage: Stage::Diarization,
                seconds: result.diarization_s,
            });
        }
        self.metrics
            .emit(MetricEvent::AudioSeconds(decoded.duration_s));
        if result.inference_s > 0.0 {
            self.metrics
                .emit(MetricEvent::Rtfx(decoded.duration_s / result.inference_s));
        }

        let t = Instant::now();
        let transcript = result.transcript;
        let options = RenderOptions {
            file_id: Some(file_id_of(&job.input.key)),
            speaker_turns: result.speaker_turns.unwrap_or_default(),
            ..RenderOptions::default()
        };
        let rendered = job
            .output_formats()
            .into_iter()
            .map(|f| Ok((f, render::render_with(f, &transcript, &options)?)))
            .collect::<Result<Vec<(OutputFormat, String)>>>()?;
        self.stage(Stage::Render, t);

        let t = Instant::now();
        let manifest = Manifest {
            schema_version: RECORD_SCHEMA_VERSION,
            job_id: job.job_id.clone(),
            input: InputInfo::new(&job.input, Some(meta)),
            model_id: self.result_model_id(job),
            diarization_model_id: diarizer.as_ref().map(|d| d.model_id().to_owned()),
            audio_duration_s: decoded.duration_s,
            segments: decoded.segments.len(),
            outputs: Vec::new(),
            created_at_ms: now_ms(),
            dispatcher_version: env!("CARGO_PKG_VERSION").to_owned(),
        };
        let written = self.writer().write_result(loc, rendered, manifest).await?;
        self.stage(Stage::Upload, t);
        tracing::debug!(job_id = %job.job_id, dir = %loc.dir, audio_s = decoded.duration_s,
            total_s = started.elapsed().as_secs_f64(), "job finished");
        Ok(match written {
            WriteOutcome::Written => JobOutcome::Done {
                manifest_key: loc.manifest_key(),
            },
            WriteOutcome::AlreadyDone => JobOutcome::AlreadyDone,
        })
    }

    /// Checkpoints for a recording long enough to be worth them (more than one), else `None`.
    fn checkpoints(
        &self,
        decoded: &Decoded,
        loc: &ResultLocation,
        stop: &CancellationToken,
    ) -> Option<StoreCheckpoints> {
        let every_s = self.settings.checkpoint_every_s;
        if decoded.duration_s <= every_s {
            return None;
        }
        let every_samples = (every_s * f64::from(audio::TARGET_SAMPLE_RATE_HZ)) as usize;
        (checkpoint_runs(&decoded.segments, every_samples).len() > 1).then(|| {
            StoreCheckpoints::new(
                self.store.clone(),
                self.settings.retry,
                loc.clone(),
                every_samples,
                stop.clone(),
            )
        })
    }

    fn stage(&self, stage: Stage, since: Instant) {
        self.metrics.emit(MetricEvent::StageSeconds {
            stage,
            seconds: since.elapsed().as_secs_f64(),
        });
    }
}

/// The recording's name in RTTM lines: the key's last segment without its extension.
fn file_id_of(key: &str) -> String {
    let name = key.rsplit('/').next().unwrap_or(key);
    match name.rsplit_once('.') {
        Some((stem, _)) if !stem.is_empty() => stem.to_owned(),
        _ => name.to_owned(),
    }
}

/// Lower-case extension of the key's last segment, as a decoding hint.
fn extension_of(key: &str) -> Option<String> {
    let name = key.rsplit('/').next()?;
    let (_, ext) = name.rsplit_once('.')?;
    (!ext.is_empty() && ext.len() <= 8).then(|| ext.to_ascii_lowercase())
}
