//! Text and timestamps against NeMo, fed NeMo's own token ids, frames and durations (so the
//! encoder plays no part): text, token/word/segment offsets and seconds must be identical.
//!
//! - `tests/data/timestamp_cases.json` (`scripts/timestamp_cases.py`): hand-made and random
//!   token sequences over two tokenizers (one with byte fallback), aimed at the edge cases;
//! - `tests/fixtures/<model>/expected.json`: what the fixture models emitted on the clips.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use model_core::timestamps::{FrameTiming, TimestampOptions, Timestamper};
use model_core::transcript::{DecodedToken, Hypothesis};
use models::checkpoint::Checkpoint;
use serde::Deserialize;

#[derive(Deserialize)]
struct CaseFile {
    window_stride_s: f64,
    subsampling_factor: usize,
    tokenizers: Vec<TokenizerCases>,
}

#[derive(Deserialize)]
struct TokenizerCases {
    tokenizer: String,
    vocabulary: Vec<String>,
    supported_punctuation: Vec<String>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    #[serde(default)]
    name: String,
    #[serde(default)]
    segment_gap_threshold: Option<usize>,
    token_ids: Vec<u32>,
    token_frames: Vec<usize>,
    token_durations: Vec<usize>,
    text: String,
    tokens: Vec<TokenRecord>,
    words: Vec<SpanRecord>,
    segments: Vec<SpanRecord>,
}

#[derive(Deserialize)]
struct TokenRecord {
    id: u32,
    /// Only in the model fixtures.
    piece: Option<String>,
    text: String,
    start_offset: usize,
    end_offset: usize,
    start: f64,
    end: f64,
}

#[derive(Deserialize)]
struct SpanRecord {
    #[serde(alias = "word", alias = "segment")]
    text: String,
    start_offset: usize,
    end_offset: usize,
    start: f64,
    end: f64,
}

#[derive(Deserialize)]
struct FixtureFile {
    clips: BTreeMap<String, Case>,
}

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    serde_json::from_str(&text).with_context(|| path.display().to_string())
}

fn hypothesis(case: &Case) -> Hypothesis {
    Hypothesis {
        scores: None,
        tokens: case
            .token_ids
            .iter()
            .zip(&case.token_frames)
            .zip(&case.token_durations)
            .map(|((&id, &frame), &duration)| DecodedToken {
                id,
                frame,
                duration,
            })
            .collect(),
    }
}

fn check_case(timestamper: &Timestamper, case: &Case) -> Result<()> {
    let hyp = hypothesis(case);
    let offsets = timestamper.offsets(&hyp)?;
    ensure!(
        offsets.text == case.text,
        "text {:?} != NeMo {:?}",
        offsets.text,
        case.text
    );

    ensure!(offsets.tokens.len() == case.tokens.len(), "token count");
    for (k, (ours, nemo)) in offsets.tokens.iter().zip(&case.tokens).enumerate() {
        ensure!(
            (
                ours.id,
                ours.text.as_str(),
                ours.start_offset,
                ours.end_offset
            ) == (
                nemo.id,
                nemo.text.as_str(),
                nemo.start_offset,
                nemo.end_offset
            ),
            "token {k}: ours {ours:?}, NeMo id {} {:?} [{}, {}]",
            nemo.id,
            nemo.text,
            nemo.start_offset,
            nemo.end_offset
        );
        if let Some(piece) = &nemo.piece {
            ensure!(
                &ours.piece == piece,
                "token {k}: piece {:?} != NeMo {piece:?}",
                ours.piece
            );
        }
    }
    for (kind, ours, nemo) in [
        ("word", &offsets.words, &case.words),
        ("segment", &offsets.segments, &case.segments),
    ] {
        let ours: Vec<_> = ours
            .iter()
            .map(|s| (s.text.as_str(), s.start_offset, s.end_offset))
            .collect();
        let nemo: Vec<_> = nemo
            .iter()
            .map(|s| (s.text.as_str(), s.start_offset, s.end_offset))
            .collect();
        ensure!(ours == nemo, "{kind}s: ours {ours:?}\n NeMo {nemo:?}");
    }

    // Seconds, bit for bit, through the public transcript.
    let transcript = timestamper.transcript(&hyp, 16_000)?;
    let token_seconds: Vec<(f64, f64)> = transcript
        .tokens
        .iter()
        .map(|t| (t.start_s, t.end_s))
        .collect();
    let nemo_token_seconds: Vec<(f64, f64)> =
        case.tokens.iter().map(|t| (t.start, t.end)).collect();
    ensure!(
        token_seconds == nemo_token_seconds,
        "token seconds {token_seconds:?} != {nemo_token_seconds:?}"
    );
    let word_seconds: Vec<(&str, f64, f64)> = transcript
        .words
        .iter()
        .map(|w| (w.word.as_str(), w.start_s, w.end_s))
        .collect();
    let nemo_word_seconds: Vec<(&str, f64, f64)> = case
        .words
        .iter()
        .map(|w| (w.text.as_str(), w.start, w.end))
        .collect();
    ensure!(
        word_seconds == nemo_word_seconds,
        "word seconds {word_seconds:?} != {nemo_word_seconds:?}"
    );
    let segment_seconds: Vec<(&str, f64, f64)> = transcript
        .segments
        .iter()
        .map(|s| (s.text.as_str(), s.start_s, s.end_s))
        .collect();
    let nemo_segment_seconds: Vec<(&str, f64, f64)> = case
        .segments
        .iter()
        .map(|s| (s.text.as_str(), s.start, s.end))
        .collect();
    ensure!(
        segment_seconds == nemo_segment_seconds,
        "segment seconds {segment_seconds:?} != {nemo_segment_seconds:?}"
    );
    // Segments partition the tokens.
    let segment_tokens: Vec<u32> = transcript
        .segments
        .iter()
        .flat_map(|s| s.tokens.clone())
        .collect();
    ensure!(
        segment_tokens == case.token_ids || case.segments.is_empty(),
        "segment tokens"
    );
    Ok(())
}

#[test]
fn nemo_recorded_cases_match_exactly() -> Result<()> {
    let file: CaseFile = read_json(&manifest_dir().join("tests/data/timestamp_cases.json"))?;
    let timing = FrameTiming {
        window_stride_s: file.window_stride_s,
        subsampling_factor: file.subsampling_factor,
        sample_rate_hz: 16_000,
    };
    let mut checked = 0;
    let mut failures = Vec::new();
    for tok in &file.tokenizers {
        let base = Timestamper::new(&tok.vocabulary, timing, TimestampOptions::default());
        let ours: Vec<String> = base
            .detokenizer()
            .punctuation()
            .iter()
            .map(|c| c.to_string())
            .collect();
        ensure!(
            ours == tok.supported_punctuation,
            "{}: supported punctuation {ours:?} != NeMo {:?}",
            tok.tokenizer,
            tok.supported_punctuation
        );
        for case in &tok.cases {
            let options = TimestampOptions {
                segment_gap_threshold_frames: case.segment_gap_threshold,
                ..TimestampOptions::default()
            };
            let timestamper = Timestamper::new(&tok.vocabulary, timing, options);
            if let Err(e) = check_case(&timestamper, case) {
                failures.push(format!("{}/{}: {e:#}", tok.tokenizer, case.name));
            }
            checked += 1;
        }
    }
    ensure!(
        failures.is_empty(),
        "{} of {checked} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    ensure!(checked >= 100, "only {checked} cases");
    Ok(())
}

#[test]
fn fixture_model_outputs_match_exactly() -> Result<()> {
    let mut checked = 0;
    let mut failures = Vec::new();
    for model in ["tdt-real-options", "tdt-local-attn"] {
        let dir = manifest_dir().join("tests/fixtures").join(model);
        let checkpoint = Checkpoint::load(&dir.join("model.nemo"))?;
        let timestamper = Timestamper::for_model(&checkpoint.vocabulary, &checkpoint.config);
        let expected: FixtureFile = read_json(&dir.join("expected.json"))?;
        for (clip, case) in &expected.clips {
            if let Err(e) = check_case(&timestamper, case) {
                failures.push(format!("{model}/{clip}: {e:#}"));
            }
            checked += 1;
        }
    }
    ensure!(
        failures.is_empty(),
        "{} of {checked} clips differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    ensure!(checked >= 10, "only {checked} clips");
    Ok(())
}
