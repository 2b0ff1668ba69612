//! Streaming mono resampler to 16 kHz: input arrives packet by packet, so only the 16 kHz output
//! is ever held in full (never the source-rate signal).

use audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Indexing, Resampler};

use crate::error::AudioError;

/// Sample rate of everything this crate outputs.
pub const TARGET_SAMPLE_RATE_HZ: u32 = 16_000;

/// Input frames per FFT resampler call; small enough to keep the delay and scratch tiny.
const CHUNK_FRAMES: usize = 1024;

pub(crate) struct MonoResampler {
    /// `None` when the source is already at 16 kHz (samples pass through untouched).
    fft: Option<Fft<f32>>,
    source_rate_hz: u32,
    /// Source frames not yet handed to the resampler (fewer than one chunk between calls).
    pending: Vec<f32>,
    scratch_out: Vec<f32>,
    /// Leading output frames that are resampler delay, not signal.
    delay_frames_left: usize,
    frames_in: u64,
    frames_out: u64,
}

impl MonoResampler {
    pub(crate) fn new(source_rate_hz: u32) -> Result<Self, AudioError> {
        let fft = if source_rate_hz == TARGET_SAMPLE_RATE_HZ {
            None
        } else {
            let fft = Fft::<f32>::new(
                source_rate_hz as usize,
                TARGET_SAMPLE_RATE_HZ as usize,
                CHUNK_FRAMES,
                1,
                FixedSync::Input,
            )
            .map_err(|e| AudioError::Internal {
                detail: format!("resampler {source_rate_hz} Hz -> 16 kHz: {e}"),
            })?;
            Some(fft)
        };
        let (scratch_len, delay) = fft
            .as_ref()
            .map_or((0, 0), |f| (f.output_frames_max(), f.output_delay()));
        Ok(Self {
            fft,
            source_rate_hz,
            pending: Vec::with_capacity(CHUNK_FRAMES * 2),
            scratch_out: vec![0.0; scratch_len],
            delay_frames_left: delay,
            frames_in: 0,
            frames_out: 0,
        })
    }

    /// Feeds source-rate mono samples; appends whatever 16 kHz output is ready to `out`.
    pub(crate) fn push(&mut self, mono: &[f32], out: &mut Vec<f32>) -> Result<(), AudioError> {
        self.frames_in += mono.len() as u64;
        if self.fft.is_none() {
            out.extend_from_slice(mono);
            self.frames_out += mono.len() as u64;
            return Ok(());
        }
        self.pending.extend_from_slice(mono);
        let mut consumed = 0;
        while self.pending.len() - consumed >= CHUNK_FRAMES {
            self.run_chunk(consumed, None, out)?;
            consumed += CHUNK_FRAMES;
        }
        self.pending.drain(..consumed);
        Ok(())
    }

    /// Flushes the tail and the resampler delay; `out` then holds exactly
    /// ceil(frames_in * 16000 / source_rate) frames from this resampler.
    pub(crate) fn finish(mut self, out: &mut Vec<f32>) -> Result<(), AudioError> {
        let Some(fft) = self.fft.as_ref() else {
            return Ok(());
        };
        let expected = (self.frames_in * u64::from(TARGET_SAMPLE_RATE_HZ))
            .div_ceil(u64::from(self.source_rate_hz));
        // Bounded: each call yields about a chunk of output, and at most the delay plus one
        // chunk is missing; the +4 is slack, not a retry loop.
        let max_calls =
            (fft.output_delay() + fft.output_frames_max()) / fft.output_frames_max().max(1) + 4;
        let tail = self.pending.len();
        self.pending.resize(CHUNK_FRAMES, 0.0);
        self.run_chunk(0, Some(tail), out)?;
        for _ in 0..max_calls {
            if self.frames_out >= expected {
                break;
            }
            self.run_chunk(0, Some(0), out)?;
        }
        let surplus = self.frames_out.saturating_sub(expected);
        out.truncate(out.len() - surplus as usize);
        Ok(())
    }

    fn run_chunk(
        &mut self,
        offset: usize,
        partial_len: Option<usize>,
        out: &mut Vec<f32>,
    ) -> Result<(), AudioError> {
        let Some(fft) = self.fft.as_mut() else {
            return Ok(());
        };
        let to_internal = |e: &dyn std::fmt::Display| AudioError::Internal {
            detail: format!("resampling {} Hz -> 16 kHz: {e}", self.source_rate_hz),
        };
        let input = InterleavedSlice::new(
            &self.pending[offset..offset + CHUNK_FRAMES],
            1,
            CHUNK_FRAMES,
        )
        .map_err(|e| to_internal(&e))?;
        let out_len = self.scratch_out.len();
        let mut output = InterleavedSlice::new_mut(&mut self.scratch_out, 1, out_len)
            .map_err(|e| to_internal(&e))?;
        let indexing = Indexing {
            partial_len,
            ..Indexing::default()
        };
        let (_, produced) = fft
            .process_into_buffer(&input, &mut output, Some(&indexing))
            .map_err(|e| to_internal(&e))?;
        let skip = self.delay_frames_left.min(produced);
        self.delay_frames_left -= skip;
        out.extend_from_slice(&self.scratch_out[skip..produced]);
        self.frames_out += (produced - skip) as u64;
        Ok(())
    }
}
