//! Speaker probabilities → speaker segments, as NeMo's Sortformer `diarize()` does it
//! (`ts_vad_post_processing`, then rounding and interval merging of its output lines):
//!
//! 1. Each 80 ms frame is repeated per 10 ms feature frame (the subsampling factor).
//! 2. Hysteresis: a segment opens when a probability exceeds `onset_threshold` and closes at
//!    the first frame below `offset_threshold`; segments are padded by `pad_onset_s` /
//!    `pad_offset_s` (start clamped at 0) and overlapping ones merged.
//! 3. Segments shorter than `min_duration_on_s` are dropped, then gaps shorter than
//!    `min_duration_off_s` are filled.
//! 4. Times are rounded to centiseconds; overlapping intervals of a speaker are merged.
//!
//! NeMo does steps 2–3 on f32 tensors (thresholds and durations compared in f32, times
//! computed in f64 and stored as f32) and orders segments with torch's unstable sort, whose
//! order of equal starts decides a merged run's end (NeMo keeps the last segment's end, not the
//! largest); so do we, so that segments come out identical.

use serde::{Deserialize, Serialize};

use super::torch_order::sort_indices;
use model_core::speakers::SpeakerSegment;

/// Post-processing parameters (NeMo `PostProcessingParams`). The defaults are NeMo's DIHARD3
/// dev values for Streaming Sortformer 4spk v2
/// (`diar_streaming_sortformer_4spk-v2_dihard3-dev.yaml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostProcessing {
    /// `onset`: a segment starts where the probability rises above this.
    pub onset_threshold: f64,
    /// `offset`: a segment ends where the probability falls below this.
    pub offset_threshold: f64,
    /// `pad_onset`: seconds added before each segment.
    pub pad_onset_s: f64,
    /// `pad_offset`: seconds added after each segment.
    pub pad_offset_s: f64,
    /// `min_duration_on`: shorter segments are dropped.
    pub min_duration_on_s: f64,
    /// `min_duration_off`: shorter gaps are filled.
    pub min_duration_off_s: f64,
}

impl Default for PostProcessing {
    fn default() -> Self {
        Self::DIHARD3
    }
}

impl PostProcessing {
    pub const DIHARD3: Self = Self {
        onset_threshold: 0.56,
        offset_threshold: 1.0,
        pad_onset_s: 0.063,
        pad_offset_s: 0.002,
        min_duration_on_s: 0.007,
        min_duration_off_s: 0.151,
    };

    /// Segments of every speaker from `probs` (`[frames, num_speakers]` row-major), sorted by
    /// start time, then speaker. `unit_seconds` is the feature hop (0.01 s) and
    /// `units_per_frame` the subsampling factor (8).
    pub fn segments(
        &self,
        probs: &[f32],
        num_speakers: usize,
        unit_seconds: f64,
        units_per_frame: usize,
    ) -> Vec<SpeakerSegment> {
        let mut out = Vec::new();
        if num_speakers == 0 {
            return out;
        }
        for speaker in 0..num_speakers {
            let column: Vec<f32> = probs
                .chunks_exact(num_speakers)
                .map(|row| row[speaker])
                .collect();
            let raw = self.speaker_intervals(&column, unit_seconds, units_per_frame);
            for (start_cs, end_cs) in merge_centiseconds(&raw) {
                out.push(SpeakerSegment {
                    speaker,
                    start_s: start_cs as f64 / 100.0,
                    end_s: end_cs as f64 / 100.0,
                });
            }
        }
        out.sort_by(|a, b| {
            a.start_s
                .total_cmp(&b.start_s)
                .then(a.speaker.cmp(&b.speaker))
        });
        out
    }

    /// Steps 1–3 for one speaker: `[start, end]` in seconds, as NeMo's f32 tensor holds them.
    pub fn speaker_intervals(
        &self,
        probs: &[f32],
        unit_seconds: f64,
        units_per_frame: usize,
    ) -> Vec<[f32; 2]> {
        let segments = self.binarize(probs, unit_seconds, units_per_frame);
        if segments.is_empty() {
            return segments;
        }
        self.filter(segments)
    }

    fn binarize(&self, probs: &[f32], unit_seconds: f64, units_per_frame: usize) -> Vec<[f32; 2]> {
        let (onset, offset) = (self.onset_threshold as f32, self.offset_threshold as f32);
        let n = probs.len() * units_per_frame;
        let mut segments = Vec::new();
        let mut speech = false;
        let mut start = 0.0f64;
        let seg_start = |start: f64| (start - self.pad_onset_s).max(0.0);
        for i in 0..n {
            let p = probs[i / units_per_frame];
            let t = i as f64 * unit_seconds;
            if speech {
                if p < offset {
                    if t + self.pad_offset_s > seg_start(start) {
                        segments.push([seg_start(start) as f32, (t + self.pad_offset_s) as f32]);
                    }
                    start = t;
                    speech = false;
                }
            } else if p > onset {
                start = t;
                speech = true;
            }
        }
        if speech {
            let last = n.saturating_sub(1) as f64 * unit_seconds;
            segments.push([seg_start(start) as f32, (last + self.pad_offset_s) as f32]);
        }
        merge_overlapping(segments)
    }

    fn filter(&self, mut segments: Vec<[f32; 2]>) -> Vec<[f32; 2]> {
        let min_on = self.min_duration_on_s as f32;
        let min_off = self.min_duration_off_s as f32;
        if self.min_duration_on_s > 0.0 {
            segments.retain(|s| s[1] - s[0] >= min_on);
        }
        if self.min_duration_off_s > 0.0 {
            let sorted = sorted_by_start(&segments);
            let short_gaps: Vec<[f32; 2]> = sorted
                .windows(2)
                .map(|w| [w[0][1], w[1][0]])
                .filter(|g| g[1] - g[0] < min_off)
                .collect();
            segments.extend(short_gaps);
            segments = merge_overlapping(segments);
        }
        segments
    }
}

/// NeMo's `merge_overlap_segment`: sort by start, then join each run of neighbours where one
/// ends at or after the next starts (the run takes its first start and last end).
fn merge_overlapping(segments: Vec<[f32; 2]>) -> Vec<[f32; 2]> {
    if segments.len() <= 1 {
        return segments;
    }
    let segments = sorted_by_start(&segments);
    let joins: Vec<bool> = segments.windows(2).map(|w| w[0][1] >= w[1][0]).collect();
    let heads = segments
        .iter()
        .enumerate()
        .filter(|(i, _)| *i == 0 || !joins[i - 1])
        .map(|(_, s)| s[0]);
    let tails = segments
        .iter()
        .enumerate()
        .filter(|(i, _)| *i == joins.len() || !joins[*i])
        .map(|(_, s)| s[1]);
    heads.zip(tails).map(|(h, t)| [h, t]).collect()
}

/// Ordered as torch's unstable `sort()` of the starts orders them: segments clamped to start at
/// 0 tie, and which one comes last decides the merged run's end.
fn sorted_by_start(segments: &[[f32; 2]]) -> Vec<[f32; 2]> {
    let starts: Vec<f32> = segments.iter().map(|s| s[0]).collect();
    sort_indices(&starts)
        .into_iter()
        .map(|i| segments[i])
        .collect()
}

/// Step 4 (NeMo `round(x, 2)` then `merge_float_intervals`): centisecond intervals, empty ones
/// dropped, starts and ends sorted independently (as NeMo's `torch.sort(dim=0)` does), and
/// intervals that strictly overlap merged.
fn merge_centiseconds(intervals: &[[f32; 2]]) -> Vec<(i64, i64)> {
    let mut kept: Vec<(i64, i64)> = intervals
        .iter()
        .map(|s| (centiseconds(s[0]), centiseconds(s[1])))
        .filter(|(a, b)| a < b)
        .collect();
    if kept.len() <= 1 {
        return kept;
    }
    let mut starts: Vec<i64> = kept.iter().map(|s| s.0).collect();
    let mut ends: Vec<i64> = kept.iter().map(|s| s.1).collect();
    starts.sort_unstable();
    ends.sort_unstable();
    kept.clear();
    let (mut start, mut end) = (starts[0], ends[0]);
    for (&s, &e) in starts.iter().zip(&ends).skip(1) {
        if end > s {
            end = end.max(e);
        } else {
            kept.push((start, end));
            start = s;
            end = end.max(e);
        }
    }
    kept.push((start, end));
    kept
}

/// Python's `round(x, 2)` of the f32 value (exact decimal rounding, ties to even) in
/// centiseconds.
fn centiseconds(x: f32) -> i64 {
    let text = format!("{:.2}", x as f64);
    let (whole, frac) = text.split_once('.').unwrap_or((&text, "0"));
    let negative = whole.starts_with('-');
    let whole: i64 = whole.trim_start_matches('-').parse().unwrap_or(0);
    let frac: i64 = frac.parse().unwrap_or(0);
    let cs = whole * 100 + frac;
    if negative {
        -cs
    } else {
        cs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pp() -> PostProcessing {
        PostProcessing {
            onset_threshold: 0.5,
            offset_threshold: 0.5,
            pad_onset_s: 0.0,
            pad_offset_s: 0.0,
            min_duration_on_s: 0.0,
            min_duration_off_s: 0.0,
        }
    }

    #[test]
    fn hysteresis_opens_above_onset_and_closes_below_offset() {
        // Frames of 80 ms: speech in frames 2..5.
        let probs = [0.1, 0.2, 0.9, 0.8, 0.7, 0.1, 0.1];
        let segs = pp().segments(&probs, 1, 0.01, 8);
        assert_eq!(segs.len(), 1);
        assert_eq!((segs[0].start_s, segs[0].end_s), (0.16, 0.4));
    }

    #[test]
    fn short_gaps_are_filled_and_short_segments_dropped() {
        let probs = [0.9, 0.9, 0.1, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1, 0.9];
        let mut p = pp();
        p.min_duration_off_s = 0.1;
        p.min_duration_on_s = 0.1;
        let segs = p.segments(&probs, 1, 0.01, 8);
        // The 80 ms gap is filled; the final one-frame segment (0.72..0.79) is too short.
        assert_eq!(segs.len(), 1);
        assert_eq!((segs[0].start_s, segs[0].end_s), (0.0, 0.4));
    }

    #[test]
    fn python_rounding_ties_to_even() {
        assert_eq!(centiseconds(1.625), 162);
        assert_eq!(centiseconds(0.875), 88);
        assert_eq!(centiseconds(0.3), 30);
    }

    #[test]
    fn defaults_are_dihard3_and_serde_round_trips() {
        let json = serde_json::to_string(&PostProcessing::default()).expect("serialize");
        let back: PostProcessing = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back, PostProcessing::DIHARD3);
        let partial: PostProcessing =
            serde_json::from_str(r#"{"onset_threshold": 0.7}"#).expect("partial");
        assert_eq!(partial.onset_threshold, 0.7);
        assert_eq!(partial.min_duration_off_s, 0.151);
    }
}
