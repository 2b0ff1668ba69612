//! The ONNX path against NeMo's own outputs on the checked-in fixtures, for each export layout:
//! encoder output within 1e-4 relative L2 error; token ids, frames, durations and text identical
//! on every clip; a clip decoded inside a mixed-length batch gives its single-clip result.
//!
//! Needs ONNX Runtime: `ORT_DYLIB_PATH=.../onnxruntime/capi/libonnxruntime.so.<version>`.
//! Without it these tests skip loudly, unless `REQUIRE_ORT` is set (CI), where they fail.
//! `ONNX_PARITY_FIXTURES` points at another fixture root (default `tests/fixtures`).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};
use model_core::config::StftPadding;
use model_core::detokenize::Detokenizer;
use model_core::tdt::EncodedUtterance;
use model_core::transcript::Hypothesis;
use models::onnx::{
    find_dylib, ExecutionProvider, LayoutKind, OnnxModel, OnnxOptions, ORT_DYLIB_PATH,
};
use models::{Features, ModelError};
use serde_json::Value;

const MAX_REL_L2: f64 = 1e-4;

/// Whether ONNX Runtime is configured; panics when it is required but missing.
fn runtime_configured(test: &str) -> bool {
    if std::env::var_os(ORT_DYLIB_PATH).is_some_and(|v| !v.is_empty()) {
        return true;
    }
    if std::env::var_os("REQUIRE_ORT").is_some() {
        panic!("REQUIRE_ORT is set but {ORT_DYLIB_PATH} is not: cannot run {test}");
    }
    // Straight to the stderr handle: libtest captures `eprintln!` of passing tests.
    let _ = writeln!(
        std::io::stderr(),
        "\n!!!!! SKIPPING {test}: {ORT_DYLIB_PATH} is not set (pip install onnxruntime; \
         export {ORT_DYLIB_PATH}=$(python3 scripts/find_onnxruntime.py)) !!!!!\n"
    );
    false
}

fn fixtures_root() -> PathBuf {
    std::env::var_os("ONNX_PARITY_FIXTURES")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

/// Fixture models with an ONNX export (`<model>/onnx`); there must be at least one.
fn fixture_models() -> Result<Vec<PathBuf>> {
    let root = fixtures_root();
    let mut models = Vec::new();
    for entry in std::fs::read_dir(&root).with_context(|| root.display().to_string())? {
        let path = entry?.path();
        if path.join("expected.json").is_file() && path.join("onnx").is_dir() {
            models.push(path);
        }
    }
    models.sort();
    ensure!(
        !models.is_empty(),
        "no <model>/onnx fixtures under {}",
        root.display()
    );
    Ok(models)
}

/// A NeMo-layout copy of `<model>/onnx` with a stem other than `model` and no `config.json`
/// (links, so external weights keep their recorded names).
fn nemo_layout(model: &Path) -> Result<tempfile::TempDir> {
    let src = model.join("onnx");
    let dir = tempfile::tempdir()?;
    for entry in std::fs::read_dir(&src)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let target = match name.as_str() {
            "config.json" | "nemo128.onnx" => continue,
            "encoder-model.onnx" => "encoder-fixture.onnx".to_string(),
            "decoder_joint-model.onnx" => "decoder_joint-fixture.onnx".to_string(),
            other => other.to_string(),
        };
        std::os::unix::fs::symlink(entry.path(), dir.path().join(target))?;
    }
    Ok(dir)
}

/// Every layout of one fixture model: (expected kind, directory, keep-alive temp dir).
fn layouts(model: &Path) -> Result<Vec<(LayoutKind, PathBuf, Option<tempfile::TempDir>)>> {
    let nemo = nemo_layout(model)?;
    let mut out = vec![
        (LayoutKind::Nemo, nemo.path().to_path_buf(), Some(nemo)),
        (LayoutKind::OnnxAsr, model.join("onnx"), None),
    ];
    let sherpa = model.join("onnx-sherpa");
    if sherpa.is_dir() {
        out.push((LayoutKind::Sherpa, sherpa, None));
    } else if std::env::var_os("REQUIRE_ORT").is_some() {
        bail!("{} is missing", sherpa.display());
    }
    Ok(out)
}

fn options() -> OnnxOptions {
    OnnxOptions {
        // One thread per session: results must not depend on the machine's core count.
        intra_threads: Some(1),
        ..OnnxOptions::default()
    }
}

fn load(kind: LayoutKind, dir: &Path) -> Result<OnnxModel> {
    let model = OnnxModel::load(dir, &options()).with_context(|| dir.display().to_string())?;
    ensure!(
        model.layout().kind == kind,
        "{} detected as {:?}, expected {kind:?}",
        dir.display(),
        model.layout().kind
    );
    Ok(model)
}

fn expected(model: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(model.join("expected.json"))?;
    Ok(serde_json::from_str(&text)?)
}

fn clip_names(expected: &Value) -> Result<Vec<String>> {
    let clips = expected["clips"]
        .as_object()
        .context("expected.json: clips")?;
    Ok(clips.keys().cloned().collect())
}

fn wav(name: &str) -> Result<Vec<f32>> {
    let path = fixtures_root().join("clips").join(format!("{name}.wav"));
    let mut reader = hound::WavReader::open(&path).with_context(|| path.display().to_string())?;
    let spec = reader.spec();
    ensure!(
        spec.sample_rate == 16_000 && spec.channels == 1 && spec.bits_per_sample == 16,
        "{}: expected 16 kHz mono PCM16, got {spec:?}",
        path.display()
    );
    reader
        .samples::<i16>()
        .map(|s| Ok(f32::from(s?) / 32768.0))
        .collect()
}

/// `[d_model, T]` f32 tensor `name` from `expected.safetensors`.
fn reference_tensor(model: &Path, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(model.join("expected.safetensors"))?;
    let tensors = safetensors::SafeTensors::deserialize(&bytes)?;
    let view = tensors.tensor(name)?;
    ensure!(view.dtype() == safetensors::Dtype::F32, "{name}: not f32");
    let data = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok((view.shape().to_vec(), data))
}

fn usizes(v: &Value) -> Result<Vec<usize>> {
    v.as_array()
        .context("expected an array")?
        .iter()
        .map(|x| {
            x.as_u64()
                .map(|x| x as usize)
                .context("expected an integer")
        })
        .collect()
}

/// Relative L2 error of our `[frames, dim]` encoder output against NeMo's `[dim, frames]`.
fn encoder_error(enc: &EncodedUtterance, shape: &[usize], reference: &[f32]) -> Result<f64> {
    ensure!(
        shape == [enc.dim, enc.frames],
        "encoder output [{}, {}], NeMo {shape:?}",
        enc.dim,
        enc.frames
    );
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for d in 0..enc.dim {
        for t in 0..enc.frames {
            let r = f64::from(reference[d * enc.frames + t]);
            let x = f64::from(enc.data[t * enc.dim + d]);
            err += (x - r) * (x - r);
            norm += r * r;
        }
    }
    Ok((err / norm.max(f64::MIN_POSITIVE)).sqrt())
}

/// Features of near-silent clips (the log guard flattens mel rows and per-feature
/// normalisation divides f32 rounding by a tiny deviation) cannot come within 1e-4 of NeMo's f32
/// values; `parity_native.rs` holds the extractor to an exact f64 reference there. Such a
/// clip's encoder output may then differ by as much as its features do (times this factor),
/// and by no more than [`MAX_FEATURE_REL_L2`], beyond which the extractor is simply wrong.
const ENCODER_OVER_FEATURE_ERROR: f64 = 10.0;
const MAX_FEATURE_REL_L2: f64 = 1e-2;

fn rel_l2(ours: &[f32], reference: &[f32]) -> f64 {
    let (err, norm) = ours
        .iter()
        .zip(reference)
        .fold((0.0f64, 0.0f64), |(e, n), (x, r)| {
            let (x, r) = (f64::from(*x), f64::from(*r));
            (e + (x - r) * (x - r), n + r * r)
        });
    (err / norm.max(f64::MIN_POSITIVE)).sqrt()
}

/// Encoder output against NeMo for every clip, layout and fixture model, with features from
/// `features_of(model, model_dir, clip)`: within 1e-4, unless the features themselves are
/// further than that from NeMo's (see [`ENCODER_OVER_FEATURE_ERROR`]).
fn check_encoder(
    test: &str,
    mut features_of: impl FnMut(&mut OnnxModel, &Path, &str) -> Result<Features>,
) -> Result<()> {
    if !runtime_configured(test) {
        return Ok(());
    }
    let mut failures = Vec::new();
    for model_dir in fixture_models()? {
        let exp = expected(&model_dir)?;
        for (kind, dir, _keep) in layouts(&model_dir)? {
            let mut model = load(kind, &dir)?;
            let mut worst = 0.0f64;
            for clip in clip_names(&exp)? {
                let feats = features_of(&mut model, &model_dir, &clip)?;
                let (shape, nemo_feats) =
                    reference_tensor(&model_dir, &format!("features/{clip}"))?;
                ensure!(
                    shape == [feats.n_mels, feats.n_frames],
                    "{kind:?} {clip}: features [{}, {}], NeMo {shape:?}",
                    feats.n_mels,
                    feats.n_frames
                );
                let feature_err = rel_l2(&feats.data, &nemo_feats);
                let enc = model.encode(&feats)?;
                let (shape, reference) = reference_tensor(&model_dir, &format!("encoder/{clip}"))?;
                let rel = encoder_error(&enc, &shape, &reference)
                    .with_context(|| format!("{kind:?} {clip}"))?;
                let bound = if feature_err <= MAX_REL_L2 {
                    MAX_REL_L2
                } else {
                    eprintln!(
                        "{test}: {kind:?} {clip}: features {feature_err:.2e} from NeMo's \
                         (ill-conditioned), encoder {rel:.2e}"
                    );
                    ENCODER_OVER_FEATURE_ERROR * feature_err
                };
                if feature_err <= MAX_REL_L2 {
                    worst = worst.max(rel);
                }
                if rel > bound || feature_err > MAX_FEATURE_REL_L2 {
                    failures.push(format!(
                        "{} {kind:?} {clip}: encoder {rel:.3e} (bound {bound:.1e}), \
                         features {feature_err:.3e}",
                        model_dir.display()
                    ));
                }
            }
            eprintln!(
                "{test}: {} {kind:?}: max encoder relative L2 {worst:.2e} (well-conditioned clips)",
                model_dir.display()
            );
        }
    }
    ensure!(
        failures.is_empty(),
        "encoder output too far from NeMo's:\n{}",
        failures.join("\n")
    );
    Ok(())
}

/// The ONNX graphs alone: NeMo's recorded features in, NeMo's encoder output expected.
#[test]
fn encoder_matches_nemo_on_nemo_features() -> Result<()> {
    check_encoder(
        "encoder_matches_nemo_on_nemo_features",
        |_, model_dir, clip| {
            let (shape, data) = reference_tensor(model_dir, &format!("features/{clip}"))?;
            let [n_mels, n_frames] = shape[..] else {
                bail!("features/{clip}: shape {shape:?}");
            };
            Ok(Features {
                n_mels,
                n_frames,
                data,
            })
        },
    )
}

/// Audio in: the model's own features (Rust extractor or the export's preprocessor graph).
#[test]
fn encoder_matches_nemo_from_audio() -> Result<()> {
    check_encoder("encoder_matches_nemo_from_audio", |model, _, clip| {
        Ok(model.features(&wav(clip)?)?)
    })
}

/// `(ids, frames, durations)` of a hypothesis.
fn token_fields(hyp: &Hypothesis) -> [Vec<usize>; 3] {
    [
        hyp.tokens.iter().map(|t| t.id as usize).collect(),
        hyp.tokens.iter().map(|t| t.frame).collect(),
        hyp.tokens.iter().map(|t| t.duration).collect(),
    ]
}

/// NeMo's single-clip `(token_ids, token_frames, token_durations)`.
fn expected_fields(clip: &Value) -> Result<[Vec<usize>; 3]> {
    Ok([
        usizes(&clip["token_ids"])?,
        usizes(&clip["token_frames"])?,
        usizes(&clip["token_durations"])?,
    ])
}

#[test]
fn tokens_match_nemo_for_every_layout() -> Result<()> {
    if !runtime_configured("tokens_match_nemo_for_every_layout") {
        return Ok(());
    }
    for model_dir in fixture_models()? {
        let exp = expected(&model_dir)?;
        let max_symbols = exp["model"]["max_symbols"]
            .as_u64()
            .context("max_symbols")? as usize;
        let durations = usizes(&exp["model"]["durations"])?;
        let mut emitted = 0;
        for (kind, dir, _keep) in layouts(&model_dir)? {
            let mut model = load(kind, &dir)?;
            let cfg = model.decoder_config().clone();
            ensure!(
                cfg.durations == durations,
                "{kind:?}: durations {:?}",
                cfg.durations
            );
            ensure!(
                cfg.max_symbols_per_step == max_symbols,
                "{kind:?}: max_symbols"
            );
            ensure!(
                cfg.vocab_size
                    == exp["model"]["vocab_size"].as_u64().context("vocab_size")? as usize,
                "{kind:?}: vocab size {}",
                cfg.vocab_size
            );
            let detok = Detokenizer::new(model.vocabulary());
            for clip in clip_names(&exp)? {
                let want = &exp["clips"][&clip];
                let pcm = wav(&clip)?;
                let hyp = model.transcribe_batch(&[&pcm])?.remove(0);
                let got = token_fields(&hyp);
                ensure!(
                    got == expected_fields(want)?,
                    "{kind:?} {clip}: (ids, frames, durations) {got:?} differ from NeMo's"
                );
                let ids: Vec<u32> = hyp.tokens.iter().map(|t| t.id).collect();
                let text = detok.decode(&ids);
                ensure!(
                    Some(text.as_str()) == want["text"].as_str(),
                    "{kind:?} {clip}: text {text:?} vs NeMo {:?}",
                    want["text"]
                );
                emitted += ids.len();
            }
        }
        ensure!(
            emitted > 0,
            "{}: no tokens decoded at all",
            model_dir.display()
        );
    }
    Ok(())
}

#[test]
fn batch_matches_single_for_every_layout() -> Result<()> {
    if !runtime_configured("batch_matches_single_for_every_layout") {
        return Ok(());
    }
    for model_dir in fixture_models()? {
        let exp = expected(&model_dir)?;
        let names = clip_names(&exp)?;
        let clips: Vec<Vec<f32>> = names.iter().map(|n| wav(n)).collect::<Result<_>>()?;
        let lengths: std::collections::BTreeSet<usize> = clips.iter().map(Vec::len).collect();
        ensure!(lengths.len() > 1, "the batch must mix clip lengths");
        for (kind, dir, _keep) in layouts(&model_dir)? {
            let mut model = load(kind, &dir)?;
            let refs: Vec<&[f32]> = clips.iter().map(Vec::as_slice).collect();
            let batched = model.transcribe_batch(&refs)?;
            for ((name, pcm), hyp) in names.iter().zip(&clips).zip(&batched) {
                let single = model.transcribe_batch(&[pcm])?.remove(0);
                ensure!(
                    &single == hyp,
                    "{kind:?} {name}: batch result differs from single"
                );
                // NeMo's single-clip record is the ground truth inside a batch too (NeMo's
                // own batch durations are off: see fixtures/README.md).
                ensure!(
                    token_fields(hyp) == expected_fields(&exp["clips"][name])?,
                    "{kind:?} {name}: batch result differs from NeMo's single-clip record"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn layout_errors_list_what_was_found() -> Result<()> {
    let empty = tempfile::tempdir()?;
    match OnnxModel::load(empty.path(), &options()) {
        Err(ModelError::OnnxLayout { found, .. }) => ensure!(found.is_empty(), "{found:?}"),
        other => bail!("empty directory: {other:?}"),
    }
    let partial = tempfile::tempdir()?;
    for name in ["encoder-model.onnx", "decoder_joint-model.onnx"] {
        std::fs::write(partial.path().join(name), b"not a model")?;
    }
    let err = OnnxModel::load(partial.path(), &options()).expect_err("no vocabulary");
    let message = err.to_string();
    ensure!(
        matches!(err, ModelError::OnnxLayout { .. })
            && message.contains("vocab.txt or tokens.txt")
            && message.contains("decoder_joint-model.onnx, encoder-model.onnx"),
        "{message}"
    );
    Ok(())
}

#[test]
fn missing_runtime_library_is_a_typed_error() {
    let err = find_dylib(Some(Path::new("/nonexistent/libonnxruntime.so"))).expect_err("missing");
    assert!(matches!(err, ModelError::OnnxRuntime { .. }), "{err:?}");
    assert!(err.to_string().contains("ORT_DYLIB_PATH"), "{err}");
}

#[test]
fn gpu_provider_never_falls_back_to_cpu() -> Result<()> {
    if !runtime_configured("gpu_provider_never_falls_back_to_cpu") {
        return Ok(());
    }
    let model_dir = fixture_models()?.remove(0);
    for provider in [
        ExecutionProvider::Cuda { device_id: 0 },
        ExecutionProvider::TensorRt { device_id: 0 },
    ] {
        let opts = OnnxOptions {
            execution_provider: provider,
            ..options()
        };
        match OnnxModel::load(&model_dir.join("onnx"), &opts) {
            Err(ModelError::Onnx { problem, .. }) => {
                ensure!(problem.contains("execution provider"), "{problem}")
            }
            // A machine with a working GPU build of ONNX Runtime may load it.
            Ok(_) if gpu_runtime_present() => {}
            other => bail!("{provider:?} on a CPU-only runtime: {other:?}"),
        }
    }
    Ok(())
}

/// Whether the configured ONNX Runtime ships the CUDA provider library next to itself.
fn gpu_runtime_present() -> bool {
    std::env::var_os(ORT_DYLIB_PATH)
        .map(PathBuf::from)
        .and_then(|p| {
            p.parent()
                .map(|d| d.join("libonnxruntime_providers_cuda.so").is_file())
        })
        .unwrap_or(false)
}

#[test]
fn degenerate_audio_decodes_without_error() -> Result<()> {
    if !runtime_configured("degenerate_audio_decodes_without_error") {
        return Ok(());
    }
    let model_dir = fixture_models()?.remove(0);
    let speech = wav("espeak_us")?;
    let empty: Vec<f32> = Vec::new();
    let one = vec![0.1f32];
    let zeros = vec![0.0f32; 4_800];
    for (kind, dir, _keep) in layouts(&model_dir)? {
        let mut model = load(kind, &dir)?;
        let single = model.transcribe_batch(&[&speech])?.remove(0);
        let hyps = model.transcribe_batch(&[&empty, &one, &zeros, &speech])?;
        ensure!(
            hyps[0].tokens.is_empty(),
            "{kind:?}: tokens for empty audio"
        );
        ensure!(hyps[1].tokens.is_empty(), "{kind:?}: tokens for one sample");
        ensure!(
            hyps[3] == single,
            "{kind:?}: degenerate rows changed the speech row"
        );
        ensure!(
            model.transcribe_batch(&[])?.is_empty(),
            "{kind:?}: empty batch"
        );
    }
    Ok(())
}

#[test]
fn settings_come_from_the_checkpoint_and_options() -> Result<()> {
    if !runtime_configured("settings_come_from_the_checkpoint_and_options") {
        return Ok(());
    }
    let model_dir = fixture_models()?.remove(0);
    let exp = expected(&model_dir)?;
    let checkpoint = models::checkpoint::Checkpoint::load(&model_dir.join("model.nemo"))?;
    let opts = OnnxOptions {
        nemo_checkpoint: Some(model_dir.join("model.nemo")),
        ..options()
    };
    let mut model = OnnxModel::load(&model_dir.join("onnx"), &opts)?;
    ensure!(model.feature_config() == Some(&checkpoint.config.features));
    ensure!(model.decoder_config().durations == checkpoint.config.decoder.durations);
    ensure!(model.decoder_config().joint_hidden == checkpoint.config.decoder.joint_hidden);
    for clip in ["espeak_us", "long"] {
        let hyp = model.transcribe_batch(&[&wav(clip)?])?.remove(0);
        ensure!(
            token_fields(&hyp) == expected_fields(&exp["clips"][clip])?,
            "{clip}: tokens differ with the checkpoint's preprocessor"
        );
    }

    // Reflect padding (NeMo < 2.5) on request, checked against NeMo 2.3's own features.
    let reflect = OnnxOptions {
        stft_padding: Some(StftPadding::Reflect),
        ..options()
    };
    let mut model = OnnxModel::load(&model_dir.join("onnx"), &reflect)?;
    let clip = "espeak_us";
    let feats = model.features(&wav(clip)?)?;
    let (shape, reference) = reference_tensor(&model_dir, &format!("features_reflect/{clip}"))?;
    ensure!(
        shape == [feats.n_mels, feats.n_frames],
        "reflect features {shape:?}"
    );
    let rel = rel_l2(&feats.data, &reference);
    ensure!(rel <= MAX_REL_L2, "reflect features relative L2 {rel:.3e}");

    let wrong = OnnxOptions {
        durations: Some(vec![0, 1, 2]),
        ..options()
    };
    match OnnxModel::load(&model_dir.join("onnx"), &wrong) {
        Err(ModelError::InvalidConfig { key, .. }) => ensure!(key == "durations"),
        other => bail!("3 durations for a 5-duration joint: {other:?}"),
    }
    Ok(())
}
