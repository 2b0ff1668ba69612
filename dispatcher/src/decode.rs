//! Audio bytes to 16 kHz mono PCM cut into model-sized segments, through the `audio` crate.
//! The PCM is decoded once and shared; segments are sample ranges into it (no copies).

use std::ops::Range;
use std::sync::Arc;

use crate::error::{DispatchError, Result};

/// Limits on untrusted audio and how long recordings are cut.
#[derive(Debug, Clone, Default)]
pub struct AudioSettings {
    pub limits: audio::AudioLimits,
    pub segmenter: audio::SegmenterConfig,
}

#[derive(Debug, Clone)]
pub struct Decoded {
    pub pcm: Arc<Vec<f32>>,
    /// Consecutive sample ranges of `pcm`, each at most the segment limit long.
    pub segments: Vec<Range<usize>>,
    pub duration_s: f64,
    /// Seconds of the decode spent downmixing and resampling.
    pub resample_s: f64,
}

/// Decodes and segments; every audio problem becomes a permanent error with its reason code.
pub fn decode_segments(
    bytes: &[u8],
    ext: Option<&str>,
    settings: &AudioSettings,
) -> Result<Decoded> {
    let decoded = audio::decode(bytes, ext, &settings.limits).map_err(|e| match e {
        audio::AudioError::Io(source) => DispatchError::io("<in-memory audio>", source),
        other => DispatchError::Audio {
            reason: other.reason_code(),
            message: other.to_string(),
        },
    })?;
    let segments = audio::segments(&decoded.pcm_16k, &settings.segmenter)
        .map(|s| s.start_sample..s.end_sample())
        .collect();
    Ok(Decoded {
        duration_s: decoded.duration_s,
        resample_s: decoded.resample_s,
        segments,
        pcm: Arc::new(decoded.pcm_16k),
    })
}
