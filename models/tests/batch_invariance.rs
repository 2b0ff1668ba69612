//! Every fixture clip decoded inside one batch of mixed lengths (in two different orders) gives
//! exactly the hypothesis it gets alone, and `transcribe_batch` agrees with the step-by-step path.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use model_core::tdt::EncodedUtterance;
use models::ParakeetModel;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn read_wav(path: &Path) -> Result<Vec<f32>> {
    let mut reader = hound::WavReader::open(path).with_context(|| path.display().to_string())?;
    reader
        .samples::<i16>()
        .map(|s| Ok(s? as f32 / 32768.0))
        .collect()
}

fn clips() -> Result<Vec<(String, Vec<f32>)>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(fixtures().join("clips"))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    paths.retain(|p| p.extension().is_some_and(|e| e == "wav"));
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let name = p
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            Ok((name, read_wav(p)?))
        })
        .collect()
}

fn check_model(name: &str) -> Result<()> {
    let model = ParakeetModel::load(&fixtures().join(name).join("model.nemo"))?;
    let clips = clips()?;
    ensure!(
        clips.len() >= 3,
        "need several clips, found {}",
        clips.len()
    );
    let encoded: Vec<EncodedUtterance> = clips
        .iter()
        .map(|(_, pcm)| model.encode(&model.features(pcm)))
        .collect::<Result<_, _>>()?;
    let lengths: Vec<usize> = encoded.iter().map(|e| e.frames).collect();
    ensure!(
        lengths.iter().min() != lengths.iter().max(),
        "clips must have mixed lengths: {lengths:?}"
    );

    let single: Vec<_> = encoded
        .iter()
        .map(|e| {
            model
                .decode(std::slice::from_ref(e))
                .map(|mut h| h.remove(0))
        })
        .collect::<Result<_, _>>()?;
    ensure!(
        single.iter().any(|h| !h.tokens.is_empty()),
        "{name}: every clip decoded to nothing; the test would prove little"
    );

    let batched = model.decode(&encoded)?;
    let mut reversed_input = encoded.clone();
    reversed_input.reverse();
    let mut reversed = model.decode(&reversed_input)?;
    reversed.reverse();
    let pcm: Vec<&[f32]> = clips.iter().map(|(_, p)| p.as_slice()).collect();
    let transcribed = model.transcribe_batch(&pcm)?;

    for (i, (clip, _)) in clips.iter().enumerate() {
        ensure!(
            batched[i] == single[i],
            "{name}/{clip}: batch differs from single"
        );
        ensure!(
            reversed[i] == single[i],
            "{name}/{clip}: reversed batch differs from single"
        );
        ensure!(
            transcribed[i] == single[i],
            "{name}/{clip}: transcribe_batch differs from single"
        );
        println!(
            "{name}/{clip}: {} frames, {} tokens, batch == single",
            lengths[i],
            single[i].tokens.len()
        );
    }
    Ok(())
}

/// Empty input, a clip shorter than one hop and exact digital silence decode (to whatever they
/// decode to) without errors, alone and inside a batch with speech.
#[test]
fn degenerate_inputs_decode_alone_and_in_a_batch() -> Result<()> {
    let model = ParakeetModel::load(&fixtures().join("tdt-real-options").join("model.nemo"))?;
    let speech = read_wav(&fixtures().join("clips").join("espeak_us.wav"))?;
    let silence = vec![0.0f32; 16000];
    let inputs: Vec<&[f32]> = vec![&[], &speech[..100], &silence, &speech];
    let batched = model.transcribe_batch(&inputs)?;
    for (pcm, hyp) in inputs.iter().zip(&batched) {
        let single = model.transcribe_batch(std::slice::from_ref(pcm))?;
        ensure!(
            single[0] == *hyp,
            "{} samples: batch differs from single",
            pcm.len()
        );
    }
    ensure!(batched[0].tokens.is_empty() && batched[1].tokens.is_empty());
    ensure!(!batched[3].tokens.is_empty(), "speech decoded to nothing");
    Ok(())
}

#[test]
fn tdt_real_options_batch_equals_single() -> Result<()> {
    check_model("tdt-real-options")
}

#[test]
fn tdt_local_attn_batch_equals_single() -> Result<()> {
    check_model("tdt-local-attn")
}
