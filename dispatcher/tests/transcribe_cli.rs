//! `dispatcher transcribe` end to end: the built binary on checked-in fixture clips with the
//! fixture model must print NeMo's recorded text, segments and words.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{ensure, Context, Result};
use serde_json::Value;

const MODEL: &str = "tdt-real-options";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures")
}

fn clip(name: &str) -> PathBuf {
    fixtures().join("clips").join(format!("{name}.wav"))
}

fn expected(clip: &str) -> Result<Value> {
    let path = fixtures().join(MODEL).join("expected.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    Ok(doc["clips"][clip].clone())
}

/// The recording's duration, seconds.
fn duration_of(want: &Value) -> Result<f64> {
    Ok(want["num_samples"].as_f64().context("num_samples")? / 16_000.0)
}

/// NeMo's `start` and `end` of a word or segment as documents print them: within the
/// recording (NeMo's last times may end after the audio).
fn nemo_span(item: &Value, duration_s: f64) -> Result<(f64, f64)> {
    let start = item["start"].as_f64().context("start")?;
    let end = item["end"].as_f64().context("end")?;
    Ok((start.min(duration_s), end.min(duration_s)))
}

fn transcribe(args: &[&str], files: &[PathBuf]) -> Result<Output> {
    let model = fixtures().join(MODEL).join("model.nemo");
    Command::new(env!("CARGO_BIN_EXE_dispatcher"))
        .arg("transcribe")
        .arg("--model")
        .arg(&model)
        .args(args)
        .args(files)
        .env("RUST_LOG", "warn")
        .output()
        .context("running dispatcher")
}

fn stdout_of(output: Output) -> Result<String> {
    ensure!(
        output.status.success(),
        "exit {:?}, stderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8(output.stdout)?)
}

/// `HH:MM:SS<sep>mmm` written independently of the renderer.
fn clock(seconds: f64, sep: char) -> String {
    let ms = (seconds * 1000.0).round() as u64;
    format!(
        "{:02}:{:02}:{:02}{sep}{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

#[test]
fn json_text_is_nemos() -> Result<()> {
    for name in ["espeak_us", "audioeval_fox"] {
        let out = stdout_of(transcribe(&["--format", "json"], &[clip(name)])?)?;
        let doc: Value = serde_json::from_str(&out)?;
        let want = expected(name)?;
        ensure!(
            !want["text"].as_str().unwrap_or("").is_empty(),
            "fixture has text"
        );
        ensure!(
            doc["text"] == want["text"],
            "{name}: {} != NeMo {}",
            doc["text"],
            want["text"]
        );
    }
    Ok(())
}

/// The ONNX engine needs ONNX Runtime (`ORT_DYLIB_PATH`); without it the test skips loudly,
/// unless `REQUIRE_ORT` is set (CI).
#[test]
fn onnx_engine_text_is_nemos() -> Result<()> {
    if std::env::var_os("ORT_DYLIB_PATH").is_none() {
        ensure!(
            std::env::var_os("REQUIRE_ORT").is_none(),
            "REQUIRE_ORT is set but ORT_DYLIB_PATH is not"
        );
        eprintln!("SKIPPED onnx_engine_text_is_nemos: ORT_DYLIB_PATH is not set");
        return Ok(());
    }
    let export = fixtures().join(MODEL).join("onnx");
    let name = "espeak_us";
    let output = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
        .args([
            "transcribe",
            "--engine",
            "onnx",
            "--format",
            "json",
            "--model",
        ])
        .arg(&export)
        .arg(clip(name))
        .env("RUST_LOG", "warn")
        .output()?;
    let doc: Value = serde_json::from_str(&stdout_of(output)?)?;
    ensure!(
        doc["text"] == expected(name)?["text"],
        "onnx text {}",
        doc["text"]
    );
    Ok(())
}

/// A short segment (36 characters, 3.5 s) is one cue; its end, after the audio's, is the
/// audio's.
#[test]
fn srt_cues_are_nemos_segments() -> Result<()> {
    let name = "espeak_gb_fast";
    let out = stdout_of(transcribe(&["--format", "srt"], &[clip(name)])?)?;
    let want = expected(name)?;
    let duration = duration_of(&want)?;
    let mut doc = String::new();
    let segments = want["segments"].as_array().context("segments")?;
    ensure!(!segments.is_empty(), "fixture has segments");
    ensure!(segments[segments.len() - 1]["end"].as_f64() > Some(duration));
    for (k, s) in segments.iter().enumerate() {
        let (start, end) = nemo_span(s, duration)?;
        let text = s["segment"].as_str().context("segment")?;
        doc.push_str(&format!(
            "{}\n{} --> {}\n{}\n\n",
            k + 1,
            clock(start, ','),
            clock(end, ','),
            text.trim()
        ));
    }
    ensure!(out == doc, "srt:\n{out}\nexpected:\n{doc}");
    Ok(())
}

#[test]
fn verbose_json_words_are_nemos() -> Result<()> {
    let name = "espeak_us";
    let out = stdout_of(transcribe(
        &["--format", "verbose_json", "--language", "english"],
        &[clip(name)],
    )?)?;
    let doc: Value = serde_json::from_str(&out)?;
    let want = expected(name)?;
    ensure!(doc["task"] == "transcribe" && doc["language"] == "english");
    ensure!(doc["text"] == want["text"]);
    let samples = want["num_samples"].as_f64().context("num_samples")?;
    ensure!(doc["duration"].as_f64() == Some((samples / 16.0).round() / 1000.0));
    let duration = duration_of(&want)?;
    let ours = doc["words"].as_array().context("words")?;
    let nemo = want["words"].as_array().context("fixture words")?;
    ensure!(ours.len() == nemo.len() && !ours.is_empty(), "word count");
    let ms = |s: f64| (s * 1000.0).round() as i64;
    for (o, n) in ours.iter().zip(nemo) {
        ensure!(
            o["word"] == n["word"],
            "word {} != {}",
            o["word"],
            n["word"]
        );
        let (start, end) = nemo_span(n, duration)?;
        let got = (o["start"].as_f64().map(ms), o["end"].as_f64().map(ms));
        ensure!(
            got == (Some(ms(start)), Some(ms(end))),
            "{o} != NeMo {n} within {duration} s"
        );
    }
    Ok(())
}

#[test]
fn several_files_out_dir_and_a_failure() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let bad = dir.path().join("broken.wav");
    std::fs::write(&bad, b"RIFF not really a wave file")?;
    let out_dir = dir.path().join("out");
    let output = transcribe(
        &[
            "--format",
            "vtt",
            "--out",
            out_dir.to_str().context("utf-8 path")?,
        ],
        &[clip("espeak_us"), bad.clone(), clip("audioeval_fox")],
    )?;
    ensure!(!output.status.success(), "a failed file must fail the run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        stderr.contains("broken.wav"),
        "stderr names the file: {stderr}"
    );
    // Said once, by us: the decoder library's own error line stays out of the log.
    ensure!(
        stderr.matches("broken.wav").count() == 1 && !stderr.contains("symphonia"),
        "one line about the file, no third-party log lines: {stderr}"
    );
    for name in ["espeak_us", "audioeval_fox"] {
        let vtt = std::fs::read_to_string(out_dir.join(format!("{name}.vtt")))?;
        ensure!(vtt.starts_with("WEBVTT\n\n00:00:"), "{name}: {vtt}");
    }
    ensure!(!out_dir.join("broken.vtt").exists());

    // To stdout, each document is announced by its file name.
    let out = stdout_of(transcribe(
        &["--format", "text"],
        &[clip("espeak_short"), clip("audioeval_fox")],
    )?)?;
    let want = format!(
        "==> {} <==\n{}\n\n==> {} <==\n{}\n",
        clip("espeak_short").display(),
        expected("espeak_short")?["text"].as_str().context("text")?,
        clip("audioeval_fox").display(),
        expected("audioeval_fox")?["text"]
            .as_str()
            .context("text")?,
    );
    ensure!(out == want, "stdout:\n{out}\nexpected:\n{want}");
    Ok(())
}

/// `--engine cuda` runs on the GPU or not at all: without one it fails with the reason, never
/// falling back to the CPU. (On a GPU machine it must transcribe.)
#[test]
fn cuda_engine_needs_a_gpu() -> Result<()> {
    let output = transcribe(&["--engine", "cuda"], &[clip("espeak_short")])?;
    if cuda_engine::CudaEngine::new(0).is_ok() {
        assert!(output.status.success(), "{output:?}");
        assert!(!output.stdout.is_empty());
    } else {
        assert!(!output.status.success(), "must not fall back to the CPU");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("no CUDA device available"), "{stderr}");
        assert!(output.stdout.is_empty(), "no transcript without the GPU");
    }
    Ok(())
}

/// `--log-format json` (before or after the subcommand): every stderr line is one JSON object
/// with a level and a message; the default off a terminal is plain text without colour codes.
#[test]
fn log_lines_are_json_when_asked_and_plain_text_otherwise() -> Result<()> {
    let model = fixtures().join(MODEL).join("model.nemo");
    let run = |format: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dispatcher"));
        cmd.arg("transcribe");
        if let Some(format) = format {
            cmd.args(["--log-format", format]);
        }
        cmd.arg("--model")
            .arg(&model)
            .arg(clip("espeak_short.wav"))
            .arg(fixtures().join("clips/missing.wav"))
            .env("RUST_LOG", "info")
            .output()
            .context("running dispatcher")
    };
    let json = run(Some("json"))?;
    let stderr = String::from_utf8(json.stderr)?;
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with('{')).collect();
    ensure!(!lines.is_empty(), "no JSON log lines:\n{stderr}");
    for line in &lines {
        let value: Value = serde_json::from_str(line).with_context(|| line.to_string())?;
        ensure!(
            value["level"].is_string() && value["message"].is_string(),
            "{line}"
        );
    }
    let text = run(None)?;
    let stderr = String::from_utf8(text.stderr)?;
    ensure!(stderr.contains("INFO"), "{stderr}");
    ensure!(
        !stderr.contains('\u{1b}'),
        "colour codes off a terminal:\n{stderr}"
    );
    Ok(())
}

/// A model path of the wrong kind fails before anything runs, naming what it is and what to
/// give instead (not the first config key or tar header that does not fit), in one `error:`
/// line that says the cause once, exit status 1.
#[test]
fn a_model_of_the_wrong_kind_is_named_with_the_fix() -> Result<()> {
    let f = fixtures();
    let diar = f.join("sortformer-tiny/model.nemo");
    let asr = f.join(MODEL).join("model.nemo");
    let cases: [(Vec<PathBuf>, &[&str]); 5] = [
        (
            vec!["--model".into(), diar.clone()],
            &["Sortformer diarization checkpoint", "--diar-model"],
        ),
        (
            vec!["--model".into(), f.join("clips")],
            &["this is a directory", "give the .nemo file itself"],
        ),
        (
            vec!["--model".into(), f.join(MODEL).join("onnx")],
            &["an ONNX export folder", "--engine onnx"],
        ),
        (
            vec!["--model".into(), clip("espeak_us")],
            &["this is an audio file", "the model's .nemo file"],
        ),
        (
            vec![
                "--model".into(),
                asr.clone(),
                "--diarize".into(),
                "--diar-model".into(),
                asr.clone(),
            ],
            &["Parakeet transcription checkpoint", "`--model`"],
        ),
    ];
    for (args, wanted) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
            .arg("transcribe")
            .args(&args)
            .arg(clip("espeak_short"))
            .env_remove("RUST_BACKTRACE")
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.code() == Some(1),
            "{args:?}: exit {:?}\n{stderr}",
            out.status
        );
        for want in wanted {
            ensure!(stderr.contains(want), "{args:?}: no `{want}` in\n{stderr}");
        }
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("error: "))
            .collect();
        ensure!(
            errors.len() == 1,
            "{args:?}: one error line wanted:\n{stderr}"
        );
        ensure!(
            stderr.matches(wanted[0]).count() == 1,
            "{args:?}: the cause `{}` more than once:\n{stderr}",
            wanted[0]
        );
        ensure!(
            !stderr.contains("vocab_size") && !stderr.contains("bad archive"),
            "{args:?}: a symptom instead of the cause:\n{stderr}"
        );
    }
    Ok(())
}

/// Settings and inputs a user gets wrong: each refused with one `error:` line that names the
/// problem and the fix, and an exit status that tells a usage error (2) from a failure (1).
#[test]
fn bad_settings_and_inputs_name_the_problem_and_the_fix() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let typo = dir.path().join("typo.toml");
    std::fs::write(&typo, "max_segment_secs = 20\n")?;
    let text = dir.path().join("notes.wav");
    std::fs::write(&text, "these are meeting notes, not audio\n")?;
    let model = fixtures().join(MODEL).join("model.nemo");
    let typo_flag = format!("--config={}", typo.display());
    let cases: [(Vec<String>, PathBuf, i32, &[&str]); 5] = [
        (
            vec!["--max-segment-s".into(), "0".into()],
            clip("espeak_short"),
            1,
            &["max_segment_s must be", "at least 1"],
        ),
        (
            vec!["--max-segment-s".into(), "NaN".into()],
            clip("espeak_short"),
            1,
            &["max_segment_s must be", "got NaN"],
        ),
        (
            vec![typo_flag],
            clip("espeak_short"),
            2,
            &[
                "`max_segment_secs` is not a setting",
                "long flags with `_` for `-`",
            ],
        ),
        (
            vec!["--engine".into(), "fleet".into()],
            clip("espeak_short"),
            2,
            &["invalid value 'fleet' for '--engine", "cpu, onnx, cuda"],
        ),
        (
            vec![],
            text,
            1,
            &["not a recognised audio container", "give WAV, FLAC, MP3"],
        ),
    ];
    for (args, input, code, wanted) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
            .arg("transcribe")
            .arg("--model")
            .arg(&model)
            .args(&args)
            .arg(&input)
            .env_remove("RUST_BACKTRACE")
            .output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.code() == Some(code),
            "{args:?}: exit {:?}, wanted {code}\n{stderr}",
            out.status
        );
        for want in wanted {
            ensure!(stderr.contains(want), "{args:?}: no `{want}` in\n{stderr}");
        }
        ensure!(
            stderr.matches(wanted[0]).count() == 1,
            "{args:?}: said more than once:\n{stderr}"
        );
    }
    Ok(())
}
