//! How sure the decoder was, the same for every engine, and the per-segment summaries OpenAI's
//! `verbose_json` carries (`avg_logprob`, `no_speech_prob`).
//!
//! Definitions (the joint's label logits are the vocabulary and blank; durations are left out):
//! - a token's log-probability is the natural log-softmax of the label logits at the frame and
//!   prediction state where the greedy loop emitted it;
//! - a frame's blank probability is the softmax probability of blank at that frame with the
//!   prediction state the decoder held there: after every token emitted at an earlier frame
//!   (frames a duration skipped over included, so every frame has one), except that where the
//!   decoder stopped right after its last token (that token's duration reached the end) it
//!   never computed the state after it, and the few frames left take the state before it;
//! - a segment's `avg_logprob` is the mean of its tokens' log-probabilities, its
//!   `no_speech_prob` the mean blank probability over the frames it spans.
//!
//! Whisper's `no_speech_prob` is one probability per 30 s window; a transducer has a blank
//! probability per 80 ms frame instead, so a segment's is their mean (high for a segment over
//! silence or noise, lower where the model hears speech throughout).

use std::ops::{Range, RangeInclusive};

use serde::{Deserialize, Serialize};

use crate::transcript::DecodedToken;

/// An engine's scores for one utterance.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DecoderScores {
    /// Per emitted token, in order: its natural log-probability.
    pub token_logprobs: Vec<f32>,
    /// Per encoder frame: the probability of blank there.
    pub frame_blank_probs: Vec<f32>,
}

/// One joint evaluation that scoring needs: at encoder frame `frame`, with the prediction
/// output after the utterance's first `state` tokens, the log-probability of label `target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScoreItem {
    pub frame: usize,
    pub state: usize,
    pub target: u32,
}

/// The evaluations that score an utterance of `frames` encoder frames decoded into `tokens`
/// (by the greedy loop with `max_symbols` labels per frame): first one per frame (target
/// blank), then one per token (target the token). Their log-probabilities, in this order, make
/// [`DecoderScores::from_logprobs`]. Every `state` is one the loop computed.
pub fn score_items(
    tokens: &[DecodedToken],
    frames: usize,
    blank: u32,
    max_symbols: usize,
) -> Vec<ScoreItem> {
    let mut items = Vec::with_capacity(frames + tokens.len());
    let last_state = last_state(tokens, frames, max_symbols);
    // Tokens come in frame order, so the state at frame t (tokens emitted before t) only grows.
    let mut state = 0;
    for frame in 0..frames {
        while state < last_state && tokens[state].frame < frame {
            state += 1;
        }
        items.push(ScoreItem {
            frame,
            state,
            target: blank,
        });
    }
    items.extend(tokens.iter().enumerate().map(|(i, t)| ScoreItem {
        frame: t.frame,
        state: i,
        target: t.id,
    }));
    items
}

/// The last prediction state the greedy loop computed: the one after its last token when it
/// went on decoding after it (the token's frame plus duration, plus the one-frame move after
/// `max_symbols` labels at one frame, is still inside the utterance), else the one before.
pub fn last_state(tokens: &[DecodedToken], frames: usize, max_symbols: usize) -> usize {
    let Some(last) = tokens.last() else {
        return 0;
    };
    let mut next_frame = last.frame + last.duration;
    if last.duration == 0 {
        let at_frame = tokens
            .iter()
            .rev()
            .take_while(|t| t.frame == last.frame)
            .count();
        if at_frame >= max_symbols {
            next_frame += 1;
        }
    }
    if next_frame < frames {
        tokens.len()
    } else {
        tokens.len() - 1
    }
}

/// The natural log-softmax of `logits` at `target` (f64 sums: the order of the terms barely
/// matters).
pub fn log_softmax_at(logits: &[f32], target: usize) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|v| f64::from(v - max).exp()).sum();
    (f64::from(logits[target] - max) - sum.ln()) as f32
}

impl DecoderScores {
    /// Scores from the log-probabilities of [`score_items`]' evaluations (`frames` of them for
    /// the frames, then the tokens').
    pub fn from_logprobs(logprobs: &[f32], frames: usize) -> Self {
        let (frame_part, token_part) = logprobs.split_at(frames.min(logprobs.len()));
        Self {
            token_logprobs: token_part.to_vec(),
            frame_blank_probs: frame_part.iter().map(|v| v.exp()).collect(),
        }
    }

    /// `(avg_logprob, no_speech_prob)` of a segment made of `tokens` and spanning encoder frames
    /// `frames` (an empty span counts its start frame; frames past the utterance its last).
    /// `None` where there is nothing to average.
    pub fn segment(
        &self,
        tokens: RangeInclusive<usize>,
        frames: Range<usize>,
    ) -> (Option<f64>, Option<f64>) {
        let logprobs = self.token_logprobs.get(tokens).unwrap_or_default();
        let last = self.frame_blank_probs.len();
        let start = frames.start.min(last.saturating_sub(1));
        let end = frames.end.max(start + 1).min(last);
        let blanks = self.frame_blank_probs.get(start..end).unwrap_or_default();
        (mean(logprobs), mean(blanks))
    }
}

fn mean(values: &[f32]) -> Option<f64> {
    (!values.is_empty())
        .then(|| values.iter().map(|v| f64::from(*v)).sum::<f64>() / values.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(id: u32, frame: usize) -> DecodedToken {
        DecodedToken {
            id,
            frame,
            duration: 1,
        }
    }

    #[test]
    fn each_frame_takes_the_state_after_the_tokens_before_it() {
        // Two tokens at frame 1, one at frame 3, in 5 frames.
        let tokens = [token(7, 1), token(8, 1), token(9, 3)];
        let items = score_items(&tokens, 5, 99, 10);
        let frames: Vec<(usize, usize)> = items[..5].iter().map(|i| (i.frame, i.state)).collect();
        assert_eq!(frames, [(0, 0), (1, 0), (2, 2), (3, 2), (4, 3)]);
        assert!(items[..5].iter().all(|i| i.target == 99));
        let toks: Vec<(usize, usize, u32)> = items[5..]
            .iter()
            .map(|i| (i.frame, i.state, i.target))
            .collect();
        assert_eq!(toks, [(1, 0, 7), (1, 1, 8), (3, 2, 9)]);
    }

    #[test]
    fn frames_after_a_last_token_that_ends_the_utterance_take_the_state_before_it() {
        let ending = |frame, duration| DecodedToken {
            id: 5,
            frame,
            duration,
        };
        // Frame 1 + 3 = 4 = frames: the loop stopped after the token.
        let tokens = [token(7, 0), ending(1, 3)];
        assert_eq!(last_state(&tokens, 4, 10), 1);
        let states: Vec<usize> = score_items(&tokens, 4, 99, 10)[..4]
            .iter()
            .map(|i| i.state)
            .collect();
        assert_eq!(states, [0, 1, 1, 1]);
        // With a frame to go it predicted once more.
        assert_eq!(last_state(&tokens, 5, 10), 2);
        // max_symbols labels at the last frame move the loop past the end.
        let stuck = [ending(4, 0), ending(4, 0)];
        assert_eq!(last_state(&stuck, 5, 2), 1);
        assert_eq!(last_state(&stuck, 5, 3), 2);
        assert_eq!(last_state(&[], 5, 3), 0);
    }

    #[test]
    fn log_softmax_is_normalised_and_stable() {
        let logits = [1.0f32, 2.0, 3.0];
        let total: f64 = (0..3)
            .map(|k| f64::from(log_softmax_at(&logits, k)).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        // Large logits do not overflow.
        let big = [1000.0f32, 1000.0];
        assert!((log_softmax_at(&big, 0) - (0.5f32).ln()).abs() < 1e-6);
    }

    #[test]
    fn segments_average_their_tokens_and_frames() {
        let scores = DecoderScores::from_logprobs(&[0.5f32.ln(), 1.0f32.ln(), 0.0, -1.0, -3.0], 2);
        assert_eq!(scores.token_logprobs, [0.0, -1.0, -3.0]);
        let near = |value: Option<f64>, want: f64| value.is_some_and(|v| (v - want).abs() < 1e-6);
        let (avg, no_speech) = scores.segment(1..=2, 0..2);
        assert_eq!(avg, Some(-2.0));
        assert!(near(no_speech, 0.75), "{no_speech:?}");
        // An empty span counts its start frame; a span past the end, the last frame.
        assert!(near(scores.segment(0..=0, 1..1).1, 1.0));
        assert!(near(scores.segment(0..=0, 7..9).1, 1.0));
        assert_eq!(DecoderScores::default().segment(0..=0, 0..1), (None, None));
    }
}
