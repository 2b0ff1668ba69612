//! `dispatcher transcribe --diarize` end to end: the built binary with the fixture models
//! (Parakeet `tdt-real-options`, Sortformer `sortformer-tiny`) must print NeMo's speaker
//! segments as RTTM and label verbose_json/srt/vtt with those speakers.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{ensure, Context, Result};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures")
}

fn transcribe(args: &[&str], file: &Path) -> Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_dispatcher"))
        .arg("transcribe")
        .arg("--model")
        .arg(fixtures().join("tdt-real-options/model.nemo"))
        .args(args)
        .arg(file)
        .env("RUST_LOG", "warn")
        .env_remove("PARAKEET_DIAR_MODEL")
        .output()
        .context("running dispatcher")
}

fn diarized(format: &str, file: &Path) -> Result<String> {
    let diar = fixtures().join("sortformer-tiny/model.nemo");
    let diar = diar.to_str().context("utf-8 path")?;
    let out = transcribe(
        &["--diarize", "--diar-model", diar, "--format", format],
        file,
    )?;
    ensure!(
        out.status.success(),
        "exit {:?}, stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// `(start ms, end ms, speaker)`.
type Turn = (i64, i64, String);

fn ms(seconds: f64) -> i64 {
    (seconds * 1000.0).round() as i64
}

/// NeMo's post-processed segments (DIHARD3 preset, the model's default) as recorded by the
/// fixture generator: `"<start> <end> <speaker>"`.
fn nemo_turns(clip: &str) -> Result<Vec<Turn>> {
    let path = fixtures().join("sortformer-tiny/expected.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let lines = doc["clips"][clip]["segments"]["dihard3"]
        .as_array()
        .context("expected segments")?;
    lines
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.as_str().context("string")?.split(' ').collect();
            ensure!(f.len() == 3, "{l}");
            Ok((ms(f[0].parse()?), ms(f[1].parse()?), f[2].to_owned()))
        })
        .collect()
}

fn rttm_turns(doc: &str, file_id: &str) -> Result<Vec<Turn>> {
    doc.lines()
        .map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            ensure!(
                f.len() == 10 && f[0] == "SPEAKER" && f[1] == file_id,
                "{line}"
            );
            let start: f64 = f[3].parse()?;
            let dur: f64 = f[4].parse()?;
            Ok((ms(start), ms(start + dur), f[7].to_owned()))
        })
        .collect()
}

#[test]
fn rttm_is_nemos_speaker_segments() -> Result<()> {
    for (clip, wav) in [
        (
            "three_speakers",
            fixtures().join("sortformer-tiny/three_speakers.wav"),
        ),
        ("espeak_us", fixtures().join("clips/espeak_us.wav")),
    ] {
        let mut got = rttm_turns(&diarized("rttm", &wav)?, clip)?;
        let mut want = nemo_turns(clip)?;
        ensure!(!want.is_empty(), "{clip}: fixture has segments");
        got.sort();
        want.sort();
        ensure!(got == want, "{clip}: RTTM {got:?}\n!= NeMo {want:?}");
    }
    Ok(())
}

#[test]
fn labelled_documents_use_the_rttm_speakers() -> Result<()> {
    let wav = fixtures().join("sortformer-tiny/three_speakers.wav");
    let speakers: BTreeSet<String> = rttm_turns(&diarized("rttm", &wav)?, "three_speakers")?
        .into_iter()
        .map(|t| t.2)
        .collect();

    let verbose: Value = serde_json::from_str(&diarized("verbose_json", &wav)?)?;
    let words = verbose["words"].as_array().context("words")?;
    let word_speakers: BTreeSet<String> = words
        .iter()
        .filter_map(|w| w["speaker"].as_str().map(String::from))
        .collect();
    ensure!(!word_speakers.is_empty(), "words carry speakers");
    ensure!(
        word_speakers.is_subset(&speakers),
        "{word_speakers:?} ⊄ {speakers:?}"
    );
    for seg in verbose["segments"].as_array().context("segments")? {
        let s = seg["speaker"].as_str().context("segment speaker")?;
        ensure!(speakers.contains(s), "{seg}");
    }

    let srt = diarized("srt", &wav)?;
    let vtt = diarized("vtt", &wav)?;
    let srt_labels: Vec<&str> = srt
        .split("\n\n")
        .filter(|b| !b.is_empty())
        .map(|b| {
            let text = b.lines().nth(2).unwrap_or("");
            text.strip_prefix('[')
                .and_then(|t| t.split_once("] "))
                .map_or("", |(s, _)| s)
        })
        .collect();
    let vtt_labels: Vec<&str> = vtt
        .lines()
        .filter_map(|l| l.strip_prefix("<v ").and_then(|t| t.split_once('>')))
        .map(|(s, _)| s)
        .collect();
    ensure!(
        !srt_labels.is_empty() && srt_labels == vtt_labels,
        "{srt}\n{vtt}"
    );
    ensure!(
        srt_labels.iter().all(|s| speakers.contains(*s)),
        "{srt_labels:?}"
    );
    Ok(())
}

#[test]
fn diarization_flags_are_checked() -> Result<()> {
    let wav = fixtures().join("clips/espeak_us.wav");
    let out = transcribe(&["--format", "rttm"], &wav)?;
    ensure!(!out.status.success(), "rttm without --diarize must fail");
    ensure!(String::from_utf8_lossy(&out.stderr).contains("--diarize"));
    let out = transcribe(&["--diarize"], &wav)?;
    ensure!(!out.status.success(), "--diarize without a model must fail");
    ensure!(String::from_utf8_lossy(&out.stderr).contains("--diar-model"));
    // Without --diarize nothing changes: no speaker fields.
    let out = transcribe(&["--format", "verbose_json"], &wav)?;
    ensure!(out.status.success());
    ensure!(!String::from_utf8(out.stdout)?.contains("speaker"));
    Ok(())
}

/// Every file under `dir`, by path relative to it.
fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path.strip_prefix(dir)?.to_path_buf());
            }
        }
    }
    Ok(out)
}

#[test]
fn local_mode_diarizes_the_input_dir() -> Result<()> {
    let work = tempfile::tempdir()?;
    let inputs = work.path().join("inputs");
    std::fs::create_dir(&inputs)?;
    std::fs::copy(
        fixtures().join("sortformer-tiny/three_speakers.wav"),
        inputs.join("consult.wav"),
    )?;
    let out = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
        .arg("local")
        .arg("--spool")
        .arg(work.path().join("spool"))
        .arg("--store")
        .arg(work.path().join("store"))
        .arg("--input-dir")
        .arg(&inputs)
        .arg("--diarize")
        .arg("--model")
        .arg(fixtures().join("tdt-real-options/model.nemo"))
        .arg("--diar-model")
        .arg(fixtures().join("sortformer-tiny/model.nemo"))
        .env("RUST_LOG", "warn")
        .output()?;
    let log = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "{log}");
    ensure!(log.contains("done 1 ·"), "{log}");
    let results = work.path().join("store/results");
    let files = files_under(&results)?;
    let rttm = files
        .iter()
        .find(|p| p.ends_with("transcript.rttm"))
        .with_context(|| format!("no transcript.rttm in {files:?}"))?;
    let manifest = rttm.with_file_name("manifest.json");
    let manifest: Value = serde_json::from_slice(&std::fs::read(results.join(&manifest))?)?;
    let formats: Vec<&str> = manifest["outputs"]
        .as_array()
        .context("outputs")?
        .iter()
        .filter_map(|o| o["format"].as_str())
        .collect();
    ensure!(formats.last() == Some(&"rttm"), "{formats:?}");
    ensure!(manifest["diarization_model_id"].is_string(), "{manifest}");
    let rttm = std::fs::read_to_string(results.join(rttm))?;
    ensure!(rttm.starts_with("SPEAKER consult 1 "), "{rttm}");
    // Without a diarization model, --diarize is refused before anything is submitted.
    let out = Command::new(env!("CARGO_BIN_EXE_dispatcher"))
        .arg("local")
        .arg("--spool")
        .arg(work.path().join("spool2"))
        .arg("--store")
        .arg(work.path().join("store2"))
        .arg("--input-dir")
        .arg(&inputs)
        .arg("--diarize")
        .arg("--model")
        .arg(fixtures().join("tdt-real-options/model.nemo"))
        .env_remove("PARAKEET_DIAR_MODEL")
        .output()?;
    ensure!(!out.status.success());
    ensure!(String::from_utf8_lossy(&out.stderr).contains("--diar-model"));
    Ok(())
}
