//! One copy of the encoder's weights per GPU, between processes as in the fleet: this test's
//! model makes the arena; a child process (this binary again, running the ignored test
//! `weight_sharing_child`) maps it after comparing every byte with its own copy and must
//! transcribe exactly as a model with private weights does; a child loading another model under
//! the same key must refuse the arena and keep its own weights.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context, Result};
use common::{engine, fixtures, read_wav, CLIPS};
use cuda_engine::{DropErrors, GpuParakeet, WeightShare, WeightSharing};
use model_core::transcript::Hypothesis;

const CHILD_TEST: &str = "weight_sharing_child";

fn clips() -> Result<Vec<Vec<f32>>> {
    CLIPS
        .iter()
        .map(|c| read_wav(&fixtures().join("clips").join(format!("{c}.wav"))))
        .collect()
}

fn transcribe(model: &GpuParakeet, clips: &[Vec<f32>]) -> Result<Vec<Hypothesis>> {
    let refs: Vec<&[f32]> = clips.iter().map(Vec::as_slice).collect();
    Ok(model.transcribe_batch(&refs)?)
}

fn model_path(name: &str) -> PathBuf {
    fixtures().join(name).join("model.nemo")
}

/// Runs `weight_sharing_child` in a new process: it loads `model`, shares under `key` in `dir`
/// and writes its outcome and transcripts to a file, returned here.
fn run_child(dir: &Path, key: &str, model: &Path) -> Result<(String, Vec<Hypothesis>)> {
    // One output per model (the two children load different fixtures).
    let name = model
        .parent()
        .and_then(Path::file_name)
        .map_or("model".into(), |n| n.to_string_lossy());
    let out = dir.join(format!("child-{name}.json"));
    let status = Command::new(std::env::current_exe()?)
        .args([CHILD_TEST, "--exact", "--ignored", "--nocapture"])
        .env("WEIGHT_SHARING_DIR", dir)
        .env("WEIGHT_SHARING_KEY", key)
        .env("WEIGHT_SHARING_MODEL", model)
        .env("WEIGHT_SHARING_OUT", &out)
        .status()?;
    ensure!(status.success(), "the child process failed: {status}");
    let text = std::fs::read_to_string(&out).with_context(|| out.display().to_string())?;
    Ok(serde_json::from_str(&text)?)
}

#[test]
fn processes_on_one_gpu_share_one_copy_of_the_weights() -> Result<()> {
    // The shared engine only tells whether there is a device; each model has its own.
    if engine("processes_on_one_gpu_share_one_copy_of_the_weights").is_none() {
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("weight-sharing-test-{}", std::process::id()));
    let path = model_path("tdt-real-options");
    let clips = clips()?;
    let expected = transcribe(&GpuParakeet::load(&path, 0)?, &clips)?;

    let mut first = GpuParakeet::load(&path, 0)?;
    let share = WeightShare::for_model(&dir, &path, "bf16", first.engine())?;
    let made = first.share_weights(&share)?;
    let WeightSharing::Created { bytes } = made else {
        anyhow::bail!("the first model did not create the arena: {made:?}");
    };
    ensure!(
        transcribe(&first, &clips)? == expected,
        "first model, shared weights"
    );

    let (outcome, child) = run_child(&dir, share.key(), &path)?;
    ensure!(
        outcome == format!("{:?}", WeightSharing::Imported { bytes }),
        "child: {outcome}"
    );
    ensure!(
        child == expected,
        "the child's transcripts on the shared weights"
    );

    // Another model presented under the same key: the comparison refuses the arena.
    let other = model_path("tdt-local-attn");
    let other_expected = transcribe(&GpuParakeet::load(&other, 0)?, &clips)?;
    let (outcome, child) = run_child(&dir, share.key(), &other)?;
    ensure!(
        outcome.starts_with("Private"),
        "another model's weights were accepted: {outcome}"
    );
    eprintln!("refused as expected: {outcome}");
    ensure!(child == other_expected, "the refusing child's own weights");
    ensure!(
        transcribe(&first, &clips)? == expected,
        "first model, at the end"
    );
    drop(first); // stops its socket's thread before the directory goes
                 // Unmapping the arena and freeing the private weight copies raised nothing for Drop to
                 // record.
    let dropped = cuda_engine::drop_errors();
    ensure!(
        dropped == DropErrors::default(),
        "releases failed in Drop: {dropped:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The second process of the test above (run by it, with its environment).
#[test]
#[ignore = "helper process of processes_on_one_gpu_share_one_copy_of_the_weights"]
fn weight_sharing_child() -> Result<()> {
    let var = |name: &str| std::env::var(name).with_context(|| format!("{name} is not set"));
    let dir = PathBuf::from(var("WEIGHT_SHARING_DIR")?);
    let model = PathBuf::from(var("WEIGHT_SHARING_MODEL")?);
    let mut gpu = GpuParakeet::load(&model, 0)?;
    let share = WeightShare::new(&dir, &var("WEIGHT_SHARING_KEY")?)?;
    let outcome = gpu.share_weights(&share)?;
    let transcripts = transcribe(&gpu, &clips()?)?;
    let json = serde_json::to_string(&(format!("{outcome:?}"), transcripts))?;
    std::fs::write(var("WEIGHT_SHARING_OUT")?, json)?;
    Ok(())
}
