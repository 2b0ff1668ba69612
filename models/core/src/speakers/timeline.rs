//! Speaker turns indexed for overlap queries.
//!
//! Each speaker's turns are merged into sorted, disjoint spans (the union of that speaker's
//! activity). Disjoint spans sorted by start are sorted by end too, so the first span that can
//! touch a query interval is one binary search away, and a query costs
//! `O(speakers · log turns + spans it touches)` — no scan over all turns.

use super::SpeakerSegment;

/// One speaker's activity: sorted, disjoint spans of positive length.
#[derive(Debug, Clone, PartialEq)]
struct Track {
    speaker: usize,
    spans: Vec<(f64, f64)>,
}

impl Track {
    /// Index of the first span ending after `t` (every span before it ends at or before `t`).
    fn first_ending_after(&self, t: f64) -> usize {
        self.spans.partition_point(|&(_, end)| end <= t)
    }

    /// Seconds of `[start, end]` covered by this speaker.
    fn overlap_s(&self, start: f64, end: f64) -> f64 {
        self.spans[self.first_ending_after(start)..]
            .iter()
            .take_while(|&&(s, _)| s < end)
            .map(|&(s, e)| e.min(end) - s.max(start))
            .sum()
    }

    /// Whether the speaker is active at instant `t` (span ends included).
    fn active_at(&self, t: f64) -> bool {
        let i = self.spans.partition_point(|&(_, end)| end < t);
        self.spans.get(i).is_some_and(|&(s, _)| s <= t)
    }

    /// Seconds between `[start, end]` and this speaker's nearest span (0 when they touch).
    fn distance_s(&self, start: f64, end: f64) -> Option<f64> {
        let i = self.first_ending_after(start);
        let before = i
            .checked_sub(1)
            .and_then(|j| self.spans.get(j))
            .map(|&(_, e)| start - e);
        let at_or_after = self.spans.get(i).map(|&(s, _)| (s - end).max(0.0));
        match (before, at_or_after) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// All speakers' turns, ready for overlap queries.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SpeakerTimeline {
    /// Ordered by speaker index (ties in queries go to the lower index).
    tracks: Vec<Track>,
}

impl SpeakerTimeline {
    /// Indexes `turns` (any order). Turns with non-finite times or no length are ignored;
    /// overlapping or touching turns of one speaker are merged.
    pub fn new(turns: &[SpeakerSegment]) -> Self {
        let mut usable: Vec<&SpeakerSegment> = turns
            .iter()
            .filter(|t| t.start_s.is_finite() && t.end_s.is_finite() && t.end_s > t.start_s)
            .collect();
        usable.sort_by(|a, b| {
            a.speaker
                .cmp(&b.speaker)
                .then(a.start_s.total_cmp(&b.start_s))
        });
        let mut tracks: Vec<Track> = Vec::new();
        for turn in usable {
            let span = (turn.start_s, turn.end_s);
            match tracks.last_mut() {
                Some(track) if track.speaker == turn.speaker => match track.spans.last_mut() {
                    Some(last) if span.0 <= last.1 => last.1 = last.1.max(span.1),
                    _ => track.spans.push(span),
                },
                _ => tracks.push(Track {
                    speaker: turn.speaker,
                    spans: vec![span],
                }),
            }
        }
        Self { tracks }
    }

    pub fn is_empty(&self) -> bool {
        self.tracks.is_empty()
    }

    /// Speaker indices with at least one turn, ascending.
    pub fn speakers(&self) -> impl Iterator<Item = usize> + '_ {
        self.tracks.iter().map(|t| t.speaker)
    }

    /// `(speaker, seconds)` for every speaker active somewhere in `[start_s, end_s]`,
    /// ascending by speaker.
    pub fn overlaps(&self, start_s: f64, end_s: f64) -> Vec<(usize, f64)> {
        self.tracks
            .iter()
            .map(|t| (t.speaker, t.overlap_s(start_s, end_s)))
            .filter(|&(_, s)| s > 0.0)
            .collect()
    }

    /// Speakers active at instant `t_s`, ascending.
    pub fn active_at(&self, t_s: f64) -> Vec<usize> {
        self.tracks
            .iter()
            .filter(|t| t.active_at(t_s))
            .map(|t| t.speaker)
            .collect()
    }

    /// The speaker whose nearest turn is closest to `[start_s, end_s]`, with that distance in
    /// seconds (the lower index on equal distances); `None` without turns.
    pub fn nearest(&self, start_s: f64, end_s: f64) -> Option<(usize, f64)> {
        self.tracks
            .iter()
            .filter_map(|t| t.distance_s(start_s, end_s).map(|d| (t.speaker, d)))
            .fold(None, |best, (speaker, d)| match best {
                Some((_, best_d)) if best_d <= d => best,
                _ => Some((speaker, d)),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(speaker: usize, start_s: f64, end_s: f64) -> SpeakerSegment {
        SpeakerSegment {
            speaker,
            start_s,
            end_s,
        }
    }

    #[test]
    fn merges_a_speakers_overlapping_turns_and_drops_bad_ones() {
        let t = SpeakerTimeline::new(&[
            turn(1, 2.0, 3.0),
            turn(0, 0.0, 1.0),
            turn(0, 0.5, 1.5),
            turn(0, 1.5, 2.0), // touches: merged
            turn(0, 4.0, 4.0), // no length
            turn(2, f64::NAN, 1.0),
        ]);
        assert_eq!(t.speakers().collect::<Vec<_>>(), vec![0, 1]);
        // Union of speaker 0 is [0, 2]: the overlap is counted once.
        assert_eq!(t.overlaps(0.0, 10.0), vec![(0, 2.0), (1, 1.0)]);
    }

    #[test]
    fn overlap_clips_to_the_query() {
        let t = SpeakerTimeline::new(&[turn(0, 0.0, 1.0), turn(0, 2.0, 3.0), turn(1, 0.5, 2.5)]);
        let got = t.overlaps(0.75, 2.25);
        assert_eq!(got.len(), 2);
        assert!((got[0].1 - 0.5).abs() < 1e-12, "{got:?}");
        assert!((got[1].1 - 1.5).abs() < 1e-12, "{got:?}");
        assert!(t.overlaps(1.0, 2.0).iter().all(|&(s, _)| s == 1));
    }

    #[test]
    fn instants_and_nearest() {
        let t = SpeakerTimeline::new(&[turn(0, 0.0, 1.0), turn(1, 3.0, 4.0)]);
        assert_eq!(t.active_at(1.0), vec![0]);
        assert!(t.active_at(2.0).is_empty());
        let (speaker, gap_s) = t.nearest(1.2, 1.4).expect("has turns");
        assert_eq!(speaker, 0);
        assert!((gap_s - 0.2).abs() < 1e-12, "{gap_s}");
        assert_eq!(t.nearest(2.7, 2.8).map(|(s, _)| s), Some(1));
        // Equal distances: the lower index.
        assert_eq!(t.nearest(1.5, 2.5).map(|(s, _)| s), Some(0));
        assert_eq!(SpeakerTimeline::new(&[]).nearest(0.0, 1.0), None);
    }
}
