//! Relative-position multi-head self-attention (Transformer-XL style, NeMo
//! `RelPositionMultiHeadAttention`) and its local band variant (`...Longformer` without global
//! tokens), for one unpadded utterance.
//!
//! Score of query i and key j in a head: `((q_i + u)·k_j + (q_i + v)·p_{rel}) / √d_k`.
//! - Full: `rel = i − j`, `p` from the `2T−1` row table (NeMo's `rel_shift`).
//! - Local `[left, right]`: keys `i−left ..= i+right` inside the utterance; the `bd` term comes
//!   from the `left+right+1` row band table, placed as NeMo places it (band column
//!   `c = j − i + w`, `w = max(left, right)`: columns `< left` take row `c`, columns
//!   `>= 2w − right` take row `left + c − (2w − right)`, any others get none). Keys outside the
//!   utterance or the context get weight exactly 0 in NeMo (−10000 or −inf before a softmax that
//!   always has the query's own key), so they are skipped here.

use crate::checkpoint::TensorMap;
use crate::error::ModelError;
use crate::linalg::{matmul, matmul_bt, softmax_in_place, Bias, Linear};
use model_core::config::{AttentionModel, EncoderConfig};

/// Queries handled per score block: bounds the score memory at `QUERY_BLOCK × T` per head.
const QUERY_BLOCK: usize = 256;

#[derive(Debug, Clone)]
pub(crate) struct RelPosAttention {
    n_heads: usize,
    d_k: usize,
    linear_q: Linear,
    linear_k: Linear,
    linear_v: Linear,
    linear_out: Linear,
    linear_pos: Linear,
    /// `[n_heads, d_k]`.
    pos_bias_u: Vec<f32>,
    pos_bias_v: Vec<f32>,
}

/// One head's operands, each `[rows, d_k]` contiguous.
struct Head {
    q_u: Vec<f32>,
    q_v: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    p: Vec<f32>,
}

impl RelPosAttention {
    /// `prefix` is `encoder.layers.N.self_attn`. Per-layer `pos_bias_u/v` (NeMo
    /// `untie_biases: true`) or the encoder-wide ones otherwise.
    pub(crate) fn load(
        tensors: &TensorMap,
        prefix: &str,
        cfg: &EncoderConfig,
    ) -> Result<Self, ModelError> {
        let d = cfg.d_model;
        if cfg.n_heads == 0 || !d.is_multiple_of(cfg.n_heads) {
            return Err(ModelError::InvalidConfig {
                file: tensors.source.clone(),
                key: "encoder.n_heads".into(),
                problem: format!("d_model {d} is not divisible by {} heads", cfg.n_heads),
            });
        }
        let d_k = d / cfg.n_heads;
        let bias = Bias::required_if(cfg.use_bias);
        let linear = |name: &str, bias| {
            Linear::load(tensors, &format!("{prefix}.{name}"), d, d, false, bias)
        };
        let pos_bias = |name: &str| -> Result<Vec<f32>, ModelError> {
            let layer_key = format!("{prefix}.{name}");
            let key = if tensors.contains(&layer_key) {
                layer_key
            } else {
                format!("encoder.{name}")
            };
            Ok(tensors.get(&key, &[cfg.n_heads, d_k])?.data.clone())
        };
        Ok(Self {
            n_heads: cfg.n_heads,
            d_k,
            linear_q: linear("linear_q", bias)?,
            linear_k: linear("linear_k", bias)?,
            linear_v: linear("linear_v", bias)?,
            linear_out: linear("linear_out", bias)?,
            linear_pos: linear("linear_pos", Bias::IfPresent)?,
            pos_bias_u: pos_bias("pos_bias_u")?,
            pos_bias_v: pos_bias("pos_bias_v")?,
        })
    }

    /// `x` is `[t, d_model]`; `pos_emb` is the position table of `model` (`2t−1` rows for full
    /// attention, `left+right+1` for local). Returns `[t, d_model]`.
    pub(crate) fn forward(
        &self,
        x: &[f32],
        t: usize,
        model: AttentionModel,
        pos_emb: &[f32],
    ) -> Vec<f32> {
        let d = self.n_heads * self.d_k;
        let n_pos = pos_emb.len() / d;
        let q = self.linear_q.forward(x, t);
        let k = self.linear_k.forward(x, t);
        let v = self.linear_v.forward(x, t);
        let p = self.linear_pos.forward(pos_emb, n_pos);

        let mut context = vec![0.0; t * d];
        for h in 0..self.n_heads {
            let head = self.split_head(h, &q, &k, &v, &p, t, n_pos);
            let out = self.head_context(&head, t, model);
            for (i, row) in out.chunks_exact(self.d_k).enumerate() {
                context[i * d + h * self.d_k..i * d + (h + 1) * self.d_k].copy_from_slice(row);
            }
        }
        self.linear_out.forward(&context, t)
    }

    #[allow(clippy::too_many_arguments)]
    fn split_head(
        &self,
        h: usize,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        p: &[f32],
        t: usize,
        n_pos: usize,
    ) -> Head {
        let (d, dk) = (self.n_heads * self.d_k, self.d_k);
        let cols = h * dk..(h + 1) * dk;
        let take = |m: &[f32], rows: usize| -> Vec<f32> {
            let mut out = Vec::with_capacity(rows * dk);
            for r in 0..rows {
                out.extend_from_slice(&m[r * d + cols.start..r * d + cols.end]);
            }
            out
        };
        let with_bias = |bias: &[f32]| -> Vec<f32> {
            let mut out = take(q, t);
            let b = &bias[cols.clone()];
            for row in out.chunks_exact_mut(dk) {
                for (x, bi) in row.iter_mut().zip(b) {
                    *x += bi;
                }
            }
            out
        };
        Head {
            q_u: with_bias(&self.pos_bias_u),
            q_v: with_bias(&self.pos_bias_v),
            k: take(k, t),
            v: take(v, t),
            p: take(p, n_pos),
        }
    }

    /// Attention output of one head, `[t, d_k]`.
    fn head_context(&self, head: &Head, t: usize, model: AttentionModel) -> Vec<f32> {
        let dk = self.d_k;
        let scale = (dk as f32).sqrt();
        let mut out = vec![0.0; t * dk];
        let mut i0 = 0;
        while i0 < t {
            let i1 = (i0 + QUERY_BLOCK).min(t);
            let rows = i1 - i0;
            let q_u = &head.q_u[i0 * dk..i1 * dk];
            let q_v = &head.q_v[i0 * dk..i1 * dk];
            // Key range this block can see.
            let (lo, hi) = match model {
                AttentionModel::RelPos => (0, t),
                AttentionModel::RelPosLocal { left, right } => {
                    (i0.saturating_sub(left), (i1 + right).min(t))
                }
            };
            let n_keys = hi - lo;
            let mut ac = vec![0.0; rows * n_keys];
            matmul_bt(q_u, rows, dk, &head.k[lo * dk..hi * dk], n_keys, &mut ac);

            let mut probs = vec![0.0; rows * n_keys];
            match model {
                AttentionModel::RelPos => {
                    // Positions needed by this block: table rows t−i1 .. t−i1+rows+t−1.
                    let r0 = t - i1;
                    let n_rel = rows + t - 1;
                    let mut bd = vec![0.0; rows * n_rel];
                    matmul_bt(
                        q_v,
                        rows,
                        dk,
                        &head.p[r0 * dk..(r0 + n_rel) * dk],
                        n_rel,
                        &mut bd,
                    );
                    for r in 0..rows {
                        let i = i0 + r;
                        let scores = &mut probs[r * n_keys..(r + 1) * n_keys];
                        let ac_row = &ac[r * n_keys..(r + 1) * n_keys];
                        // Table row of (i, j) is t−1−i+j, i.e. bd column i1−1−i+j.
                        let bd_row = &bd[r * n_rel + (i1 - 1 - i)..r * n_rel + (i1 - 1 - i) + t];
                        for ((s, a), b) in scores.iter_mut().zip(ac_row).zip(bd_row) {
                            *s = (a + b) / scale;
                        }
                        softmax_in_place(scores);
                    }
                }
                AttentionModel::RelPosLocal { left, right } => {
                    let w = left.max(right);
                    let n_band = left + right + 1;
                    let mut bd = vec![0.0; rows * n_band];
                    matmul_bt(q_v, rows, dk, &head.p, n_band, &mut bd);
                    for r in 0..rows {
                        let i = i0 + r;
                        let (j_lo, j_hi) = (i.saturating_sub(left), (i + right + 1).min(t));
                        let scores = &mut probs[r * n_keys..(r + 1) * n_keys];
                        for j in j_lo..j_hi {
                            let c = j + w - i;
                            let b = if c < left {
                                bd[r * n_band + c]
                            } else if c >= 2 * w - right {
                                bd[r * n_band + left + c - (2 * w - right)]
                            } else {
                                0.0
                            };
                            scores[j - lo] = (ac[r * n_keys + j - lo] + b) / scale;
                        }
                        softmax_in_place(&mut scores[j_lo - lo..j_hi - lo]);
                    }
                }
            }
            matmul(
                &probs,
                rows,
                n_keys,
                &head.v[lo * dk..hi * dk],
                dk,
                &mut out[i0 * dk..i1 * dk],
            );
            i0 = i1;
        }
        out
    }
}
