//! Loading the checked-in NeMo fixture: the resolved config must match what the generator
//! recorded in `expected.json`, the state dict must hold every tensor the architecture needs
//! with the right shape, and the stored values must decode exactly.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use model_core::config::{AttentionModel, FeatureNormalization, StftPadding};
use models::checkpoint::{Checkpoint, LoadOptions};
use serde_json::Value;

/// The NeMo-built fixtures (see `tests/fixtures/README.md`): the real model's options, and
/// local attention with biases and no joint dropout.
const FIXTURES: [&str; 2] = ["tdt-real-options", "tdt-local-attn"];

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn expected(name: &str) -> Result<Value> {
    let text = std::fs::read_to_string(fixture_dir(name).join("expected.json"))?;
    Ok(serde_json::from_str(&text)?)
}

fn num(v: &Value, key: &str) -> Result<usize> {
    v[key]
        .as_u64()
        .map(|n| n as usize)
        .with_context(|| format!("expected.json model.{key} is not an integer"))
}

fn load_fixture(name: &str) -> Result<Checkpoint> {
    Checkpoint::load(&fixture_dir(name).join("model.nemo"))
        .with_context(|| format!("loading fixture {name}"))
}

#[test]
fn config_matches_the_generator_record() -> Result<()> {
    for name in FIXTURES {
        config_matches(name)?;
    }
    Ok(())
}

fn config_matches(name: &str) -> Result<()> {
    let exp = expected(name)?;
    let m = &exp["model"];
    let ckpt = load_fixture(name)?;
    let c = &ckpt.config;

    assert_eq!(c.features.n_mels, num(m, "n_mels")?);
    assert_eq!(c.features.sample_rate_hz, 16_000);
    assert_eq!(c.features.win_length_samples, 400);
    assert_eq!(c.features.hop_length_samples, 160);
    assert_eq!(c.features.n_fft, 512);
    assert_eq!(c.features.preemphasis, Some(0.97));
    assert_eq!(c.features.mag_power, 2.0);
    assert_eq!(c.features.log_zero_guard, 2f32.powi(-24));
    let normalization = match m["normalize"].as_str() {
        Some("per_feature") => FeatureNormalization::PerFeature,
        other => bail!("unexpected normalize {other:?} in expected.json"),
    };
    assert_eq!(c.features.normalization, normalization);

    let e = &c.encoder;
    assert_eq!(e.feat_in, num(m, "n_mels")?);
    assert_eq!(e.n_layers, num(m, "n_layers")?);
    assert_eq!(e.d_model, num(m, "d_model")?);
    assert_eq!(e.n_heads, num(m, "n_heads")?);
    assert_eq!(
        e.ff_hidden,
        num(m, "d_model")? * num(m, "ff_expansion_factor")?
    );
    assert_eq!(m["subsampling"], "dw_striding");
    assert_eq!(e.subsampling_factor, num(m, "subsampling_factor")?);
    assert_eq!(
        e.subsampling_conv_channels,
        num(m, "subsampling_conv_channels")?
    );
    assert_eq!(Some(e.xscaling), m["xscaling"].as_bool());
    assert_eq!(Some(e.use_bias), m["use_bias"].as_bool());
    assert_eq!(e.conv_kernel_size, num(m, "conv_kernel_size")?);
    let context: Vec<i64> = serde_json::from_value(m["att_context_size"].clone())?;
    let attention = match (m["self_attention_model"].as_str(), context.as_slice()) {
        (Some("rel_pos"), _) => AttentionModel::RelPos,
        (Some("rel_pos_local_attn"), &[l, r]) => AttentionModel::RelPosLocal {
            left: l as usize,
            right: r as usize,
        },
        other => bail!("unexpected attention {other:?} in expected.json"),
    };
    assert_eq!(e.attention, attention);

    let d = &c.decoder;
    assert_eq!(d.vocab_size, num(m, "vocab_size")?);
    assert_eq!(d.blank_id(), num(m, "blank_id")?);
    assert_eq!(d.pred_hidden, num(m, "pred_hidden")?);
    assert_eq!(d.pred_rnn_layers, num(m, "pred_rnn_layers")?);
    assert_eq!(d.joint_hidden, num(m, "joint_hidden")?);
    let durations: Vec<usize> = serde_json::from_value(m["durations"].clone())?;
    assert_eq!(d.durations, durations);
    assert_eq!(d.max_symbols_per_step, num(m, "max_symbols")?);
    let frame = m["frame_seconds"].as_f64().context("frame_seconds")?;
    assert!((c.seconds_per_encoder_frame() - frame).abs() < 1e-12);

    // Created by NeMo >= 2.5, so zero STFT padding unless overridden.
    let version = exp["nemo_version"].as_str().context("nemo_version")?;
    let major_minor: Vec<u32> = version
        .split('.')
        .take(2)
        .map(|p| p.parse())
        .collect::<Result<_, _>>()?;
    assert!(major_minor >= vec![2, 5], "{version}");
    assert_eq!(c.features.stft_padding, StftPadding::Zeros);
    Ok(())
}

#[test]
fn stft_padding_can_be_overridden() -> Result<()> {
    let options = LoadOptions {
        stft_padding: Some(StftPadding::Reflect),
    };
    let ckpt = Checkpoint::load_with(&fixture_dir(FIXTURES[0]).join("model.nemo"), &options)?;
    assert_eq!(ckpt.config.features.stft_padding, StftPadding::Reflect);
    Ok(())
}

#[test]
fn state_dict_has_every_tensor_the_architecture_needs() -> Result<()> {
    for name in FIXTURES {
        state_dict_complete(name)?;
    }
    Ok(())
}

fn state_dict_complete(name: &str) -> Result<()> {
    let exp = expected(name)?;
    let m = &exp["model"];
    let ckpt = load_fixture(name)?;
    let use_bias = m["use_bias"].as_bool().context("use_bias")?;
    let t = &ckpt.tensors;
    let (d, heads, c) = (
        num(m, "d_model")?,
        num(m, "n_heads")?,
        num(m, "subsampling_conv_channels")?,
    );
    let ff = d * num(m, "ff_expansion_factor")?;
    let k = num(m, "conv_kernel_size")?;
    let (v, h, j) = (
        num(m, "vocab_size")?,
        num(m, "pred_hidden")?,
        num(m, "joint_hidden")?,
    );
    let n_durations = m["durations"].as_array().context("durations")?.len();
    let n_mels = num(m, "n_mels")?;

    t.get("preprocessor.featurizer.fb", &[1, n_mels, 257])?;
    t.get("preprocessor.featurizer.window", &[400])?;
    t.get("encoder.pre_encode.conv.0.weight", &[c, 1, 3, 3])?;
    for (dw, pw) in [(2, 3), (5, 6)] {
        t.get(
            &format!("encoder.pre_encode.conv.{dw}.weight"),
            &[c, 1, 3, 3],
        )?;
        t.get(
            &format!("encoder.pre_encode.conv.{pw}.weight"),
            &[c, c, 1, 1],
        )?;
    }
    t.get("encoder.pre_encode.out.weight", &[d, c * n_mels / 8])?;
    for i in 0..num(m, "n_layers")? {
        let l = format!("encoder.layers.{i}");
        t.get(&format!("{l}.feed_forward1.linear1.weight"), &[ff, d])?;
        t.get(&format!("{l}.feed_forward2.linear2.weight"), &[d, ff])?;
        t.get(&format!("{l}.self_attn.linear_q.weight"), &[d, d])?;
        t.get(&format!("{l}.self_attn.linear_pos.weight"), &[d, d])?;
        t.get(&format!("{l}.self_attn.pos_bias_u"), &[heads, d / heads])?;
        t.get(&format!("{l}.conv.depthwise_conv.weight"), &[d, 1, k])?;
        t.get(&format!("{l}.conv.batch_norm.running_var"), &[d])?;
        t.get(&format!("{l}.norm_out.bias"), &[d])?;
        // Encoder Linear/Conv biases exist exactly when the model was built with use_bias.
        if use_bias {
            t.get(&format!("{l}.self_attn.linear_q.bias"), &[d])?;
            t.get(&format!("{l}.feed_forward1.linear1.bias"), &[ff])?;
            t.get(&format!("{l}.conv.pointwise_conv1.bias"), &[2 * d])?;
            t.get(&format!("{l}.conv.depthwise_conv.bias"), &[d])?;
        } else {
            assert!(!t.contains(&format!("{l}.self_attn.linear_q.bias")));
            assert!(!t.contains(&format!("{l}.conv.pointwise_conv1.bias")));
        }
        // Integer buffers are not floating weights and are skipped.
        assert!(!t.contains(&format!("{l}.conv.batch_norm.num_batches_tracked")));
    }
    t.get("decoder.prediction.embed.weight", &[v + 1, h])?;
    for layer in 0..num(m, "pred_rnn_layers")? {
        t.get(
            &format!("decoder.prediction.dec_rnn.lstm.weight_ih_l{layer}"),
            &[4 * h, h],
        )?;
        t.get(
            &format!("decoder.prediction.dec_rnn.lstm.bias_hh_l{layer}"),
            &[4 * h],
        )?;
    }
    t.get("joint.enc.weight", &[j, d])?;
    t.get("joint.pred.weight", &[j, h])?;
    let final_linear = m["final_joint_linear"]
        .as_str()
        .context("final_joint_linear")?;
    assert_eq!(t.joint_output_prefix().as_deref(), Some(final_linear));
    t.get(&format!("{final_linear}.weight"), &[v + 1 + n_durations, j])?;
    Ok(())
}

#[test]
fn stored_window_decodes_to_a_symmetric_hann() -> Result<()> {
    let ckpt = load_fixture(FIXTURES[0])?;
    let window = &ckpt
        .tensors
        .get("preprocessor.featurizer.window", &[400])?
        .data;
    for (n, &w) in window.iter().enumerate() {
        let expected = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * n as f64 / 399.0).cos();
        assert!(
            (f64::from(w) - expected).abs() < 1e-6,
            "window[{n}] = {w}, want {expected}"
        );
    }
    // The embedding's blank row (padding_idx) is all zeros in NeMo.
    let m = &expected(FIXTURES[0])?["model"];
    let (v, h) = (num(m, "vocab_size")?, num(m, "pred_hidden")?);
    let embed = &ckpt
        .tensors
        .get("decoder.prediction.embed.weight", &[v + 1, h])?
        .data;
    assert!(embed[v * h..].iter().all(|&x| x == 0.0));
    assert!(embed[..v * h].iter().any(|&x| x != 0.0));
    Ok(())
}

#[test]
fn vocabulary_is_the_sentencepiece_listing() -> Result<()> {
    for name in FIXTURES {
        vocabulary_matches(name)?;
    }
    Ok(())
}

fn vocabulary_matches(name: &str) -> Result<()> {
    let ckpt = load_fixture(name)?;
    let m = &expected(name)?["model"];
    assert_eq!(ckpt.vocabulary.len(), num(m, "vocab_size")?);

    // Independently: the `.vocab` member's first column, in order.
    let mut archive = tar::Archive::new(std::fs::File::open(fixture_dir(name).join("model.nemo"))?);
    let mut listing = None;
    for entry in archive.entries()? {
        let mut entry = entry?;
        if entry
            .path()?
            .to_string_lossy()
            .ends_with("_tokenizer.vocab")
        {
            let mut text = String::new();
            entry.read_to_string(&mut text)?;
            listing = Some(text);
        }
    }
    let listing = listing.context("fixture has no _tokenizer.vocab")?;
    let pieces: Vec<&str> = listing
        .lines()
        .filter_map(|l| l.split('\t').next())
        .collect();
    assert_eq!(ckpt.vocabulary, pieces);
    assert!(ckpt.vocabulary.iter().any(|p| p.starts_with('\u{2581}')));
    Ok(())
}

/// The full-size (0.6B) random checkpoint, made on demand, not checked in:
/// `PARAKEET_FULL_NEMO=/path/full.nemo cargo test -p models --release --test checkpoint_load -- --ignored`
/// (run the test binary under `/usr/bin/time -v` for peak RSS).
#[test]
#[ignore = "needs PARAKEET_FULL_NEMO, a multi-gigabyte checkpoint"]
fn full_size_checkpoint_loads() -> Result<()> {
    let path = std::env::var_os("PARAKEET_FULL_NEMO").context("set PARAKEET_FULL_NEMO")?;
    let start = std::time::Instant::now();
    let ckpt = Checkpoint::load(Path::new(&path))?;
    let params: usize = ckpt
        .tensors
        .names()
        .filter_map(|n| ckpt.tensors.get_any_shape(n))
        .map(|t| t.numel())
        .sum();
    println!(
        "loaded {} tensors, {params} parameters, {} layers x d_model {} in {:.2} s",
        ckpt.tensors.names().count(),
        ckpt.config.encoder.n_layers,
        ckpt.config.encoder.d_model,
        start.elapsed().as_secs_f64()
    );
    assert!(
        params > 100_000_000,
        "{params} parameters is not a full-size model"
    );
    Ok(())
}
