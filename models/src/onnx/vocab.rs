//! `vocab.txt` / `tokens.txt` of ONNX exports: one `piece id` per line, ids 0.. in order,
//! optionally ending with the blank (`<blk> N`, N = number of pieces).

use std::path::Path;

use crate::error::ModelError;

/// Token pieces by id, blank excluded.
pub(crate) fn read_vocabulary(file: &Path) -> Result<Vec<String>, ModelError> {
    let text = std::fs::read_to_string(file).map_err(|source| ModelError::Io {
        file: file.to_path_buf(),
        source,
    })?;
    parse_vocabulary(&text).map_err(|problem| ModelError::Vocabulary {
        file: file.to_path_buf(),
        problem,
    })
}

fn parse_vocabulary(text: &str) -> Result<Vec<String>, String> {
    let mut pieces = Vec::new();
    let mut blank_seen = false;
    for (index, line) in text.lines().enumerate() {
        let line_no = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        if blank_seen {
            return Err(format!("line {line_no}: entries after the blank `<blk>`"));
        }
        // The id is the last field; a piece never contains a space (SentencePiece uses `▁`).
        let (piece, id) = line
            .rsplit_once(' ')
            .ok_or_else(|| format!("line {line_no}: expected `piece id`, got {line:?}"))?;
        let id: usize = id
            .trim()
            .parse()
            .map_err(|_| format!("line {line_no}: id {id:?} is not a number"))?;
        if id != pieces.len() {
            return Err(format!(
                "line {line_no}: id {id}, expected {} (ids must count up from 0)",
                pieces.len()
            ));
        }
        if piece == "<blk>" {
            blank_seen = true;
        } else {
            pieces.push(piece.to_string());
        }
    }
    if pieces.is_empty() {
        return Err("no tokens".into());
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pieces_and_drops_the_blank() {
        let v = parse_vocabulary("<unk> 0\n▁the 1\ns 2\n<blk> 3\n").expect("parse");
        assert_eq!(v, ["<unk>", "▁the", "s"]);
        let v = parse_vocabulary("a 0\nb 1\n").expect("parse");
        assert_eq!(v, ["a", "b"]);
    }

    #[test]
    fn rejects_malformed_files() {
        for (text, needle) in [
            ("a 0\nb 2\n", "expected 1"),
            ("a 0\nb\n", "expected `piece id`"),
            ("a x\n", "not a number"),
            ("a 0\n<blk> 1\nc 2\n", "after the blank"),
            ("", "no tokens"),
        ] {
            let err = parse_vocabulary(text).expect_err(text);
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }
}
