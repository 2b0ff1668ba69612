//! A recording of several minutes in one pass, against NeMo (`long_audio.json`, made by
//! scripts/fixtures/long_audio.py): with full attention by default, and with NeMo's long-audio
//! recipe (local attention, context [128, 128]) once the recording is over the
//! `full_attention_max_s` limit.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use model_core::long_audio::LongAudio;
use models::ParakeetModel;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// 16 kHz mono PCM16 as f32 in [-1, 1) (soundfile's scaling, which NeMo used).
fn read_wav(path: &Path) -> Result<Vec<f32>> {
    let mut reader = hound::WavReader::open(path).with_context(|| path.display().to_string())?;
    reader
        .samples::<i16>()
        .map(|s| Ok(s? as f32 / 32768.0))
        .collect()
}

/// The recording the fixture describes: its clips joined end to end, `repeats` times over.
fn recording(doc: &Value) -> Result<Vec<f32>> {
    let mut once = Vec::new();
    for clip in doc["recipe"].as_array().context("recipe")? {
        let name = clip.as_str().context("clip name")?;
        once.extend(read_wav(
            &fixtures().join("clips").join(format!("{name}.wav")),
        )?);
    }
    let repeats = doc["repeats"].as_u64().context("repeats")? as usize;
    let audio = once.repeat(repeats);
    ensure!(audio.len() as u64 == doc["num_samples"].as_u64().context("num_samples")?);
    Ok(audio)
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default()
}

/// Tokens, frames and durations of `model` on `audio` equal NeMo's `want`.
fn check(model: &ParakeetModel, audio: &[f32], want: &Value, mode: &str) -> Result<()> {
    let hyp = model.transcribe_batch(&[audio])?.remove(0);
    let ids: Vec<i64> = hyp.tokens.iter().map(|t| i64::from(t.id)).collect();
    let frames: Vec<i64> = hyp.tokens.iter().map(|t| t.frame as i64).collect();
    let durations: Vec<i64> = hyp.tokens.iter().map(|t| t.duration as i64).collect();
    let first_difference = ids
        .iter()
        .zip(ints(&want["token_ids"]))
        .position(|(a, b)| *a != b);
    ensure!(
        ids == ints(&want["token_ids"]),
        "{mode}: {} tokens, NeMo {}; first difference at token {first_difference:?}",
        ids.len(),
        ints(&want["token_ids"]).len()
    );
    ensure!(
        frames == ints(&want["token_frames"]),
        "{mode}: frames differ"
    );
    ensure!(
        durations == ints(&want["token_durations"]),
        "{mode}: durations differ"
    );
    Ok(())
}

#[test]
fn several_minutes_in_one_pass_match_nemo_full_and_local() -> Result<()> {
    let path = fixtures().join("tdt-real-options/long_audio.json");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let audio = recording(&doc)?;
    let seconds = audio.len() as f64 / 16_000.0;
    let model = ParakeetModel::load(&fixtures().join("tdt-real-options/model.nemo"))?;
    // The default limit (24 minutes) keeps this recording on full attention, as NeMo's
    // transcribe() runs it.
    check(&model, &audio, &doc["full"], "full attention")?;
    // Under a limit it exceeds, NeMo's recipe: rel_pos_local_attn, [128, 128].
    let model = model.with_long_audio(LongAudio {
        full_attention_max_s: seconds / 2.0,
    });
    check(&model, &audio, &doc["local"], "local attention")
}
