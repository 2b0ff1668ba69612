//! What a model path holds, recognised before it is loaded as the kind the caller expects, so
//! a mix-up (a Sortformer given as the transcription model, an ONNX folder or an audio file
//! given as a `.nemo`) fails naming what was given and what to give instead, not with the first
//! config key or tar header that does not fit.

use std::io::Read;
use std::path::Path;

use crate::error::ModelError;

/// The two checkpoint kinds this crate loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// Parakeet TDT, the transcription model.
    Parakeet,
    /// Streaming Sortformer, the diarization model.
    Sortformer,
}

impl ModelKind {
    fn described(self) -> &'static str {
        match self {
            Self::Parakeet => "a Parakeet transcription checkpoint (.nemo)",
            Self::Sortformer => "a Sortformer diarization checkpoint (.nemo)",
        }
    }

    /// Where a checkpoint of this kind is given.
    fn belongs(self) -> &'static str {
        match self {
            Self::Parakeet => "give it as the transcription model (`--model`)",
            Self::Sortformer => {
                "give it as the diarization model (`--diar-model`; a worker's `--task diarize`)"
            }
        }
    }
}

fn wrong(path: &Path, found: &str, expected: ModelKind, fix: String) -> ModelError {
    ModelError::WrongModel {
        path: path.to_path_buf(),
        found: found.to_owned(),
        expected: expected.described(),
        fix,
    }
}

/// Refuses a path that cannot be a `.nemo` at all: a directory (an ONNX export or not) or a
/// file whose first bytes say it is audio or a bare PyTorch zip. A missing path passes (the
/// open reports it).
pub(crate) fn check_path(path: &Path, expected: ModelKind) -> Result<(), ModelError> {
    if path.is_dir() {
        let onnx = std::fs::read_dir(path)
            .map(|entries| {
                entries
                    .flatten()
                    .any(|e| e.path().extension().is_some_and(|x| x == "onnx"))
            })
            .unwrap_or(false);
        return Err(if onnx {
            wrong(
                path,
                "an ONNX export folder",
                expected,
                "run it with `--engine onnx`, or give the .nemo file it was exported from"
                    .to_owned(),
            )
        } else {
            wrong(
                path,
                "a directory",
                expected,
                "give the .nemo file itself".to_owned(),
            )
        });
    }
    let mut head = [0u8; 12];
    let read = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .unwrap_or(0);
    let head = &head[..read];
    let audio = head.starts_with(b"RIFF")
        || head.starts_with(b"ID3")
        || head.starts_with(b"fLaC")
        || head.starts_with(b"OggS")
        || head.get(4..8) == Some(b"ftyp".as_slice())
        || (head.len() >= 2 && head[0] == 0xFF && head[1] & 0xE0 == 0xE0);
    if audio {
        return Err(wrong(
            path,
            "an audio file",
            expected,
            "give the model's .nemo file here and the recording as an input".to_owned(),
        ));
    }
    if head.starts_with(b"PK\x03\x04") {
        return Err(wrong(
            path,
            "a zip archive (a bare PyTorch checkpoint?)",
            expected,
            "give the .nemo archive NeMo saves (`model.save_to(...)`)".to_owned(),
        ));
    }
    Ok(())
}

/// Top-level keys of a YAML document (lines that start with a key and a colon).
fn top_level_keys(yaml: &str) -> impl Iterator<Item = &str> {
    yaml.lines().filter_map(|line| {
        let (key, _) = line.split_once(':')?;
        let plain = !key.is_empty()
            && !key.starts_with([' ', '\t', '#', '-'])
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        plain.then_some(key)
    })
}

/// The kind a `.nemo`'s `model_config.yaml` describes, when it is one of ours.
fn kind_of(yaml: &str) -> Option<ModelKind> {
    let keys: Vec<&str> = top_level_keys(yaml).collect();
    if keys.contains(&"sortformer_modules") {
        Some(ModelKind::Sortformer)
    } else if keys.contains(&"joint") && keys.contains(&"decoder") {
        Some(ModelKind::Parakeet)
    } else {
        None
    }
}

/// Refuses a `.nemo` of the other kind before its config is interpreted as `expected`.
pub(crate) fn check_config(path: &Path, yaml: &str, expected: ModelKind) -> Result<(), ModelError> {
    match kind_of(yaml) {
        Some(found) if found != expected => Err(wrong(
            path,
            found.described(),
            expected,
            found.belongs().to_owned(),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_are_told_apart_by_their_top_level_sections() {
        let parakeet =
            "preprocessor:\n  x: 1\nencoder:\n  d: 2\ndecoder:\n  vocab_size: 3\njoint:\n  j: 4\n";
        let sortformer = "preprocessor:\n  x: 1\nsortformer_modules:\n  n: 4\nencoder:\n  d: 2\n";
        assert_eq!(kind_of(parakeet), Some(ModelKind::Parakeet));
        assert_eq!(kind_of(sortformer), Some(ModelKind::Sortformer));
        assert_eq!(
            kind_of("encoder:\n  decoder:\n  joint:\n"),
            None,
            "nested keys are not top level"
        );
        let path = Path::new("m.nemo");
        let e = check_config(path, sortformer, ModelKind::Parakeet)
            .expect_err("a Sortformer as the transcription model")
            .to_string();
        assert!(
            e.contains("Sortformer diarization checkpoint") && e.contains("--diar-model"),
            "{e}"
        );
        assert!(check_config(path, parakeet, ModelKind::Parakeet).is_ok());
        let e = check_config(path, parakeet, ModelKind::Sortformer)
            .expect_err("a Parakeet as the diarization model")
            .to_string();
        assert!(
            e.contains("Parakeet transcription checkpoint") && e.contains("`--model`"),
            "{e}"
        );
    }
}
