//! Subtitles in real clients: ffmpeg and PyPI's `srt` and `webvtt-py` read the srt and vtt
//! documents (`subtitle_clients.py` beside this file) of `dispatcher transcribe` on fixture
//! clips and of a long synthetic transcript with speakers, and find every cue within the
//! limits: at most 7 s, two lines of 42 characters, within the recording, every word once; and
//! the official `openai` package validates the verbose_json (scores in range, the fixture
//! model's real ones).
//!
//! Without python3's `srt`, `webvtt` and `openai` modules or ffmpeg the tests skip loudly, unless
//! `REQUIRE_SUBTITLE_CLIENTS` is set (CI installs them).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{ensure, Context, Result};
use model_core::render::{render, OutputFormat, RenderOptions};
use model_core::transcript::{Segment, Transcript, Word};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures")
}

/// Whether the clients are here; a failure when CI requires them.
fn clients_present(test: &str) -> Result<bool> {
    Ok(common::tools::present(
        test,
        "REQUIRE_SUBTITLE_CLIENTS",
        &[
            (
                "python3 with srt, webvtt-py and openai",
                &["python3", "-c", "import srt, webvtt, openai"],
            ),
            ("ffmpeg", &["ffmpeg", "-version"]),
        ],
        "pip install -r scripts/ci-requirements.txt; apt-get install ffmpeg",
    ))
}

/// `subtitle_clients.py` on one recording's verbose_json and subtitle documents.
fn check(verbose_json: &Path, documents: &[PathBuf], limits: &[&str]) -> Result<Output> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/subtitle_clients.py");
    Command::new("python3")
        .arg(script)
        .args(limits)
        .arg("--verbose-json")
        .arg(verbose_json)
        .args(documents)
        .output()
        .context("running subtitle_clients.py")
}

fn passes(output: &Output) -> Result<()> {
    ensure!(
        output.status.success(),
        "subtitle_clients.py: exit {:?}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// Cue count of an srt document.
fn srt_cue_count(path: &Path) -> Result<usize> {
    Ok(std::fs::read_to_string(path)?.matches(" --> ").count())
}

#[test]
fn fixture_clips_in_real_clients() -> Result<()> {
    if !clients_present("fixture_clips_in_real_clients")? {
        return Ok(());
    }
    // long: one 292-character NeMo sentence of 24.9 s; the others end after their audio.
    let clips = ["long", "silence", "espeak_us"];
    let dir = tempfile::tempdir()?;
    let model = fixtures().join("tdt-real-options/model.nemo");
    let diar_model = fixtures().join("sortformer-tiny/model.nemo");
    let three = fixtures().join("sortformer-tiny/three_speakers.wav");
    for format in ["srt", "vtt", "verbose_json"] {
        let plain = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
            .args(["transcribe", "--format", format, "--out"])
            .arg(dir.path())
            .arg("--model")
            .arg(&model)
            .args(
                clips
                    .iter()
                    .map(|c| fixtures().join("clips").join(format!("{c}.wav"))),
            )
            .env("RUST_LOG", "warn")
            .output()?;
        ensure!(plain.status.success(), "{plain:?}");
        let diarized = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
            .args(["transcribe", "--diarize", "--format", format, "--out"])
            .arg(dir.path())
            .arg("--model")
            .arg(&model)
            .arg("--diar-model")
            .arg(&diar_model)
            .arg(&three)
            .env("RUST_LOG", "warn")
            .output()?;
        ensure!(diarized.status.success(), "{diarized:?}");
    }
    // The fixture model's labels: vocabulary 96 + blank (its model_config.yaml).
    let classes = ["--classes", "97"];
    for clip in clips.iter().chain(&["three_speakers"]) {
        let doc = |ext: &str| dir.path().join(format!("{clip}.{ext}"));
        passes(&check(&doc("json"), &[doc("srt"), doc("vtt")], &classes)?)?;
    }
    let long = dir.path().join("long.srt");
    ensure!(
        srt_cue_count(&long)? >= 4,
        "{}",
        std::fs::read_to_string(&long)?
    );
    ensure!(std::fs::read_to_string(dir.path().join("three_speakers.srt"))?.contains("[speaker_"));
    Ok(())
}

/// `n` words of one to thirteen letters, a word every `step_s` seconds, in segments of 60
/// words whose speaker changes every 25 words; word 70 is 50 letters long, and the last word
/// ends after the recording.
fn long_transcript(n: usize, step_s: f64) -> Transcript {
    let speaker = |i: usize| format!("speaker_{}", i / 25 % 2);
    let words: Vec<Word> = (0..n)
        .map(|i| {
            let len = if i == 70 { 50 } else { 1 + (i * 7) % 13 };
            Word {
                word: (0..len)
                    .map(|k| char::from(b'a' + ((i + k) % 26) as u8))
                    .collect(),
                start_s: i as f64 * step_s,
                end_s: (i as f64 + 0.9) * step_s,
                speaker: Some(speaker(i)),
            }
        })
        .collect();
    let segments: Vec<Segment> = words
        .chunks(60)
        .enumerate()
        .map(|(id, chunk)| Segment {
            id,
            start_s: chunk[0].start_s,
            end_s: chunk[chunk.len() - 1].end_s,
            text: chunk
                .iter()
                .map(|w| w.word.as_str())
                .collect::<Vec<_>>()
                .join(" "),
            tokens: Vec::new(),
            speaker: Some(speaker(id * 60)),
            avg_logprob: Some(-0.25),
            no_speech_prob: Some(0.125),
        })
        .collect();
    Transcript {
        text: segments
            .iter()
            .map(|s| s.text.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        duration_s: (n as f64 - 0.5) * step_s,
        tokens: Vec::new(),
        words,
        segments,
    }
}

/// Writes `transcript`'s verbose_json, srt and vtt under `dir` as `name.*`.
fn write_docs(
    dir: &Path,
    name: &str,
    transcript: &Transcript,
    options: &RenderOptions,
) -> Result<(PathBuf, Vec<PathBuf>)> {
    let mut paths = Vec::new();
    for format in [
        OutputFormat::VerboseJson,
        OutputFormat::Srt,
        OutputFormat::Vtt,
    ] {
        let path = dir.join(format!("{name}.{}", format.extension()));
        std::fs::write(&path, render(transcript, format, options))?;
        paths.push(path);
    }
    let json = paths.remove(0);
    Ok((json, paths))
}

#[test]
fn a_long_transcript_with_speakers_in_real_clients() -> Result<()> {
    if !clients_present("a_long_transcript_with_speakers_in_real_clients")? {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let transcript = long_transcript(200, 0.45);
    let (json, subtitles) = write_docs(dir.path(), "long", &transcript, &RenderOptions::default())?;
    passes(&check(&json, &subtitles, &[])?)?;
    ensure!(srt_cue_count(&subtitles[0])? > 2 * transcript.segments.len());

    // The checks bite: one cue a segment breaks every limit.
    let one_cue_a_segment = RenderOptions {
        max_cue_s: 60.0,
        max_line_chars: 1000,
        max_lines: 1,
        ..RenderOptions::default()
    };
    let (json, subtitles) = write_docs(dir.path(), "whole", &transcript, &one_cue_a_segment)?;
    let output = check(&json, &subtitles, &[])?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(!output.status.success(), "limits not enforced: {stderr}");
    for broken in ["lasts more than 7.0 s", "more than 42"] {
        ensure!(stderr.contains(broken), "no {broken:?} in {stderr}");
    }
    // ... and the same documents pass looser limits.
    passes(&check(
        &json,
        &subtitles,
        &[
            "--max-cue-s",
            "60",
            "--max-line-chars",
            "1000",
            "--max-lines",
            "1",
        ],
    )?)?;

    // An unscored transcript (no avg_logprob, no_speech_prob) and no language are not
    // OpenAI's verbose_json.
    let mut unscored = transcript.clone();
    unscored
        .segments
        .iter_mut()
        .for_each(|s| s.avg_logprob = None);
    let no_language = RenderOptions {
        language: None,
        ..RenderOptions::default()
    };
    let (json, subtitles) = write_docs(dir.path(), "unscored", &unscored, &no_language)?;
    let output = check(&json, &subtitles, &[])?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        !output.status.success(),
        "validation not enforced: {stderr}"
    );
    for broken in [
        "not an OpenAI TranscriptionVerbose",
        "language",
        "avg_logprob",
    ] {
        ensure!(stderr.contains(broken), "no {broken:?} in {stderr}");
    }
    Ok(())
}
