//! Streaming mono resampler to 16 kHz: input arrives packet by packet, so only the 16 kHz output
//! is ever held in full (never the source-rate signal).
//!
//! libsoxr at its "HQ" recipe (20-bit), the resampler librosa uses by default (`soxr_hq`), so
//! NeMo's `transcribe()` on a 44.1 or 48 kHz file resamples with the same filter. Against the
//! rubato FFT resampler used before, downmix and resampling of a 10-minute 44.1 kHz stereo MP3
//! take 0.30 instead of 0.37 ms per audio second (one core of the developer machine).

use soxr::format::Mono;
use soxr::params::{QualityRecipe, QualitySpec, RuntimeSpec};
use soxr::Soxr;

use crate::error::AudioError;

/// Sample rate of everything this crate outputs.
pub const TARGET_SAMPLE_RATE_HZ: u32 = 16_000;

/// Output frames libsoxr may hold back beyond the exact ratio on one call (its filter delay is
/// released on `finish`); the slack only sizes the space offered, never the result.
const OUTPUT_SLACK_FRAMES: usize = 64;

pub(crate) struct MonoResampler {
    /// `None` when the source is already at 16 kHz (samples pass through untouched).
    soxr: Option<Soxr<Mono<f32>>>,
    source_rate_hz: u32,
    frames_in: u64,
    frames_out: u64,
}

impl MonoResampler {
    pub(crate) fn new(source_rate_hz: u32) -> Result<Self, AudioError> {
        let soxr = if source_rate_hz == TARGET_SAMPLE_RATE_HZ {
            None
        } else {
            // One thread: recordings are decoded in parallel, one per pool thread.
            let soxr = Soxr::new_with_params(
                f64::from(source_rate_hz),
                f64::from(TARGET_SAMPLE_RATE_HZ),
                QualitySpec::new(QualityRecipe::high()),
                RuntimeSpec::new(1),
            )
            .map_err(|e| AudioError::Internal {
                detail: format!("resampler {source_rate_hz} Hz -> 16 kHz: {e}"),
            })?;
            Some(soxr)
        };
        Ok(Self {
            soxr,
            source_rate_hz,
            frames_in: 0,
            frames_out: 0,
        })
    }

    /// Feeds source-rate mono samples; appends whatever 16 kHz output is ready to `out`.
    pub(crate) fn push(&mut self, mono: &[f32], out: &mut Vec<f32>) -> Result<(), AudioError> {
        self.frames_in += mono.len() as u64;
        let source_rate_hz = self.source_rate_hz;
        let Some(soxr) = self.soxr.as_mut() else {
            out.extend_from_slice(mono);
            self.frames_out += mono.len() as u64;
            return Ok(());
        };
        let mut consumed = 0;
        while consumed < mono.len() {
            let room = (mono.len() - consumed) * TARGET_SAMPLE_RATE_HZ as usize
                / source_rate_hz as usize
                + OUTPUT_SLACK_FRAMES;
            let start = out.len();
            out.resize(start + room, 0.0);
            let processed = soxr
                .process(&mono[consumed..], &mut out[start..])
                .map_err(|e| resample_error(source_rate_hz, &e));
            let produced = processed.as_ref().map_or(0, |p| p.output_frames);
            out.truncate(start + produced);
            let processed = processed?;
            self.frames_out += produced as u64;
            consumed += processed.input_frames;
            if processed.input_frames == 0 && produced == 0 {
                // libsoxr buffers internally and always takes input; not taking any and
                // giving nothing back would loop forever.
                return Err(AudioError::Internal {
                    detail: format!("resampler {source_rate_hz} Hz -> 16 kHz made no progress"),
                });
            }
        }
        Ok(())
    }

    /// Flushes the filter's delay; `out` then holds exactly ceil(frames_in * 16000 /
    /// source_rate) frames from this resampler.
    pub(crate) fn finish(mut self, out: &mut Vec<f32>) -> Result<(), AudioError> {
        let source_rate_hz = self.source_rate_hz;
        let Some(soxr) = self.soxr.as_mut() else {
            return Ok(());
        };
        let expected =
            (self.frames_in * u64::from(TARGET_SAMPLE_RATE_HZ)).div_ceil(u64::from(source_rate_hz));
        // Each drain call returns what is left of the delay, then 0.
        loop {
            let room = (expected.saturating_sub(self.frames_out) as usize) + OUTPUT_SLACK_FRAMES;
            let start = out.len();
            out.resize(start + room, 0.0);
            let drained = soxr.drain(&mut out[start..]);
            let produced = *drained.as_ref().unwrap_or(&0);
            out.truncate(start + produced);
            drained.map_err(|e| resample_error(source_rate_hz, &e))?;
            self.frames_out += produced as u64;
            if produced == 0 {
                break;
            }
        }
        // libsoxr rounds the total length to the nearest frame; the contract is the ceiling.
        if self.frames_out < expected {
            out.resize(out.len() + (expected - self.frames_out) as usize, 0.0);
        } else {
            out.truncate(out.len() - (self.frames_out - expected) as usize);
        }
        Ok(())
    }
}

fn resample_error(source_rate_hz: u32, e: &dyn std::fmt::Display) -> AudioError {
    AudioError::Internal {
        detail: format!("resampling {source_rate_hz} Hz -> 16 kHz: {e}"),
    }
}
