//! The three ONNX export layouts of a Parakeet TDT model, recognised from file names alone:
//!
//! - **NeMo** (`model.export("<stem>.onnx")`): `encoder-<stem>.onnx`, `decoder_joint-<stem>.onnx`
//!   and a vocabulary (`vocab.txt` or `tokens.txt`, `piece id` per line) that the user adds.
//! - **onnx-asr** (istupakov): NeMo's export with stem `model` (`encoder-model.onnx`, optionally
//!   with external weights `encoder-model.onnx.data`, `decoder_joint-model.onnx`), `vocab.txt`,
//!   `config.json` and optionally the feature extractor `nemo128.onnx`. `config.json` is what
//!   tells it apart from a plain NeMo export with stem `model`.
//! - **sherpa-onnx**: `encoder.onnx`, `decoder.onnx`, `joiner.onnx`, `tokens.txt`.
//!
//! onnx-asr and sherpa-onnx also ship int8 graphs (`*.int8.onnx`), picked with
//! [`super::OnnxOptions::prefer_int8`].

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::ModelError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutKind {
    Nemo,
    OnnxAsr,
    Sherpa,
}

impl fmt::Display for LayoutKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LayoutKind::Nemo => "NeMo export",
            LayoutKind::OnnxAsr => "onnx-asr export",
            LayoutKind::Sherpa => "sherpa-onnx export",
        })
    }
}

/// How the prediction and joint networks are split into graphs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransducerGraphs {
    /// One graph: (encoder frame, last label, LSTM states) -> (logits, next states).
    DecoderJoint(PathBuf),
    /// Prediction network and joint as separate graphs (sherpa-onnx).
    Split { decoder: PathBuf, joiner: PathBuf },
}

/// The files of one export directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub kind: LayoutKind,
    pub dir: PathBuf,
    pub encoder: PathBuf,
    pub transducer: TransducerGraphs,
    /// `piece id` per line; a trailing `<blk>` line is the blank.
    pub vocabulary: PathBuf,
    /// onnx-asr's `config.json`.
    pub config_json: Option<PathBuf>,
    /// onnx-asr's feature extractor graph (`nemo128.onnx`).
    pub preprocessor: Option<PathBuf>,
    /// A single `*.nemo` in the directory (the checkpoint the export came from).
    pub nemo_checkpoint: Option<PathBuf>,
}

impl Layout {
    /// Recognises the layout of `dir`; the error lists what the directory holds.
    pub fn detect(dir: &Path, prefer_int8: bool) -> Result<Self, ModelError> {
        let names = list_files(dir)?;
        let has = |n: &str| names.contains(n);
        let layout_error = |problem: String| ModelError::OnnxLayout {
            dir: dir.to_path_buf(),
            problem,
            found: found_summary(&names),
        };
        let pick = |base: &str| -> Option<PathBuf> {
            let plain = format!("{base}.onnx");
            let int8 = format!("{base}.int8.onnx");
            let choice = match (has(&plain), has(&int8)) {
                (true, true) if prefer_int8 => int8,
                (true, _) => plain,
                (false, true) => int8,
                (false, false) => return None,
            };
            Some(dir.join(choice))
        };
        let nemo_checkpoint = {
            let nemos: Vec<&String> = names.iter().filter(|n| n.ends_with(".nemo")).collect();
            match nemos.as_slice() {
                [one] => Some(dir.join(one)),
                _ => None,
            }
        };

        // sherpa-onnx: three graphs and tokens.txt.
        let sherpa = [pick("encoder"), pick("decoder"), pick("joiner")];
        if let [Some(encoder), Some(decoder), Some(joiner)] = sherpa.clone() {
            if !has("tokens.txt") {
                return Err(layout_error(
                    "sherpa-onnx graphs (encoder, decoder, joiner) without tokens.txt".into(),
                ));
            }
            return Ok(Self {
                kind: LayoutKind::Sherpa,
                dir: dir.to_path_buf(),
                encoder,
                transducer: TransducerGraphs::Split { decoder, joiner },
                vocabulary: dir.join("tokens.txt"),
                config_json: None,
                preprocessor: None,
                nemo_checkpoint,
            });
        }

        // NeMo's export, possibly packaged by onnx-asr (stem `model` plus config.json).
        let stems = export_stems(&names);
        let vocabulary = ["vocab.txt", "tokens.txt"]
            .into_iter()
            .find(|n| has(n))
            .map(|n| dir.join(n));
        match stems.as_slice() {
            [stem] => {
                let encoder = pick(&format!("encoder-{stem}"));
                let decoder_joint = pick(&format!("decoder_joint-{stem}"));
                let (Some(encoder), Some(decoder_joint)) = (encoder, decoder_joint) else {
                    return Err(layout_error("bug: stem without both graphs".into()));
                };
                let onnx_asr = stem == "model" && has("config.json");
                let kind = if onnx_asr {
                    LayoutKind::OnnxAsr
                } else {
                    LayoutKind::Nemo
                };
                let vocabulary = match (onnx_asr, vocabulary) {
                    (true, _) if !has("vocab.txt") => {
                        return Err(layout_error("onnx-asr export without vocab.txt".into()))
                    }
                    (true, _) => dir.join("vocab.txt"),
                    (false, Some(v)) => v,
                    (false, None) => {
                        return Err(layout_error(format!(
                            "NeMo export (encoder-{stem}.onnx, decoder_joint-{stem}.onnx) \
                             without a vocabulary: add vocab.txt or tokens.txt (`piece id` per line)"
                        )))
                    }
                };
                Ok(Self {
                    kind,
                    dir: dir.to_path_buf(),
                    encoder,
                    transducer: TransducerGraphs::DecoderJoint(decoder_joint),
                    vocabulary,
                    config_json: onnx_asr.then(|| dir.join("config.json")),
                    preprocessor: (onnx_asr && has("nemo128.onnx"))
                        .then(|| dir.join("nemo128.onnx")),
                    nemo_checkpoint,
                })
            }
            [] => Err(layout_error(closest_miss(&names, &sherpa))),
            many => Err(layout_error(format!(
                "several NeMo exports ({}); keep one per directory",
                many.join(", ")
            ))),
        }
    }

    /// One line naming the layout and its files.
    pub fn describe(&self) -> String {
        let name = |p: &Path| {
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let mut parts = vec![name(&self.encoder)];
        let external = self.encoder.with_extension("onnx.data");
        if external.is_file() {
            parts.push(format!("(+ external weights {})", name(&external)));
        }
        match &self.transducer {
            TransducerGraphs::DecoderJoint(p) => parts.push(name(p)),
            TransducerGraphs::Split { decoder, joiner } => {
                parts.push(name(decoder));
                parts.push(name(joiner));
            }
        }
        parts.push(name(&self.vocabulary));
        if let Some(c) = &self.config_json {
            parts.push(name(c));
        }
        if let Some(p) = &self.preprocessor {
            parts.push(format!("preprocessor {}", name(p)));
        }
        if let Some(n) = &self.nemo_checkpoint {
            parts.push(format!("checkpoint {}", name(n)));
        }
        format!(
            "{} in {}: {}",
            self.kind,
            self.dir.display(),
            parts.join(", ")
        )
    }
}

/// File names for an error message; external-weight exports hold hundreds, so the list is cut.
fn found_summary(names: &BTreeSet<String>) -> Vec<String> {
    const SHOWN: usize = 30;
    let mut found: Vec<String> = names.iter().take(SHOWN).cloned().collect();
    if names.len() > SHOWN {
        found.push(format!("... and {} more", names.len() - SHOWN));
    }
    found
}

fn list_files(dir: &Path) -> Result<BTreeSet<String>, ModelError> {
    let io = |source| ModelError::Io {
        file: dir.to_path_buf(),
        source,
    };
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        // Follow symlinks: an export directory may link to shared weights.
        if entry.path().is_file() {
            names.insert(entry.file_name().to_string_lossy().into_owned());
        }
    }
    Ok(names)
}

/// Stems `S` with both `encoder-S.onnx` and `decoder_joint-S.onnx` (an int8 variant of either
/// counts; `S.int8` is not a stem of its own when `S` is).
fn export_stems(names: &BTreeSet<String>) -> Vec<String> {
    let stem_of = |name: &str, prefix: &str| -> Option<String> {
        let rest = name.strip_prefix(prefix)?.strip_suffix(".onnx")?;
        Some(rest.strip_suffix(".int8").unwrap_or(rest).to_string())
    };
    let encoders: BTreeSet<String> = names
        .iter()
        .filter_map(|n| stem_of(n, "encoder-"))
        .collect();
    let decoders: BTreeSet<String> = names
        .iter()
        .filter_map(|n| stem_of(n, "decoder_joint-"))
        .collect();
    encoders
        .intersection(&decoders)
        .filter(|s| !s.is_empty())
        .cloned()
        .collect()
}

/// What is missing for the layout the directory comes closest to.
fn closest_miss(names: &BTreeSet<String>, sherpa: &[Option<PathBuf>; 3]) -> String {
    let sherpa_found = sherpa.iter().filter(|p| p.is_some()).count();
    if sherpa_found > 0 {
        let missing: Vec<&str> = ["encoder.onnx", "decoder.onnx", "joiner.onnx"]
            .into_iter()
            .zip(sherpa)
            .filter(|(_, p)| p.is_none())
            .map(|(n, _)| n)
            .collect();
        return format!(
            "incomplete sherpa-onnx export: missing {}",
            missing.join(", ")
        );
    }
    let encoder = names.iter().find(|n| n.starts_with("encoder-"));
    let decoder = names.iter().find(|n| n.starts_with("decoder_joint-"));
    match (encoder, decoder) {
        (Some(e), None) => format!("{e} without a matching decoder_joint-<stem>.onnx"),
        (None, Some(d)) => format!("{d} without a matching encoder-<stem>.onnx"),
        (Some(e), Some(d)) => format!("{e} and {d} do not share a stem"),
        (None, None) => "expected encoder-<stem>.onnx + decoder_joint-<stem>.onnx (NeMo, \
                         onnx-asr) or encoder.onnx + decoder.onnx + joiner.onnx (sherpa-onnx)"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_with(files: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for f in files {
            std::fs::write(dir.path().join(f), b"").expect("write");
        }
        dir
    }

    #[test]
    fn recognises_each_layout() {
        let d = dir_with(&[
            "encoder-parakeet.onnx",
            "decoder_joint-parakeet.onnx",
            "tokens.txt",
        ]);
        let l = Layout::detect(d.path(), false).expect("nemo");
        assert_eq!(l.kind, LayoutKind::Nemo);
        assert_eq!(l.vocabulary, d.path().join("tokens.txt"));

        let d = dir_with(&[
            "encoder-model.onnx",
            "encoder-model.onnx.data",
            "decoder_joint-model.onnx",
            "vocab.txt",
            "config.json",
            "nemo128.onnx",
        ]);
        let l = Layout::detect(d.path(), false).expect("onnx-asr");
        assert_eq!(l.kind, LayoutKind::OnnxAsr);
        assert_eq!(l.preprocessor, Some(d.path().join("nemo128.onnx")));
        assert!(
            l.describe().contains("external weights"),
            "{}",
            l.describe()
        );

        let d = dir_with(&[
            "encoder-model.onnx",
            "decoder_joint-model.onnx",
            "vocab.txt",
        ]);
        assert_eq!(
            Layout::detect(d.path(), false).expect("nemo").kind,
            LayoutKind::Nemo
        );

        let d = dir_with(&[
            "encoder.onnx",
            "encoder.int8.onnx",
            "decoder.onnx",
            "decoder.int8.onnx",
            "joiner.int8.onnx",
            "tokens.txt",
        ]);
        let l = Layout::detect(d.path(), false).expect("sherpa");
        assert_eq!(l.kind, LayoutKind::Sherpa);
        assert_eq!(l.encoder, d.path().join("encoder.onnx"));
        let TransducerGraphs::Split { joiner, .. } = &l.transducer else {
            panic!("split graphs expected");
        };
        assert_eq!(joiner, &d.path().join("joiner.int8.onnx"));
        let l = Layout::detect(d.path(), true).expect("sherpa int8");
        assert_eq!(l.encoder, d.path().join("encoder.int8.onnx"));
    }

    fn layout_error(files: &[&str]) -> (String, Vec<String>) {
        let d = dir_with(files);
        match Layout::detect(d.path(), false) {
            Err(ModelError::OnnxLayout { problem, found, .. }) => (problem, found),
            other => panic!("expected a layout error for {files:?}, got {other:?}"),
        }
    }

    #[test]
    fn explains_what_is_missing() {
        let (problem, found) = layout_error(&[]);
        assert!(
            problem.contains("expected encoder-<stem>.onnx"),
            "{problem}"
        );
        assert!(found.is_empty());

        let (problem, found) = layout_error(&["encoder-x.onnx", "decoder_joint-x.onnx"]);
        assert!(problem.contains("without a vocabulary"), "{problem}");
        assert_eq!(found, ["decoder_joint-x.onnx", "encoder-x.onnx"]);

        let (problem, _) = layout_error(&["encoder.onnx", "decoder.onnx", "tokens.txt"]);
        assert!(problem.contains("missing joiner.onnx"), "{problem}");

        let (problem, _) = layout_error(&["encoder-a.onnx", "decoder_joint-b.onnx"]);
        assert!(problem.contains("do not share a stem"), "{problem}");

        let (problem, _) = layout_error(&[
            "encoder-model.onnx",
            "decoder_joint-model.onnx",
            "config.json",
        ]);
        assert!(
            problem.contains("onnx-asr export without vocab.txt"),
            "{problem}"
        );

        let (problem, _) = layout_error(&[
            "encoder-a.onnx",
            "decoder_joint-a.onnx",
            "encoder-b.onnx",
            "decoder_joint-b.onnx",
            "vocab.txt",
        ]);
        assert!(problem.contains("several NeMo exports (a, b)"), "{problem}");
    }

    #[test]
    fn long_listings_are_cut() {
        let files: Vec<String> = (0..40).map(|i| format!("weight_{i:02}")).collect();
        let refs: Vec<&str> = files.iter().map(String::as_str).collect();
        let (_, found) = layout_error(&refs);
        assert_eq!(found.len(), 31);
        assert_eq!(found[30], "... and 10 more");
    }

    #[test]
    fn missing_directory_is_an_io_error() {
        let err = Layout::detect(Path::new("/nonexistent/onnx-dir"), false).expect_err("missing");
        assert!(matches!(err, ModelError::Io { .. }), "{err:?}");
    }
}
