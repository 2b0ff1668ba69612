//! `model_config.yaml` -> [`ParakeetConfig`]. Every architectural value comes from the
//! checkpoint's config; where a key is absent we use the default of the NeMo class that the
//! key configures (`AudioToMelSpectrogramPreprocessor`, `ConformerEncoder`, `RNNTDecoder`,
//! `RNNTJoint`, the greedy TDT decoder). Options the CPU model does not implement are
//! rejected with [`ModelError::UnsupportedConfig`] rather than silently ignored.

use std::path::Path;

use super::yaml::{as_f64, show, ConfigYaml, MAX_SETTING};
use crate::error::ModelError;
use model_core::config::{
    AttentionModel, DecoderConfig, EncoderConfig, FeatureConfig, FeatureNormalization,
    ParakeetConfig, StftPadding,
};

/// LayerNorm and BatchNorm epsilon: PyTorch defaults, which NeMo's Conformer never overrides.
const NORM_EPS: f32 = 1e-5;

/// Everything read from the config: the model plus what the loader needs to finish the job.
#[derive(Debug, Clone)]
pub(crate) struct ConfigFile {
    pub(crate) model: ParakeetConfig,
    /// `nemo_version`: the NeMo that first created the model (kept across re-saves).
    pub(crate) nemo_version: Option<String>,
    /// `joint.vocabulary` (or top-level `labels`): pieces by id.
    pub(crate) vocabulary: Option<Vec<String>>,
    /// `tokenizer.spe_tokenizer_vocab`, e.g. `nemo:<hex>_tokenizer.vocab`.
    pub(crate) spe_vocab_ref: Option<String>,
    /// `tokenizer.model_path`, e.g. `nemo:<hex>_tokenizer.model`.
    pub(crate) spe_model_ref: Option<String>,
}

/// Decides STFT centre padding from the NeMo version recorded in the config.
///
/// NeMo writes `nemo_version` into the model config when a model is first built, and the value
/// travels with the config through every later save, so it says which NeMo the model was
/// created (and normally trained) with. NeMo 2.5.0 switched the STFT's centre padding from
/// torch's default `reflect` to zeros (and the frame count from `len/hop + 1` to `len/hop`);
/// the 2.4.0 and 2.4.1 wheels still reflect (checked in their `features.py`). A model created
/// before 2.5 learned reflect-padded features, so we reproduce those; from 2.5 on, zeros.
/// A config without `nemo_version` predates version stamping and therefore 2.5: reflect.
/// An unparseable version is taken as recent (zeros). Note that NeMo 2.5+ itself applies zeros
/// to every checkpoint, old ones included: to match today's NeMo on an old model, override with
/// [`super::LoadOptions`].
pub(crate) fn stft_padding_for_version(nemo_version: Option<&str>) -> StftPadding {
    let Some(version) = nemo_version else {
        return StftPadding::Reflect;
    };
    let mut parts = version.trim().trim_start_matches('v').split('.');
    let major = parts.next().and_then(leading_number);
    let minor = parts.next().and_then(leading_number);
    match (major, minor) {
        (Some(major), Some(minor)) if (major, minor) < (2, 5) => StftPadding::Reflect,
        (Some(major), None) if major < 2 => StftPadding::Reflect,
        _ => StftPadding::Zeros,
    }
}

fn leading_number(s: &str) -> Option<u64> {
    let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Parses `model_config.yaml`. `file` is the name used in errors.
pub(crate) fn parse(text: &str, file: &Path) -> Result<ConfigFile, ModelError> {
    let y = ConfigYaml::parse(text, file)?;
    let (features, encoder, nemo_version) = parse_frontend(&y)?;
    let decoder = decoder(&y)?;
    let vocabulary = match y.string_list("joint.vocabulary")? {
        Some(v) => Some(v),
        None => y.string_list("labels")?,
    };
    Ok(ConfigFile {
        model: ParakeetConfig {
            features,
            encoder,
            decoder,
        },
        nemo_version,
        vocabulary,
        spe_vocab_ref: y
            .str_opt("tokenizer.spe_tokenizer_vocab")?
            .map(str::to_string),
        spe_model_ref: y.str_opt("tokenizer.model_path")?.map(str::to_string),
    })
}

/// The preprocessor and encoder sections only (models with another head, e.g. Sortformer),
/// plus `nemo_version`.
pub(crate) fn parse_frontend(
    y: &ConfigYaml<'_>,
) -> Result<(FeatureConfig, EncoderConfig, Option<String>), ModelError> {
    let nemo_version = y
        .get("nemo_version")
        .map(|v| v.as_str().map_or_else(|| show(v), str::to_string));
    let features = features(y, stft_padding_for_version(nemo_version.as_deref()))?;
    let encoder = encoder(y, features.n_mels)?;
    Ok((features, encoder, nemo_version))
}

fn features(y: &ConfigYaml<'_>, stft_padding: StftPadding) -> Result<FeatureConfig, ModelError> {
    y.target("preprocessor", "AudioToMelSpectrogramPreprocessor")?;
    let p = |k: &str| format!("preprocessor.{k}");
    let sample_rate_hz = match y.usize_opt(&p("sample_rate"))? {
        Some(sr) => sr,
        None => y.usize_opt("sample_rate")?.unwrap_or(16_000),
    };
    let sample_rate_hz = u32::try_from(sample_rate_hz)
        .ok()
        .filter(|&sr| sr > 0)
        .ok_or_else(|| {
            y.invalid(
                &p("sample_rate"),
                format!("{sample_rate_hz} Hz is not usable"),
            )
        })?;

    // Seconds (`window_size`) or samples (`n_window_size`); NeMo converts seconds with int(),
    // which truncates, and so do we.
    let samples = |secs_key: &str, n_key: &str, default_s: f64| -> Result<usize, ModelError> {
        match (y.f64_opt(&p(secs_key))?, y.usize_opt(&p(n_key))?) {
            (Some(_), Some(_)) => {
                Err(y.invalid(&p(n_key), format!("both {secs_key} and {n_key} are set")))
            }
            (None, Some(n)) if n > 0 => Ok(n),
            (None, Some(_)) => Err(y.invalid(&p(n_key), "must be positive")),
            (secs, None) => {
                let n = (secs.unwrap_or(default_s) * f64::from(sample_rate_hz)) as i64;
                usize::try_from(n)
                    .ok()
                    .filter(|&n| n > 0 && n as u64 <= MAX_SETTING)
                    .ok_or_else(|| y.invalid(&p(secs_key), format!("gives a {n}-sample window")))
            }
        }
    };
    let win_length_samples = samples("window_size", "n_window_size", 0.02)?;
    let hop_length_samples = samples("window_stride", "n_window_stride", 0.01)?;
    let n_fft = match y.usize_opt(&p("n_fft"))? {
        Some(n) => n,
        None => win_length_samples.next_power_of_two(),
    };
    if n_fft < win_length_samples {
        return Err(y.invalid(
            &p("n_fft"),
            format!("{n_fft} is shorter than the {win_length_samples}-sample window"),
        ));
    }
    let n_mels = y.usize_opt(&p("features"))?.unwrap_or(64);
    if n_mels == 0 {
        return Err(y.invalid(&p("features"), "must be positive"));
    }

    let preemphasis = match y.get(&p("preemph")) {
        // An explicit `null` disables preemphasis; `get` maps null to None, so look again.
        None if y.is_null(&p("preemph")) => None,
        None => Some(0.97),
        Some(_) => y.f64_opt(&p("preemph"))?.map(|v| v as f32),
    };
    let mag_power = y.f64_opt(&p("mag_power"))?.unwrap_or(2.0) as f32;
    if !y.bool_or(&p("log"), true)? {
        return Err(y.unsupported(&p("log"), false));
    }
    y.choice(&p("log_zero_guard_type"), "add", &["add"])?;
    let log_zero_guard = match y.get(&p("log_zero_guard_value")) {
        None => 2f32.powi(-24),
        Some(v) => match v.as_str() {
            Some("tiny") => f32::MIN_POSITIVE,
            Some("eps") => f32::EPSILON,
            Some(s) => return Err(y.unsupported(&p("log_zero_guard_value"), s)),
            None => {
                as_f64(v).ok_or_else(|| y.unsupported(&p("log_zero_guard_value"), show(v)))? as f32
            }
        },
    };
    let normalization = match y.get(&p("normalize")).map(|v| (v, v.as_str())) {
        None => match y.is_null(&p("normalize")) {
            true => FeatureNormalization::None,
            false => FeatureNormalization::PerFeature,
        },
        Some((_, Some("per_feature"))) => FeatureNormalization::PerFeature,
        Some((_, Some("" | "NA" | "None"))) => FeatureNormalization::None,
        Some((v, _)) => return Err(y.unsupported(&p("normalize"), show(v))),
    };
    y.choice(&p("window"), "hann", &["hann"])?;
    y.choice(&p("mel_norm"), "slaney", &["slaney"])?;
    if let Some(n) = y.usize_opt(&p("frame_splicing"))?.filter(|&n| n != 1) {
        return Err(y.unsupported(&p("frame_splicing"), n));
    }
    if y.bool_or(&p("exact_pad"), false)? {
        return Err(y.unsupported(&p("exact_pad"), true));
    }
    // `pad_to` / `pad_value` only shape the padding past each clip's length, which the model
    // masks; `dither` and `nb_augmentation_prob` act in training only.
    let low_freq_hz = y.f64_opt(&p("lowfreq"))?.unwrap_or(0.0) as f32;
    let high_freq_hz = match y.f64_opt(&p("highfreq"))? {
        Some(f) => f as f32,
        None => sample_rate_hz as f32 / 2.0,
    };
    Ok(FeatureConfig {
        sample_rate_hz,
        win_length_samples,
        hop_length_samples,
        n_fft,
        n_mels,
        preemphasis,
        mag_power,
        log_zero_guard,
        normalization,
        stft_padding,
        low_freq_hz,
        high_freq_hz,
    })
}

fn encoder(y: &ConfigYaml<'_>, n_mels: usize) -> Result<EncoderConfig, ModelError> {
    y.target("encoder", "ConformerEncoder")?;
    let e = |k: &str| format!("encoder.{k}");
    let feat_in = y.positive(&e("feat_in"))?;
    if feat_in != n_mels {
        return Err(y.invalid(
            &e("feat_in"),
            format!("{feat_in} differs from preprocessor.features = {n_mels}"),
        ));
    }
    let n_layers = y.usize(&e("n_layers"))?;
    let d_model = y.positive(&e("d_model"))?;
    let n_heads = y.usize_opt(&e("n_heads"))?.unwrap_or(4);
    if n_heads == 0 || !d_model.is_multiple_of(n_heads) {
        return Err(y.invalid(
            &e("n_heads"),
            format!("{n_heads} heads do not divide d_model {d_model}"),
        ));
    }
    let ff_expansion = y.usize_opt(&e("ff_expansion_factor"))?.unwrap_or(4);
    let ff_hidden = d_model
        .checked_mul(ff_expansion)
        .filter(|&h| h > 0)
        .ok_or_else(|| {
            y.invalid(
                &e("ff_expansion_factor"),
                format!("{ff_expansion} is not usable"),
            )
        })?;

    y.choice(&e("subsampling"), "striding", &["dw_striding"])?;
    let subsampling_factor = y.usize_opt(&e("subsampling_factor"))?.unwrap_or(4);
    if subsampling_factor < 2 || !subsampling_factor.is_power_of_two() {
        return Err(y.unsupported(&e("subsampling_factor"), subsampling_factor));
    }
    let subsampling_conv_channels = match y.i64_opt(&e("subsampling_conv_channels"))? {
        None | Some(-1) => d_model,
        Some(c) => usize::try_from(c)
            .ok()
            .filter(|&c| c > 0 && c as u64 <= MAX_SETTING)
            .ok_or_else(|| y.invalid(&e("subsampling_conv_channels"), format!("{c} channels")))?,
    };
    if y.bool_or(&e("causal_downsampling"), false)? {
        return Err(y.unsupported(&e("causal_downsampling"), true));
    }
    if let Some(f) = y
        .i64_opt(&e("feat_out"))?
        .filter(|&f| f > 0 && f as usize != d_model)
    {
        return Err(y.unsupported(&e("feat_out"), f));
    }
    if let Some(reduction) = y.get(&e("reduction")) {
        if y.usize_opt(&e("reduction_factor"))?.unwrap_or(1) > 1 {
            return Err(y.unsupported(&e("reduction"), show(reduction)));
        }
    }
    if let Some(g) = y.usize_opt(&e("global_tokens"))?.filter(|&g| g > 0) {
        return Err(y.unsupported(&e("global_tokens"), g));
    }
    y.choice(&e("att_context_style"), "regular", &["regular"])?;
    y.choice(&e("conv_norm_type"), "batch_norm", &["batch_norm"])?;
    if let Some(v) = y.get(&e("conv_context_size")) {
        return Err(y.unsupported(&e("conv_context_size"), show(v)));
    }
    let conv_kernel_size = y.usize_opt(&e("conv_kernel_size"))?.unwrap_or(31);
    if conv_kernel_size.is_multiple_of(2) {
        return Err(y.unsupported(&e("conv_kernel_size"), conv_kernel_size));
    }

    let model = y.choice(
        &e("self_attention_model"),
        "rel_pos",
        &["rel_pos", "rel_pos_local_attn"],
    )?;
    let context = match y.get(&e("att_context_size")) {
        None => None,
        Some(v) => match y.int_list(&e("att_context_size")) {
            Ok(Some(c)) if c.len() == 2 => Some((c[0], c[1])),
            // Lists of lists select among several streaming contexts: not implemented.
            _ => return Err(y.unsupported(&e("att_context_size"), show(v))),
        },
    };
    let attention = match (model, context) {
        ("rel_pos", None | Some((-1, -1))) => AttentionModel::RelPos,
        ("rel_pos", Some((l, r))) => {
            return Err(y.unsupported(&e("att_context_size"), format!("[{l}, {r}] with rel_pos")))
        }
        (_, Some((l, r)))
            if l > 0 && r > 0 && l as u64 <= MAX_SETTING && r as u64 <= MAX_SETTING =>
        {
            AttentionModel::RelPosLocal {
                left: l as usize,
                right: r as usize,
            }
        }
        (_, c) => {
            return Err(y.unsupported(
                &e("att_context_size"),
                c.map_or("absent".to_string(), |(l, r)| format!("[{l}, {r}]"))
                    + " with rel_pos_local_attn",
            ))
        }
    };

    Ok(EncoderConfig {
        feat_in,
        n_layers,
        d_model,
        n_heads,
        ff_hidden,
        subsampling_factor,
        subsampling_conv_channels,
        xscaling: y.bool_or(&e("xscaling"), true)?,
        conv_kernel_size,
        attention,
        // Provisional: the loader confirms it against the state dict.
        use_bias: y.bool_or(&e("use_bias"), true)?,
        layer_norm_eps: NORM_EPS,
        batch_norm_eps: NORM_EPS,
    })
}

fn decoder(y: &ConfigYaml<'_>) -> Result<DecoderConfig, ModelError> {
    y.target("decoder", "RNNTDecoder")?;
    y.target("joint", "RNNTJoint")?;
    let vocab_size = y.positive("decoder.vocab_size")?;
    if let Some(n) = y
        .usize_opt("joint.num_classes")?
        .filter(|&n| n != vocab_size)
    {
        return Err(y.invalid(
            "joint.num_classes",
            format!("{n} differs from decoder.vocab_size = {vocab_size}"),
        ));
    }
    if !y.bool_or("decoder.blank_as_pad", true)? {
        return Err(y.unsupported("decoder.blank_as_pad", false));
    }
    if let Some(v) = y.get("decoder.normalization_mode") {
        return Err(y.unsupported("decoder.normalization_mode", show(v)));
    }
    let pred_hidden = y.positive("decoder.prednet.pred_hidden")?;
    let pred_rnn_layers = y.positive("decoder.prednet.pred_rnn_layers")?;
    let joint_hidden = y.positive("joint.jointnet.joint_hidden")?;
    y.choice("joint.jointnet.activation", "relu", &["relu"])?;

    let durations = tdt_durations(y)?;
    let extra = y.usize_opt("joint.num_extra_outputs")?.unwrap_or(0);
    if extra != durations.len() {
        return Err(y.invalid(
            "joint.num_extra_outputs",
            format!("{extra} differs from the {} TDT durations", durations.len()),
        ));
    }

    let max_symbols_key = [
        "decoding.greedy.max_symbols",
        "decoding.greedy.max_symbols_per_step",
    ];
    let mut max_symbols_per_step = 10;
    for key in max_symbols_key {
        if let Some(n) = y.usize_opt(key)? {
            if n == 0 {
                return Err(y.invalid(key, "must be positive"));
            }
            max_symbols_per_step = n;
            break;
        }
    }
    Ok(DecoderConfig {
        vocab_size,
        pred_hidden,
        pred_rnn_layers,
        joint_hidden,
        durations,
        max_symbols_per_step,
    })
}

/// TDT durations may be given in up to three places; all that are present must agree.
fn tdt_durations(y: &ConfigYaml<'_>) -> Result<Vec<usize>, ModelError> {
    const KEYS: [&str; 3] = [
        "decoding.durations",
        "model_defaults.tdt_durations",
        "loss.tdt_kwargs.durations",
    ];
    let mut found: Option<(&str, Vec<i64>)> = None;
    for key in KEYS {
        let Some(list) = y.int_list(key)? else {
            continue;
        };
        match &found {
            Some((first, durations)) if *durations != list => {
                return Err(y.invalid(
                    key,
                    format!("{list:?} differs from {first} = {durations:?}"),
                ));
            }
            Some(_) => {}
            None => found = Some((key, list)),
        }
    }
    let Some((key, list)) = found else {
        let kind = y.str_opt("decoding.model_type")?.unwrap_or("rnnt");
        return Err(y.unsupported(
            "decoding.model_type",
            format!("{kind} (no TDT durations in the config)"),
        ));
    };
    if list.is_empty() {
        return Err(y.invalid(key, "empty"));
    }
    list.iter()
        .map(|&d| usize::try_from(d).map_err(|_| y.invalid(key, format!("negative duration {d}"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_rule() {
        assert_eq!(stft_padding_for_version(None), StftPadding::Reflect);
        assert_eq!(
            stft_padding_for_version(Some("2.3.1")),
            StftPadding::Reflect
        );
        assert_eq!(
            stft_padding_for_version(Some("1.23.0")),
            StftPadding::Reflect
        );
        assert_eq!(
            stft_padding_for_version(Some("2.4.1")),
            StftPadding::Reflect
        );
        assert_eq!(
            stft_padding_for_version(Some("2.5.0rc0")),
            StftPadding::Zeros
        );
        assert_eq!(stft_padding_for_version(Some("2.10.0")), StftPadding::Zeros);
        assert_eq!(stft_padding_for_version(Some("3.0.0")), StftPadding::Zeros);
        assert_eq!(
            stft_padding_for_version(Some("garbage")),
            StftPadding::Zeros
        );
    }
}
