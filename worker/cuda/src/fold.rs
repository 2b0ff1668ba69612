//! Load-time folding of an inference-mode BatchNorm into the depthwise convolution before it.
//!
//! BatchNorm(conv(x)) = scale * (conv(x) - mean) + beta with scale = gamma / sqrt(var + eps),
//! which is a convolution with weight `w * scale` and bias `(b - mean) * scale + beta`.

use crate::error::{CudaEngineError, Result};

/// BatchNorm1d's inference parameters, one value per channel.
#[derive(Debug, Clone, Copy)]
pub struct BatchNorm<'a> {
    pub gamma: &'a [f32],
    pub beta: &'a [f32],
    pub running_mean: &'a [f32],
    pub running_var: &'a [f32],
    pub eps: f32,
}

/// A depthwise convolution with the BatchNorm folded in: `weight` is `[channels, kernel]`.
#[derive(Debug, Clone, PartialEq)]
pub struct FoldedDepthwise {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
    pub channels: usize,
    pub kernel: usize,
}

/// Folds `bn` into a depthwise convolution with `weight` `[channels, kernel]` (the Conv1d
/// weight `[channels, 1, kernel]` flattened) and optional `bias`. Computed in f64.
pub fn fold_batch_norm(
    weight: &[f32],
    bias: Option<&[f32]>,
    channels: usize,
    kernel: usize,
    bn: &BatchNorm<'_>,
) -> Result<FoldedDepthwise> {
    let shape_error = |detail: String| CudaEngineError::Shape {
        op: "fold_batch_norm",
        detail,
    };
    if weight.len() != channels * kernel {
        return Err(shape_error(format!(
            "weight has {} values, expected channels {channels} x kernel {kernel}",
            weight.len()
        )));
    }
    let per_channel = [
        ("bias", bias.map_or(channels, <[f32]>::len)),
        ("gamma", bn.gamma.len()),
        ("beta", bn.beta.len()),
        ("running_mean", bn.running_mean.len()),
        ("running_var", bn.running_var.len()),
    ];
    for (name, len) in per_channel {
        if len != channels {
            return Err(shape_error(format!(
                "{name} has {len} values, expected {channels}"
            )));
        }
    }
    let mut folded_weight = Vec::with_capacity(weight.len());
    let mut folded_bias = Vec::with_capacity(channels);
    for c in 0..channels {
        let scale =
            f64::from(bn.gamma[c]) / (f64::from(bn.running_var[c]) + f64::from(bn.eps)).sqrt();
        folded_weight.extend(
            weight[c * kernel..(c + 1) * kernel]
                .iter()
                .map(|&w| (f64::from(w) * scale) as f32),
        );
        let conv_bias = bias.map_or(0.0, |b| f64::from(b[c]));
        let shifted = (conv_bias - f64::from(bn.running_mean[c])) * scale + f64::from(bn.beta[c]);
        folded_bias.push(shifted as f32);
    }
    Ok(FoldedDepthwise {
        weight: folded_weight,
        bias: folded_bias,
        channels,
        kernel,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folded_convolution_equals_convolution_then_batch_norm() {
        let (channels, kernel) = (3, 3);
        let weight = [0.5, -1.0, 2.0, 0.25, 0.75, -0.5, 1.5, 0.0, -2.0];
        let bias = [0.1, -0.2, 0.3];
        let bn = BatchNorm {
            gamma: &[1.5, 0.5, -1.0],
            beta: &[0.2, 0.0, -0.3],
            running_mean: &[0.4, -0.1, 0.05],
            running_var: &[2.0, 0.25, 1.0],
            eps: 1e-5,
        };
        let folded = fold_batch_norm(&weight, Some(&bias), channels, kernel, &bn).expect("fold");
        let window = [0.3f32, -0.7, 1.1];
        for c in 0..channels {
            let conv: f32 = (0..kernel)
                .map(|k| weight[c * kernel + k] * window[k])
                .sum::<f32>()
                + bias[c];
            let expected = (conv - bn.running_mean[c]) / (bn.running_var[c] + bn.eps).sqrt()
                * bn.gamma[c]
                + bn.beta[c];
            let got: f32 = (0..kernel)
                .map(|k| folded.weight[c * kernel + k] * window[k])
                .sum::<f32>()
                + folded.bias[c];
            assert!(
                (got - expected).abs() < 1e-5,
                "channel {c}: {got} vs {expected}"
            );
        }
    }

    #[test]
    fn mismatched_lengths_are_rejected() {
        let bn = BatchNorm {
            gamma: &[1.0],
            beta: &[0.0],
            running_mean: &[0.0],
            running_var: &[1.0],
            eps: 1e-5,
        };
        assert!(fold_batch_norm(&[1.0, 2.0], None, 1, 3, &bn).is_err());
        assert!(fold_batch_norm(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], None, 2, 3, &bn).is_err());
    }
}
