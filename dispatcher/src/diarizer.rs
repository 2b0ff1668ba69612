//! The diarization side, behind a trait like [`crate::transcriber::Transcriber`]: the pipeline
//! hands over the whole recording's 16 kHz mono PCM and gets speaker turns back. The model
//! streams over the recording in bounded memory, so it sees the recording whole (speaker
//! identities stay consistent across the transcriber's segments). Implementations are
//! synchronous and run on a blocking thread. The first one is the in-process Sortformer.

use std::path::Path;
use std::sync::Arc;

use model_core::speakers::SpeakerSegment;
use models::sortformer::SortformerModel;

use crate::error::{DispatchError, Result};

pub trait Diarizer: Send + Sync {
    /// Identifies the model (and its weights) in result keys, next to the transcriber's id.
    fn model_id(&self) -> &str;

    /// Speaker turns of the whole recording, in seconds from its start.
    fn diarize(&self, pcm_16k: &[f32]) -> Result<Vec<SpeakerSegment>>;
}

/// Streaming Sortformer on the CPU (the models crate).
pub struct SortformerDiarizer {
    model: SortformerModel,
    model_id: String,
}

impl Diarizer for SortformerDiarizer {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn diarize(&self, pcm_16k: &[f32]) -> Result<Vec<SpeakerSegment>> {
        self.model
            .diarize(pcm_16k)
            .map_err(|e| DispatchError::Inference(format!("diarization: {e}")))
    }
}

/// Loads the Sortformer `.nemo` at `path`; the id defaults to the file stem plus a hash of
/// the file, as for the transcription model.
pub fn load(path: &Path, model_id: Option<String>) -> Result<Arc<dyn Diarizer>> {
    let model_id = match model_id {
        Some(id) => id,
        None => crate::engine::model_id_for(path)?,
    };
    let started = std::time::Instant::now();
    let model = SortformerModel::load(path).map_err(|e| {
        DispatchError::Config(format!("loading diarization model {}: {e}", path.display()))
    })?;
    tracing::info!(model = %path.display(), %model_id, speakers = model.num_speakers(),
        load_s = started.elapsed().as_secs_f64(), "diarization model loaded");
    Ok(Arc::new(SortformerDiarizer { model, model_id }))
}

/// The model id in a diarized job's result keys and manifest: the transcriber's and the
/// diarizer's together, so a diarized result never collides with (or is skipped because of) a
/// plain one for the same input, and a new diarization model gives new results.
pub fn diarized_model_id(transcriber_id: &str, diarizer_id: Option<&str>) -> String {
    format!(
        "{transcriber_id}_diar-{}",
        diarizer_id.unwrap_or("unavailable")
    )
}
