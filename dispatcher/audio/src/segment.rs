//! Cuts long 16 kHz recordings into model-sized segments at quiet points. Segments borrow the
//! PCM buffer, so a multi-hour recording is never copied; each carries its start offset so
//! token timestamps map back to the recording.

use serde::{Deserialize, Serialize};

use crate::resample::TARGET_SAMPLE_RATE_HZ;

/// How recordings are cut.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SegmenterConfig {
    /// Longest segment handed to the model.
    pub max_segment_s: f64,
    /// The cut is the quietest point within this many seconds before the limit; a longer window
    /// finds real pauses more often at the price of shorter segments.
    pub cut_search_s: f64,
    /// Length of the frames whose RMS energy is compared (20-30 ms spans one phoneme-sized gap).
    pub energy_frame_ms: u32,
}

impl Default for SegmenterConfig {
    fn default() -> Self {
        Self {
            max_segment_s: 30.0,
            cut_search_s: 5.0,
            energy_frame_ms: 25,
        }
    }
}

/// One piece of a recording: a slice of the 16 kHz PCM and where it starts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Segment<'a> {
    /// Offset of `samples[0]` in the whole recording, in 16 kHz samples.
    pub start_sample: usize,
    pub samples: &'a [f32],
}

impl Segment<'_> {
    /// One past the last sample, in recording samples.
    pub fn end_sample(&self) -> usize {
        self.start_sample + self.samples.len()
    }

    /// Start time in the recording; add it to segment-relative timestamps.
    pub fn start_s(&self) -> f64 {
        self.start_sample as f64 / f64::from(TARGET_SAMPLE_RATE_HZ)
    }

    pub fn duration_s(&self) -> f64 {
        self.samples.len() as f64 / f64::from(TARGET_SAMPLE_RATE_HZ)
    }
}

/// Lazily cuts `pcm` (16 kHz mono) into consecutive segments of at most
/// `cfg.max_segment_s` that cover it exactly, with no gaps and no overlaps.
pub fn segments<'a>(pcm: &'a [f32], cfg: &SegmenterConfig) -> Segments<'a> {
    let rate = f64::from(TARGET_SAMPLE_RATE_HZ);
    let frame = (cfg.energy_frame_ms as usize * TARGET_SAMPLE_RATE_HZ as usize / 1000).max(1);
    // Sanitised so any config yields progress: at least two frames per segment, and the search
    // window inside the segment.
    let max_len = secs_to_samples(cfg.max_segment_s, rate).max(2 * frame);
    let search = secs_to_samples(cfg.cut_search_s, rate).clamp(frame, max_len - frame);
    Segments {
        pcm,
        pos: 0,
        max_len,
        search,
        frame,
    }
}

fn secs_to_samples(secs: f64, rate: f64) -> usize {
    if secs.is_finite() && secs > 0.0 {
        (secs * rate).round() as usize
    } else {
        0
    }
}

/// Iterator returned by [`segments`].
#[derive(Clone, Debug)]
pub struct Segments<'a> {
    pcm: &'a [f32],
    pos: usize,
    max_len: usize,
    search: usize,
    frame: usize,
}

impl<'a> Iterator for Segments<'a> {
    type Item = Segment<'a>;

    fn next(&mut self) -> Option<Segment<'a>> {
        let start = self.pos;
        let remaining = self.pcm.len().checked_sub(start).filter(|&n| n > 0)?;
        let end = if remaining <= self.max_len {
            self.pcm.len()
        } else {
            self.quietest_cut(start)
        };
        self.pos = end;
        Some(Segment {
            start_sample: start,
            samples: &self.pcm[start..end],
        })
    }
}

impl Segments<'_> {
    /// The middle of the lowest-energy frame among those ending by `start + max_len` and
    /// starting at or after `start + max_len - search`; ties go to the later frame so
    /// segments in uniform audio stay long. Always in `start + frame/2 ..= start + max_len`.
    fn quietest_cut(&self, start: usize) -> usize {
        let limit = start + self.max_len;
        let mut best: Option<(f64, usize)> = None;
        let mut frame_start = limit - self.search;
        while frame_start + self.frame <= limit {
            let energy = self.pcm[frame_start..frame_start + self.frame]
                .iter()
                .map(|&s| f64::from(s) * f64::from(s))
                .sum::<f64>();
            if best.is_none_or(|(e, _)| energy <= e) {
                best = Some((energy, frame_start));
            }
            frame_start += self.frame;
        }
        best.map_or(limit, |(_, s)| s + self.frame / 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: usize = TARGET_SAMPLE_RATE_HZ as usize;

    fn tone(len: usize) -> Vec<f32> {
        (0..len)
            .map(|i| 0.5 * (i as f32 * 2.0 * std::f32::consts::PI * 300.0 / RATE as f32).sin())
            .collect()
    }

    fn assert_exact_cover(pcm: &[f32], cfg: &SegmenterConfig) -> Vec<(usize, usize)> {
        let max = (cfg.max_segment_s * RATE as f64).round() as usize;
        let mut next = 0;
        let mut spans = Vec::new();
        for seg in segments(pcm, cfg) {
            assert_eq!(seg.start_sample, next, "gap or overlap at {next}");
            assert!(!seg.samples.is_empty(), "empty segment at {next}");
            assert!(
                seg.samples.len() <= max,
                "segment of {} > {max}",
                seg.samples.len()
            );
            // The slice really is that part of the buffer, not a copy of something else.
            assert!(std::ptr::eq(seg.samples.as_ptr(), pcm[next..].as_ptr()));
            spans.push((seg.start_sample, seg.end_sample()));
            next = seg.end_sample();
        }
        assert_eq!(next, pcm.len(), "segments stop short of the end");
        spans
    }

    #[test]
    fn empty_input_has_no_segments() {
        assert_eq!(segments(&[], &SegmenterConfig::default()).count(), 0);
    }

    #[test]
    fn short_input_is_one_segment() {
        let pcm = tone(RATE * 7);
        let spans = assert_exact_cover(&pcm, &SegmenterConfig::default());
        assert_eq!(spans, vec![(0, pcm.len())]);
    }

    #[test]
    fn uniform_audio_is_cut_near_the_limit_and_covered_exactly() {
        let pcm = tone(RATE * 125 + 123);
        let cfg = SegmenterConfig::default();
        let spans = assert_exact_cover(&pcm, &cfg);
        assert_eq!(spans.len(), 5);
        for &(s, e) in &spans[..4] {
            // No pause anywhere: the quietest frame is found within the search window.
            assert!(e - s >= RATE * 25, "segment {s}..{e} cut too early");
        }
    }

    #[test]
    fn cuts_land_in_silences() {
        // Speech-like tone with a 300 ms pause every 13 s: the cut before each 30 s limit must
        // fall inside the last pause in the 5 s window (at 26 s, 52+.. relative offsets).
        let mut pcm = tone(RATE * 100);
        let pause = RATE * 3 / 10;
        let mut pauses = Vec::new();
        let mut at = RATE * 13;
        while at + pause < pcm.len() {
            pcm[at..at + pause].iter_mut().for_each(|s| *s = 0.0);
            pauses.push(at..at + pause);
            at += RATE * 13;
        }
        let spans = assert_exact_cover(&pcm, &SegmenterConfig::default());
        assert!(spans.len() >= 4);
        for &(_, cut) in &spans[..spans.len() - 1] {
            assert!(
                pauses.iter().any(|p| p.contains(&cut)),
                "cut at {cut} is not inside a pause: {pauses:?}"
            );
        }
    }

    #[test]
    fn quieter_of_two_points_wins() {
        let mut pcm = tone(RATE * 40);
        // A faint dip at 27 s and true silence at 28.5 s: the silence must win.
        pcm[RATE * 27..RATE * 27 + 800]
            .iter_mut()
            .for_each(|s| *s *= 0.1);
        let silence = RATE * 57 / 2..RATE * 57 / 2 + 800;
        pcm[silence.clone()].iter_mut().for_each(|s| *s = 0.0);
        let first = segments(&pcm, &SegmenterConfig::default()).next();
        let cut = first.map(|s| s.end_sample()).unwrap_or_default();
        assert!(silence.contains(&cut), "cut at {cut}, silence {silence:?}");
    }

    #[test]
    fn odd_configs_still_make_progress_and_cover() {
        let pcm = tone(RATE * 3 + 17);
        for cfg in [
            SegmenterConfig {
                max_segment_s: 0.01,
                cut_search_s: 100.0,
                energy_frame_ms: 25,
            },
            SegmenterConfig {
                max_segment_s: 1.0,
                cut_search_s: 0.0,
                energy_frame_ms: 0,
            },
            SegmenterConfig {
                max_segment_s: f64::NAN,
                cut_search_s: f64::INFINITY,
                energy_frame_ms: 30,
            },
        ] {
            let mut next = 0;
            let mut count = 0;
            for seg in segments(&pcm, &cfg) {
                assert_eq!(seg.start_sample, next);
                assert!(!seg.samples.is_empty());
                next = seg.end_sample();
                count += 1;
                assert!(count <= pcm.len(), "no progress with {cfg:?}");
            }
            assert_eq!(next, pcm.len(), "{cfg:?}");
        }
    }
}
