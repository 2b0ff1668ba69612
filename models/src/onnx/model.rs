//! [`OnnxModel`]: an ONNX export of a Parakeet TDT model run through ONNX Runtime, decoded by
//! the same batched greedy TDT loop as the native engine.

use std::path::Path;

use super::encoder::OnnxEncoder;
use super::layout::{Layout, TransducerGraphs};
use super::options::{FeatureSource, OnnxOptions};
use super::preprocessor::OnnxPreprocessor;
use super::runtime;
use super::session::OnnxSession;
use super::settings::{self, OnnxAsrConfig};
use super::state::StateShape;
use super::transducer::OnnxTransducer;
use super::vocab::read_vocabulary;
use crate::checkpoint::{Checkpoint, LoadOptions};
use crate::error::ModelError;
use crate::features::{FeatureExtractor, Features};
use model_core::config::{DecoderConfig, FeatureConfig};
use model_core::tdt::{greedy_decode, EncodedUtterance, TransducerNet};
use model_core::transcript::Hypothesis;

const FILTERBANK: &str = "preprocessor.featurizer.fb";
const WINDOW: &str = "preprocessor.featurizer.window";

#[derive(Debug)]
enum Frontend {
    Native {
        config: FeatureConfig,
        extractor: FeatureExtractor,
    },
    Graph(OnnxPreprocessor),
}

/// A Parakeet TDT ONNX export on ONNX Runtime.
///
/// ONNX Runtime sessions need `&mut` to run (ort 2.0), so every method that runs a graph takes
/// `&mut self`: give each engine thread its own `OnnxModel`. It is `Send` (it may be built on
/// one thread and moved to another) and `Sync`, though sharing it needs a lock.
#[derive(Debug)]
pub struct OnnxModel {
    layout: Layout,
    vocabulary: Vec<String>,
    decoder: DecoderConfig,
    seconds_per_frame: f64,
    frontend: Frontend,
    encoder: OnnxEncoder,
    transducer: OnnxTransducer,
}

impl OnnxModel {
    /// Loads the export in `dir` (layout detected from its files, see [`Layout`]).
    ///
    /// What the graphs do not say is derived as follows, explicit options first:
    /// - LSTM layers and width: the state inputs' shapes (sherpa metadata if dynamic);
    /// - vocabulary: the vocabulary file (blank = its size); the number of TDT durations is the
    ///   joint's output width minus vocabulary + blank; the durations themselves come from the
    ///   `.nemo` checkpoint, else the graphs' `tdt_durations` metadata, else `0..n` (NeMo's
    ///   convention: Parakeet uses 0..4);
    /// - `max_symbols`: the checkpoint, else onnx-asr `max_tokens_per_step`, else 10;
    /// - features: the checkpoint's preprocessor (with its stored filterbank and window), else
    ///   NeMo's default Parakeet preprocessor with the encoder's mel count and sherpa's
    ///   `normalize_type`, STFT padding from [`OnnxOptions::stft_padding`] (zeros by default);
    ///   with [`FeatureSource::Auto`] onnx-asr's `nemo128.onnx` if present.
    pub fn load(dir: &Path, opts: &OnnxOptions) -> Result<Self, ModelError> {
        let layout = Layout::detect(dir, opts.prefer_int8)?;
        tracing::debug!(layout = %layout.describe(), "loading ONNX export");
        let env = runtime::environment(opts.dylib_path.as_deref())?;
        let vocabulary = read_vocabulary(&layout.vocabulary)?;
        let checkpoint = match opts
            .nemo_checkpoint
            .as_deref()
            .or(layout.nemo_checkpoint.as_deref())
        {
            Some(path) => Some(Checkpoint::load_with(
                path,
                &LoadOptions {
                    stft_padding: opts.stft_padding,
                },
            )?),
            None => None,
        };
        let onnx_asr = match &layout.config_json {
            Some(p) => Some(OnnxAsrConfig::read(p)?),
            None => None,
        };

        let encoder = OnnxEncoder::new(OnnxSession::open(&env, &layout.encoder, opts)?)?;
        let enc_session = encoder.session();
        let meta_usize = |key: &str| {
            enc_session
                .metadata(key)
                .and_then(|v| v.trim().parse::<usize>().ok())
        };
        let metadata_hint = match (meta_usize("pred_rnn_layers"), meta_usize("pred_hidden")) {
            (Some(lead), Some(trail)) => Some(StateShape { lead, trail }),
            _ => None,
        };
        let mut transducer = match &layout.transducer {
            TransducerGraphs::DecoderJoint(p) => {
                OnnxTransducer::decoder_joint(OnnxSession::open(&env, p, opts)?)?
            }
            TransducerGraphs::Split { decoder, joiner } => OnnxTransducer::split(
                OnnxSession::open(&env, decoder, opts)?,
                OnnxSession::open(&env, joiner, opts)?,
                metadata_hint,
            )?,
        };
        if transducer.enc_dim.is_none() {
            transducer.enc_dim = encoder.d_model;
        }

        let vocab_size = vocabulary.len();
        if let Some(ckpt) = &checkpoint {
            if ckpt.config.decoder.vocab_size != vocab_size {
                return Err(ModelError::Vocabulary {
                    file: layout.vocabulary.clone(),
                    problem: format!(
                        "{vocab_size} tokens, but the checkpoint has {}",
                        ckpt.config.decoder.vocab_size
                    ),
                });
            }
        }
        let width = joint_width(&mut transducer, vocab_size, &layout)?;
        let n_durations = width
            .checked_sub(vocab_size + 1)
            .filter(|n| *n > 0)
            .ok_or_else(|| ModelError::Vocabulary {
                file: layout.vocabulary.clone(),
                problem: format!(
                    "{vocab_size} tokens + blank leave no TDT duration outputs in the joint's \
                     {width} outputs (wrong vocabulary, or not a TDT model)"
                ),
            })?;
        let metadata_durations = durations_from_metadata(&encoder, &layout)?;
        let durations = opts
            .durations
            .clone()
            .or_else(|| {
                checkpoint
                    .as_ref()
                    .map(|c| c.config.decoder.durations.clone())
            })
            .or(metadata_durations)
            .unwrap_or_else(|| (0..n_durations).collect());
        if durations.len() != n_durations {
            return Err(ModelError::InvalidConfig {
                file: layout.dir.clone(),
                key: "durations".into(),
                problem: format!(
                    "{durations:?} has {} entries, the joint predicts {n_durations}",
                    durations.len()
                ),
            });
        }
        let max_symbols_per_step = opts
            .max_symbols_per_step
            .or_else(|| {
                checkpoint
                    .as_ref()
                    .map(|c| c.config.decoder.max_symbols_per_step)
            })
            .or(onnx_asr.as_ref().and_then(|c| c.max_tokens_per_step))
            .unwrap_or(settings::DEFAULT_MAX_SYMBOLS);
        let lstm = transducer
            .state_shapes()
            .first()
            .copied()
            .ok_or_else(|| ModelError::Onnx {
                file: layout.dir.clone(),
                problem: "the prediction network has no state (bug)".into(),
            })?;
        let decoder = DecoderConfig {
            vocab_size,
            pred_hidden: lstm.trail,
            pred_rnn_layers: lstm.lead,
            // Not visible in the graphs; only the checkpoint knows it (0: unknown).
            joint_hidden: checkpoint
                .as_ref()
                .map_or(0, |c| c.config.decoder.joint_hidden),
            durations,
            max_symbols_per_step,
        };

        let n_mels = encoder
            .n_mels
            .or(onnx_asr.as_ref().and_then(|c| c.features_size))
            .or(meta_usize("feat_dim"))
            .unwrap_or(128);
        let normalization = settings::normalization_from_metadata(
            &layout.encoder,
            enc_session.metadata("normalize_type").as_deref(),
        )?;
        let subsampling = checkpoint
            .as_ref()
            .map(|c| c.config.encoder.subsampling_factor)
            .or(onnx_asr.as_ref().and_then(|c| c.subsampling_factor))
            .or(meta_usize("subsampling_factor"))
            .unwrap_or(settings::DEFAULT_SUBSAMPLING);
        let native = |config: FeatureConfig| -> Result<Frontend, ModelError> {
            let (fb, window) = match &checkpoint {
                Some(c) if c.config.features == config => {
                    let n_freq = config.n_fft / 2 + 1;
                    (
                        c.tensors
                            .get_optional(FILTERBANK, &[1, config.n_mels, n_freq])?,
                        c.tensors
                            .get_optional(WINDOW, &[config.win_length_samples])?,
                    )
                }
                _ => (None, None),
            };
            let extractor = FeatureExtractor::new(&config, fb, window)?;
            Ok(Frontend::Native { config, extractor })
        };
        let mut derived = checkpoint
            .as_ref()
            .map(|c| c.config.features.clone())
            .unwrap_or_else(|| settings::default_feature_config(n_mels, normalization));
        if let Some(padding) = opts.stft_padding {
            derived.stft_padding = padding;
        }
        let frontend = match (&opts.features, &layout.preprocessor) {
            (FeatureSource::NativeWith(cfg), _) => native(cfg.clone())?,
            (FeatureSource::Native, _) | (FeatureSource::Auto, None) => native(derived)?,
            (FeatureSource::Auto | FeatureSource::Preprocessor, Some(p)) => {
                Frontend::Graph(OnnxPreprocessor::new(OnnxSession::open(&env, p, opts)?)?)
            }
            (FeatureSource::Preprocessor, None) => {
                return Err(ModelError::OnnxLayout {
                    dir: layout.dir.clone(),
                    problem: "the preprocessor graph (nemo128.onnx) was requested but is absent"
                        .into(),
                    found: vec![layout.describe()],
                })
            }
        };
        let seconds_per_frame = match &frontend {
            Frontend::Native { config, .. } => {
                config.hop_length_samples as f64 / config.sample_rate_hz as f64
            }
            // onnx-asr's nemo128.onnx uses NeMo's 10 ms hop.
            Frontend::Graph(_) => 0.01,
        } * subsampling as f64;

        Ok(Self {
            layout,
            vocabulary,
            decoder,
            seconds_per_frame,
            frontend,
            encoder,
            transducer,
        })
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Token pieces by id (blank excluded).
    pub fn vocabulary(&self) -> &[String] {
        &self.vocabulary
    }

    /// The decoding configuration derived at load (see [`Self::load`]).
    pub fn decoder_config(&self) -> &DecoderConfig {
        &self.decoder
    }

    /// The Rust feature extractor's configuration; `None` when the export's preprocessor graph
    /// computes the features.
    pub fn feature_config(&self) -> Option<&FeatureConfig> {
        match &self.frontend {
            Frontend::Native { config, .. } => Some(config),
            Frontend::Graph(_) => None,
        }
    }

    /// Seconds per encoder frame (0.08 for Parakeet).
    pub fn seconds_per_encoder_frame(&self) -> f64 {
        self.seconds_per_frame
    }

    pub fn features(&mut self, pcm_16k: &[f32]) -> Result<Features, ModelError> {
        match &mut self.frontend {
            Frontend::Native { extractor, .. } => Ok(extractor.compute(pcm_16k)),
            Frontend::Graph(p) => p.compute(pcm_16k),
        }
    }

    /// Encoder output `[T_enc, d_model]` of one utterance.
    pub fn encode(&mut self, features: &Features) -> Result<EncodedUtterance, ModelError> {
        let mut out = self.encoder.encode(&[features])?;
        out.pop().ok_or_else(|| {
            self.encoder
                .session()
                .error("no encoder output for one utterance")
        })
    }

    /// Encoder outputs of several utterances, run as one batch.
    pub fn encode_batch(
        &mut self,
        features: &[&Features],
    ) -> Result<Vec<EncodedUtterance>, ModelError> {
        self.encoder.encode(features)
    }

    /// Batched greedy TDT decoding; each utterance keeps its own length.
    pub fn decode(&mut self, encoded: &[EncodedUtterance]) -> Result<Vec<Hypothesis>, ModelError> {
        greedy_decode(&mut self.transducer, &self.decoder, encoded)
    }

    /// Features per clip, one encoder batch, one batched decode.
    pub fn transcribe_batch(&mut self, pcm: &[&[f32]]) -> Result<Vec<Hypothesis>, ModelError> {
        let features = pcm
            .iter()
            .map(|p| self.features(p))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&Features> = features.iter().collect();
        let encoded = self.encode_batch(&refs)?;
        self.decode(&encoded)
    }
}

/// The joint's output width, from one probe run (blank from a zero state on a zero frame).
fn joint_width(
    transducer: &mut OnnxTransducer,
    vocab_size: usize,
    layout: &Layout,
) -> Result<usize, ModelError> {
    let enc_dim = transducer.enc_dim.ok_or_else(|| ModelError::Onnx {
        file: layout.encoder.clone(),
        problem: "the encoder output width is dynamic and the joint does not fix it".into(),
    })?;
    let state = transducer.initial_state(1)?;
    let (pred, _) = transducer.predict(&[vocab_size as u32], &state)?;
    Ok(transducer.joint(&vec![0.0; enc_dim], &pred)?.len())
}

/// `tdt_durations` (or `durations`) metadata on the encoder graph.
fn durations_from_metadata(
    encoder: &OnnxEncoder,
    layout: &Layout,
) -> Result<Option<Vec<usize>>, ModelError> {
    for key in ["tdt_durations", "durations"] {
        if let Some(v) = encoder.session().metadata(key) {
            return settings::parse_durations(&layout.encoder, key, &v).map(Some);
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_can_move_to_its_engine_thread() {
        fn send_and_sync<T: Send + Sync>() {}
        send_and_sync::<OnnxModel>();
    }
}
