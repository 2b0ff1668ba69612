//! The native CPU model against outputs NeMo itself recorded (`tests/fixtures/<model>/`):
//! features and encoder output within 1e-4 relative L2, decoded token ids, frames, durations
//! and text identical, for every clip of every fixture model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, ensure, Context, Result};
use models::detokenize::Detokenizer;
use models::ParakeetModel;
use serde_json::Value;

const MAX_REL_L2: f64 = 1e-4;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// 16 kHz mono PCM16 as f32 in [-1, 1) (soundfile's scaling, which NeMo used).
fn read_wav(path: &Path) -> Result<Vec<f32>> {
    let mut reader = hound::WavReader::open(path).with_context(|| path.display().to_string())?;
    let spec = reader.spec();
    ensure!(
        spec.channels == 1 && spec.sample_rate == 16000 && spec.bits_per_sample == 16,
        "{}: expected 16 kHz mono PCM16, got {spec:?}",
        path.display()
    );
    reader
        .samples::<i16>()
        .map(|s| Ok(s? as f32 / 32768.0))
        .collect()
}

/// `name -> (shape, values)` of an f32 safetensors file.
fn read_safetensors(path: &Path) -> Result<BTreeMap<String, (Vec<usize>, Vec<f32>)>> {
    let bytes = std::fs::read(path).with_context(|| path.display().to_string())?;
    let file = safetensors::SafeTensors::deserialize(&bytes)?;
    let mut out = BTreeMap::new();
    for (name, view) in file.tensors() {
        ensure!(view.dtype() == safetensors::Dtype::F32, "{name}: not f32");
        let values = view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        out.insert(name, (view.shape().to_vec(), values));
    }
    Ok(out)
}

fn rel_l2(ours: &[f32], reference: &[f32]) -> f64 {
    let err: f64 = ours
        .iter()
        .zip(reference)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    let norm: f64 = reference.iter().map(|b| (*b as f64).powi(2)).sum();
    (err / norm.max(f64::MIN_POSITIVE)).sqrt()
}

fn usize_list(clip: &Value, key: &str) -> Result<Vec<usize>> {
    clip[key]
        .as_array()
        .ok_or_else(|| anyhow!("`{key}` is not a list"))?
        .iter()
        .map(|v| {
            v.as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| anyhow!("`{key}` holds {v}"))
        })
        .collect()
}

fn check_model(name: &str) -> Result<()> {
    let dir = fixtures().join(name);
    let model = ParakeetModel::load(&dir.join("model.nemo"))?;
    let expected = read_safetensors(&dir.join("expected.safetensors"))?;
    let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json"))?)?;
    let clips = json["clips"]
        .as_object()
        .ok_or_else(|| anyhow!("{name}: expected.json has no `clips`"))?;
    ensure!(!clips.is_empty(), "{name}: no clips");
    let detokenizer = Detokenizer::new(model.vocabulary());

    let mut failures = Vec::new();
    let (mut worst_features, mut worst_encoder) = (0.0f64, 0.0f64);
    for (clip, want) in clips {
        let pcm = read_wav(&fixtures().join("clips").join(format!("{clip}.wav")))?;

        let features = model.features(&pcm);
        let (shape, reference) = &expected[&format!("features/{clip}")];
        ensure!(
            shape == &[features.n_mels, features.n_frames],
            "{name}/{clip}: features {:?}, NeMo {shape:?}",
            [features.n_mels, features.n_frames]
        );
        let feature_err = rel_l2(&features.data, reference);

        let encoded = model.encode(&features)?;
        let (shape, reference) = &expected[&format!("encoder/{clip}")];
        ensure!(
            shape == &[encoded.dim, encoded.frames],
            "{name}/{clip}: encoder [{}, {}], NeMo {shape:?}",
            encoded.dim,
            encoded.frames
        );
        // NeMo records [d_model, T]; ours is [T, d_model].
        let mut transposed = vec![0.0; encoded.data.len()];
        for (t, frame) in encoded.data.chunks_exact(encoded.dim).enumerate() {
            for (c, v) in frame.iter().enumerate() {
                transposed[c * encoded.frames + t] = *v;
            }
        }
        let encoder_err = rel_l2(&transposed, reference);

        let hyp = model
            .decode(std::slice::from_ref(&encoded))?
            .pop()
            .ok_or_else(|| anyhow!("no hypothesis"))?;
        let ids: Vec<usize> = hyp.tokens.iter().map(|t| t.id as usize).collect();
        let frames: Vec<usize> = hyp.tokens.iter().map(|t| t.frame).collect();
        let durations: Vec<usize> = hyp.tokens.iter().map(|t| t.duration).collect();
        let text = detokenizer.decode(&hyp.tokens.iter().map(|t| t.id).collect::<Vec<_>>());
        let tokens_ok = ids == usize_list(want, "token_ids")?
            && frames == usize_list(want, "token_frames")?
            && durations == usize_list(want, "token_durations")?;
        let text_ok = want["text"].as_str() == Some(text.as_str());

        println!(
            "{name}/{clip}: features rel L2 {feature_err:.2e}, encoder rel L2 {encoder_err:.2e}, \
             {} tokens, tokens {}, text {}",
            ids.len(),
            if tokens_ok { "identical" } else { "DIFFER" },
            if text_ok { "identical" } else { "DIFFERS" },
        );
        worst_features = worst_features.max(feature_err);
        worst_encoder = worst_encoder.max(encoder_err);
        if feature_err > MAX_REL_L2 || encoder_err > MAX_REL_L2 || !tokens_ok || !text_ok {
            failures.push(format!(
                "{clip}: features {feature_err:.2e}, encoder {encoder_err:.2e}, \
                 ids {ids:?} frames {frames:?} durations {durations:?} text {text:?} vs NeMo {want}"
            ));
        }
    }
    println!(
        "{name}: max features rel L2 {worst_features:.2e}, max encoder rel L2 {worst_encoder:.2e}"
    );
    if !failures.is_empty() {
        bail!(
            "{name}: {} clip(s) differ from NeMo:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
    Ok(())
}

#[test]
fn tdt_real_options_matches_nemo() -> Result<()> {
    check_model("tdt-real-options")
}

#[test]
fn tdt_local_attn_matches_nemo() -> Result<()> {
    check_model("tdt-local-attn")
}
