//! Dense f32 building blocks of the CPU reference: sgemm-backed Linear layers (torch weight
//! layout), layer norm, softmax and activations. Activations are row-major `[rows, dim]`.

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use crate::checkpoint::TensorMap;
use crate::error::ModelError;

/// `out[m, n] = a[m, k] · b[k, n]` through matrixmultiply's sgemm.
pub(crate) fn matmul(a: &[f32], m: usize, k: usize, b: &[f32], n: usize, out: &mut [f32]) {
    if m == 0 || n == 0 {
        return;
    }
    let a = ArrayView2::from_shape((m, k), a).expect("matmul lhs shape (bug)");
    let b = ArrayView2::from_shape((k, n), b).expect("matmul rhs shape (bug)");
    let mut c = ArrayViewMut2::from_shape((m, n), out).expect("matmul out shape (bug)");
    general_mat_mul(1.0, &a, &b, 0.0, &mut c);
}

/// `out[m, n] = a[m, k] · b[n, k]ᵀ` (b in torch's `[out, in]` Linear layout).
pub(crate) fn matmul_bt(a: &[f32], m: usize, k: usize, b: &[f32], n: usize, out: &mut [f32]) {
    if m == 0 || n == 0 {
        return;
    }
    let a = ArrayView2::from_shape((m, k), a).expect("matmul lhs shape (bug)");
    let b = ArrayView2::from_shape((n, k), b).expect("matmul rhs shape (bug)");
    let mut c = ArrayViewMut2::from_shape((m, n), out).expect("matmul out shape (bug)");
    general_mat_mul(1.0, &a, &b.t(), 0.0, &mut c);
}

/// Dot product with eight independent accumulators (vectorises without fast-math). Its
/// summation order depends only on the two vectors, never on a batch size.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8;
    for (ca, cb) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += ca[i] * cb[i];
        }
    }
    let mut tail = 0.0f32;
    for i in chunks * 8..a.len() {
        tail += a[i] * b[i];
    }
    let s0 = (acc[0] + acc[4]) + (acc[1] + acc[5]);
    let s1 = (acc[2] + acc[6]) + (acc[3] + acc[7]);
    (s0 + s1) + tail
}

/// Whether a layer's bias must exist, or is used only when the state dict has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bias {
    Required,
    IfPresent,
}

impl Bias {
    pub(crate) fn required_if(flag: bool) -> Self {
        if flag {
            Bias::Required
        } else {
            Bias::IfPresent
        }
    }
}

/// Load a 1-D parameter of length `n`.
pub(crate) fn load_vector(
    tensors: &TensorMap,
    name: &str,
    n: usize,
) -> Result<Vec<f32>, ModelError> {
    Ok(tensors.get(name, &[n])?.data.clone())
}

/// A torch `nn.Linear` (or a kernel-1 `nn.Conv1d`): `y = x Wᵀ + b`.
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    pub(crate) in_dim: usize,
    pub(crate) out_dim: usize,
    /// `[out_dim, in_dim]` row-major.
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
}

impl Linear {
    pub(crate) fn new(
        in_dim: usize,
        out_dim: usize,
        weight: Vec<f32>,
        bias: Option<Vec<f32>>,
    ) -> Self {
        assert_eq!(weight.len(), in_dim * out_dim, "linear weight size (bug)");
        if let Some(b) = &bias {
            assert_eq!(b.len(), out_dim, "linear bias size (bug)");
        }
        Self {
            in_dim,
            out_dim,
            weight,
            bias,
        }
    }

    /// `{prefix}.weight` of shape `[out, in]` (or `[out, in, 1]` for a pointwise Conv1d when
    /// `conv1d`), and `{prefix}.bias` per `bias`.
    pub(crate) fn load(
        tensors: &TensorMap,
        prefix: &str,
        in_dim: usize,
        out_dim: usize,
        conv1d: bool,
        bias: Bias,
    ) -> Result<Self, ModelError> {
        let weight_name = format!("{prefix}.weight");
        let weight = if conv1d {
            tensors.get(&weight_name, &[out_dim, in_dim, 1])?
        } else {
            tensors.get(&weight_name, &[out_dim, in_dim])?
        };
        let bias_name = format!("{prefix}.bias");
        let bias = match bias {
            Bias::Required => Some(tensors.get(&bias_name, &[out_dim])?),
            Bias::IfPresent => tensors.get_optional(&bias_name, &[out_dim])?,
        };
        Ok(Self::new(
            in_dim,
            out_dim,
            weight.data.clone(),
            bias.map(|b| b.data.clone()),
        ))
    }

    pub(crate) fn weight(&self) -> &[f32] {
        &self.weight
    }

    pub(crate) fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// `x` is `[rows, in_dim]`; returns `[rows, out_dim]` (sgemm).
    pub(crate) fn forward(&self, x: &[f32], rows: usize) -> Vec<f32> {
        debug_assert_eq!(x.len(), rows * self.in_dim);
        let mut out = vec![0.0; rows * self.out_dim];
        matmul_bt(x, rows, self.in_dim, &self.weight, self.out_dim, &mut out);
        self.add_bias(&mut out);
        out
    }

    /// Like [`Self::forward`] but one dot product per output, so every row's result is
    /// independent of how many rows are computed together (batched decoding).
    pub(crate) fn forward_rowwise(&self, x: &[f32], rows: usize) -> Vec<f32> {
        debug_assert_eq!(x.len(), rows * self.in_dim);
        let mut out = vec![0.0; rows * self.out_dim];
        for (xr, or) in x
            .chunks_exact(self.in_dim)
            .zip(out.chunks_exact_mut(self.out_dim))
        {
            for (o, w) in or.iter_mut().zip(self.weight.chunks_exact(self.in_dim)) {
                *o = dot(xr, w);
            }
        }
        self.add_bias(&mut out);
        out
    }

    fn add_bias(&self, out: &mut [f32]) {
        if let Some(b) = &self.bias {
            for row in out.chunks_exact_mut(self.out_dim) {
                for (o, bi) in row.iter_mut().zip(b) {
                    *o += bi;
                }
            }
        }
    }
}

/// torch `nn.LayerNorm` over the last dimension (biased variance).
#[derive(Debug, Clone)]
pub(crate) struct LayerNorm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    pub(crate) fn load(
        tensors: &TensorMap,
        prefix: &str,
        dim: usize,
        eps: f32,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            gamma: load_vector(tensors, &format!("{prefix}.weight"), dim)?,
            beta: load_vector(tensors, &format!("{prefix}.bias"), dim)?,
            eps,
        })
    }

    /// `x` is `[rows, dim]`; returns the normalised copy.
    pub(crate) fn forward(&self, x: &[f32]) -> Vec<f32> {
        let dim = self.gamma.len();
        let mut out = vec![0.0; x.len()];
        for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
            let mean = xr.iter().map(|v| *v as f64).sum::<f64>() / dim as f64;
            let var = xr
                .iter()
                .map(|v| {
                    let d = *v as f64 - mean;
                    d * d
                })
                .sum::<f64>()
                / dim as f64;
            let inv = 1.0 / (var + self.eps as f64).sqrt();
            for ((o, v), (g, b)) in or.iter_mut().zip(xr).zip(self.gamma.iter().zip(&self.beta)) {
                *o = ((*v as f64 - mean) * inv) as f32 * g + b;
            }
        }
        out
    }
}

/// In-place numerically stable softmax of one row.
pub(crate) fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// SiLU / Swish: `x · σ(x)`.
pub(crate) fn silu_in_place(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v *= sigmoid(*v);
    }
}

pub(crate) fn relu_in_place(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = v.max(0.0);
    }
}

/// `x += scale · y`, element-wise.
pub(crate) fn add_scaled(x: &mut [f32], y: &[f32], scale: f32) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += scale * b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_bt_matches_naive() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut out = vec![0.0; m * n];
        matmul_bt(&a, m, k, &b, n, &mut out);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k).map(|t| a[i * k + t] * b[j * k + t]).sum();
                assert!((out[i * n + j] - want).abs() < 1e-5);
            }
        }
        let lin = Linear::new(k, n, b.clone(), Some(vec![1.0, 2.0, 3.0]));
        let fast = lin.forward(&a, m);
        let rowwise = lin.forward_rowwise(&a, m);
        for (x, y) in fast.iter().zip(&rowwise) {
            assert!((x - y).abs() < 1e-5);
        }
    }

    #[test]
    fn softmax_sums_to_one() {
        let mut row = vec![1.0, 2.0, -3.0, 1000.0];
        softmax_in_place(&mut row);
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(row[3] > 0.99);
    }
}
