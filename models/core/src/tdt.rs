//! Batched greedy TDT decoding with NeMo's label-looping rules, independent of how the
//! prediction and joint networks are computed (CPU reference, ONNX sessions, ...).
//!
//! Rules (NeMo `tdt_label_looping.py`, `GreedyBatchedTDTLabelLoopingComputer.torch_impl`):
//! - every row starts at frame 0 with the prediction network fed the blank id (SOS) from a zero
//!   state;
//! - at each outer step the joint is evaluated at the row's frame; a blank advances the frame by
//!   its duration, forced to at least 1, and the joint is re-evaluated (same prediction output)
//!   until a non-blank label is found or the row runs out of frames;
//! - a non-blank label is emitted at the frame where it was found, with its predicted duration
//!   (0 allowed), the frame advances by that duration and the prediction network consumes the
//!   label (its state changes only for rows that emitted);
//! - after `max_symbols` consecutive emissions at one frame the frame is forced on by one.
//!
//! Every row's arithmetic depends only on that row, so decoding a clip inside a batch gives
//! exactly its single-clip result.
//!
//! After the loop every hypothesis is scored ([`crate::scores`]): the joint runs once more per
//! frame and per token, with the prediction outputs the loop kept.

use crate::config::DecoderConfig;
use crate::error::CoreError;
use crate::scores::{log_softmax_at, score_items, DecoderScores, ScoreItem};
use crate::transcript::{DecodedToken, Hypothesis};

/// The prediction and joint networks of a transducer, batched over rows.
pub trait TransducerNet {
    /// Prediction-network state for a whole batch (LSTM h/c, ...).
    type State;
    /// The engine's error; the loop's own rule violations arrive as [`CoreError`].
    type Error: From<CoreError>;

    /// Zero state for `batch` rows.
    fn initial_state(&mut self, batch: usize) -> Result<Self::State, Self::Error>;

    /// Feed `labels[b]` (blank = start of sequence) to the prediction network of every row.
    /// Returns the prediction output, row-major `[batch, pred_dim]`, and the next state.
    fn predict(
        &mut self,
        labels: &[u32],
        state: &Self::State,
    ) -> Result<(Vec<f32>, Self::State), Self::Error>;

    /// Keep `next`'s state only for rows where `keep_next[b]`; others take `prev`'s.
    fn select_state(
        &mut self,
        keep_next: &[bool],
        prev: Self::State,
        next: Self::State,
    ) -> Result<Self::State, Self::Error>;

    /// Joint logits for each row: `enc_frames` is `[batch, enc_dim]` (the encoder frame each
    /// row is looking at), `pred` is `[batch, pred_dim]`. Returns `[batch, vocab + 1 + n_durations]`
    /// with blank at index `vocab`, durations last.
    fn joint(&mut self, enc_frames: &[f32], pred: &[f32]) -> Result<Vec<f32>, Self::Error>;
}

/// Encoder output of one utterance, `[frames, dim]` row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedUtterance {
    pub frames: usize,
    pub dim: usize,
    pub data: Vec<f32>,
}

impl EncodedUtterance {
    fn frame(&self, t: usize) -> &[f32] {
        &self.data[t * self.dim..(t + 1) * self.dim]
    }
}

/// Index of the first maximum (torch's argmax picks the first of equal maxima on CPU).
fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best
}

/// Per-row decoding cursor.
#[derive(Debug, Clone)]
struct Row {
    frames: usize,
    time: usize,
    /// Frame of the last emitted label and how many labels were emitted there in a row.
    last_emit_frame: Option<usize>,
    emits_at_last_frame: usize,
    hyp: Hypothesis,
    /// Prediction outputs: after the start of sequence, then after each emitted token.
    preds: Vec<Vec<f32>>,
}

impl Row {
    fn active(&self) -> bool {
        self.time < self.frames
    }

    fn safe_time(&self) -> usize {
        self.time.min(self.frames.saturating_sub(1))
    }
}

/// Greedy batched TDT decoding of `utterances` (each with its own length).
pub fn greedy_decode<N: TransducerNet>(
    net: &mut N,
    cfg: &DecoderConfig,
    utterances: &[EncodedUtterance],
) -> Result<Vec<Hypothesis>, N::Error> {
    let batch = utterances.len();
    if batch == 0 {
        return Ok(Vec::new());
    }
    let dim = utterances[0].dim;
    if let Some(u) = utterances
        .iter()
        .find(|u| u.dim != dim || u.data.len() != u.frames * u.dim)
    {
        return Err(N::Error::from(CoreError::Decode(format!(
            "encoder output of {} frames x {} does not match the batch's dimension {dim}",
            u.frames, u.dim
        ))));
    }
    let blank = cfg.blank_id();
    let n_classes = blank + 1;
    let n_out = n_classes + cfg.durations.len();

    let mut rows: Vec<Row> = utterances
        .iter()
        .map(|u| Row {
            frames: u.frames,
            time: 0,
            last_emit_frame: None,
            emits_at_last_frame: 0,
            hyp: Hypothesis::default(),
            preds: Vec::new(),
        })
        .collect();

    let sos = vec![blank as u32; batch];
    let mut state = net.initial_state(batch)?;
    let (mut pred, next) = net.predict(&sos, &state)?;
    state = next;
    let pred_dim = pred.len() / batch;
    for (b, row) in rows.iter_mut().enumerate() {
        row.preds
            .push(pred[b * pred_dim..(b + 1) * pred_dim].to_vec());
    }

    let mut enc_frames = vec![0.0f32; batch * dim];
    let mut labels = vec![blank; batch];
    let mut durations = vec![0usize; batch];
    // Frame at which each row's current label was found.
    let mut label_frames = vec![0usize; batch];

    let joint_at = |net: &mut N,
                    rows: &[Row],
                    pred: &[f32],
                    enc_frames: &mut Vec<f32>|
     -> Result<Vec<f32>, N::Error> {
        for (b, row) in rows.iter().enumerate() {
            let dst = &mut enc_frames[b * dim..(b + 1) * dim];
            if row.frames == 0 {
                dst.fill(0.0);
            } else {
                dst.copy_from_slice(utterances[b].frame(row.safe_time()));
            }
        }
        let logits = net.joint(enc_frames, pred)?;
        if logits.len() != batch * n_out {
            return Err(N::Error::from(CoreError::Decode(format!(
                "joint returned {} values, expected {batch} x {n_out}",
                logits.len()
            ))));
        }
        Ok(logits)
    };
    let choose = |logits: &[f32], b: usize| -> (usize, usize) {
        let row = &logits[b * n_out..(b + 1) * n_out];
        let label = argmax(&row[..n_classes]);
        let mut duration = cfg.durations[argmax(&row[n_classes..])];
        if label == blank && duration == 0 {
            duration = 1;
        }
        (label, duration)
    };

    while rows.iter().any(Row::active) {
        let was_active: Vec<bool> = rows.iter().map(Row::active).collect();

        // Stage 1: first joint at each row's frame.
        let logits = joint_at(net, &rows, &pred, &mut enc_frames)?;
        for (b, row) in rows.iter_mut().enumerate() {
            let (label, duration) = choose(&logits, b);
            labels[b] = label;
            durations[b] = duration;
            label_frames[b] = row.time;
            if was_active[b] {
                row.time += duration;
            }
        }

        // Stage 1.2: rows that found blank keep looking at later frames.
        let mut searching: Vec<bool> = (0..batch)
            .map(|b| rows[b].active() && labels[b] == blank)
            .collect();
        while searching.iter().any(|s| *s) {
            let logits = joint_at(net, &rows, &pred, &mut enc_frames)?;
            for (b, row) in rows.iter_mut().enumerate() {
                if !searching[b] {
                    continue;
                }
                let (label, duration) = choose(&logits, b);
                labels[b] = label;
                durations[b] = duration;
                label_frames[b] = row.time;
                row.time += duration;
                searching[b] = row.active() && label == blank;
            }
        }

        // Stage 2: record non-blank labels of rows that were active at the start of the step.
        let emitted: Vec<bool> = (0..batch)
            .map(|b| was_active[b] && labels[b] != blank)
            .collect();
        for (b, row) in rows.iter_mut().enumerate() {
            if !emitted[b] {
                continue;
            }
            row.hyp.tokens.push(DecodedToken {
                id: labels[b] as u32,
                frame: label_frames[b],
                duration: durations[b],
            });
            if row.last_emit_frame == Some(label_frames[b]) {
                row.emits_at_last_frame += 1;
            } else {
                row.last_emit_frame = Some(label_frames[b]);
                row.emits_at_last_frame = 1;
            }
        }

        // Stage 3: the prediction network consumes the emitted labels.
        if emitted.iter().any(|e| *e) {
            let fed: Vec<u32> = labels.iter().map(|l| *l as u32).collect();
            let (next_pred, next_state) = net.predict(&fed, &state)?;
            state = net.select_state(&emitted, state, next_state)?;
            for b in (0..batch).filter(|b| emitted[*b]) {
                let row_pred = &next_pred[b * pred_dim..(b + 1) * pred_dim];
                pred[b * pred_dim..(b + 1) * pred_dim].copy_from_slice(row_pred);
                rows[b].preds.push(row_pred.to_vec());
            }
        }

        // Stage 4: after max_symbols labels at one frame, move on by one frame.
        for (b, row) in rows.iter_mut().enumerate() {
            if row.active()
                && labels[b] != blank
                && row.emits_at_last_frame >= cfg.max_symbols_per_step
                && row.last_emit_frame == Some(row.time)
            {
                row.time += 1;
            }
        }
    }

    score(net, cfg, utterances, &mut rows)?;
    Ok(rows.into_iter().map(|r| r.hyp).collect())
}

/// Joint evaluations per scoring call: bounds the logits held at once.
const SCORE_CHUNK: usize = 256;

/// Fills every row's [`Hypothesis::scores`]: the log-probability of each of [`score_items`]'
/// targets, with the encoder frames of `utterances` and the prediction outputs the loop kept.
fn score<N: TransducerNet>(
    net: &mut N,
    cfg: &DecoderConfig,
    utterances: &[EncodedUtterance],
    rows: &mut [Row],
) -> Result<(), N::Error> {
    let blank = cfg.blank_id() as u32;
    let n_classes = cfg.blank_id() + 1;
    let items: Vec<Vec<ScoreItem>> = rows
        .iter()
        .map(|r| score_items(&r.hyp.tokens, r.frames, blank, cfg.max_symbols_per_step))
        .collect();
    // (row, item) pairs in order, evaluated a chunk at a time across rows.
    let all: Vec<(usize, ScoreItem)> = items
        .iter()
        .enumerate()
        .flat_map(|(b, row_items)| row_items.iter().map(move |i| (b, *i)))
        .collect();
    let mut logprobs: Vec<Vec<f32>> = items.iter().map(|i| Vec::with_capacity(i.len())).collect();
    for chunk in all.chunks(SCORE_CHUNK) {
        let mut enc = Vec::new();
        let mut pred = Vec::new();
        for (b, item) in chunk {
            enc.extend_from_slice(utterances[*b].frame(item.frame));
            pred.extend_from_slice(&rows[*b].preds[item.state]);
        }
        let logits = net.joint(&enc, &pred)?;
        let n_out = logits.len() / chunk.len();
        if n_out < n_classes || logits.len() != chunk.len() * n_out {
            return Err(N::Error::from(CoreError::Decode(format!(
                "joint returned {} values for {} scoring rows of at least {n_classes}",
                logits.len(),
                chunk.len()
            ))));
        }
        for (k, (b, item)) in chunk.iter().enumerate() {
            let classes = &logits[k * n_out..k * n_out + n_classes];
            logprobs[*b].push(log_softmax_at(classes, item.target as usize));
        }
    }
    for (row, values) in rows.iter_mut().zip(logprobs) {
        row.hyp.scores = Some(DecoderScores::from_logprobs(&values, row.frames));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy transducer whose joint depends on the encoder frame and the last label, with a
    /// "state" that counts emitted labels: enough to exercise every branch of the loop.
    struct ToyNet {
        vocab: usize,
        n_durations: usize,
    }

    impl TransducerNet for ToyNet {
        type State = Vec<f32>;
        type Error = CoreError;

        fn initial_state(&mut self, batch: usize) -> Result<Self::State, CoreError> {
            Ok(vec![0.0; batch])
        }

        fn predict(
            &mut self,
            labels: &[u32],
            state: &Self::State,
        ) -> Result<(Vec<f32>, Self::State), CoreError> {
            let next: Vec<f32> = state.iter().map(|s| s + 1.0).collect();
            let out = labels
                .iter()
                .zip(&next)
                .flat_map(|(l, s)| [*l as f32, *s])
                .collect();
            Ok((out, next))
        }

        fn select_state(
            &mut self,
            keep_next: &[bool],
            prev: Self::State,
            next: Self::State,
        ) -> Result<Self::State, CoreError> {
            Ok(keep_next
                .iter()
                .zip(prev.iter().zip(&next))
                .map(|(k, (p, n))| if *k { *n } else { *p })
                .collect())
        }

        fn joint(&mut self, enc: &[f32], pred: &[f32]) -> Result<Vec<f32>, CoreError> {
            let n_out = self.vocab + 1 + self.n_durations;
            let batch = pred.len() / 2;
            let mut out = vec![0.0; batch * n_out];
            for b in 0..batch {
                let (e0, e1) = (enc[b * 2], enc[b * 2 + 1]);
                let (last, count) = (pred[b * 2], pred[b * 2 + 1]);
                let row = &mut out[b * n_out..(b + 1) * n_out];
                for (k, v) in row.iter_mut().enumerate() {
                    let x =
                        (k as f32 + 1.0) * (e0 * 1.7 + last * 0.31 + count * 0.13) + e1 * k as f32;
                    *v = x.sin();
                }
            }
            Ok(out)
        }
    }

    /// The per-utterance reference loop (NeMo `GreedyTDTInfer` with blank durations forced to
    /// at least one), written independently of the batched version.
    fn single_reference(net: &mut ToyNet, cfg: &DecoderConfig, u: &EncodedUtterance) -> Hypothesis {
        let blank = cfg.blank_id();
        let mut hyp = Hypothesis::default();
        let mut state = net.initial_state(1).expect("toy");
        let (mut pred, s) = net.predict(&[blank as u32], &state).expect("toy");
        state = s;
        let mut t = 0;
        while t < u.frames {
            let mut emitted_here = 0;
            loop {
                let logits = net.joint(u.frame(t), &pred).expect("toy");
                let label = argmax(&logits[..=blank]);
                let mut d = cfg.durations[argmax(&logits[blank + 1..])];
                if label == blank {
                    d = d.max(1);
                } else {
                    hyp.tokens.push(DecodedToken {
                        id: label as u32,
                        frame: t,
                        duration: d,
                    });
                    let (p, s) = net.predict(&[label as u32], &state).expect("toy");
                    pred = p;
                    state = s;
                    emitted_here += 1;
                }
                t += d;
                if d > 0 || emitted_here >= cfg.max_symbols_per_step || t >= u.frames {
                    if d == 0 && emitted_here >= cfg.max_symbols_per_step {
                        t += 1;
                    }
                    break;
                }
            }
        }
        hyp
    }

    fn utterance(seed: u32, frames: usize) -> EncodedUtterance {
        let data = (0..frames * 2)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761) ^ seed.wrapping_mul(40503)) % 1000) as f32
                    / 1000.0
            })
            .collect();
        EncodedUtterance {
            frames,
            dim: 2,
            data,
        }
    }

    /// The toy network for [`config`]'s vocabulary and durations.
    fn toy_net() -> ToyNet {
        ToyNet {
            vocab: 6,
            n_durations: 5,
        }
    }

    fn config(max_symbols: usize) -> DecoderConfig {
        DecoderConfig {
            vocab_size: 6,
            pred_hidden: 2,
            pred_rnn_layers: 1,
            joint_hidden: 2,
            durations: vec![0, 1, 2, 3, 4],
            max_symbols_per_step: max_symbols,
        }
    }

    #[test]
    fn batch_matches_single_and_reference() {
        for max_symbols in [1, 2, 10] {
            let cfg = config(max_symbols);
            let mut net = toy_net();
            let utts: Vec<_> = [(1, 37), (2, 0), (3, 5), (4, 120), (5, 1)]
                .into_iter()
                .map(|(s, f)| utterance(s, f))
                .collect();
            let batched = greedy_decode(&mut net, &cfg, &utts).expect("decode");
            let emitted: usize = batched.iter().map(|h| h.tokens.len()).sum();
            assert!(emitted > 20, "toy net should emit labels ({emitted})");
            assert!(batched
                .iter()
                .flat_map(|h| &h.tokens)
                .any(|t| t.duration == 0));
            for (u, hyp) in utts.iter().zip(&batched) {
                let single =
                    greedy_decode(&mut net, &cfg, std::slice::from_ref(u)).expect("decode");
                assert_eq!(
                    &single[0], hyp,
                    "batch vs single, max_symbols {max_symbols}"
                );
                assert_eq!(
                    single_reference(&mut net, &cfg, u).tokens,
                    hyp.tokens,
                    "vs reference loop"
                );
            }
        }
    }

    /// The scores of a hypothesis, recomputed one evaluation at a time from the definitions:
    /// the prediction output after the tokens before each frame, and before each token.
    fn reference_scores(
        net: &mut ToyNet,
        cfg: &DecoderConfig,
        u: &EncodedUtterance,
        hyp: &Hypothesis,
    ) -> DecoderScores {
        let blank = cfg.blank_id();
        let mut preds = Vec::new();
        let state = net.initial_state(1).expect("toy");
        let (mut pred, mut state) = net.predict(&[blank as u32], &state).expect("toy");
        preds.push(pred.clone());
        for t in &hyp.tokens {
            (pred, state) = net.predict(&[t.id], &state).expect("toy");
            preds.push(pred.clone());
        }
        let logprob = |net: &mut ToyNet, frame: usize, state: usize, target: usize| {
            let logits = net.joint(u.frame(frame), &preds[state]).expect("toy");
            log_softmax_at(&logits[..=blank], target)
        };
        let last = crate::scores::last_state(&hyp.tokens, u.frames, cfg.max_symbols_per_step);
        let frame_blank_probs = (0..u.frames)
            .map(|t| {
                let before = hyp.tokens.iter().filter(|k| k.frame < t).count();
                logprob(net, t, before.min(last), blank).exp()
            })
            .collect();
        let token_logprobs = hyp
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| logprob(net, t.frame, i, t.id as usize))
            .collect();
        DecoderScores {
            token_logprobs,
            frame_blank_probs,
        }
    }

    #[test]
    fn scores_follow_their_definition_batched_or_not() {
        let cfg = config(3);
        let mut net = toy_net();
        let utts: Vec<_> = [(11, 300), (12, 0), (13, 40)]
            .into_iter()
            .map(|(s, f)| utterance(s, f))
            .collect();
        let hyps = greedy_decode(&mut net, &cfg, &utts).expect("decode");
        for (u, hyp) in utts.iter().zip(&hyps) {
            let scores = hyp.scores.as_ref().expect("scored");
            assert_eq!(scores.token_logprobs.len(), hyp.tokens.len());
            assert_eq!(scores.frame_blank_probs.len(), u.frames);
            assert_eq!(scores, &reference_scores(&mut net, &cfg, u, hyp));
            assert!(scores.token_logprobs.iter().all(|v| *v <= 0.0));
            assert!(scores
                .frame_blank_probs
                .iter()
                .all(|p| (0.0..=1.0).contains(p)));
        }
    }

    #[test]
    fn max_symbols_caps_emissions_per_frame() {
        let cfg = config(2);
        let mut net = toy_net();
        let hyps = greedy_decode(&mut net, &cfg, &[utterance(9, 300)]).expect("decode");
        let mut per_frame = std::collections::BTreeMap::new();
        for t in &hyps[0].tokens {
            *per_frame.entry(t.frame).or_insert(0usize) += 1;
        }
        assert!(per_frame.values().all(|n| *n <= 2), "{per_frame:?}");
    }
}
