//! `dw_striding` subsampling (NeMo `ConvSubsampling`): the features as a one-channel image
//! `[T, n_mels]`, then `Conv2d(1→C, 3, s2, p1) → ReLU`, then per further stage
//! `depthwise Conv2d(C, 3, s2, p1) → pointwise Conv2d(C→C, 1) → ReLU`, then `[T', C·F']` into
//! `out` Linear. Only valid frames come in, so NeMo's length masking is a no-op here.

use crate::checkpoint::TensorMap;
use crate::error::ModelError;
use crate::linalg::{load_vector, matmul, relu_in_place, Bias, Linear};
use model_core::config::EncoderConfig;
use model_core::encoder::{stride2_out_len, subsampled_len};

const KERNEL: usize = 3;
const TAPS: usize = KERNEL * KERNEL;
/// Output frames computed per chunk (bounds memory on long inputs).
const OUTPUT_FRAMES_PER_CHUNK: usize = 128;

/// A `[channels, rows, cols]` activation.
struct Planes {
    channels: usize,
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

#[derive(Debug, Clone)]
struct DepthwiseStage {
    /// `[C, 3·3]`.
    depthwise_weight: Vec<f32>,
    depthwise_bias: Vec<f32>,
    pointwise: Linear,
}

#[derive(Debug, Clone)]
pub(crate) struct Subsampling {
    channels: usize,
    /// `[C, 3·3]` of the first (single input channel) convolution.
    first_weight: Vec<f32>,
    first_bias: Vec<f32>,
    stages: Vec<DepthwiseStage>,
    out: Linear,
}

impl Subsampling {
    pub(crate) fn load(tensors: &TensorMap, cfg: &EncoderConfig) -> Result<Self, ModelError> {
        let factor = cfg.subsampling_factor;
        if factor < 2 || !factor.is_power_of_two() {
            return Err(ModelError::UnsupportedConfig {
                file: tensors.source.clone(),
                key: "encoder.subsampling_factor".into(),
                value: factor.to_string(),
            });
        }
        let n_stages = factor.trailing_zeros() as usize;
        let c = cfg.subsampling_conv_channels;
        let p = "encoder.pre_encode";
        let first_weight = tensors.get(&format!("{p}.conv.0.weight"), &[c, 1, KERNEL, KERNEL])?;
        let first_bias = load_vector(tensors, &format!("{p}.conv.0.bias"), c)?;
        let mut stages = Vec::new();
        for s in 1..n_stages {
            let (dw, pw) = (3 * s - 1, 3 * s);
            let w = tensors.get(&format!("{p}.conv.{dw}.weight"), &[c, 1, KERNEL, KERNEL])?;
            let pw_weight = tensors.get(&format!("{p}.conv.{pw}.weight"), &[c, c, 1, 1])?;
            let pw_bias = load_vector(tensors, &format!("{p}.conv.{pw}.bias"), c)?;
            stages.push(DepthwiseStage {
                depthwise_weight: w.data.clone(),
                depthwise_bias: load_vector(tensors, &format!("{p}.conv.{dw}.bias"), c)?,
                pointwise: Linear::new(c, c, pw_weight.data.clone(), Some(pw_bias)),
            });
        }
        let mut freq = cfg.feat_in;
        for _ in 0..n_stages {
            freq = stride2_out_len(freq);
        }
        let out = Linear::load(
            tensors,
            &format!("{p}.out"),
            c * freq,
            cfg.d_model,
            false,
            Bias::Required,
        )?;
        Ok(Self {
            channels: c,
            first_weight: first_weight.data.clone(),
            first_bias,
            stages,
            out,
        })
    }

    /// `features` is `[n_mels, t]`; returns `([t', d_model], t')`.
    ///
    /// Long inputs run in time chunks so the first stage's `C × t/2 × n_mels/2` activation stays
    /// small. A chunk producing output frames `[a, b)` reads input rows from `8a − 8` (one
    /// output frame of left context, discarded, absorbs the chunk-local zero padding) to `8b + 8`,
    /// which covers every row those outputs depend on, so chunking changes no value.
    pub(crate) fn forward(&self, features: &[f32], n_mels: usize, t: usize) -> (Vec<f32>, usize) {
        let factor = 1usize << (self.stages.len() + 1);
        let out_len = subsampled_len(t, self.stages.len() + 1);
        let mut out = Vec::with_capacity(out_len * self.out.out_dim);
        let mut a = 0;
        while a < out_len {
            let b = (a + OUTPUT_FRAMES_PER_CHUNK).min(out_len);
            let skip = usize::from(a > 0);
            let first = (a - skip) * factor;
            let last = ((b + 1) * factor).min(t);
            let (chunk, rows) = self.forward_rows(features, n_mels, t, first, last);
            debug_assert!(rows >= skip + b - a, "chunk too short (bug)");
            out.extend_from_slice(
                &chunk[skip * self.out.out_dim..(skip + b - a) * self.out.out_dim],
            );
            a = b;
        }
        (out, out_len)
    }

    /// The whole stack on input rows `[first, last)`, zero padded at the slice's edges.
    fn forward_rows(
        &self,
        features: &[f32],
        n_mels: usize,
        t: usize,
        first: usize,
        last: usize,
    ) -> (Vec<f32>, usize) {
        let rows = last - first;
        let mut image = vec![0.0; rows * n_mels];
        for m in 0..n_mels {
            for (r, v) in features[m * t + first..m * t + last].iter().enumerate() {
                image[r * n_mels + m] = *v;
            }
        }
        let mut x = self.first_conv(&image, rows, n_mels);
        relu_in_place(&mut x.data);
        for stage in &self.stages {
            x = depthwise_conv(&x, &stage.depthwise_weight, &stage.depthwise_bias);
            // Pointwise 1×1: [C, C] · [C, rows·cols].
            let positions = x.rows * x.cols;
            let mut y = vec![0.0; self.channels * positions];
            matmul(
                stage.pointwise.weight(),
                self.channels,
                self.channels,
                &x.data,
                positions,
                &mut y,
            );
            let bias = stage
                .pointwise
                .bias()
                .expect("pointwise bias is loaded (bug)");
            for (plane, b) in y.chunks_exact_mut(positions).zip(bias) {
                for v in plane.iter_mut() {
                    *v += b;
                }
            }
            relu_in_place(&mut y);
            x.data = y;
        }
        // [C, T', F'] → [T', C·F'] (channel-major within a frame, as NeMo's reshape).
        let (tp, fp) = (x.rows, x.cols);
        let width = self.channels * fp;
        let mut flat = vec![0.0; tp * width];
        for c in 0..self.channels {
            for ti in 0..tp {
                let src = &x.data[(c * tp + ti) * fp..(c * tp + ti + 1) * fp];
                flat[ti * width + c * fp..ti * width + (c + 1) * fp].copy_from_slice(src);
            }
        }
        (self.out.forward(&flat, tp), tp)
    }

    /// The first convolution as im2col + sgemm.
    fn first_conv(&self, image: &[f32], rows: usize, cols: usize) -> Planes {
        let (out_rows, out_cols) = (stride2_out_len(rows), stride2_out_len(cols));
        let positions = out_rows * out_cols;
        let mut patches = vec![0.0; TAPS * positions];
        for ki in 0..KERNEL {
            for kj in 0..KERNEL {
                let tap = &mut patches[(ki * KERNEL + kj) * positions..][..positions];
                for r in 0..out_rows {
                    let Some(src_r) = (2 * r + ki).checked_sub(1).filter(|v| *v < rows) else {
                        continue;
                    };
                    for c in 0..out_cols {
                        if let Some(src_c) = (2 * c + kj).checked_sub(1).filter(|v| *v < cols) {
                            tap[r * out_cols + c] = image[src_r * cols + src_c];
                        }
                    }
                }
            }
        }
        let mut data = vec![0.0; self.channels * positions];
        matmul(
            &self.first_weight,
            self.channels,
            TAPS,
            &patches,
            positions,
            &mut data,
        );
        for (plane, b) in data.chunks_exact_mut(positions).zip(&self.first_bias) {
            for v in plane.iter_mut() {
                *v += b;
            }
        }
        Planes {
            channels: self.channels,
            rows: out_rows,
            cols: out_cols,
            data,
        }
    }
}

/// Depthwise `3×3, stride 2, padding 1` convolution of every channel.
fn depthwise_conv(x: &Planes, weight: &[f32], bias: &[f32]) -> Planes {
    let (out_rows, out_cols) = (stride2_out_len(x.rows), stride2_out_len(x.cols));
    let mut data = vec![0.0; x.channels * out_rows * out_cols];
    for ch in 0..x.channels {
        let src = &x.data[ch * x.rows * x.cols..(ch + 1) * x.rows * x.cols];
        let w = &weight[ch * TAPS..(ch + 1) * TAPS];
        let dst = &mut data[ch * out_rows * out_cols..(ch + 1) * out_rows * out_cols];
        for r in 0..out_rows {
            for c in 0..out_cols {
                let mut acc = bias[ch];
                for ki in 0..KERNEL {
                    let Some(sr) = (2 * r + ki).checked_sub(1).filter(|v| *v < x.rows) else {
                        continue;
                    };
                    for kj in 0..KERNEL {
                        if let Some(sc) = (2 * c + kj).checked_sub(1).filter(|v| *v < x.cols) {
                            acc += w[ki * KERNEL + kj] * src[sr * x.cols + sc];
                        }
                    }
                }
                dst[r * out_cols + c] = acc;
            }
        }
    }
    Planes {
        channels: x.channels,
        rows: out_rows,
        cols: out_cols,
        data,
    }
}
