//! [`TransducerNet`] over ONNX graphs, so ONNX exports decode with exactly the same TDT rules
//! as the native engine ([`model_core::tdt::greedy_decode`]).
//!
//! Two shapes of export:
//! - **decoder_joint** (NeMo, onnx-asr): one graph `(encoder frame, last label, states) ->
//!   (logits, next states)`; the prediction output is never exposed. A row's "prediction
//!   output" is therefore packed as `[last label, state before that label...]` and the joint
//!   re-runs the graph from it. Same inputs, same arithmetic: the result is what NeMo's own
//!   decoding of the export computes, at the cost of re-running the LSTM for each joint call.
//! - **decoder + joiner** (sherpa-onnx): the prediction output is a real `[batch, pred_dim]`.
//!
//! Inputs and outputs are found from the graphs' signatures (names where the exports agree,
//! element type and rank otherwise); the LSTM layers and width come from the state inputs'
//! shapes. Graphs that fix the batch dimension to 1 (sherpa's traced decoder) run row by row.

use std::ops::Range;

use super::session::{Elem, Input, IoSpec, OnnxSession, Output};
use super::state::{LstmState, StateShape};
use crate::error::ModelError;
use model_core::tdt::TransducerNet;

/// Where each role sits in a graph's input list.
#[derive(Debug, Clone)]
struct DecoderInputs {
    /// `[batch, 1]` last labels.
    targets: usize,
    targets_elem: Elem,
    /// `[batch]` target lengths (always 1 here).
    target_length: Option<usize>,
    target_length_elem: Elem,
    /// `[batch, enc_dim, 1]` encoder frame (decoder_joint only).
    encoder: Option<usize>,
    /// State tensors `[lead, batch, trail]`, in order.
    states: Vec<usize>,
}

fn is_float3(s: &IoSpec) -> bool {
    s.elem == Elem::F32 && s.dims.len() == 3
}

fn is_int(s: &IoSpec) -> bool {
    matches!(s.elem, Elem::I32 | Elem::I64)
}

/// The first float rank-3 input whose name contains `hint`, else the first float rank-3 input
/// not in `taken`.
fn find_float3(specs: &[IoSpec], hint: &str, taken: &[usize]) -> Option<usize> {
    let free = |i: &usize| !taken.contains(i);
    (0..specs.len())
        .filter(free)
        .find(|i| is_float3(&specs[*i]) && specs[*i].name.contains(hint))
        .or_else(|| {
            (0..specs.len())
                .filter(free)
                .find(|i| is_float3(&specs[*i]))
        })
}

impl DecoderInputs {
    fn find(session: &OnnxSession, with_encoder: bool) -> Result<Self, ModelError> {
        let specs = &session.inputs;
        let missing = |what: &str| {
            session.error(format!(
                "no {what} input; the graph has {}",
                session.describe_io()
            ))
        };
        let targets = (0..specs.len())
            .find(|i| is_int(&specs[*i]) && specs[*i].dims.len() == 2)
            .ok_or_else(|| missing("integer [batch, 1] targets"))?;
        let target_length =
            (0..specs.len()).find(|i| is_int(&specs[*i]) && specs[*i].dims.len() == 1);
        let encoder = if with_encoder {
            Some(find_float3(specs, "encoder", &[]).ok_or_else(|| missing("encoder frame"))?)
        } else {
            None
        };
        let states: Vec<usize> = (0..specs.len())
            .filter(|i| Some(*i) != encoder && is_float3(&specs[*i]))
            .collect();
        if states.is_empty() {
            return Err(missing("state"));
        }
        let used = 1 + usize::from(target_length.is_some()) + usize::from(encoder.is_some());
        if used + states.len() != specs.len() {
            return Err(session.error(format!(
                "unexpected inputs for a transducer decoder: {}",
                session.describe_io()
            )));
        }
        Ok(Self {
            targets,
            targets_elem: specs[targets].elem,
            target_length,
            target_length_elem: target_length.map_or(Elem::I32, |i| specs[i].elem),
            encoder,
            states,
        })
    }

    /// `[lead, trail]` of each state input, from its fixed dims or from the graph metadata
    /// (sherpa-onnx's `pred_rnn_layers` / `pred_hidden`) when they are dynamic.
    fn state_shapes(
        &self,
        session: &OnnxSession,
        metadata_hint: Option<StateShape>,
    ) -> Result<Vec<StateShape>, ModelError> {
        self.states
            .iter()
            .map(|i| {
                let spec = &session.inputs[*i];
                match (spec.dims[0], spec.dims[2]) {
                    (lead, trail) if lead > 0 && trail > 0 => Ok(StateShape {
                        lead: lead as usize,
                        trail: trail as usize,
                    }),
                    _ => metadata_hint.ok_or_else(|| {
                        session.error(format!(
                            "state input {} has dynamic layers/width and no \
                             pred_rnn_layers/pred_hidden metadata",
                            spec.describe()
                        ))
                    }),
                }
            })
            .collect()
    }

    /// Whether every per-row input accepts more than one row.
    fn batchable(&self, session: &OnnxSession) -> bool {
        let specs = &session.inputs;
        let row_axis_free = |i: usize, axis: usize| !specs[i].fixed(axis, 1);
        row_axis_free(self.targets, 0)
            && self.target_length.is_none_or(|i| row_axis_free(i, 0))
            && self.encoder.is_none_or(|i| row_axis_free(i, 0))
            && self.states.iter().all(|i| row_axis_free(*i, 1))
    }

    /// Inputs for rows `rows`: labels, optional encoder frames `[rows, enc_dim]`, state rows.
    fn build(
        &self,
        n_inputs: usize,
        labels: &[u32],
        enc: Option<(&[f32], usize)>,
        state: &LstmState,
        rows: Range<usize>,
    ) -> Vec<Input> {
        let n = rows.len();
        let mut inputs: Vec<Option<Input>> = vec![None; n_inputs];
        let row_labels = &labels[rows.clone()];
        inputs[self.targets] = Some(int_input(self.targets_elem, vec![n, 1], row_labels));
        if let Some(i) = self.target_length {
            inputs[i] = Some(int_input(self.target_length_elem, vec![n], &vec![1; n]));
        }
        if let (Some(i), Some((frames, dim))) = (self.encoder, enc) {
            inputs[i] = Some(Input::F32(
                vec![n, dim, 1],
                frames[rows.start * dim..rows.end * dim].to_vec(),
            ));
        }
        for (k, i) in self.states.iter().enumerate() {
            let s = state.shapes[k];
            inputs[*i] = Some(Input::F32(
                vec![s.lead, n, s.trail],
                state.gather(k, rows.clone()),
            ));
        }
        inputs
            .into_iter()
            .map(|i| i.expect("every input is assigned a role (bug)"))
            .collect()
    }
}

fn int_input(elem: Elem, shape: Vec<usize>, values: &[u32]) -> Input {
    match elem {
        Elem::I64 => Input::I64(shape, values.iter().map(|v| i64::from(*v)).collect()),
        _ => Input::I32(shape, values.iter().map(|v| *v as i32).collect()),
    }
}

/// Row ranges per graph run: the whole batch, or one row at a time.
fn row_chunks(batch: usize, batchable: bool) -> Vec<Range<usize>> {
    if batchable {
        std::iter::once(0..batch).collect()
    } else {
        (0..batch).map(|b| b..b + 1).collect()
    }
}

/// Float outputs of a decoder graph: the main one (logits or prediction output) and the
/// next-state tensors, in input order.
#[derive(Debug, Clone)]
struct DecoderOutputs {
    main: usize,
    states: Vec<usize>,
}

impl DecoderOutputs {
    fn find(session: &OnnxSession, main_rank: usize, n_states: usize) -> Result<Self, ModelError> {
        let specs = &session.outputs;
        let floats: Vec<usize> = (0..specs.len())
            .filter(|i| specs[*i].elem == Elem::F32)
            .collect();
        let main = floats
            .iter()
            .copied()
            .find(|i| specs[*i].dims.len() == main_rank)
            .ok_or_else(|| {
                session.error(format!(
                    "no rank-{main_rank} f32 output; the graph has {}",
                    session.describe_io()
                ))
            })?;
        let states: Vec<usize> = floats.into_iter().filter(|i| *i != main).collect();
        if states.len() != n_states {
            return Err(session.error(format!(
                "{} state outputs for {n_states} state inputs: {}",
                states.len(),
                session.describe_io()
            )));
        }
        Ok(Self { main, states })
    }
}

/// Copies the next state of rows `rows` from a decoder run into `next`.
fn scatter_states(
    session: &OnnxSession,
    outputs: &[Output],
    which: &[usize],
    next: &mut LstmState,
    rows: Range<usize>,
) -> Result<(), ModelError> {
    for (k, o) in which.iter().enumerate() {
        let s = next.shapes[k];
        let data = outputs[*o].f32().map_err(|e| session.error(e))?;
        if outputs[*o].shape != [s.lead, rows.len(), s.trail] {
            return Err(session.error(format!(
                "state output {} has shape {:?}, expected [{}, {}, {}]",
                session.outputs[*o].name,
                outputs[*o].shape,
                s.lead,
                rows.len(),
                s.trail
            )));
        }
        next.scatter(k, rows.clone(), data);
    }
    Ok(())
}

/// `[rows, width]` values of a `[rows, 1, 1, width]` / `[rows, width, 1]` output.
fn rows_of<'o>(
    session: &OnnxSession,
    output: &'o Output,
    rows: usize,
) -> Result<(&'o [f32], usize), ModelError> {
    let data = output.f32().map_err(|e| session.error(e))?;
    if output.shape.first() != Some(&rows) || rows == 0 || data.len() % rows != 0 {
        return Err(session.error(format!(
            "output of shape {:?} for {rows} rows",
            output.shape
        )));
    }
    Ok((data, data.len() / rows))
}

/// NeMo's `decoder_joint` graph.
#[derive(Debug)]
struct DecoderJoint {
    session: OnnxSession,
    inputs: DecoderInputs,
    outputs: DecoderOutputs,
    batchable: bool,
}

/// sherpa-onnx's separate decoder and joiner.
#[derive(Debug)]
struct Split {
    decoder: OnnxSession,
    decoder_inputs: DecoderInputs,
    decoder_outputs: DecoderOutputs,
    decoder_batchable: bool,
    joiner: OnnxSession,
    /// Input positions of the encoder frame and the prediction output.
    joiner_encoder: usize,
    joiner_decoder: usize,
    joiner_batchable: bool,
}

#[derive(Debug)]
enum Graphs {
    DecoderJoint(DecoderJoint),
    Split(Split),
}

/// The prediction and joint networks of an ONNX export.
#[derive(Debug)]
pub(crate) struct OnnxTransducer {
    graphs: Graphs,
    state_shapes: Vec<StateShape>,
    /// Encoder frame width the graphs expect (`None`: dynamic, taken from the call).
    pub(crate) enc_dim: Option<usize>,
}

impl OnnxTransducer {
    pub(crate) fn decoder_joint(session: OnnxSession) -> Result<Self, ModelError> {
        let inputs = DecoderInputs::find(&session, true)?;
        let state_shapes = inputs.state_shapes(&session, None)?;
        let outputs = DecoderOutputs::find(&session, 4, inputs.states.len())?;
        let enc_dim = inputs
            .encoder
            .and_then(|i| usize::try_from(session.inputs[i].dims[1]).ok());
        let batchable = inputs.batchable(&session);
        Ok(Self {
            graphs: Graphs::DecoderJoint(DecoderJoint {
                session,
                inputs,
                outputs,
                batchable,
            }),
            state_shapes,
            enc_dim,
        })
    }

    /// `metadata_hint`: LSTM `[layers, hidden]` from the encoder's metadata, used only when
    /// the decoder's state inputs have dynamic dims.
    pub(crate) fn split(
        decoder: OnnxSession,
        joiner: OnnxSession,
        metadata_hint: Option<StateShape>,
    ) -> Result<Self, ModelError> {
        let decoder_inputs = DecoderInputs::find(&decoder, false)?;
        let state_shapes = decoder_inputs.state_shapes(&decoder, metadata_hint)?;
        let decoder_outputs = DecoderOutputs::find(&decoder, 3, decoder_inputs.states.len())?;
        let decoder_batchable = decoder_inputs.batchable(&decoder);

        let specs = &joiner.inputs;
        let joiner_encoder = find_float3(specs, "encoder", &[])
            .ok_or_else(|| joiner.error(format!("no encoder input: {}", joiner.describe_io())))?;
        let joiner_decoder = find_float3(specs, "decoder", &[joiner_encoder])
            .ok_or_else(|| joiner.error(format!("no decoder input: {}", joiner.describe_io())))?;
        if specs.len() != 2 || !joiner.outputs.iter().any(|o| o.elem == Elem::F32) {
            return Err(joiner.error(format!(
                "expected (encoder, decoder) -> logits, got {}",
                joiner.describe_io()
            )));
        }
        let joiner_batchable =
            !specs[joiner_encoder].fixed(0, 1) && !specs[joiner_decoder].fixed(0, 1);
        let enc_dim = usize::try_from(specs[joiner_encoder].dims[1]).ok();
        Ok(Self {
            graphs: Graphs::Split(Split {
                decoder,
                decoder_inputs,
                decoder_outputs,
                decoder_batchable,
                joiner,
                joiner_encoder,
                joiner_decoder,
                joiner_batchable,
            }),
            state_shapes,
            enc_dim,
        })
    }

    /// LSTM state tensors as `[layers, hidden]` (h and c).
    pub(crate) fn state_shapes(&self) -> &[StateShape] {
        &self.state_shapes
    }

    /// Width of one decoder_joint prediction row: the label plus the packed state.
    fn packed_len(&self) -> usize {
        1 + LstmState::row_len(&self.state_shapes)
    }
}

impl DecoderJoint {
    /// Runs the graph for all rows; returns the logits `[batch, width]` and the next state.
    fn run(
        &mut self,
        labels: &[u32],
        enc: &[f32],
        enc_dim: usize,
        state: &LstmState,
    ) -> Result<(Vec<f32>, LstmState), ModelError> {
        let batch = labels.len();
        let mut next = LstmState::zeros(&state.shapes, batch);
        let mut logits = Vec::new();
        for rows in row_chunks(batch, self.batchable) {
            let n_inputs = self.session.inputs.len();
            let inputs =
                self.inputs
                    .build(n_inputs, labels, Some((enc, enc_dim)), state, rows.clone());
            let outputs = self.session.run(inputs)?;
            let (values, _) = rows_of(&self.session, &outputs[self.outputs.main], rows.len())?;
            logits.extend_from_slice(values);
            scatter_states(
                &self.session,
                &outputs,
                &self.outputs.states,
                &mut next,
                rows,
            )?;
        }
        Ok((logits, next))
    }
}

impl TransducerNet for OnnxTransducer {
    type State = LstmState;
    type Error = ModelError;

    fn initial_state(&mut self, batch: usize) -> Result<LstmState, ModelError> {
        Ok(LstmState::zeros(&self.state_shapes, batch))
    }

    fn predict(
        &mut self,
        labels: &[u32],
        state: &LstmState,
    ) -> Result<(Vec<f32>, LstmState), ModelError> {
        let batch = labels.len();
        let packed_len = self.packed_len();
        match &mut self.graphs {
            Graphs::DecoderJoint(g) => {
                // The next state does not depend on the encoder frame: feed zeros.
                let enc_dim = self.enc_dim.ok_or_else(|| {
                    g.session
                        .error("the encoder frame input has a dynamic width")
                })?;
                let zeros = vec![0.0; batch * enc_dim];
                let (_, next) = g.run(labels, &zeros, enc_dim, state)?;
                let mut pred = Vec::with_capacity(batch * packed_len);
                for (b, label) in labels.iter().enumerate() {
                    pred.push(*label as f32);
                    pred.extend(state.row(b));
                }
                Ok((pred, next))
            }
            Graphs::Split(g) => {
                let mut next = LstmState::zeros(&state.shapes, batch);
                let mut pred = Vec::new();
                for rows in row_chunks(batch, g.decoder_batchable) {
                    let n_inputs = g.decoder.inputs.len();
                    let inputs =
                        g.decoder_inputs
                            .build(n_inputs, labels, None, state, rows.clone());
                    let outputs = g.decoder.run(inputs)?;
                    let main = &outputs[g.decoder_outputs.main];
                    let (values, _) = rows_of(&g.decoder, main, rows.len())?;
                    pred.extend_from_slice(values);
                    scatter_states(
                        &g.decoder,
                        &outputs,
                        &g.decoder_outputs.states,
                        &mut next,
                        rows,
                    )?;
                }
                Ok((pred, next))
            }
        }
    }

    fn select_state(
        &mut self,
        keep_next: &[bool],
        prev: LstmState,
        next: LstmState,
    ) -> Result<LstmState, ModelError> {
        Ok(prev.select(keep_next, &next))
    }

    fn joint(&mut self, enc_frames: &[f32], pred: &[f32]) -> Result<Vec<f32>, ModelError> {
        match &mut self.graphs {
            Graphs::DecoderJoint(g) => {
                let packed_len = 1 + LstmState::row_len(&self.state_shapes);
                let batch = pred.len() / packed_len;
                let enc_dim = enc_frames.len() / batch.max(1);
                let mut labels = Vec::with_capacity(batch);
                let mut state = LstmState::zeros(&self.state_shapes, batch);
                for (b, row) in pred.chunks_exact(packed_len).enumerate() {
                    labels.push(row[0] as u32);
                    state.set_row(b, &row[1..]);
                }
                let (logits, _) = g.run(&labels, enc_frames, enc_dim, &state)?;
                Ok(logits)
            }
            Graphs::Split(g) => {
                let enc_dim = self.enc_dim.ok_or_else(|| {
                    g.joiner
                        .error("the joiner's encoder input has a dynamic width")
                })?;
                let batch = enc_frames.len() / enc_dim;
                let pred_dim = pred.len() / batch.max(1);
                let mut logits = Vec::new();
                for rows in row_chunks(batch, g.joiner_batchable) {
                    let n = rows.len();
                    let enc = Input::F32(
                        vec![n, enc_dim, 1],
                        enc_frames[rows.start * enc_dim..rows.end * enc_dim].to_vec(),
                    );
                    let dec = Input::F32(
                        vec![n, pred_dim, 1],
                        pred[rows.start * pred_dim..rows.end * pred_dim].to_vec(),
                    );
                    let inputs = if g.joiner_encoder < g.joiner_decoder {
                        vec![enc, dec]
                    } else {
                        vec![dec, enc]
                    };
                    let outputs = g.joiner.run(inputs)?;
                    let main = outputs
                        .iter()
                        .find(|o| o.f32().is_ok())
                        .ok_or_else(|| g.joiner.error("no f32 output"))?;
                    let (values, _) = rows_of(&g.joiner, main, n)?;
                    logits.extend_from_slice(values);
                }
                Ok(logits)
            }
        }
    }
}
