//! Model ids: the name of a model (and its weights) in result keys.

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{DispatchError, Result};
use crate::outputs::safe_segment;

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

/// The model id in a diarized job's result keys and manifest: the transcriber's and the
/// diarizer's together, so a diarized result never collides with (or is skipped because of) a
/// plain one for the same input, and a new diarization model gives new results.
pub fn diarized_model_id(transcriber_id: &str, diarizer_id: Option<&str>) -> String {
    format!(
        "{transcriber_id}_diar-{}",
        diarizer_id.unwrap_or("unavailable")
    )
}

/// `given`, else [`model_id_for`] the file at `path`.
pub fn given_or_hashed(given: Option<String>, path: &Path) -> Result<String> {
    match given {
        Some(id) => Ok(id),
        None => model_id_for(path),
    }
}
