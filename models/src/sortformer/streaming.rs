//! The streaming state of Streaming Sortformer (AOSC: arrival-order speaker cache) and its
//! update after each chunk, following NeMo's synchronous `streaming_update` and
//! `_compress_spkcache` at inference (no speaker permutation, no score noise).
//!
//! The state holds **pre-encode** embeddings (after subsampling, before the conformer layers):
//! a FIFO of the most recent frames and a speaker cache of frames chosen per speaker. Each step
//! the chunk's frames join the FIFO; when the FIFO overflows, its oldest frames move to the cache
//! (and silent ones update a mean silence embedding); when the cache overflows, it is compressed
//! back to `spkcache_len` frames: per speaker the frames with the best "only this speaker speaks"
//! log scores, after boosts that guarantee each speaker a share, plus silence slots.

use super::config::StreamingParams;
use super::torch_order::topk_indices;

/// Sentinel for cache slots that stay empty (NeMo uses index 99999); sorts after every frame.
const DISABLED: usize = usize::MAX;

/// `[frames, dim]` row-major embeddings plus per-frame speaker probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamingState {
    pub dim: usize,
    pub num_speakers: usize,
    /// Speaker cache embeddings, `[spkcache_frames, dim]`.
    pub spkcache: Vec<f32>,
    /// Probabilities kept with the cache, `[spkcache_frames, num_speakers]`; `None` until the
    /// cache is first compressed (NeMo reads them from the current step before that).
    pub spkcache_preds: Option<Vec<f32>>,
    /// FIFO embeddings, `[fifo_frames, dim]`.
    pub fifo: Vec<f32>,
    /// The FIFO's probabilities from the latest step, `[fifo_frames, num_speakers]`.
    pub fifo_preds: Vec<f32>,
    /// Mean embedding of the silent frames that left the FIFO so far, `[dim]`.
    pub mean_sil_emb: Vec<f32>,
    pub n_sil_frames: usize,
}

impl StreamingState {
    pub fn new(dim: usize, num_speakers: usize) -> Self {
        Self {
            dim,
            num_speakers,
            spkcache: Vec::new(),
            spkcache_preds: None,
            fifo: Vec::new(),
            fifo_preds: Vec::new(),
            mean_sil_emb: vec![0.0; dim],
            n_sil_frames: 0,
        }
    }

    pub fn spkcache_frames(&self) -> usize {
        self.spkcache.len() / self.dim
    }

    pub fn fifo_frames(&self) -> usize {
        self.fifo.len() / self.dim
    }

    /// Whether the buffers agree with each other (they always do unless edited by hand).
    pub fn is_consistent(&self) -> bool {
        let (d, k) = (self.dim, self.num_speakers);
        d > 0
            && k > 0
            && self.spkcache.len().is_multiple_of(d)
            && self.fifo.len().is_multiple_of(d)
            && self.mean_sil_emb.len() == d
            && self.fifo_preds.len() == self.fifo_frames() * k
            && self
                .spkcache_preds
                .as_ref()
                .is_none_or(|p| p.len() == self.spkcache_frames() * k)
    }

    /// The model input before the chunk: `[spkcache; fifo]` embeddings.
    pub fn context(&self) -> Vec<f32> {
        let mut x = Vec::with_capacity(self.spkcache.len() + self.fifo.len());
        x.extend_from_slice(&self.spkcache);
        x.extend_from_slice(&self.fifo);
        x
    }

    /// Folds one step in. `chunk` is the step's pre-encoded embeddings `[lc + c + rc, dim]`,
    /// `preds` the model's probabilities for `[spkcache; fifo; chunk]`; returns the chunk's own
    /// probabilities `[c, num_speakers]` (context frames `lc`/`rc` excluded).
    pub fn update(
        &mut self,
        params: &StreamingParams,
        chunk: &[f32],
        preds: &[f32],
        lc: usize,
        rc: usize,
    ) -> Vec<f32> {
        let (d, k) = (self.dim, self.num_speakers);
        let (cache_len, fifo_len) = (self.spkcache_frames(), self.fifo_frames());
        let chunk_len = (chunk.len() / d).saturating_sub(lc + rc);
        debug_assert_eq!(
            preds.len(),
            (cache_len + fifo_len + chunk.len() / d) * k,
            "preds (bug)"
        );

        self.fifo_preds = preds[cache_len * k..(cache_len + fifo_len) * k].to_vec();
        let chunk_start = cache_len + fifo_len + lc;
        let chunk_preds = preds[chunk_start * k..(chunk_start + chunk_len) * k].to_vec();
        self.fifo
            .extend_from_slice(&chunk[lc * d..(lc + chunk_len) * d]);
        self.fifo_preds.extend_from_slice(&chunk_preds);

        if fifo_len + chunk_len > params.fifo_len_frames {
            let overflow = fifo_len + chunk_len - params.fifo_len_frames;
            let pop = params
                .spkcache_update_period_frames
                .max(overflow)
                .min(fifo_len + chunk_len);
            let pop_embs: Vec<f32> = self.fifo.drain(..pop * d).collect();
            let pop_preds: Vec<f32> = self.fifo_preds.drain(..pop * k).collect();
            self.update_silence_profile(params, &pop_embs, &pop_preds);
            self.spkcache.extend_from_slice(&pop_embs);
            if let Some(cache_preds) = &mut self.spkcache_preds {
                cache_preds.extend_from_slice(&pop_preds);
            }
            if self.spkcache_frames() > params.spkcache_len_frames {
                let cache_preds = self.spkcache_preds.take().unwrap_or_else(|| {
                    let mut p = preds[..cache_len * k].to_vec();
                    p.extend_from_slice(&pop_preds);
                    p
                });
                let (cache, cache_preds) = compress(
                    params,
                    &self.spkcache,
                    &cache_preds,
                    &self.mean_sil_emb,
                    d,
                    k,
                );
                self.spkcache = cache;
                self.spkcache_preds = Some(cache_preds);
            }
        }
        chunk_preds
    }

    /// Running mean of the embeddings whose probabilities sum below `sil_threshold`.
    fn update_silence_profile(&mut self, params: &StreamingParams, embs: &[f32], preds: &[f32]) {
        let (d, k) = (self.dim, self.num_speakers);
        let mut sum = vec![0.0f32; d];
        let mut count = 0;
        for (emb, p) in embs.chunks_exact(d).zip(preds.chunks_exact(k)) {
            if p.iter().sum::<f32>() < params.sil_threshold {
                count += 1;
                sum.iter_mut().zip(emb).for_each(|(s, e)| *s += e);
            }
        }
        if count == 0 {
            return;
        }
        let total = self.n_sil_frames + count;
        let old = self.n_sil_frames as f32;
        for (m, s) in self.mean_sil_emb.iter_mut().zip(&sum) {
            *m = (*m * old + s) / total as f32;
        }
        self.n_sil_frames = total;
    }
}

/// Cache compression: `emb` `[n, d]` with `preds` `[n, k]` (n > spkcache_len) to exactly
/// `spkcache_len` frames, grouped by speaker, frame order kept within a speaker, each speaker's
/// block followed by its silence slots; unfilled slots come last. Slots that are silence or
/// unfilled get the mean silence embedding and zero probabilities.
fn compress(
    params: &StreamingParams,
    emb: &[f32],
    preds: &[f32],
    mean_sil_emb: &[f32],
    d: usize,
    k: usize,
) -> (Vec<f32>, Vec<f32>) {
    let n = preds.len() / k;
    let cache_len = params.spkcache_len_frames;
    let sil = params.spkcache_sil_frames_per_spk;
    let per_spk = (cache_len / k).saturating_sub(sil);
    let rate = |r: f64| (per_spk as f64 * r).floor().max(0.0) as usize;
    let strong = rate(params.strong_boost_rate);
    let weak = rate(params.weak_boost_rate);
    let min_pos = rate(params.min_pos_scores_rate);

    // scores[s][t], speaker-major as NeMo flattens them.
    let mut scores = log_pred_scores(params, preds, k);
    disable_low_scores(preds, &mut scores, k, min_pos);
    if params.scores_boost_latest > 0.0 {
        for column in scores.iter_mut() {
            for s in column.iter_mut().skip(cache_len) {
                *s += params.scores_boost_latest;
            }
        }
    }
    let ln_half = 0.5f64.ln();
    for column in scores.iter_mut() {
        boost_top(column, strong, (-2.0 * ln_half) as f32);
    }
    for column in scores.iter_mut() {
        boost_top(column, weak, (-ln_half) as f32);
    }

    // Top `cache_len` of all speakers' scores, silence slots (+inf) included.
    let padded = n + sil;
    let mut flat: Vec<f32> = Vec::with_capacity(k * padded);
    for column in &scores {
        flat.extend_from_slice(column);
        flat.extend(std::iter::repeat_n(f32::INFINITY, sil));
    }
    let mut chosen: Vec<usize> = topk_indices(&flat, cache_len)
        .into_iter()
        .map(|i| {
            if flat[i] == f32::NEG_INFINITY {
                DISABLED
            } else {
                i
            }
        })
        .collect();
    chosen.sort_unstable();

    let mut out_emb = Vec::with_capacity(cache_len * d);
    let mut out_preds = Vec::with_capacity(cache_len * k);
    for index in chosen {
        let frame = if index == DISABLED { n } else { index % padded };
        if frame >= n {
            out_emb.extend_from_slice(mean_sil_emb);
            out_preds.extend(std::iter::repeat_n(0.0, k));
        } else {
            out_emb.extend_from_slice(&emb[frame * d..(frame + 1) * d]);
            out_preds.extend_from_slice(&preds[frame * k..(frame + 1) * k]);
        }
    }
    (out_emb, out_preds)
}

/// Per speaker and frame: high when this speaker alone is confidently active,
/// `log p_s − log(1−p_s) + Σ_j log(1−p_j) − log ½`, probabilities clamped at the threshold.
fn log_pred_scores(params: &StreamingParams, preds: &[f32], k: usize) -> Vec<Vec<f32>> {
    let floor = params.pred_score_threshold;
    let ln_half = 0.5f64.ln() as f32;
    let n = preds.len() / k;
    let mut scores = vec![vec![0.0f32; n]; k];
    for (t, row) in preds.chunks_exact(k).enumerate() {
        let log_1: Vec<f32> = row.iter().map(|p| (1.0 - p).max(floor).ln()).collect();
        let log_1_sum: f32 = log_1.iter().sum();
        for (s, p) in row.iter().enumerate() {
            scores[s][t] = p.max(floor).ln() - log_1[s] + log_1_sum - ln_half;
        }
    }
    scores
}

/// Non-speech (p ≤ ½) scores become −∞; so do a speaker's non-positive speech scores
/// (overlap, mostly) once that speaker has at least `min_pos` positive ones.
fn disable_low_scores(preds: &[f32], scores: &mut [Vec<f32>], k: usize, min_pos: usize) {
    for (s, column) in scores.iter_mut().enumerate() {
        let speech: Vec<bool> = preds.chunks_exact(k).map(|row| row[s] > 0.5).collect();
        for (v, &is_speech) in column.iter_mut().zip(&speech) {
            if !is_speech {
                *v = f32::NEG_INFINITY;
            }
        }
        let positives = column.iter().filter(|v| **v > 0.0).count();
        if positives >= min_pos {
            for (v, &is_speech) in column.iter_mut().zip(&speech) {
                if is_speech && *v <= 0.0 {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// Adds `amount` to the `count` highest scores (−∞ stays −∞), chosen as torch does.
fn boost_top(column: &mut [f32], count: usize, amount: f32) {
    for i in topk_indices(column, count) {
        column[i] += amount;
    }
}
