//! Long recordings in one pass, as NeMo runs them (the Parakeet TDT model card's recipe): the
//! checkpoint's full attention while the recording is short enough, and beyond that
//! `change_attention_model("rel_pos_local_attn", [128, 128])`, the same weights attending to
//! 128 encoder frames (10.24 s) on each side. Every engine applies the same limit, so a
//! recording's transcript does not depend on the engine that ran it.

use crate::config::{AttentionModel, ParakeetConfig};

/// Local attention beyond the limit: NeMo's long-audio context.
pub const LOCAL_ATTENTION: AttentionModel = AttentionModel::RelPosLocal {
    left: 128,
    right: 128,
};

/// The limit by default: 24 minutes, what the model card gives for full attention (on an 80 GB
/// A100).
pub const DEFAULT_FULL_ATTENTION_MAX_S: f64 = 24.0 * 60.0;

/// When an utterance leaves full attention for [`LOCAL_ATTENTION`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LongAudio {
    /// Longest utterance, seconds of audio, that runs with the checkpoint's own attention.
    pub full_attention_max_s: f64,
}

impl Default for LongAudio {
    fn default() -> Self {
        Self {
            full_attention_max_s: DEFAULT_FULL_ATTENTION_MAX_S,
        }
    }
}

impl LongAudio {
    /// The attention for an utterance of `encoder_frames` under `config`: the checkpoint's up
    /// to the limit, local beyond (a checkpoint with local attention keeps its own).
    pub fn attention(&self, config: &ParakeetConfig, encoder_frames: usize) -> AttentionModel {
        let seconds = encoder_frames as f64 * config.seconds_per_encoder_frame();
        self.attention_for(config.encoder.attention, seconds)
    }

    /// [`Self::attention`] of a checkpoint attending with `configured`, for `seconds` of audio.
    pub fn attention_for(&self, configured: AttentionModel, seconds: f64) -> AttentionModel {
        match configured {
            AttentionModel::RelPos if seconds > self.full_attention_max_s => LOCAL_ATTENTION,
            _ => configured,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_attention_up_to_the_limit_then_local() {
        let policy = LongAudio {
            full_attention_max_s: 60.0,
        };
        let full = AttentionModel::RelPos;
        assert_eq!(policy.attention_for(full, 60.0), full);
        assert_eq!(policy.attention_for(full, 60.08), LOCAL_ATTENTION);
        let local = AttentionModel::RelPosLocal {
            left: 16,
            right: 16,
        };
        assert_eq!(policy.attention_for(local, 3600.0), local);
        assert_eq!(
            LongAudio::default().attention_for(full, 1440.0),
            full,
            "24 minutes"
        );
    }
}
