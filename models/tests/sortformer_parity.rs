//! Streaming Sortformer on the CPU against what NeMo 3.0.0 recorded for the random-weight
//! fixture `tests/fixtures/sortformer-tiny/` (scripts/fixtures/generate_sortformer.py):
//! per-chunk speaker probabilities within 1e-4 relative L2, the speaker cache / FIFO / silence
//! profile after every chunk, and identical post-processed segments; plus typed errors for bad
//! configs and tensors.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, ensure, Context, Result};
use models::checkpoint::TensorMap;
use models::sortformer::{PostProcessing, SortformerCheckpoint, SortformerModel, StreamingState};
use models::ModelError;
use saphyr::{LoadableYamlNode, Mapping, Scalar, Yaml, YamlEmitter};
use serde_json::Value;

const MAX_REL_L2: f64 = 1e-4;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sortformer-tiny")
}

fn expected() -> Result<Value> {
    let path = fixture_dir().join("expected.json");
    Ok(serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| path.display().to_string())?,
    )?)
}

fn read_wav(path: &Path) -> Result<Vec<f32>> {
    let mut reader = hound::WavReader::open(path).with_context(|| path.display().to_string())?;
    let spec = reader.spec();
    ensure!(
        spec.channels == 1 && spec.sample_rate == 16000 && spec.bits_per_sample == 16,
        "{spec:?}"
    );
    reader
        .samples::<i16>()
        .map(|s| Ok(s? as f32 / 32768.0))
        .collect()
}

type NamedTensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

fn read_safetensors(path: &Path) -> Result<NamedTensors> {
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

fn rel_l2(ours: &[f32], theirs: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (a, b) in ours.iter().zip(theirs) {
        num += (*a as f64 - *b as f64).powi(2);
        den += (*b as f64).powi(2);
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

fn model() -> Result<SortformerModel> {
    Ok(SortformerModel::load(&fixture_dir().join("model.nemo"))?)
}

fn clip_audio(clip: &Value) -> Result<Vec<f32>> {
    let wav = clip["wav"]
        .as_str()
        .ok_or_else(|| anyhow!("clip has no wav"))?;
    read_wav(&fixture_dir().parent().expect("fixtures dir").join(wav))
}

/// Our per-step chunk probabilities and state snapshots.
struct Recorded {
    probs: Vec<f32>,
    steps: Vec<(Vec<f32>, StreamingState, usize, usize)>,
}

fn run(model: &SortformerModel, pcm: &[f32]) -> Result<Recorded> {
    let mut steps = Vec::new();
    let probs = model.probabilities_with(pcm, |step| {
        steps.push((
            step.chunk_probs.to_vec(),
            step.state.clone(),
            step.span.left_context,
            step.span.right_context,
        ))
    })?;
    Ok(Recorded { probs, steps })
}

/// Compares `ours` with NeMo's `<clip>/<step>/<key>`; returns the rel L2 (shape must match).
fn compare(tensors: &NamedTensors, name: &str, ours: &[f32], rows: usize) -> Result<f64> {
    let (shape, theirs) = tensors
        .get(name)
        .ok_or_else(|| anyhow!("{name} not recorded"))?;
    ensure!(
        shape.first().copied() == Some(rows) && theirs.len() == ours.len(),
        "{name}: NeMo shape {shape:?}, ours {rows} rows / {} values",
        ours.len()
    );
    Ok(rel_l2(ours, theirs))
}

#[test]
fn streaming_probabilities_and_state_match_nemo_after_every_chunk() -> Result<()> {
    let model = model()?;
    let expected = expected()?;
    let tensors = read_safetensors(&fixture_dir().join("expected.safetensors"))?;
    let clips = expected["clips"]
        .as_object()
        .ok_or_else(|| anyhow!("no clips"))?;
    ensure!(clips.len() >= 2, "fixture should have at least two clips");
    let k = model.num_speakers();
    for (name, clip) in clips {
        let rec = run(&model, &clip_audio(clip)?)?;
        let steps = clip["steps"]
            .as_array()
            .ok_or_else(|| anyhow!("no steps"))?;
        ensure!(
            rec.steps.len() == steps.len(),
            "{name}: {} chunks, NeMo {}",
            rec.steps.len(),
            steps.len()
        );
        let mut worst: BTreeMap<&str, f64> = BTreeMap::new();
        for (i, ((chunk_probs, state, lc, rc), nemo)) in rec.steps.iter().zip(steps).enumerate() {
            let at = |key: &str| format!("{name}/{i:03}/{key}");
            ensure!(
                (*lc as u64, *rc as u64)
                    == (
                        nemo["lc"].as_u64().unwrap_or(99),
                        nemo["rc"].as_u64().unwrap_or(99)
                    ),
                "{name} step {i}: context ({lc}, {rc}) vs NeMo {nemo}"
            );
            let frames = |key: &str| nemo[key].as_u64().map(|n| n as usize);
            ensure!(
                Some(chunk_probs.len() / k) == frames("chunk_frames")
                    && Some(state.spkcache_frames()) == frames("spkcache_frames")
                    && Some(state.fifo_frames()) == frames("fifo_frames")
                    && Some(state.n_sil_frames) == frames("n_sil_frames")
                    && state.spkcache_preds.is_some() == nemo["has_spkcache_preds"].as_bool().unwrap_or(false),
                "{name} step {i}: chunk {} cache {} fifo {} silent {} cache preds {} vs NeMo {nemo}",
                chunk_probs.len() / k,
                state.spkcache_frames(),
                state.fifo_frames(),
                state.n_sil_frames,
                state.spkcache_preds.is_some()
            );
            let mut check = |key: &'static str, ours: &[f32], rows: usize| -> Result<()> {
                if rows == 0 {
                    return Ok(());
                }
                let err = compare(&tensors, &at(key), ours, rows)?;
                ensure!(err <= MAX_REL_L2, "{name} step {i} {key}: rel L2 {err:.3e}");
                let w = worst.entry(key).or_insert(0.0);
                *w = w.max(err);
                Ok(())
            };
            check("chunk_preds", chunk_probs, chunk_probs.len() / k)?;
            check("spkcache", &state.spkcache, state.spkcache_frames())?;
            check("fifo", &state.fifo, state.fifo_frames())?;
            check("fifo_preds", &state.fifo_preds, state.fifo_frames())?;
            if let Some(p) = &state.spkcache_preds {
                check("spkcache_preds", p, state.spkcache_frames())?;
            }
            if state.n_sil_frames > 0 {
                check(
                    "mean_sil_emb",
                    &state.mean_sil_emb,
                    state.mean_sil_emb.len(),
                )?;
            }
        }
        println!("{name}: {} chunks, worst rel L2 {worst:?}", rec.steps.len());
    }
    Ok(())
}

#[test]
fn recording_longer_than_the_cache_gives_nemos_result() -> Result<()> {
    let model = model()?;
    let expected = expected()?;
    let tensors = read_safetensors(&fixture_dir().join("expected.safetensors"))?;
    let s = model.streaming_params().clone();
    let k = model.num_speakers();
    let mut checked = 0;
    for (name, clip) in expected["clips"]
        .as_object()
        .ok_or_else(|| anyhow!("no clips"))?
    {
        let frames = clip["frames"].as_u64().unwrap_or(0) as usize;
        if frames <= 2 * (s.spkcache_len_frames + s.fifo_len_frames) {
            continue;
        }
        let rec = run(&model, &clip_audio(clip)?)?;
        let compressions = rec
            .steps
            .iter()
            .filter(|(_, st, ..)| st.spkcache_preds.is_some())
            .count();
        ensure!(
            compressions >= 5,
            "{name}: the cache was compressed at only {compressions} steps"
        );
        for (_, state, ..) in &rec.steps {
            ensure!(
                state.spkcache_frames() <= s.spkcache_len_frames
                    && state.fifo_frames() <= s.fifo_len_frames.max(s.chunk_len_frames),
                "{name}: state outgrew its bounds"
            );
        }
        ensure!(
            rec.probs.len() == frames * k,
            "{name}: {} values for {frames} frames",
            rec.probs.len()
        );
        let err = compare(&tensors, &format!("{name}/total_preds"), &rec.probs, frames)?;
        println!("{name}: {frames} frames, {compressions} compressions, whole-recording rel L2 {err:.3e}");
        ensure!(err <= MAX_REL_L2, "{name}: rel L2 {err:.3e}");
        checked += 1;
    }
    ensure!(
        checked > 0,
        "no fixture clip is longer than twice the cache + FIFO"
    );
    Ok(())
}

#[test]
fn overridden_streaming_params_match_nemo() -> Result<()> {
    let expected = expected()?;
    let tensors = read_safetensors(&fixture_dir().join("expected.safetensors"))?;
    let presets = expected["presets"]
        .as_object()
        .ok_or_else(|| anyhow!("no presets"))?;
    ensure!(
        presets.len() >= 2,
        "fixture should record at least two presets"
    );
    for (preset, rec) in presets {
        let mut model = model()?;
        let mut params = model.streaming_params().clone();
        let p = &rec["params"];
        let get = |k: &str| {
            p[k].as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| anyhow!("{preset}: no {k}"))
        };
        params.chunk_len_frames = get("chunk_len")?;
        params.chunk_left_context_frames = get("chunk_left_context")?;
        params.chunk_right_context_frames = get("chunk_right_context")?;
        params.fifo_len_frames = get("fifo_len")?;
        params.spkcache_len_frames = get("spkcache_len")?;
        params.spkcache_update_period_frames = get("spkcache_update_period")?;
        model.set_streaming_params(params)?;
        let clip = rec["clip"].as_str().ok_or_else(|| anyhow!("no clip"))?;
        let pcm = read_wav(&fixture_dir().join(format!("{clip}.wav")))?;
        let ran = run(&model, &pcm)?;
        let sizes: Vec<Vec<u64>> = serde_json::from_value(rec["steps_spkcache_fifo_sil"].clone())?;
        let ours: Vec<Vec<u64>> = ran
            .steps
            .iter()
            .map(|(_, s, ..)| {
                vec![
                    s.spkcache_frames() as u64,
                    s.fifo_frames() as u64,
                    s.n_sil_frames as u64,
                ]
            })
            .collect();
        ensure!(
            ours == sizes,
            "{preset}: cache/FIFO/silence sizes per step differ\n ours: {ours:?}\n NeMo: {sizes:?}"
        );
        let frames = rec["frames"].as_u64().unwrap_or(0) as usize;
        let err = compare(
            &tensors,
            &format!("{preset}/total_preds"),
            &ran.probs,
            frames,
        )?;
        ensure!(
            err <= MAX_REL_L2,
            "{preset}: probabilities rel L2 {err:.3e}"
        );
        let (_, last, ..) = ran.steps.last().ok_or_else(|| anyhow!("no steps"))?;
        let mut worst = err;
        for (key, ours, rows) in [
            ("spkcache", &last.spkcache, last.spkcache_frames()),
            ("fifo", &last.fifo, last.fifo_frames()),
            ("mean_sil_emb", &last.mean_sil_emb, last.mean_sil_emb.len()),
        ] {
            if rows > 0 && !(key == "mean_sil_emb" && last.n_sil_frames == 0) {
                let e = compare(&tensors, &format!("{preset}/final/{key}"), ours, rows)?;
                ensure!(e <= MAX_REL_L2, "{preset}: final {key} rel L2 {e:.3e}");
                worst = worst.max(e);
            }
        }
        println!("{preset}: {} chunks, probabilities rel L2 {err:.3e}, worst incl. final state {worst:.3e}", ran.steps.len());
    }
    Ok(())
}

fn post_processing(value: &Value) -> Result<PostProcessing> {
    let get = |k: &str| {
        value[k]
            .as_f64()
            .ok_or_else(|| anyhow!("postprocessing has no {k}"))
    };
    Ok(PostProcessing {
        onset_threshold: get("onset")?,
        offset_threshold: get("offset")?,
        pad_onset_s: get("pad_onset")?,
        pad_offset_s: get("pad_offset")?,
        min_duration_on_s: get("min_duration_on")?,
        min_duration_off_s: get("min_duration_off")?,
    })
}

#[test]
fn post_processed_segments_are_identical_to_nemos() -> Result<()> {
    let mut model = model()?;
    let expected = expected()?;
    let sets = expected["postprocessing"]
        .as_object()
        .ok_or_else(|| anyhow!("no postprocessing"))?;
    ensure!(
        post_processing(&sets["dihard3"])? == PostProcessing::default(),
        "the DIHARD3 set recorded differs from PostProcessing::default()"
    );
    for (name, clip) in expected["clips"]
        .as_object()
        .ok_or_else(|| anyhow!("no clips"))?
    {
        let pcm = clip_audio(clip)?;
        let probs = model.probabilities(&pcm)?;
        for (set, params) in sets {
            model.set_post_processing(post_processing(params)?);
            let ours = if set == "dihard3" {
                model.diarize(&pcm)?
            } else {
                model.segments(&probs)
            };
            let mut ours: Vec<String> = ours
                .iter()
                .map(|s| format!("{:.3} {:.3} {}", s.start_s, s.end_s, s.label()))
                .collect();
            let mut theirs: Vec<String> = clip["segments"][set]
                .as_array()
                .ok_or_else(|| anyhow!("no segments for {set}"))?
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            ensure!(
                theirs.len() > 3,
                "{name}/{set}: NeMo's segments are trivial"
            );
            ours.sort();
            theirs.sort();
            if ours != theirs {
                bail!("{name}/{set}: segments differ\n ours:  {ours:?}\n NeMo: {theirs:?}");
            }
            println!("{name}/{set}: {} identical segments", ours.len());
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Errors

fn members() -> Result<Vec<(String, Vec<u8>)>> {
    let mut archive = tar::Archive::new(std::fs::File::open(fixture_dir().join("model.nemo"))?);
    let mut out = Vec::new();
    for entry in archive.entries()? {
        let mut entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path()?.to_string_lossy().into_owned();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes)?;
        out.push((name, bytes));
    }
    Ok(out)
}

/// Loads the fixture with `model_config.yaml` edited by `edit` (on the parsed YAML).
fn load_with_config(
    edit: impl Fn(&mut Yaml<'static>),
) -> Result<Result<SortformerModel, ModelError>> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, mut bytes) in members()? {
        if name.ends_with("model_config.yaml") {
            let mut documents: Vec<Yaml<'static>> =
                Yaml::load_from_str(std::str::from_utf8(&bytes)?)?;
            ensure!(
                documents.len() == 1,
                "{name}: {} documents",
                documents.len()
            );
            edit(&mut documents[0]);
            let mut text = String::new();
            YamlEmitter::new(&mut text).dump(&documents[0])?;
            bytes = text.into_bytes();
        }
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, &name, bytes.as_slice())?;
    }
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("model.nemo");
    std::fs::write(&path, builder.into_inner()?)?;
    Ok(SortformerModel::load(&path))
}

/// Sets dotted `path` to the YAML scalar `value` (e.g. `"4"`, `"gelu"`, `"true"`), adding
/// missing mappings on the way.
fn set(yaml: &mut Yaml<'static>, path: &str, value: &'static str) {
    let mut node = yaml;
    for part in path.split('.') {
        let key = Yaml::Value(Scalar::String(part.to_string().into()));
        node = node
            .as_mapping_mut()
            .unwrap_or_else(|| panic!("`{path}` does not go through mappings"))
            .entry(key)
            .or_insert_with(|| Yaml::Mapping(Mapping::new()));
    }
    *node = Yaml::value_from_str(value);
}

/// A load result for messages (the model itself is too big to print).
fn outcome(result: &Result<SortformerModel, ModelError>) -> String {
    match result {
        Ok(_) => "loaded".into(),
        Err(e) => format!("error {e:?}"),
    }
}

#[test]
fn bad_configs_give_typed_errors() -> Result<()> {
    let cases = [
        ("sortformer_modules.spkcache_len", "4", "spkcache_len"),
        ("sortformer_modules.chunk_len", "0", "chunk_len"),
        ("transformer_encoder.hidden_act", "gelu", "hidden_act"),
        ("transformer_encoder.pre_ln", "true", "pre_ln"),
        ("transformer_encoder.num_layers", "1", "num_layers"),
        (
            "transformer_encoder.num_attention_heads",
            "5",
            "num_attention_heads",
        ),
        ("sortformer_modules.tf_d_model", "48", "tf_d_model"),
        ("max_num_of_spks", "3", "max_num_of_spks"),
        ("encoder.subsampling", "striding", "subsampling"),
    ];
    for (key, value, expect_key) in cases {
        match load_with_config(|y| set(y, key, value))? {
            Ok(_) => bail!("{key} = {value:?} loaded"),
            Err(
                ModelError::InvalidConfig { key: k, .. }
                | ModelError::UnsupportedConfig { key: k, .. },
            ) => {
                ensure!(k.ends_with(expect_key), "{key}: error names `{k}`")
            }
            Err(other) => bail!("{key}: unexpected error {other}"),
        }
    }
    // A wider transformer than the weights: the first tensor read says so, by name.
    match load_with_config(|y| {
        set(y, "transformer_encoder.hidden_size", "48");
        set(y, "sortformer_modules.tf_d_model", "48");
        set(y, "model_defaults.tf_d_model", "48");
    })? {
        Err(ModelError::TensorShape { name, .. }) => ensure!(
            name.starts_with("sortformer_modules.encoder_proj"),
            "{name}"
        ),
        other => bail!("expected a TensorShape error, got {}", outcome(&other)),
    }
    Ok(())
}

#[test]
fn missing_or_misshapen_tensors_give_typed_errors() -> Result<()> {
    let ckpt = SortformerCheckpoint::load(&fixture_dir().join("model.nemo"))?;
    let rebuilt = |drop: &str, reshape: Option<&str>| -> TensorMap {
        let tensors = ckpt
            .tensors
            .names()
            .filter(|n| *n != drop)
            .map(|n| {
                let mut t = ckpt.tensors.get_any_shape(n).expect("listed").clone();
                if reshape == Some(n) {
                    t.shape = vec![1, t.numel()];
                }
                (n.to_string(), t)
            })
            .collect();
        TensorMap::new(ckpt.tensors.source.clone(), tensors)
    };
    for name in [
        "transformer_encoder.layers.1.second_sub_layer.dense_out.weight",
        "sortformer_modules.single_hidden_to_spks.bias",
        "encoder.layers.0.self_attn.linear_q.weight",
        "encoder.pre_encode.out.weight",
    ] {
        let bad = SortformerCheckpoint {
            config: ckpt.config.clone(),
            tensors: rebuilt(name, None),
        };
        match SortformerModel::from_checkpoint(&bad) {
            Err(ModelError::MissingTensor { name: n, .. }) => ensure!(n == name, "{n} vs {name}"),
            other => bail!("dropping {name}: {}", outcome(&other)),
        }
        let bad = SortformerCheckpoint {
            config: ckpt.config.clone(),
            tensors: rebuilt("", Some(name)),
        };
        match SortformerModel::from_checkpoint(&bad) {
            Err(ModelError::TensorShape { name: n, .. }) => ensure!(n == name, "{n} vs {name}"),
            other => bail!("reshaping {name}: {}", outcome(&other)),
        }
    }
    Ok(())
}

#[test]
fn chunk_features_equal_whole_recording_features() -> Result<()> {
    let model = model()?;
    let pcm = read_wav(&fixture_dir().join("three_speakers.wav"))?;
    let total = pcm.len() / model.config().features.hop_length_samples;
    let whole = model.feature_frames(&pcm, 0, total);
    ensure!(
        whole.n_frames == total,
        "{} of {total} frames",
        whole.n_frames
    );
    let mut spans = model.chunk_spans(total);
    ensure!(spans.len() > 10, "{} chunks", spans.len());
    spans.truncate(12);
    for span in spans {
        let chunk = model.feature_frames(&pcm, span.first_frame, span.last_frame);
        let n = span.last_frame - span.first_frame;
        ensure!(chunk.n_frames == n, "{span:?}: {} frames", chunk.n_frames);
        let expected: Vec<f32> = whole
            .data
            .chunks_exact(total)
            .flat_map(|row| row[span.first_frame..span.last_frame].iter().copied())
            .collect();
        let err = rel_l2(&chunk.data, &expected);
        ensure!(err <= 1e-6, "{span:?}: rel L2 {err:.3e}");
    }
    Ok(())
}

#[test]
fn short_and_empty_inputs_are_handled() -> Result<()> {
    let model = model()?;
    assert!(model.diarize(&[])?.is_empty());
    assert!(model.probabilities(&[0.0; 100])?.is_empty());
    // Shorter than one chunk: one step, ceil(frames / 8) rows.
    let probs = model.probabilities(&vec![0.01; 16000])?;
    ensure!(
        probs.len() == 13 * model.num_speakers(),
        "{} values",
        probs.len()
    );
    ensure!(probs.iter().all(|p| (0.0..=1.0).contains(p)));
    // Spans outside the recording give no frames.
    let pcm = vec![0.01; 16000];
    ensure!(model.feature_frames(&pcm, 500, 600).n_frames == 0);
    ensure!(model.feature_frames(&pcm, 50, 10).n_frames == 0);
    ensure!(model.feature_frames(&pcm, 90, 120).n_frames == 10);
    let mut bad = vec![0.0; 16000];
    bad[123] = f32::NAN;
    ensure!(matches!(model.diarize(&bad), Err(ModelError::Decode(_))));
    // A state from another model, or edited out of shape, is refused, not a panic.
    let chunk = model.feature_frames(&vec![0.01; 16000], 0, 100);
    let mut state = StreamingState::new(model.config().encoder.d_model + 1, model.num_speakers());
    ensure!(matches!(
        model.step(&mut state, &chunk, 0, 0),
        Err(ModelError::Decode(_))
    ));
    let mut state = StreamingState::new(model.config().encoder.d_model, model.num_speakers());
    state.fifo.push(1.0);
    ensure!(matches!(
        model.step(&mut state, &chunk, 0, 0),
        Err(ModelError::Decode(_))
    ));
    Ok(())
}

/// A full-size Streaming Sortformer 4spk v2 `.nemo` (scripts/make_full_size_sortformer.py, random
/// weights): loads, streams 45 s in 15 s chunks with bounded state, and reports milliseconds per
/// chunk. `SORTFORMER_FULL_NEMO=/path/model.nemo cargo test --release -- --ignored full_size`.
#[test]
#[ignore = "needs SORTFORMER_FULL_NEMO (a ~0.5 GB generated checkpoint)"]
fn full_size_checkpoint_streams_in_bounded_state() -> Result<()> {
    let path = std::env::var("SORTFORMER_FULL_NEMO").context("set SORTFORMER_FULL_NEMO")?;
    let started = std::time::Instant::now();
    let model = SortformerModel::load(Path::new(&path))?;
    let cfg = model.config();
    println!(
        "loaded in {:.1} s: {} x {} conformer, {} x {} transformer, chunk {} / FIFO {} / cache {} frames",
        started.elapsed().as_secs_f64(),
        cfg.encoder.n_layers,
        cfg.encoder.d_model,
        cfg.transformer.n_layers,
        cfg.transformer.hidden,
        cfg.streaming.chunk_len_frames,
        cfg.streaming.fifo_len_frames,
        cfg.streaming.spkcache_len_frames
    );
    // 45 s of a deterministic chirp-like signal.
    let pcm: Vec<f32> = (0..45 * 16000)
        .map(|i| {
            let t = i as f32 / 16000.0;
            0.3 * (2.0 * std::f32::consts::PI * (150.0 + 40.0 * (0.5 * t).sin()) * t).sin()
        })
        .collect();
    let mut last = std::time::Instant::now();
    let mut times = Vec::new();
    let s = cfg.streaming.clone();
    let probs = model.probabilities_with(&pcm, |step| {
        times.push(last.elapsed().as_secs_f64() * 1e3);
        last = std::time::Instant::now();
        assert!(step.state.spkcache_frames() <= s.spkcache_len_frames);
        assert!(step.state.fifo_frames() <= s.fifo_len_frames.max(s.chunk_len_frames));
    })?;
    ensure!(probs.iter().all(|p| (0.0..=1.0).contains(p)));
    println!("ms per chunk: {times:.0?}");
    Ok(())
}
