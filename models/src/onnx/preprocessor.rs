//! onnx-asr's feature extractor graph (`nemo128.onnx`): waveforms `[batch, N]` f32 +
//! waveform lengths `[batch]` i64 -> features `[batch, n_mels, T]` + feature lengths.

use super::session::{Elem, Input, OnnxSession};
use crate::error::ModelError;
use crate::features::Features;

#[derive(Debug)]
pub(crate) struct OnnxPreprocessor {
    session: OnnxSession,
    waveform_input: usize,
    length_input: usize,
    length_elem: Elem,
    features_output: usize,
    length_output: usize,
}

impl OnnxPreprocessor {
    pub(crate) fn new(session: OnnxSession) -> Result<Self, ModelError> {
        let ins = &session.inputs;
        let outs = &session.outputs;
        let bad = |what: &str| {
            session.error(format!(
                "not a feature extractor ({what}): {}",
                session.describe_io()
            ))
        };
        let int1 = |s: &&super::session::IoSpec| {
            matches!(s.elem, Elem::I32 | Elem::I64) && s.dims.len() == 1
        };
        let waveform_input = ins
            .iter()
            .position(|s| s.elem == Elem::F32 && s.dims.len() == 2)
            .ok_or_else(|| bad("no f32 [B, N] waveform input"))?;
        let length_input = ins
            .iter()
            .position(|s| int1(&s))
            .ok_or_else(|| bad("no length input"))?;
        let features_output = outs
            .iter()
            .position(|s| s.elem == Elem::F32 && s.dims.len() == 3)
            .ok_or_else(|| bad("no f32 [B, mels, T] output"))?;
        let length_output = outs
            .iter()
            .position(|s| int1(&s))
            .ok_or_else(|| bad("no length output"))?;
        if ins.len() != 2 {
            return Err(bad("expected two inputs"));
        }
        Ok(Self {
            length_elem: ins[length_input].elem,
            session,
            waveform_input,
            length_input,
            features_output,
            length_output,
        })
    }

    /// Features of one utterance (valid frames only).
    pub(crate) fn compute(&mut self, pcm_16k: &[f32]) -> Result<Features, ModelError> {
        let n = pcm_16k.len();
        let mut inputs = vec![None, None];
        inputs[self.waveform_input] = Some(Input::F32(vec![1, n], pcm_16k.to_vec()));
        inputs[self.length_input] = Some(match self.length_elem {
            Elem::I32 => Input::I32(vec![1], vec![n as i32]),
            _ => Input::I64(vec![1], vec![n as i64]),
        });
        let outputs = self.session.run(inputs.into_iter().flatten().collect())?;
        let feats = &outputs[self.features_output];
        let values = feats.f32().map_err(|e| self.session.error(e))?;
        let [1, n_mels, t] = feats.shape[..] else {
            return Err(self.session.error(format!(
                "features of shape {:?} for one waveform",
                feats.shape
            )));
        };
        let lengths = outputs[self.length_output]
            .int()
            .map_err(|e| self.session.error(e))?;
        let n_frames = lengths
            .first()
            .and_then(|l| usize::try_from(*l).ok())
            .filter(|l| *l <= t)
            .ok_or_else(|| {
                self.session
                    .error(format!("feature lengths {lengths:?} of {t} frames"))
            })?;
        let mut data = Vec::with_capacity(n_mels * n_frames);
        for m in 0..n_mels {
            data.extend_from_slice(&values[m * t..m * t + n_frames]);
        }
        Ok(Features {
            n_mels,
            n_frames,
            data,
        })
    }
}
