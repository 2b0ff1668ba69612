//! The id -> piece list. Sources, most authoritative first:
//! 1. the SentencePiece model (`tokenizer.model_path`, `<hex>_tokenizer.model`): the protobuf
//!    NeMo decodes with;
//! 2. SentencePiece's text listing (`tokenizer.spe_tokenizer_vocab`, `<hex>_tokenizer.vocab`,
//!    `piece<TAB>score` per line);
//! 3. the config's `joint.vocabulary` / `labels`.
//!
//! NeMo's `vocab.txt` is not used: it rewrites pieces WordPiece-style (`▁` dropped, `##` added).

use std::path::Path;

use super::nemo::{member_path, NemoArchive};
use super::yaml_config::ConfigFile;
use crate::error::ModelError;

/// SentencePiece's `ModelProto`, reduced to the piece list (unknown fields are skipped).
#[derive(Clone, PartialEq, prost::Message)]
struct ModelProto {
    #[prost(message, repeated, tag = "1")]
    pieces: Vec<SentencePiece>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SentencePiece {
    #[prost(string, optional, tag = "1")]
    piece: Option<String>,
}

/// Pieces by id; exactly `vocab_size` of them.
pub(crate) fn load(
    archive: &NemoArchive,
    config: &ConfigFile,
    vocab_size: usize,
) -> Result<Vec<String>, ModelError> {
    let (pieces, source) = if let Some(member) =
        find_member(archive, config.spe_model_ref.as_deref(), "tokenizer.model")
    {
        let file = member_path(archive.path(), &member);
        (
            from_model_proto(&archive.read_small(&member)?, &file)?,
            file,
        )
    } else if let Some(member) =
        find_member(archive, config.spe_vocab_ref.as_deref(), "tokenizer.vocab")
    {
        let file = member_path(archive.path(), &member);
        (from_vocab_text(&archive.read_small(&member)?, &file)?, file)
    } else if let Some(pieces) = &config.vocabulary {
        (
            pieces.clone(),
            member_path(archive.path(), "model_config.yaml"),
        )
    } else {
        return Err(ModelError::Vocabulary {
            file: archive.path().to_path_buf(),
            problem: "no SentencePiece tokenizer member and no joint.vocabulary in the config"
                .to_string(),
        });
    };
    if pieces.len() != vocab_size {
        return Err(ModelError::Vocabulary {
            file: source,
            problem: format!(
                "{} pieces, but decoder.vocab_size is {vocab_size}",
                pieces.len()
            ),
        });
    }
    if let Some(listed) = &config.vocabulary {
        if *listed != pieces {
            tracing::warn!(
                source = %source.display(),
                "joint.vocabulary in the config differs from the tokenizer; using the tokenizer"
            );
        }
    }
    Ok(pieces)
}

/// The member a `nemo:<name>` (or absolute training-machine path) reference points to, or
/// else the only member whose name ends in `suffix`.
fn find_member(archive: &NemoArchive, reference: Option<&str>, suffix: &str) -> Option<String> {
    if let Some(reference) = reference {
        let name = reference.strip_prefix("nemo:").unwrap_or(reference);
        let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
        for candidate in [name, base] {
            if archive.contains(candidate) {
                return Some(candidate.to_string());
            }
        }
    }
    let mut matches = archive.member_names().filter(|n| n.ends_with(suffix));
    match (matches.next(), matches.next()) {
        (Some(only), None) => Some(only.to_string()),
        _ => None,
    }
}

fn from_model_proto(bytes: &[u8], file: &Path) -> Result<Vec<String>, ModelError> {
    let model =
        <ModelProto as prost::Message>::decode(bytes).map_err(|e| ModelError::Vocabulary {
            file: file.to_path_buf(),
            problem: format!("not a SentencePiece model: {e}"),
        })?;
    model
        .pieces
        .into_iter()
        .enumerate()
        .map(|(id, p)| {
            p.piece.ok_or_else(|| ModelError::Vocabulary {
                file: file.to_path_buf(),
                problem: format!("piece {id} has no text"),
            })
        })
        .collect()
}

fn from_vocab_text(bytes: &[u8], file: &Path) -> Result<Vec<String>, ModelError> {
    let text = std::str::from_utf8(bytes).map_err(|e| ModelError::Vocabulary {
        file: file.to_path_buf(),
        problem: format!("not UTF-8: {e}"),
    })?;
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            line.split_once('\t')
                .map(|(piece, _score)| piece.to_string())
                .ok_or_else(|| ModelError::Vocabulary {
                    file: file.to_path_buf(),
                    problem: format!("line {} is not `piece<TAB>score`", i + 1),
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocab_text_keeps_order_and_word_marker() {
        let pieces = from_vocab_text("<unk>\t0\n▁the\t-0\nhe\t-1\n".as_bytes(), Path::new("v"))
            .expect("valid listing");
        assert_eq!(pieces, vec!["<unk>", "▁the", "he"]);
    }

    #[test]
    fn vocab_text_without_tab_is_an_error() {
        let err = from_vocab_text(b"<unk> 0\n", Path::new("x.vocab")).expect_err("no tab");
        assert!(err.to_string().contains("x.vocab"), "{err}");
    }

    #[test]
    fn model_proto_pieces() {
        let model = ModelProto {
            pieces: vec![
                SentencePiece {
                    piece: Some("<unk>".into()),
                },
                SentencePiece {
                    piece: Some("▁a".into()),
                },
            ],
        };
        let bytes = prost::Message::encode_to_vec(&model);
        let pieces = from_model_proto(&bytes, Path::new("m")).expect("valid proto");
        assert_eq!(pieces, vec!["<unk>", "▁a"]);
    }
}
