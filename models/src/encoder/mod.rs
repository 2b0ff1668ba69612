//! The FastConformer encoder (NeMo `ConformerEncoder`) for one unpadded utterance:
//! subsampling, optional x-scaling, relative position table, conformer layers.

mod attention;
mod conformer;
mod subsampling;

use crate::checkpoint::TensorMap;
use crate::error::ModelError;
use crate::features::Features;
use model_core::config::{AttentionModel, EncoderConfig};
use model_core::encoder::position_table;
use model_core::tdt::EncodedUtterance;

use conformer::ConformerLayer;
use subsampling::Subsampling;

#[derive(Debug, Clone)]
pub(crate) struct Encoder {
    cfg: EncoderConfig,
    pre_encode: Subsampling,
    layers: Vec<ConformerLayer>,
    /// The local attention band table does not depend on the utterance.
    local_pos_emb: Option<Vec<f32>>,
}

impl Encoder {
    pub(crate) fn load(tensors: &TensorMap, cfg: &EncoderConfig) -> Result<Self, ModelError> {
        let layers = (0..cfg.n_layers)
            .map(|l| ConformerLayer::load(tensors, &format!("encoder.layers.{l}"), cfg))
            .collect::<Result<Vec<_>, _>>()?;
        let local_pos_emb = match cfg.attention {
            AttentionModel::RelPos => None,
            AttentionModel::RelPosLocal { left, right } => {
                if left.max(right) == 0 {
                    return Err(ModelError::InvalidConfig {
                        file: tensors.source.clone(),
                        key: "encoder.att_context_size".into(),
                        problem: "local attention needs a context larger than 0".into(),
                    });
                }
                Some(position_table(cfg.attention, 0, cfg.d_model))
            }
        };
        Ok(Self {
            cfg: cfg.clone(),
            pre_encode: Subsampling::load(tensors, cfg)?,
            layers,
            local_pos_emb,
        })
    }

    /// The encoder on one utterance, with the attention `attention_for` picks for its number
    /// of encoder frames (the checkpoint's own, or local attention for a long recording).
    pub(crate) fn forward(
        &self,
        features: &Features,
        attention_for: impl Fn(usize) -> AttentionModel,
    ) -> Result<EncodedUtterance, ModelError> {
        let d = self.cfg.d_model;
        if features.n_mels != self.cfg.feat_in
            || features.data.len() != features.n_mels * features.n_frames
        {
            return Err(ModelError::Decode(format!(
                "features of {} mels x {} frames ({} values) do not fit an encoder with {} inputs",
                features.n_mels,
                features.n_frames,
                features.data.len(),
                self.cfg.feat_in
            )));
        }
        if features.n_frames == 0 {
            return Ok(EncodedUtterance {
                frames: 0,
                dim: d,
                data: Vec::new(),
            });
        }
        let (x, t) = self.pre_encode_frames(features);
        let x = self.forward_pre_encoded_with(x, t, attention_for(t));
        Ok(EncodedUtterance {
            frames: t,
            dim: d,
            data: x,
        })
    }

    /// Subsampling only (NeMo `encoder.pre_encode`): `features` `[n_mels, T]`, already checked
    /// against `feat_in`, to `([T', d_model], T')`. Streaming Sortformer caches these embeddings.
    pub(crate) fn pre_encode_frames(&self, features: &Features) -> (Vec<f32>, usize) {
        self.pre_encode
            .forward(&features.data, features.n_mels, features.n_frames)
    }

    /// Everything after subsampling (NeMo `bypass_pre_encode=True`): x-scaling, positions and
    /// the conformer layers on `[t, d_model]` pre-encoded embeddings, with the checkpoint's
    /// attention.
    pub(crate) fn forward_pre_encoded(&self, x: Vec<f32>, t: usize) -> Vec<f32> {
        self.forward_pre_encoded_with(x, t, self.cfg.attention)
    }

    /// [`Self::forward_pre_encoded`] with `attention` (the same weights, as NeMo's
    /// `change_attention_model` uses them).
    fn forward_pre_encoded_with(
        &self,
        mut x: Vec<f32>,
        t: usize,
        attention: AttentionModel,
    ) -> Vec<f32> {
        let d = self.cfg.d_model;
        debug_assert_eq!(x.len(), t * d, "pre-encoded shape (bug)");
        if self.cfg.xscaling {
            let scale = (d as f64).sqrt() as f32;
            for v in x.iter_mut() {
                *v *= scale;
            }
        }
        let computed;
        let pos_emb: &[f32] = match &self.local_pos_emb {
            Some(table) if attention == self.cfg.attention => table,
            _ => {
                computed = position_table(attention, t, d);
                &computed
            }
        };
        for layer in &self.layers {
            layer.forward(&mut x, t, attention, pos_emb);
        }
        x
    }
}
