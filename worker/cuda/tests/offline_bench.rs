//! Offline transcription of a clip set with the whole GPU model (`GpuParakeet`): token ids per
//! clip for the agreement check against PyTorch (`scripts/bench/token_agreement.py`), and the
//! offline RTFx of a length-sorted run at one batch size.
//!
//! Ignored by default; on a GPU:
//! `OFFLINE_MODEL=m.nemo OFFLINE_MANIFEST=clips.jsonl OFFLINE_OUT=ours.jsonl OFFLINE_BATCH=16
//!  [OFFLINE_PRECISION=bf16|f32] [OFFLINE_FEATURES=device|host] [ENCODER_FUSED_ATTENTION=0]
//!  ./offline_bench --ignored --nocapture`.
//! The manifest has one JSON object per line with at least `"path"` (16 kHz mono PCM16 WAV, as
//! `scripts/bench/make_clips.py` writes). Clips are sorted by length and cut into batches of
//! `OFFLINE_BATCH`; the wall time covers features, encoder and decoder of every batch (WAV
//! reading excluded), after a warm-up at the largest batch and clip length. The output has one
//! line per clip in manifest order: `{"path": ..., "tokens": [ids]}`.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use common::{engine, read_wav};
use cuda_engine::{EncoderPrecision, FeatureLocation, GpuParakeet};

fn var(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| format!("set {name}"))
}

#[test]
#[ignore = "benchmark: needs a GPU, OFFLINE_MODEL, OFFLINE_MANIFEST and OFFLINE_OUT"]
fn offline_transcription() -> Result<()> {
    if engine("offline_transcription").is_none() {
        return Ok(());
    }
    let model_path = PathBuf::from(var("OFFLINE_MODEL")?);
    let manifest = PathBuf::from(var("OFFLINE_MANIFEST")?);
    let out_path = PathBuf::from(var("OFFLINE_OUT")?);
    let batch: usize = std::env::var("OFFLINE_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16)
        .max(1);

    let mut paths = Vec::new();
    for line in std::fs::read_to_string(&manifest)?.lines() {
        if line.trim().is_empty() {
            continue;
        }
        let entry: serde_json::Value = serde_json::from_str(line)?;
        let path = entry["path"]
            .as_str()
            .context("manifest line without path")?;
        paths.push(path.to_owned());
    }
    let clips: Vec<Vec<f32>> = paths
        .iter()
        .map(|p| read_wav(std::path::Path::new(p)))
        .collect::<Result<_>>()?;
    let rate = 16_000.0;
    let audio_s: f64 = clips.iter().map(|c| c.len() as f64 / rate).sum();
    let longest_s = clips.iter().map(|c| c.len()).max().unwrap_or(0) as f64 / rate;

    let precision = match std::env::var("OFFLINE_PRECISION").as_deref() {
        Ok("f32") => EncoderPrecision::F32,
        Ok("bf16") | Err(_) => EncoderPrecision::Bf16,
        Ok(other) => anyhow::bail!("OFFLINE_PRECISION={other}: use bf16 or f32"),
    };
    let features = match std::env::var("OFFLINE_FEATURES").as_deref() {
        Ok("host") => FeatureLocation::Host,
        Ok("device") | Err(_) => FeatureLocation::Device,
        Ok(other) => anyhow::bail!("OFFLINE_FEATURES={other}: use device or host"),
    };
    let mut model = GpuParakeet::load_with(&model_path, 0, precision)?;
    model.set_feature_location(features);
    model.set_fused_attention(std::env::var("ENCODER_FUSED_ATTENTION").as_deref() != Ok("0"));
    model.warm_up(batch.min(clips.len()).max(1), longest_s.max(1.0))?;

    let mut order: Vec<usize> = (0..clips.len()).collect();
    order.sort_by_key(|&i| clips[i].len());
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); clips.len()];
    let started = Instant::now();
    for group in order.chunks(batch) {
        let pcm: Vec<&[f32]> = group.iter().map(|&i| clips[i].as_slice()).collect();
        let hyps = model.transcribe_batch(&pcm)?;
        anyhow::ensure!(hyps.len() == group.len(), "one hypothesis per clip");
        for (&i, hyp) in group.iter().zip(hyps) {
            tokens[i] = hyp.tokens.iter().map(|t| t.id).collect();
        }
    }
    let wall_s = started.elapsed().as_secs_f64();

    // A second pass drained between phases: where the time goes, and the same tokens again.
    let mut phases = cuda_engine::PhaseTimes::default();
    for group in order.chunks(batch) {
        let pcm: Vec<&[f32]> = group.iter().map(|&i| clips[i].as_slice()).collect();
        let (hyps, t) = model.transcribe_batch_timed(&pcm)?;
        for (&i, hyp) in group.iter().zip(hyps) {
            let again: Vec<u32> = hyp.tokens.iter().map(|t| t.id).collect();
            anyhow::ensure!(
                again == tokens[i],
                "clip {} decoded differently twice",
                paths[i]
            );
        }
        phases.features += t.features;
        phases.encoder += t.encoder;
        phases.decoder += t.decoder;
    }
    println!(
        "RESULT offline phases (drained between phases) features_s={:.3} encoder_s={:.3} \
         decoder_s={:.3}",
        phases.features.as_secs_f64(),
        phases.encoder.as_secs_f64(),
        phases.decoder.as_secs_f64()
    );

    let mut out = std::io::BufWriter::new(std::fs::File::create(&out_path)?);
    for (path, ids) in paths.iter().zip(&tokens) {
        writeln!(
            out,
            "{}",
            serde_json::json!({ "path": path, "tokens": ids })
        )?;
    }
    out.flush()?;
    println!(
        "RESULT offline encoder={precision:?} features={features:?} clips={} audio_s={audio_s:.1} batch={batch} \
         wall_s={wall_s:.3} rtfx={:.0} tokens={}",
        clips.len(),
        audio_s / wall_s,
        tokens.iter().map(Vec::len).sum::<usize>()
    );
    Ok(())
}
