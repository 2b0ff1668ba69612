//! Checkpoint loading: `.nemo` archives (tar, `model_config.yaml`, torch `model_weights.ckpt`,
//! tokenizer artifacts) into a resolved [`ParakeetConfig`], named tensors and a vocabulary.
//!
//! Errors about a member's contents name it as `<archive>:<member>` (and
//! `<archive>:model_weights.ckpt:<stem>/data.pkl` inside the torch zip). The weights are read in
//! place from the tar (a gzip-wrapped `.nemo` is first inflated to an anonymous temporary file
//! under `TMPDIR`), so peak memory is the f32 weights plus about a megabyte.

pub mod kind;
mod nemo;
mod pickle;
mod torch;
mod validate;
mod vocabulary;
pub(crate) mod yaml;
mod yaml_config;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::ModelError;
use crate::tensor::Tensor;
use model_core::config::{ParakeetConfig, StftPadding};

/// Named f32 tensors from a state dict (f16/bf16 storages are widened at load).
#[derive(Debug, Clone, Default)]
pub struct TensorMap {
    /// Where the tensors came from, for error messages.
    pub source: PathBuf,
    tensors: BTreeMap<String, Tensor>,
}

impl TensorMap {
    pub fn new(source: PathBuf, tensors: BTreeMap<String, Tensor>) -> Self {
        Self { source, tensors }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// The tensor `name`, which must have exactly `shape`.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<&Tensor, ModelError> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                file: self.source.clone(),
                name: name.to_string(),
            })?;
        if t.shape != shape {
            return Err(ModelError::TensorShape {
                file: self.source.clone(),
                name: name.to_string(),
                expected: shape.to_vec(),
                found: t.shape.clone(),
            });
        }
        Ok(t)
    }

    /// The tensor `name` whatever its shape (for inspection; the model uses [`Self::get`]).
    pub fn get_any_shape(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// `joint.joint_net.<i>`, the joint's final Linear: `<i>` is 2 when the joint has dropout
    /// and 1 without, so it is found, not assumed. `None` if there is no such weight.
    pub fn joint_output_prefix(&self) -> Option<String> {
        self.names()
            .filter_map(|n| n.strip_prefix("joint.joint_net.")?.strip_suffix(".weight"))
            .filter_map(|i| i.parse::<usize>().ok())
            .max()
            .map(|i| format!("joint.joint_net.{i}"))
    }

    /// [`Self::joint_output_prefix`], or a `MissingTensor` error naming what is missing.
    pub fn require_joint_output_prefix(&self) -> Result<String, ModelError> {
        self.joint_output_prefix()
            .ok_or_else(|| ModelError::MissingTensor {
                file: self.source.clone(),
                name: "joint.joint_net.<last>.weight".to_string(),
            })
    }

    /// Like [`Self::get`] but `None` when absent (optional biases).
    pub fn get_optional(&self, name: &str, shape: &[usize]) -> Result<Option<&Tensor>, ModelError> {
        if self.contains(name) {
            self.get(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// The raw parts of a `.nemo` that is not a Parakeet TDT model (Sortformer): its config text
/// (with the name errors use for it) and its weights.
#[derive(Debug, Clone)]
pub(crate) struct RawNemo {
    pub(crate) config_path: PathBuf,
    pub(crate) config_yaml: String,
    pub(crate) tensors: TensorMap,
}

/// Reads `model_config.yaml` and `model_weights.ckpt` of a `.nemo` without interpreting them,
/// once the path and the config say it is an `expected` checkpoint (before the weights are read).
pub(crate) fn read_raw_nemo(path: &Path, expected: kind::ModelKind) -> Result<RawNemo, ModelError> {
    kind::check_path(path, expected)?;
    let archive = nemo::NemoArchive::open(path)?;
    let config_path = nemo::member_path(path, "model_config.yaml");
    let yaml = archive.read_small("model_config.yaml")?;
    let config_yaml = String::from_utf8(yaml).map_err(|e| ModelError::InvalidConfig {
        file: config_path.clone(),
        key: "<document>".to_string(),
        problem: format!("not UTF-8: {e}"),
    })?;
    kind::check_config(path, &config_yaml, expected)?;
    let weights_path = nemo::member_path(path, "model_weights.ckpt");
    let weights_len = archive.member_len("model_weights.ckpt")?;
    let tensors = torch::read_state_dict(
        archive.reader("model_weights.ckpt")?,
        weights_len,
        &weights_path,
    )?;
    Ok(RawNemo {
        config_path,
        config_yaml,
        tensors: TensorMap::new(weights_path, tensors),
    })
}

pub(crate) use yaml_config::parse_frontend;

/// A loaded Parakeet TDT checkpoint.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub config: ParakeetConfig,
    pub tensors: TensorMap,
    /// SentencePiece pieces by id (blank excluded), `▁` kept as is.
    pub vocabulary: Vec<String>,
}

/// Choices the checkpoint cannot make for itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// STFT centre padding. `None`: decided from the config's `nemo_version`
    /// (reflect before NeMo 2.5, zeros from 2.5 on; see `yaml_config::stft_padding_for_version`).
    pub stft_padding: Option<StftPadding>,
}

impl Checkpoint {
    /// Loads a `.nemo` (plain or gzip tar) with default options.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        Self::load_with(path, &LoadOptions::default())
    }

    /// Loads a `.nemo`: config and vocabulary first (cheap, fail fast), then the weights,
    /// then a check that the weights are what the config describes.
    pub fn load_with(path: &Path, options: &LoadOptions) -> Result<Self, ModelError> {
        const CONFIG: &str = "model_config.yaml";
        const WEIGHTS: &str = "model_weights.ckpt";

        kind::check_path(path, kind::ModelKind::Parakeet)?;
        let archive = nemo::NemoArchive::open(path)?;
        let config_path = nemo::member_path(path, CONFIG);
        let yaml = archive.read_small(CONFIG)?;
        let yaml = std::str::from_utf8(&yaml).map_err(|e| ModelError::InvalidConfig {
            file: config_path.clone(),
            key: "<document>".to_string(),
            problem: format!("not UTF-8: {e}"),
        })?;
        kind::check_config(path, yaml, kind::ModelKind::Parakeet)?;
        let parsed = yaml_config::parse(yaml, &config_path)?;
        let mut config = parsed.model.clone();
        if let Some(padding) = options.stft_padding {
            config.features.stft_padding = padding;
        }
        let vocabulary = vocabulary::load(&archive, &parsed, config.decoder.vocab_size)?;

        let weights_path = nemo::member_path(path, WEIGHTS);
        let weights_len = archive.member_len(WEIGHTS)?;
        let tensors = torch::read_state_dict(archive.reader(WEIGHTS)?, weights_len, &weights_path)?;
        let tensors = TensorMap::new(weights_path, tensors);
        validate::check(&mut config, &tensors)?;
        tracing::debug!(
            file = %path.display(),
            nemo_version = parsed.nemo_version.as_deref().unwrap_or("unknown"),
            stft_padding = ?config.features.stft_padding,
            tensors = tensors.names().count(),
            "checkpoint loaded"
        );
        Ok(Self {
            config,
            tensors,
            vocabulary,
        })
    }
}
