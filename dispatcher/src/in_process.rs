//! Engines inside this process, through the one engine seam (`engine::load`): a transcription
//! engine behind [`Transcriber`] (hypotheses plus NeMo's timestamps) and a diarization engine
//! behind [`Diarizer`]. One call at a time each (the engine is behind a lock); the fleet is the
//! way to run several.

use std::path::Path;
use std::sync::{Arc, Mutex};

use engine::{DiarizationEngine, Engine, EngineKind, EngineSettings};
use model_core::speakers::SpeakerSegment;
use model_core::timestamps::Timestamper;
use model_core::transcript::Transcript;

use crate::diarizer::Diarizer;
use crate::error::{DispatchError, Result};
use crate::model_id::given_or_hashed;
use crate::transcriber::{SharedPcm, Transcriber};

/// A transcription engine in this process with NeMo-style timestamps.
pub struct InProcessTranscriber {
    engine: Mutex<Box<dyn Engine>>,
    timestamper: Timestamper,
    model_id: String,
    frame_s: f64,
}

impl Transcriber for InProcessTranscriber {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn frame_duration_s(&self) -> f64 {
        self.frame_s
    }

    fn transcribe(&self, segments: &[&[f32]]) -> Result<Vec<Transcript>> {
        let hyps = self
            .engine
            .lock()
            .map_err(|_| DispatchError::Inference("the engine panicked earlier".into()))?
            .transcribe(segments)
            .map_err(|e| DispatchError::Engine(Box::new(e)))?;
        hyps.iter()
            .zip(segments)
            .map(|(hyp, pcm)| {
                self.timestamper
                    .transcript(hyp, pcm.len())
                    .map_err(|e| DispatchError::Inference(e.to_string()))
            })
            .collect()
    }
}

/// Loads the transcription model at `path` on the `kind` engine; the model id defaults to the
/// file stem plus a hash of the file ([`crate::model_id::model_id_for`]).
pub fn load_transcriber(
    kind: EngineKind,
    path: &Path,
    settings: &EngineSettings,
    model_id: Option<String>,
) -> Result<Arc<dyn Transcriber>> {
    let model_id = given_or_hashed(model_id, path)?;
    let started = std::time::Instant::now();
    let engine =
        engine::load(kind, path, settings).map_err(|e| DispatchError::EngineLoad(Box::new(e)))?;
    let info = engine.model_info();
    tracing::info!(model = %path.display(), engine = %kind, %model_id,
        load_s = started.elapsed().as_secs_f64(), "model loaded");
    Ok(Arc::new(InProcessTranscriber {
        engine: Mutex::new(engine),
        timestamper: info.timestamper(),
        model_id,
        frame_s: info.frame_timing().seconds(1),
    }))
}

/// A diarization engine in this process.
pub struct InProcessDiarizer {
    engine: Mutex<Box<dyn DiarizationEngine>>,
    model_id: String,
}

impl Diarizer for InProcessDiarizer {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn diarize(&self, pcm_16k: &SharedPcm) -> Result<Vec<SpeakerSegment>> {
        self.engine
            .lock()
            .map_err(|_| DispatchError::Inference("the diarizer panicked earlier".into()))?
            .diarize(pcm_16k.as_slice())
            .map_err(|e| DispatchError::Engine(Box::new(e)))
    }
}

/// Loads the Sortformer model at `path` on the `kind` engine; the id defaults to the file stem
/// plus a hash of the file, as for the transcription model.
pub fn load_diarizer(
    kind: EngineKind,
    path: &Path,
    settings: &EngineSettings,
    model_id: Option<String>,
) -> Result<Arc<dyn Diarizer>> {
    let model_id = given_or_hashed(model_id, path)?;
    let started = std::time::Instant::now();
    let engine = engine::load_diarizer(kind, path, settings)
        .map_err(|e| DispatchError::EngineLoad(Box::new(e)))?;
    tracing::info!(model = %path.display(), engine = %kind, %model_id,
        load_s = started.elapsed().as_secs_f64(), "diarization model loaded");
    Ok(Arc::new(InProcessDiarizer {
        engine: Mutex::new(engine),
        model_id,
    }))
}
