//! One copy of the encoder's weights per GPU: a second model on the device maps the first one's
//! arena (after comparing every byte with its own copy) and transcribes exactly as a model with
//! private weights does; the arena outlives the model that made it; a later model finds a
//! surviving holder; and a model whose weights differ refuses the arena and keeps its own.

mod common;

use anyhow::{ensure, Result};
use common::{engine, fixtures, read_wav, CLIPS};
use cuda_engine::{GpuParakeet, WeightShare, WeightSharing};
use models::transcript::Hypothesis;

fn transcribe(model: &GpuParakeet, clips: &[Vec<f32>]) -> Result<Vec<Hypothesis>> {
    let refs: Vec<&[f32]> = clips.iter().map(Vec::as_slice).collect();
    Ok(model.transcribe_batch(&refs)?)
}

#[test]
fn models_on_one_gpu_share_one_copy_of_the_weights() -> Result<()> {
    // The shared engine only tells whether there is a device; each model has its own.
    if engine("models_on_one_gpu_share_one_copy_of_the_weights").is_none() {
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("weight-sharing-test-{}", std::process::id()));
    let path = fixtures().join("tdt-real-options/model.nemo");
    let clips: Vec<Vec<f32>> = CLIPS
        .iter()
        .map(|c| read_wav(&fixtures().join("clips").join(format!("{c}.wav"))))
        .collect::<Result<_>>()?;
    let expected = transcribe(&GpuParakeet::load(&path, 0)?, &clips)?;

    let mut first = GpuParakeet::load(&path, 0)?;
    let share = WeightShare::for_model(&dir, &path, "bf16", first.engine())?;
    let made = first.share_weights(&share)?;
    ensure!(
        matches!(made, WeightSharing::Created { .. }),
        "first: {made:?}"
    );
    let used_mib = |model: &GpuParakeet| -> Result<f64> {
        Ok(model.engine().used_memory_bytes()? as f64 / (1u64 << 20) as f64)
    };
    eprintln!(
        "device memory in use with one shared model: {:.0} MiB",
        used_mib(&first)?
    );
    let mut second = GpuParakeet::load(&path, 0)?;
    eprintln!(
        "... plus a second model, private: {:.0} MiB",
        used_mib(&second)?
    );
    let mapped = second.share_weights(&share)?;
    ensure!(
        made == WeightSharing::Created {
            bytes: match mapped {
                WeightSharing::Imported { bytes } => bytes,
                ref other => anyhow::bail!("second: {other:?}"),
            }
        },
        "the second model mapped a different size: {made:?} vs {mapped:?}"
    );
    ensure!(
        transcribe(&first, &clips)? == expected,
        "first model, shared weights"
    );
    ensure!(
        transcribe(&second, &clips)? == expected,
        "second model, shared weights"
    );

    drop(first); // its socket goes; the memory lives on in `second`
    ensure!(
        transcribe(&second, &clips)? == expected,
        "after the creator was dropped"
    );
    let mut third = GpuParakeet::load(&path, 0)?;
    let found = third.share_weights(&share)?;
    ensure!(
        matches!(found, WeightSharing::Imported { .. }),
        "third (served by the second): {found:?}"
    );
    ensure!(transcribe(&third, &clips)? == expected, "third model");

    // Another model presented under the same key: the comparison refuses the arena.
    let other_path = fixtures().join("tdt-local-attn/model.nemo");
    let other_expected = transcribe(&GpuParakeet::load(&other_path, 0)?, &clips)?;
    let mut other = GpuParakeet::load(&other_path, 0)?;
    let refused = other.share_weights(&share)?;
    ensure!(
        matches!(refused, WeightSharing::Private { .. }),
        "another model's weights were accepted: {refused:?}"
    );
    eprintln!("refused as expected: {refused:?}");
    ensure!(
        transcribe(&other, &clips)? == other_expected,
        "the refusing model's own weights"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
