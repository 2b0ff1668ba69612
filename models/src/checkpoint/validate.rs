//! Cross-checks the resolved config against the state dict: every tensor the forward pass
//! reads must exist with the shape the config implies, so a mismatched config or truncated
//! checkpoint fails at load time with the tensor's name instead of deep inside inference.

use super::TensorMap;
use crate::error::ModelError;
use model_core::config::ParakeetConfig;

/// Settles `encoder.use_bias` from the tensors, then checks every expected tensor.
pub(crate) fn check(config: &mut ParakeetConfig, tensors: &TensorMap) -> Result<(), ModelError> {
    settle_use_bias(config, tensors);
    check_no_extra_layers(config, tensors)?;
    check_preprocessor(config, tensors)?;
    check_encoder(config, tensors)?;
    check_decoder(config, tensors)
}

/// Bias presence is what the weights say; the config's `use_bias` can be stale.
fn settle_use_bias(config: &mut ParakeetConfig, tensors: &TensorMap) {
    if config.encoder.n_layers == 0 {
        return;
    }
    let has_bias = tensors.contains("encoder.layers.0.feed_forward1.linear1.bias");
    if has_bias != config.encoder.use_bias {
        tracing::warn!(
            source = %tensors.source.display(),
            config = config.encoder.use_bias,
            state_dict = has_bias,
            "encoder.use_bias disagrees with the state dict; following the state dict"
        );
        config.encoder.use_bias = has_bias;
    }
}

fn check_no_extra_layers(config: &ParakeetConfig, tensors: &TensorMap) -> Result<(), ModelError> {
    let n_layers = config.encoder.n_layers;
    let beyond = tensors.names().find_map(|name| {
        let index = name.strip_prefix("encoder.layers.")?.split('.').next()?;
        index.parse::<usize>().ok().filter(|&i| i >= n_layers)
    });
    match beyond {
        Some(i) => Err(ModelError::InvalidConfig {
            file: tensors.source.clone(),
            key: "encoder.n_layers".to_string(),
            problem: format!(
                "the state dict has encoder.layers.{i} but the config says {n_layers} layers"
            ),
        }),
        None => Ok(()),
    }
}

fn check_preprocessor(config: &ParakeetConfig, tensors: &TensorMap) -> Result<(), ModelError> {
    let f = &config.features;
    tensors.get_optional(
        "preprocessor.featurizer.fb",
        &[1, f.n_mels, f.n_fft / 2 + 1],
    )?;
    tensors.get_optional("preprocessor.featurizer.window", &[f.win_length_samples])?;
    Ok(())
}

/// A weight plus, when `bias`, its bias.
fn linear(
    tensors: &TensorMap,
    prefix: &str,
    weight: &[usize],
    bias: bool,
) -> Result<(), ModelError> {
    tensors.get(&format!("{prefix}.weight"), weight)?;
    if bias {
        tensors.get(&format!("{prefix}.bias"), &weight[..1])?;
    }
    Ok(())
}

fn check_encoder(config: &ParakeetConfig, tensors: &TensorMap) -> Result<(), ModelError> {
    let e = &config.encoder;
    let (d, c) = (e.d_model, e.subsampling_conv_channels);

    // dw_striding: conv.0 (full 3x3), then per further stride-2 stage a depthwise 3x3 and a
    // pointwise 1x1, with a ReLU after each stage (hence the index pattern 0, 2/3, 5/6, ...).
    let stages = e.subsampling_factor.trailing_zeros() as usize;
    linear(tensors, "encoder.pre_encode.conv.0", &[c, 1, 3, 3], true)?;
    for stage in 1..stages {
        linear(
            tensors,
            &format!("encoder.pre_encode.conv.{}", 3 * stage - 1),
            &[c, 1, 3, 3],
            true,
        )?;
        linear(
            tensors,
            &format!("encoder.pre_encode.conv.{}", 3 * stage),
            &[c, c, 1, 1],
            true,
        )?;
    }
    let mut freq = e.feat_in;
    for _ in 0..stages {
        freq = (freq + 2 - 3) / 2 + 1;
    }
    linear(tensors, "encoder.pre_encode.out", &[d, c * freq], true)?;

    let b = e.use_bias;
    let d_head = d / e.n_heads;
    for i in 0..e.n_layers {
        let l = format!("encoder.layers.{i}");
        for norm in [
            "norm_feed_forward1",
            "norm_self_att",
            "norm_conv",
            "norm_feed_forward2",
            "norm_out",
        ] {
            linear(tensors, &format!("{l}.{norm}"), &[d], true)?;
        }
        for ff in ["feed_forward1", "feed_forward2"] {
            linear(tensors, &format!("{l}.{ff}.linear1"), &[e.ff_hidden, d], b)?;
            linear(tensors, &format!("{l}.{ff}.linear2"), &[d, e.ff_hidden], b)?;
        }
        for proj in ["linear_q", "linear_k", "linear_v", "linear_out"] {
            linear(tensors, &format!("{l}.self_attn.{proj}"), &[d, d], b)?;
        }
        linear(
            tensors,
            &format!("{l}.self_attn.linear_pos"),
            &[d, d],
            false,
        )?;
        tensors.get(&format!("{l}.self_attn.pos_bias_u"), &[e.n_heads, d_head])?;
        tensors.get(&format!("{l}.self_attn.pos_bias_v"), &[e.n_heads, d_head])?;
        linear(
            tensors,
            &format!("{l}.conv.pointwise_conv1"),
            &[2 * d, d, 1],
            b,
        )?;
        linear(
            tensors,
            &format!("{l}.conv.depthwise_conv"),
            &[d, 1, e.conv_kernel_size],
            b,
        )?;
        linear(tensors, &format!("{l}.conv.pointwise_conv2"), &[d, d, 1], b)?;
        for stat in ["weight", "bias", "running_mean", "running_var"] {
            tensors.get(&format!("{l}.conv.batch_norm.{stat}"), &[d])?;
        }
    }
    Ok(())
}

fn check_decoder(config: &ParakeetConfig, tensors: &TensorMap) -> Result<(), ModelError> {
    let dc = &config.decoder;
    let (h, j) = (dc.pred_hidden, dc.joint_hidden);
    // blank_as_pad: one extra embedding row for blank.
    tensors.get("decoder.prediction.embed.weight", &[dc.vocab_size + 1, h])?;
    for layer in 0..dc.pred_rnn_layers {
        let p = "decoder.prediction.dec_rnn.lstm";
        tensors.get(&format!("{p}.weight_ih_l{layer}"), &[4 * h, h])?;
        tensors.get(&format!("{p}.weight_hh_l{layer}"), &[4 * h, h])?;
        tensors.get(&format!("{p}.bias_ih_l{layer}"), &[4 * h])?;
        tensors.get(&format!("{p}.bias_hh_l{layer}"), &[4 * h])?;
    }
    linear(tensors, "joint.pred", &[j, h], true)?;
    linear(tensors, "joint.enc", &[j, config.encoder.d_model], true)?;
    let out = tensors.require_joint_output_prefix()?;
    linear(
        tensors,
        &out,
        &[dc.vocab_size + 1 + dc.durations.len(), j],
        true,
    )
}
