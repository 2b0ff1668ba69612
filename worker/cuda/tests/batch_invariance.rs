//! A clip's encoder output must not depend on the batch it shares: each fixture clip alone, in a
//! batch of all clips, and in that batch reversed gives bit-identical encoder frames, for both
//! storages and both feature locations. The fleet's golden comparisons and job retries rely on
//! it: a request's transcript must not depend on which other requests were batched with it.
//!
//! With `ENCODING_DIGESTS=<file>`, each clip's digest (alone) is appended to the file, so runs
//! in different setups (e.g. alone and under an MPS thread limit) can be compared.
//!
//! Without CUDA these tests print SKIPPED and pass, unless `REQUIRE_CUDA=1`.

mod common;

use anyhow::{ensure, Result};
use common::{engine, fixtures, read_wav, CLIPS, MODELS};
use cuda_engine::{EncoderPrecision, FeatureLocation, GpuParakeet};
use model_core::tdt::EncodedUtterance;

/// Differing values and the largest difference between two encodings of one clip.
fn compare(a: &EncodedUtterance, b: &EncodedUtterance) -> (usize, f32) {
    if a.frames != b.frames || a.data.len() != b.data.len() {
        return (usize::MAX, f32::INFINITY);
    }
    a.data
        .iter()
        .zip(&b.data)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .fold((0, 0.0f32), |(n, max), (x, y)| {
            (n + 1, max.max((x - y).abs()))
        })
}

/// FNV-1a over the values' bits.
fn digest(u: &EncodedUtterance) -> u64 {
    u.data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
        (h ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3)
    })
}

fn check(
    model: &str,
    precision: EncoderPrecision,
    location: FeatureLocation,
) -> Result<Vec<String>> {
    let mut gpu = GpuParakeet::load_with(&fixtures().join(model).join("model.nemo"), 0, precision)?;
    gpu.set_feature_location(location);
    gpu.warm_up(4, 30.0)?;
    let mut pcm = Vec::new();
    for clip in CLIPS {
        pcm.push(read_wav(
            &fixtures().join("clips").join(format!("{clip}.wav")),
        )?);
    }
    let refs: Vec<&[f32]> = pcm.iter().map(Vec::as_slice).collect();
    let batched = gpu.encode_batch(&refs)?;
    let reversed_refs: Vec<&[f32]> = refs.iter().rev().copied().collect();
    let mut reversed = gpu.encode_batch(&reversed_refs)?;
    reversed.reverse();
    let label = format!("{model} ({precision:?} encoder, {location:?} features)");
    let mut failures = Vec::new();
    for (i, clip) in CLIPS.iter().enumerate() {
        let alone = gpu.encode_batch(&refs[i..=i])?.remove(0);
        if let Ok(path) = std::env::var("ENCODING_DIGESTS") {
            use std::io::Write;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?;
            writeln!(file, "{label} {clip} {:016x}", digest(&alone))?;
        }
        for (how, other) in [
            ("in the batch", &batched[i]),
            ("in the reversed batch", &reversed[i]),
        ] {
            let (differing, max) = compare(&alone, other);
            eprintln!(
                "RESULT {label} {clip} {how}: {differing} of {} values differ from alone (max {max:e})",
                alone.data.len()
            );
            if differing != 0 {
                failures.push(format!(
                    "{label} {clip} {how}: {differing} values, max {max:e}"
                ));
            }
        }
    }
    Ok(failures)
}

#[test]
fn encoder_output_does_not_depend_on_the_batch() -> Result<()> {
    let Some(engine) = engine("batch_invariance") else {
        return Ok(());
    };
    drop(engine);
    let mut failures = Vec::new();
    for model in MODELS {
        for precision in [EncoderPrecision::Bf16, EncoderPrecision::F32] {
            for location in [FeatureLocation::Host, FeatureLocation::Device] {
                failures.extend(check(model, precision, location)?);
            }
        }
    }
    ensure!(
        failures.is_empty(),
        "batch-dependent encoder output: {failures:#?}"
    );
    Ok(())
}
