//! Checkpoint loading: `.nemo` archives (tar, `model_config.yaml`, torch `model_weights.ckpt`,
//! tokenizer artifacts) into a resolved [`ParakeetConfig`], named tensors and a vocabulary.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::config::ParakeetConfig;
use crate::error::ModelError;
use crate::tensor::Tensor;

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

    /// Like [`Self::get`] but `None` when absent (optional biases).
    pub fn get_optional(&self, name: &str, shape: &[usize]) -> Result<Option<&Tensor>, ModelError> {
        if self.contains(name) {
            self.get(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// A loaded Parakeet TDT checkpoint.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    pub config: ParakeetConfig,
    pub tensors: TensorMap,
    /// SentencePiece pieces by id (blank excluded), `▁` kept as is.
    pub vocabulary: Vec<String>,
}
