//! Token, word and segment timestamps and the transcript text, computed from a TDT hypothesis
//! exactly as NeMo does with `compute_timestamps=True`:
//!
//! - text: `decode_ids` of all tokens, then one whitespace removed before each supported
//!   punctuation mark (`RNNTDecoding.decode_hypothesis`);
//! - tokens span `[frame, frame + duration]` encoder frames (`_compute_offsets_tdt`); a token that
//!   decodes to one punctuation mark is snapped to the end of the previous token, so it lasts zero
//!   frames (`_refine_timestamps_tdt`);
//! - words (`get_words_offsets`, bpe): a token whose piece differs from its decoded text (a `▁`
//!   piece, `<unk>`, a byte piece) starts a word; punctuation joins the word before it;
//! - segments (`get_segment_offsets`): a word ending in a delimiter (`.`, `!`, `?`) closes a
//!   segment; optionally a gap of at least `segment_gap_threshold` frames does too;
//! - seconds = `offset * window_stride * subsampling_factor`, in that order
//!   (`process_timestamp_outputs`), so the floats are bit-identical to NeMo's (the order only
//!   matters when the subsampling factor is not a power of two).

use crate::config::ParakeetConfig;
use crate::detokenize::Detokenizer;
use crate::error::CoreError;
use crate::transcript::{Hypothesis, Segment, TimedToken, Transcript, Word};

/// How encoder frames map to seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FrameTiming {
    /// `preprocessor.window_stride` (hop / sample rate).
    pub window_stride_s: f64,
    pub subsampling_factor: usize,
    pub sample_rate_hz: u32,
}

impl FrameTiming {
    pub fn from_config(cfg: &ParakeetConfig) -> Self {
        Self {
            // 160 / 16000 rounds to the same f64 as the YAML's 0.01.
            window_stride_s: cfg.features.hop_length_samples as f64
                / f64::from(cfg.features.sample_rate_hz),
            subsampling_factor: cfg.encoder.subsampling_factor,
            sample_rate_hz: cfg.features.sample_rate_hz,
        }
    }

    /// Seconds at an encoder frame, rounded exactly as NeMo's Python expression.
    pub fn seconds(&self, frame: usize) -> f64 {
        frame as f64 * self.window_stride_s * self.subsampling_factor as f64
    }
}

/// NeMo decoding options that shape words and segments (`RNNTDecodingConfig`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimestampOptions {
    /// `segment_seperators`: a word ending in (or equal to) one of these closes a segment.
    pub segment_delimiters: Vec<String>,
    /// `segment_gap_threshold` (frames); `None` or 0 disables gap segmentation.
    pub segment_gap_threshold_frames: Option<usize>,
}

impl Default for TimestampOptions {
    fn default() -> Self {
        Self {
            segment_delimiters: [".", "!", "?"].map(String::from).to_vec(),
            segment_gap_threshold_frames: None,
        }
    }
}

/// A token's span in encoder frames, after punctuation snapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenOffsets {
    pub id: u32,
    pub piece: String,
    /// The token decoded on its own.
    pub text: String,
    pub start_offset: usize,
    pub end_offset: usize,
}

/// A word or segment in encoder frames, with the tokens it was built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpanOffsets {
    pub text: String,
    pub start_offset: usize,
    pub end_offset: usize,
    /// Token index range (inclusive) this span covers.
    pub first_token: usize,
    pub last_token: usize,
}

/// Everything NeMo's timestamp pass computes, in frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offsets {
    pub text: String,
    pub tokens: Vec<TokenOffsets>,
    pub words: Vec<SpanOffsets>,
    pub segments: Vec<SpanOffsets>,
}

/// Turns hypotheses of one model into transcripts; build once per model.
#[derive(Debug, Clone)]
pub struct Timestamper {
    detokenizer: Detokenizer,
    timing: FrameTiming,
    options: TimestampOptions,
}

/// NeMo's word separator.
const WORD_SEPARATOR: &str = " ";

impl Timestamper {
    pub fn new(vocabulary: &[String], timing: FrameTiming, options: TimestampOptions) -> Self {
        Self {
            detokenizer: Detokenizer::new(vocabulary),
            timing,
            options,
        }
    }

    pub fn for_model(vocabulary: &[String], cfg: &ParakeetConfig) -> Self {
        Self::new(
            vocabulary,
            FrameTiming::from_config(cfg),
            TimestampOptions::default(),
        )
    }

    pub fn detokenizer(&self) -> &Detokenizer {
        &self.detokenizer
    }

    pub fn timing(&self) -> &FrameTiming {
        &self.timing
    }

    /// The transcript of `hyp`, for audio of `num_samples` samples.
    pub fn transcript(
        &self,
        hyp: &Hypothesis,
        num_samples: usize,
    ) -> Result<Transcript, CoreError> {
        let offsets = self.offsets(hyp)?;
        let t = &self.timing;
        let tokens = offsets
            .tokens
            .iter()
            .map(|tok| TimedToken {
                id: tok.id,
                piece: tok.piece.clone(),
                start_frame: tok.start_offset,
                end_frame: tok.end_offset,
                start_s: t.seconds(tok.start_offset),
                end_s: t.seconds(tok.end_offset),
            })
            .collect();
        let words = offsets
            .words
            .iter()
            .map(|w| Word {
                word: w.text.clone(),
                start_s: t.seconds(w.start_offset),
                end_s: t.seconds(w.end_offset),
                speaker: None,
            })
            .collect();
        let segments = offsets
            .segments
            .iter()
            .enumerate()
            .map(|(id, s)| {
                let (avg_logprob, no_speech_prob) =
                    hyp.scores.as_ref().map_or((None, None), |sc| {
                        sc.segment(s.first_token..=s.last_token, s.start_offset..s.end_offset)
                    });
                Segment {
                    id,
                    start_s: t.seconds(s.start_offset),
                    end_s: t.seconds(s.end_offset),
                    text: s.text.clone(),
                    tokens: offsets.tokens[s.first_token..=s.last_token]
                        .iter()
                        .map(|tok| tok.id)
                        .collect(),
                    speaker: None,
                    avg_logprob,
                    no_speech_prob,
                }
            })
            .collect();
        Ok(Transcript {
            text: offsets.text,
            duration_s: num_samples as f64 / f64::from(t.sample_rate_hz.max(1)),
            tokens,
            words,
            segments,
        })
    }

    /// Text and frame offsets of `hyp` (what NeMo stores in `hypothesis.timestamp`).
    pub fn offsets(&self, hyp: &Hypothesis) -> Result<Offsets, CoreError> {
        let tokens = self.token_offsets(hyp)?;
        let ids: Vec<u32> = hyp.tokens.iter().map(|t| t.id).collect();
        let text = self
            .detokenizer
            .remove_space_before_punctuation(&self.detokenizer.decode(&ids));
        let words = self.words(&tokens);
        let mut segments = self.segments(&words);
        // Every token belongs to exactly one segment: a segment runs from the token after the
        // previous segment to its last word's last token; the final one to the last token.
        let mut next_token = 0;
        let segment_count = segments.len();
        for (k, s) in segments.iter_mut().enumerate() {
            s.first_token = next_token;
            if k + 1 == segment_count {
                s.last_token = tokens.len() - 1;
            }
            next_token = s.last_token + 1;
        }
        Ok(Offsets {
            text,
            tokens,
            words,
            segments,
        })
    }

    fn token_offsets(&self, hyp: &Hypothesis) -> Result<Vec<TokenOffsets>, CoreError> {
        let d = &self.detokenizer;
        let mut tokens: Vec<TokenOffsets> = Vec::with_capacity(hyp.tokens.len());
        for tok in &hyp.tokens {
            let (Some(piece), Some(text)) = (d.piece(tok.id), d.piece_text(tok.id)) else {
                return Err(CoreError::Decode(format!(
                    "token id {} is outside the vocabulary of {} pieces",
                    tok.id,
                    d.len()
                )));
            };
            let mut start = tok.frame;
            let mut end = tok.frame + tok.duration;
            if d.is_punctuation(text) {
                if let Some(prev) = tokens.last() {
                    start = prev.end_offset;
                    end = start;
                }
            }
            tokens.push(TokenOffsets {
                id: tok.id,
                piece: piece.to_string(),
                text: text.to_string(),
                start_offset: start,
                end_offset: end,
            });
        }
        Ok(tokens)
    }

    /// The first token after `i` whose text is neither empty nor the separator (NeMo's
    /// `next_non_delimeter_token`, which also stops at an empty text on the last token).
    fn next_word_text(tokens: &[TokenOffsets], i: usize) -> Option<&str> {
        let mut next: Option<&str> = None;
        let mut j = i;
        while next.is_none_or(str::is_empty) && j + 1 < tokens.len() {
            j += 1;
            let text = tokens[j].text.as_str();
            next = (text != WORD_SEPARATOR).then_some(text);
        }
        next
    }

    fn words(&self, tokens: &[TokenOffsets]) -> Vec<SpanOffsets> {
        let d = &self.detokenizer;
        let decode = |built: &[usize]| {
            let ids: Vec<u32> = built.iter().map(|&k| tokens[k].id).collect();
            d.decode(&ids)
        };
        let mut words: Vec<SpanOffsets> = Vec::new();
        let mut built: Vec<usize> = Vec::new();
        let mut first = 0;
        for (i, tok) in tokens.iter().enumerate() {
            let text = tok.text.as_str();
            let is_punctuation = d.is_punctuation(text) && text != WORD_SEPARATOR;
            let starts_word = tok.piece != text
                || (text == WORD_SEPARATOR
                    && !Self::next_word_text(tokens, i).is_some_and(|n| d.is_punctuation(n)));
            if starts_word && !is_punctuation {
                if !built.is_empty() {
                    words.push(SpanOffsets {
                        text: decode(&built),
                        start_offset: tokens[first].start_offset,
                        end_offset: tokens[i - 1].end_offset,
                        first_token: first,
                        last_token: i - 1,
                    });
                }
                built.clear();
                if text != WORD_SEPARATOR {
                    built.push(i);
                    first = i;
                }
            } else if is_punctuation && built.is_empty() && !words.is_empty() {
                if let Some(last) = words.last_mut() {
                    last.end_offset = tok.end_offset;
                    if last.text.ends_with(' ') {
                        last.text.pop();
                    }
                    last.text.push_str(text);
                    last.last_token = i;
                }
            } else if is_punctuation && !built.is_empty() {
                let bare_marker = built
                    .last()
                    .is_some_and(|&k| matches!(tokens[k].piece.as_str(), " " | "_" | "\u{2581}"));
                if bare_marker {
                    built.pop();
                }
                built.push(i);
            } else {
                if built.is_empty() {
                    first = i;
                }
                built.push(i);
            }
        }

        let Some(last_index) = tokens.len().checked_sub(1) else {
            return words;
        };
        if words.is_empty() {
            if !built.is_empty() {
                words.push(SpanOffsets {
                    text: decode(&built),
                    start_offset: tokens[0].start_offset,
                    end_offset: tokens[last_index].end_offset,
                    first_token: 0,
                    last_token: last_index,
                });
            }
        } else {
            words[0].start_offset = tokens[0].start_offset;
            words[0].first_token = 0;
            if !built.is_empty() {
                words.push(SpanOffsets {
                    text: decode(&built),
                    start_offset: tokens[first].start_offset,
                    end_offset: tokens[last_index].end_offset,
                    first_token: first,
                    last_token: last_index,
                });
            }
        }
        words
    }

    fn ends_segment(&self, word: &str) -> bool {
        let delimiters = &self.options.segment_delimiters;
        let last_char = word.chars().last().map(String::from);
        last_char.is_some_and(|c| delimiters.contains(&c)) || delimiters.iter().any(|d| d == word)
    }

    fn segments(&self, words: &[SpanOffsets]) -> Vec<SpanOffsets> {
        let gap_threshold = self.options.segment_gap_threshold_frames.filter(|g| *g > 0);
        let mut segments = Vec::new();
        let mut segment_words: Vec<&str> = Vec::new();
        let mut first = 0;
        let close = |segment_words: &[&str], first: usize, last: usize, end: usize| SpanOffsets {
            text: segment_words.join(" "),
            start_offset: words[first].start_offset,
            end_offset: end,
            first_token: words[first].first_token,
            last_token: words[last].last_token,
        };
        for (i, word) in words.iter().enumerate() {
            match gap_threshold {
                // NeMo skips the delimiter check whenever a gap threshold is set and the
                // segment has words: only gaps split such segments.
                Some(threshold) if !segment_words.is_empty() => {
                    let gap = word.start_offset as i64 - words[i - 1].end_offset as i64;
                    if gap >= threshold as i64 {
                        segments.push(close(&segment_words, first, i - 1, words[i - 1].end_offset));
                        segment_words = vec![word.text.as_str()];
                        first = i;
                        continue;
                    }
                }
                _ if !word.text.is_empty() && self.ends_segment(&word.text) => {
                    segment_words.push(&word.text);
                    segments.push(close(&segment_words, first, i, word.end_offset));
                    segment_words.clear();
                    first = i + 1;
                    continue;
                }
                _ => {}
            }
            segment_words.push(&word.text);
        }
        if let Some(last) = words.len().checked_sub(1) {
            if !segment_words.is_empty() {
                segments.push(close(&segment_words, first, last, words[last].end_offset));
            }
        }
        segments
    }
}

/// One-off convenience: the transcript of `hyp` for a model's vocabulary and config. Build a
/// [`Timestamper`] instead when transcribing more than one clip.
pub fn build_transcript(
    hyp: &Hypothesis,
    vocabulary: &[String],
    cfg: &ParakeetConfig,
    num_samples: usize,
) -> Result<Transcript, CoreError> {
    Timestamper::for_model(vocabulary, cfg).transcript(hyp, num_samples)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::DecodedToken;

    const VOCAB: &[&str] = &[
        "<unk>", "▁the", "re", "▁cat", ".", ",", "▁", "?", "s", "▁a", "'",
    ];

    fn timestamper() -> Timestamper {
        let vocab: Vec<String> = VOCAB.iter().map(|p| p.to_string()).collect();
        let timing = FrameTiming {
            window_stride_s: 0.01,
            subsampling_factor: 8,
            sample_rate_hz: 16_000,
        };
        Timestamper::new(&vocab, timing, TimestampOptions::default())
    }

    /// (piece, frame, duration) triples.
    fn hyp(tokens: &[(&str, usize, usize)]) -> Hypothesis {
        Hypothesis {
            scores: None,
            tokens: tokens
                .iter()
                .map(|(piece, frame, duration)| DecodedToken {
                    id: VOCAB.iter().position(|p| p == piece).expect("test piece") as u32,
                    frame: *frame,
                    duration: *duration,
                })
                .collect(),
        }
    }

    fn words(o: &Offsets) -> Vec<(&str, usize, usize)> {
        o.words
            .iter()
            .map(|w| (w.text.as_str(), w.start_offset, w.end_offset))
            .collect()
    }

    fn segments(o: &Offsets) -> Vec<(&str, usize, usize, usize, usize)> {
        o.segments
            .iter()
            .map(|s| {
                (
                    s.text.as_str(),
                    s.start_offset,
                    s.end_offset,
                    s.first_token,
                    s.last_token,
                )
            })
            .collect()
    }

    #[test]
    fn empty_hypothesis_gives_empty_transcript() {
        let t = timestamper()
            .transcript(&Hypothesis::default(), 24_000)
            .expect("transcript");
        assert_eq!(t.text, "");
        assert!(t.tokens.is_empty() && t.words.is_empty() && t.segments.is_empty());
        assert_eq!(t.duration_s, 1.5);
    }

    #[test]
    fn punctuation_snaps_to_previous_token_and_joins_word() {
        let o = timestamper()
            .offsets(&hyp(&[
                ("▁the", 0, 2),
                ("re", 2, 1),
                (",", 9, 3),
                ("▁cat", 12, 2),
                (".", 20, 1),
                ("▁a", 21, 0),
                ("?", 21, 0),
            ]))
            .expect("offsets");
        assert_eq!(o.text, "there, cat. a?");
        let spans: Vec<_> = o
            .tokens
            .iter()
            .map(|t| (t.start_offset, t.end_offset))
            .collect();
        assert_eq!(
            spans,
            [
                (0, 2),
                (2, 3),
                (3, 3),
                (12, 14),
                (14, 14),
                (21, 21),
                (21, 21)
            ]
        );
        assert_eq!(
            words(&o),
            [("there,", 0, 3), ("cat.", 12, 14), ("a?", 21, 21)]
        );
        assert_eq!(
            segments(&o),
            [("there, cat.", 0, 14, 0, 4), ("a?", 21, 21, 5, 6)]
        );
    }

    #[test]
    fn first_token_without_marker_and_leading_punctuation() {
        let o = timestamper()
            .offsets(&hyp(&[("re", 3, 1), ("▁cat", 4, 1)]))
            .expect("offsets");
        assert_eq!(o.text, "re cat");
        assert_eq!(words(&o), [("re", 3, 4), ("cat", 4, 5)]);

        // Punctuation first is not snapped (nothing before it) and starts a word of its own.
        let o = timestamper()
            .offsets(&hyp(&[(".", 5, 2), ("▁cat", 8, 1)]))
            .expect("offsets");
        assert_eq!(o.text, ". cat");
        assert_eq!(words(&o), [(".", 5, 7), ("cat", 8, 9)]);
        assert_eq!(segments(&o), [(".", 5, 7, 0, 0), ("cat", 8, 9, 1, 1)]);
    }

    #[test]
    fn punctuation_only_and_repeated_tokens_at_one_frame() {
        let o = timestamper()
            .offsets(&hyp(&[(",", 4, 0), (".", 4, 0), ("?", 4, 0)]))
            .expect("offsets");
        assert_eq!(o.text, ",.?");
        assert_eq!(words(&o), [(",.?", 4, 4)]);
        assert_eq!(segments(&o), [(",.?", 4, 4, 0, 2)]);

        let o = timestamper()
            .offsets(&hyp(&[("▁cat", 7, 0), ("▁cat", 7, 0), ("s", 7, 1)]))
            .expect("offsets");
        assert_eq!(o.text, "cat cats");
        assert_eq!(words(&o), [("cat", 7, 7), ("cats", 7, 8)]);
    }

    #[test]
    fn bare_marker_before_punctuation_is_dropped_from_the_word() {
        let o = timestamper()
            .offsets(&hyp(&[
                ("▁cat", 0, 1),
                ("▁", 1, 1),
                (",", 2, 1),
                ("▁a", 3, 1),
            ]))
            .expect("offsets");
        // NeMo's text regex removes the space before the comma; the word drops the bare `▁`.
        assert_eq!(o.text, "cat, a");
        assert_eq!(words(&o), [("cat", 0, 1), (",", 1, 2), ("a", 3, 4)]);
    }

    #[test]
    fn apostrophe_is_punctuation_in_this_vocabulary() {
        let o = timestamper()
            .offsets(&hyp(&[("▁cat", 0, 2), ("'", 2, 1), ("s", 3, 1)]))
            .expect("offsets");
        assert_eq!(o.text, "cat's");
        assert_eq!(o.tokens[1].start_offset, 2);
        assert_eq!(words(&o), [("cat's", 0, 4)]);
    }

    #[test]
    fn seconds_follow_nemo_float_order() {
        let t = timestamper()
            .transcript(&hyp(&[("▁cat", 1237, 1)]), 16_001)
            .expect("transcript");
        // Python's 1237 * 0.01 * 8.
        assert_eq!(t.words[0].start_s, 98.96000000000001);
        assert_eq!(t.words[0].end_s, 99.04);
        assert_eq!(t.segments[0].tokens, [3]);
        assert_eq!(t.duration_s, 16_001.0 / 16_000.0);
    }

    #[test]
    fn gap_threshold_splits_segments() {
        let vocab: Vec<String> = VOCAB.iter().map(|p| p.to_string()).collect();
        let timing = FrameTiming {
            window_stride_s: 0.01,
            subsampling_factor: 8,
            sample_rate_hz: 16_000,
        };
        let ts = Timestamper::new(
            &vocab,
            timing,
            TimestampOptions {
                segment_gap_threshold_frames: Some(5),
                ..TimestampOptions::default()
            },
        );
        let o = ts
            .offsets(&hyp(&[
                ("▁cat", 0, 1),
                (".", 1, 1),
                ("▁a", 2, 1),
                ("▁cat", 10, 1),
            ]))
            .expect("offsets");
        // With a threshold NeMo ignores the `.` once the segment has words.
        assert_eq!(
            segments(&o),
            [
                ("cat.", 0, 1, 0, 1),
                ("a", 2, 3, 2, 2),
                ("cat", 10, 11, 3, 3)
            ]
        );
    }

    #[test]
    fn ids_outside_the_vocabulary_are_an_error() {
        let bad = Hypothesis {
            scores: None,
            tokens: vec![DecodedToken {
                id: 99,
                frame: 0,
                duration: 1,
            }],
        };
        let err = timestamper().offsets(&bad).expect_err("out of range");
        assert!(err.to_string().contains("token id 99"), "{err}");
    }
}
