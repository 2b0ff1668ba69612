//! The TDT prediction network (NeMo `RNNTDecoder`: embedding with blank as padding, stacked
//! LSTM) and joint (`RNNTJoint`: `Linear(relu(enc(f) + pred(g)))`), and [`CpuTransducer`], the
//! CPU [`TransducerNet`] over them. Every row is computed with its own dot products, so a
//! row's result never depends on the batch around it.

use crate::checkpoint::TensorMap;
use crate::error::ModelError;
use crate::linalg::{relu_in_place, sigmoid, Bias, Linear};
use model_core::config::{DecoderConfig, EncoderConfig};
use model_core::tdt::TransducerNet;

/// One LSTM layer: `gates = W_ih x + b_ih + W_hh h + b_hh`, gate order i, f, g, o.
#[derive(Debug, Clone)]
struct LstmLayer {
    input: Linear,
    hidden: Linear,
}

#[derive(Debug, Clone)]
pub(crate) struct PredictionNet {
    hidden: usize,
    /// `[vocab + 1, hidden]`; the blank row is the start-of-sequence input.
    embedding: Vec<f32>,
    n_embeddings: usize,
    layers: Vec<LstmLayer>,
}

impl PredictionNet {
    pub(crate) fn load(tensors: &TensorMap, cfg: &DecoderConfig) -> Result<Self, ModelError> {
        let h = cfg.pred_hidden;
        let n_embeddings = cfg.vocab_size + 1;
        let embedding = tensors
            .get("decoder.prediction.embed.weight", &[n_embeddings, h])?
            .data
            .clone();
        let mut layers = Vec::new();
        for l in 0..cfg.pred_rnn_layers {
            let lstm = "decoder.prediction.dec_rnn.lstm";
            let load = |kind: &str| -> Result<Linear, ModelError> {
                let w = tensors.get(&format!("{lstm}.weight_{kind}_l{l}"), &[4 * h, h])?;
                let b = tensors.get_optional(&format!("{lstm}.bias_{kind}_l{l}"), &[4 * h])?;
                Ok(Linear::new(
                    h,
                    4 * h,
                    w.data.clone(),
                    b.map(|b| b.data.clone()),
                ))
            };
            layers.push(LstmLayer {
                input: load("ih")?,
                hidden: load("hh")?,
            });
        }
        Ok(Self {
            hidden: h,
            embedding,
            n_embeddings,
            layers,
        })
    }
}

/// `enc` and `pred` projections and the final Linear of `joint_net`.
#[derive(Debug, Clone)]
pub(crate) struct Joint {
    enc: Linear,
    pred: Linear,
    out: Linear,
}

impl Joint {
    pub(crate) fn load(
        tensors: &TensorMap,
        enc_cfg: &EncoderConfig,
        cfg: &DecoderConfig,
    ) -> Result<Self, ModelError> {
        let hj = cfg.joint_hidden;
        let n_out = cfg.vocab_size + 1 + cfg.durations.len();
        let out_prefix = tensors.require_joint_output_prefix()?;
        Ok(Self {
            enc: Linear::load(
                tensors,
                "joint.enc",
                enc_cfg.d_model,
                hj,
                false,
                Bias::IfPresent,
            )?,
            pred: Linear::load(
                tensors,
                "joint.pred",
                cfg.pred_hidden,
                hj,
                false,
                Bias::IfPresent,
            )?,
            out: Linear::load(tensors, &out_prefix, hj, n_out, false, Bias::IfPresent)?,
        })
    }
}

/// LSTM state of a batch: `h` and `c` are `[layers, batch, hidden]`.
#[derive(Debug, Clone, PartialEq)]
pub struct LstmState {
    batch: usize,
    h: Vec<f32>,
    c: Vec<f32>,
}

/// The CPU prediction + joint networks for [`model_core::tdt::greedy_decode`]; borrows the weights,
/// keeps no decoding state of its own.
#[derive(Debug, Clone, Copy)]
pub struct CpuTransducer<'a> {
    prediction: &'a PredictionNet,
    joint: &'a Joint,
}

impl<'a> CpuTransducer<'a> {
    pub(crate) fn new(prediction: &'a PredictionNet, joint: &'a Joint) -> Self {
        Self { prediction, joint }
    }
}

impl TransducerNet for CpuTransducer<'_> {
    type State = LstmState;
    type Error = ModelError;

    fn initial_state(&mut self, batch: usize) -> Result<LstmState, ModelError> {
        let n = self.prediction.layers.len() * batch * self.prediction.hidden;
        Ok(LstmState {
            batch,
            h: vec![0.0; n],
            c: vec![0.0; n],
        })
    }

    fn predict(
        &mut self,
        labels: &[u32],
        state: &LstmState,
    ) -> Result<(Vec<f32>, LstmState), ModelError> {
        let net = self.prediction;
        let (batch, hidden) = (labels.len(), net.hidden);
        if state.batch != batch {
            return Err(ModelError::Decode(format!(
                "prediction state holds {} rows, {batch} labels given",
                state.batch
            )));
        }
        let mut x = Vec::with_capacity(batch * hidden);
        for &label in labels {
            let label = label as usize;
            if label >= net.n_embeddings {
                return Err(ModelError::Decode(format!(
                    "label {label} is outside the prediction network's {} embeddings",
                    net.n_embeddings
                )));
            }
            x.extend_from_slice(&net.embedding[label * hidden..(label + 1) * hidden]);
        }
        let mut next = state.clone();
        let per_layer = batch * hidden;
        for (l, layer) in net.layers.iter().enumerate() {
            let h_prev = &state.h[l * per_layer..(l + 1) * per_layer];
            let c_prev = &state.c[l * per_layer..(l + 1) * per_layer];
            let gi = layer.input.forward_rowwise(&x, batch);
            let gh = layer.hidden.forward_rowwise(h_prev, batch);
            let h_next = &mut next.h[l * per_layer..(l + 1) * per_layer];
            let c_next = &mut next.c[l * per_layer..(l + 1) * per_layer];
            for b in 0..batch {
                let gates_i = &gi[b * 4 * hidden..(b + 1) * 4 * hidden];
                let gates_h = &gh[b * 4 * hidden..(b + 1) * 4 * hidden];
                for u in 0..hidden {
                    let gate = |g: usize| gates_i[g * hidden + u] + gates_h[g * hidden + u];
                    let (i, f) = (sigmoid(gate(0)), sigmoid(gate(1)));
                    let (g, o) = (gate(2).tanh(), sigmoid(gate(3)));
                    let c = f * c_prev[b * hidden + u] + i * g;
                    c_next[b * hidden + u] = c;
                    h_next[b * hidden + u] = o * c.tanh();
                }
            }
            x = h_next.to_vec();
        }
        Ok((x, next))
    }

    fn select_state(
        &mut self,
        keep_next: &[bool],
        prev: LstmState,
        next: LstmState,
    ) -> Result<LstmState, ModelError> {
        if keep_next.len() != prev.batch || prev.batch != next.batch {
            return Err(ModelError::Decode(format!(
                "state selection over {} rows for states of {} and {} rows",
                keep_next.len(),
                prev.batch,
                next.batch
            )));
        }
        let hidden = self.prediction.hidden;
        let mut out = prev;
        for l in 0..self.prediction.layers.len() {
            for (b, keep) in keep_next.iter().enumerate() {
                if *keep {
                    let r = (l * out.batch + b) * hidden..(l * out.batch + b + 1) * hidden;
                    out.h[r.clone()].copy_from_slice(&next.h[r.clone()]);
                    out.c[r.clone()].copy_from_slice(&next.c[r]);
                }
            }
        }
        Ok(out)
    }

    fn joint(&mut self, enc_frames: &[f32], pred: &[f32]) -> Result<Vec<f32>, ModelError> {
        let joint = self.joint;
        let batch = pred.len() / joint.pred.in_dim;
        if enc_frames.len() != batch * joint.enc.in_dim || pred.len() != batch * joint.pred.in_dim {
            return Err(ModelError::Decode(format!(
                "joint got {} encoder values and {} prediction values, not a batch of {} x {} and {}",
                enc_frames.len(),
                pred.len(),
                batch,
                joint.enc.in_dim,
                joint.pred.in_dim
            )));
        }
        let mut hidden = joint.enc.forward_rowwise(enc_frames, batch);
        let g = joint.pred.forward_rowwise(pred, batch);
        for (a, b) in hidden.iter_mut().zip(&g) {
            *a += b;
        }
        relu_in_place(&mut hidden);
        Ok(joint.out.forward_rowwise(&hidden, batch))
    }
}
