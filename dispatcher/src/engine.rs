//! The in-process CPU engine (the models crate) behind [`Transcriber`].

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::error::{DispatchError, Result};
use crate::outputs::safe_segment;
use crate::transcriber::Transcriber;
use model_core::timestamps::Timestamper;
use model_core::transcript::Transcript;
use models::ParakeetModel;

/// `<file stem>-<first 12 hex digits of the file's SHA-256>`: fine-tuned weights under the
/// same file name still get their own result keys.
pub fn model_id_for(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).map_err(|e| DispatchError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| DispatchError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    Ok(format!(
        "{}-{}",
        safe_segment(&stem),
        &format!("{:x}", hasher.finalize())[..12]
    ))
}

/// The CPU f32 reference model with NeMo-style timestamps.
pub struct CpuEngine {
    model: ParakeetModel,
    timestamper: Timestamper,
    model_id: String,
    frame_s: f64,
}

impl Transcriber for CpuEngine {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn frame_duration_s(&self) -> f64 {
        self.frame_s
    }

    fn transcribe(&self, segments: &[&[f32]]) -> Result<Vec<Transcript>> {
        let hyps = self
            .model
            .transcribe_batch(segments)
            .map_err(|e| DispatchError::Inference(e.to_string()))?;
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

/// Loads the `.nemo` model at `path` for in-process CPU inference.
pub fn load(path: &Path, model_id: Option<String>) -> Result<Arc<dyn Transcriber>> {
    let model_id = match model_id {
        Some(id) => id,
        None => model_id_for(path)?,
    };
    let started = std::time::Instant::now();
    let model = ParakeetModel::load(path)
        .map_err(|e| DispatchError::Config(format!("loading {}: {e}", path.display())))?;
    let timestamper = Timestamper::for_model(model.vocabulary(), model.config());
    let frame_s = model.config().seconds_per_encoder_frame();
    tracing::info!(model = %path.display(), %model_id, load_s = started.elapsed().as_secs_f64(),
        "model loaded");
    Ok(Arc::new(CpuEngine {
        model,
        timestamper,
        model_id,
        frame_s,
    }))
}
