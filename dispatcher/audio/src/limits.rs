//! What input the decoder accepts. Every limit is checked before the allocation it protects.

use serde::{Deserialize, Serialize};

/// Limits on untrusted input. Defaults suit clinical consultation recordings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AudioLimits {
    /// Largest accepted input as stored. 2 GiB holds about 3 h of 16-bit 48 kHz stereo WAV or
    /// 9 h of 16 kHz mono WAV; compressed formats are far smaller. Callers that download should
    /// check the object size with [`check_input_size`](crate::check_input_size) first.
    pub max_input_bytes: u64,
    /// Longest accepted recording. Checked against the container's declared length before
    /// decoding and again against the decoded frame count while decoding, so a header that lies
    /// cannot make the output grow past it. The 16 kHz f32 output costs 230 MB per hour.
    pub max_duration_s: u64,
    /// Shortest accepted recording (160 ms, like AssemblyAI): shorter clips cannot hold a word.
    pub min_duration_ms: u64,
    /// Most channels accepted (more: `too_many_channels`, before decoding). 32 covers mono,
    /// stereo, 5.1, 7.1 and microphone arrays of up to 32 capsules. Every layout is downmixed
    /// by the plain mean of its channels: right for surround mixes, a compromise for arrays,
    /// whose independent microphones hear the talker at different delays (the mean smears
    /// speech somewhat; beamforming would not, but needs the array's geometry).
    pub max_channels: usize,
    /// Lowest accepted source sample rate (8 kHz telephony is common and transcribes fine).
    pub min_sample_rate_hz: u32,
    /// Highest accepted source sample rate (96 kHz studio recorders; more is only cost).
    pub max_sample_rate_hz: u32,
    /// Undecodable packets skipped before the stream is declared corrupt.
    pub max_corrupt_packets: u32,
    /// Wall-clock budget for one decode, checked between packets. Real decoding runs hundreds of
    /// times faster than real time; this catches pathological inputs that crawl.
    pub decode_timeout_s: u64,
}

impl Default for AudioLimits {
    fn default() -> Self {
        Self {
            max_input_bytes: 2 * 1024 * 1024 * 1024,
            max_duration_s: 12 * 3600,
            min_duration_ms: 160,
            max_channels: 32,
            min_sample_rate_hz: 8_000,
            max_sample_rate_hz: 96_000,
            max_corrupt_packets: 32,
            decode_timeout_s: 600,
        }
    }
}

impl AudioLimits {
    /// Most source frames accepted at `sample_rate_hz`.
    pub(crate) fn max_source_frames(&self, sample_rate_hz: u32) -> u64 {
        self.max_duration_s
            .saturating_mul(u64::from(sample_rate_hz))
    }

    /// Fewest source frames accepted at `sample_rate_hz` (integer maths: 160 ms at 16 kHz is
    /// exactly 2560 frames, which floating point would round the wrong way).
    pub(crate) fn min_source_frames(&self, sample_rate_hz: u32) -> u64 {
        (self.min_duration_ms * u64::from(sample_rate_hz)).div_ceil(1000)
    }
}
