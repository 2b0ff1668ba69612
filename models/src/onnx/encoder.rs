//! The encoder graph: features `[batch, n_mels, T]` + lengths `[batch]` -> encoded
//! `[batch, d_model, T']` + lengths. Utterances of different lengths share one run, zero-padded
//! to the longest (the exported encoder masks by length, as NeMo does in a batch).

use super::session::{Elem, Input, OnnxSession};
use crate::error::ModelError;
use crate::features::Features;
use model_core::tdt::EncodedUtterance;

#[derive(Debug)]
pub(crate) struct OnnxEncoder {
    session: OnnxSession,
    features_input: usize,
    length_input: usize,
    length_elem: Elem,
    encoded_output: usize,
    length_output: usize,
    /// Mel bins the graph takes, when fixed.
    pub(crate) n_mels: Option<usize>,
    /// Output width (d_model), when fixed.
    pub(crate) d_model: Option<usize>,
    batchable: bool,
}

impl OnnxEncoder {
    pub(crate) fn new(session: OnnxSession) -> Result<Self, ModelError> {
        let ins = &session.inputs;
        let outs = &session.outputs;
        let bad = |what: &str| {
            session.error(format!(
                "not a transducer encoder ({what}): {}",
                session.describe_io()
            ))
        };
        let float3 = |s: &super::session::IoSpec| s.elem == Elem::F32 && s.dims.len() == 3;
        let int1 = |s: &super::session::IoSpec| {
            matches!(s.elem, Elem::I32 | Elem::I64) && s.dims.len() == 1
        };
        if ins.len() != 2 {
            return Err(bad("expected two inputs"));
        }
        let features_input = ins
            .iter()
            .position(float3)
            .ok_or_else(|| bad("no f32 [B, mels, T] input"))?;
        let length_input = ins
            .iter()
            .position(int1)
            .ok_or_else(|| bad("no integer length input"))?;
        let encoded_output = outs
            .iter()
            .position(float3)
            .ok_or_else(|| bad("no f32 [B, D, T] output"))?;
        let length_output = outs
            .iter()
            .position(int1)
            .ok_or_else(|| bad("no length output"))?;
        let fixed = |d: i64| usize::try_from(d).ok().filter(|d| *d > 0);
        Ok(Self {
            n_mels: fixed(ins[features_input].dims[1]),
            d_model: fixed(outs[encoded_output].dims[1]),
            length_elem: ins[length_input].elem,
            batchable: !ins[features_input].fixed(0, 1),
            features_input,
            length_input,
            encoded_output,
            length_output,
            session,
        })
    }

    pub(crate) fn session(&self) -> &OnnxSession {
        &self.session
    }

    /// Encodes utterances together (one at a time if the graph fixes batch 1).
    pub(crate) fn encode(
        &mut self,
        feats: &[&Features],
    ) -> Result<Vec<EncodedUtterance>, ModelError> {
        if self.batchable {
            self.encode_rows(feats)
        } else {
            let mut out = Vec::with_capacity(feats.len());
            for f in feats {
                out.extend(self.encode_rows(std::slice::from_ref(f))?);
            }
            Ok(out)
        }
    }

    fn encode_rows(&mut self, feats: &[&Features]) -> Result<Vec<EncodedUtterance>, ModelError> {
        let Some(first) = feats.first() else {
            return Ok(Vec::new());
        };
        let n_mels = first.n_mels;
        let expected = self.n_mels.unwrap_or(n_mels);
        if let Some(f) = feats.iter().find(|f| f.n_mels != expected) {
            return Err(self.session.error(format!(
                "features with {} mel bins; the encoder takes {expected}",
                f.n_mels
            )));
        }
        let batch = feats.len();
        // At least one frame: a zero-length input is not a valid tensor for every exporter.
        let t_max = feats.iter().map(|f| f.n_frames).max().unwrap_or(0).max(1);
        let mut data = vec![0.0f32; batch * n_mels * t_max];
        for (b, f) in feats.iter().enumerate() {
            for m in 0..n_mels {
                let src = &f.data[m * f.n_frames..(m + 1) * f.n_frames];
                let dst = (b * n_mels + m) * t_max;
                data[dst..dst + f.n_frames].copy_from_slice(src);
            }
        }
        let lengths: Vec<i64> = feats.iter().map(|f| f.n_frames as i64).collect();
        let mut inputs = vec![None, None];
        inputs[self.features_input] = Some(Input::F32(vec![batch, n_mels, t_max], data));
        inputs[self.length_input] = Some(match self.length_elem {
            Elem::I32 => Input::I32(vec![batch], lengths.iter().map(|l| *l as i32).collect()),
            _ => Input::I64(vec![batch], lengths),
        });
        let inputs = inputs.into_iter().flatten().collect();
        let outputs = self.session.run(inputs)?;

        let encoded = &outputs[self.encoded_output];
        let values = encoded.f32().map_err(|e| self.session.error(e))?;
        let [b_out, dim, t_out] = encoded.shape[..] else {
            return Err(self
                .session
                .error(format!("encoder output shape {:?}", encoded.shape)));
        };
        let out_lengths = outputs[self.length_output]
            .int()
            .map_err(|e| self.session.error(e))?;
        if b_out != batch || out_lengths.len() != batch {
            return Err(self.session.error(format!(
                "encoder returned {b_out} rows and {} lengths for {batch} utterances",
                out_lengths.len()
            )));
        }
        let mut result = Vec::with_capacity(batch);
        for (b, len) in out_lengths.iter().enumerate() {
            let frames = usize::try_from(*len)
                .ok()
                .filter(|l| *l <= t_out)
                .ok_or_else(|| {
                    self.session
                        .error(format!("encoded length {len} of {t_out} frames"))
                })?;
            // [D, T'] of this row -> [frames, D].
            let row = &values[b * dim * t_out..(b + 1) * dim * t_out];
            let mut data = vec![0.0f32; frames * dim];
            for d in 0..dim {
                for t in 0..frames {
                    data[t * dim + d] = row[d * t_out + t];
                }
            }
            // An empty utterance has no frames whatever the padded run produced.
            let frames = if feats[b].n_frames == 0 { 0 } else { frames };
            data.truncate(frames * dim);
            result.push(EncodedUtterance { frames, dim, data });
        }
        Ok(result)
    }
}
