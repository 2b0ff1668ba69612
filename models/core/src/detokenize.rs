//! SentencePiece detokenisation from the piece list alone, as NeMo's `SentencePieceTokenizer`
//! (sentencepiece 0.2 `decode_ids`) produces it, plus the punctuation set NeMo derives from the
//! vocabulary (`extract_punctuation_from_vocab`).
//!
//! The piece list carries no piece types, so they are inferred from the piece text the way
//! SentencePiece names them: `<unk>` is the unknown piece, `<s>`, `</s>` and `<pad>` are control
//! pieces, `<0xHH>` are byte-fallback pieces. The normaliser is assumed to be SentencePiece's
//! default (`add_dummy_prefix`, `remove_extra_whitespaces`), as in every NeMo tokenizer.

use std::collections::BTreeSet;

use unicode_general_category::{get_general_category, GeneralCategory};

/// SentencePiece's word-boundary marker.
pub const SPACE_SYMBOL: char = '\u{2581}';
/// What SentencePiece prints for the unknown piece.
const UNKNOWN_SURFACE: &str = " \u{2047} ";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PieceKind {
    Normal,
    Unknown,
    Control,
    Byte(u8),
}

fn piece_kind(piece: &str) -> PieceKind {
    match piece {
        "<unk>" => PieceKind::Unknown,
        "<s>" | "</s>" | "<pad>" => PieceKind::Control,
        _ => byte_piece(piece).map_or(PieceKind::Normal, PieceKind::Byte),
    }
}

/// `<0xHH>` (upper-case hex, as SentencePiece writes byte pieces).
fn byte_piece(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    let upper_hex = hex.len() == 2
        && hex
            .chars()
            .all(|c| c.is_ascii_digit() || ('A'..='F').contains(&c));
    if upper_hex {
        u8::from_str_radix(hex, 16).ok()
    } else {
        None
    }
}

/// Python's `str.isspace` (and the `\s` class of `re` on str): Rust's White_Space plus the
/// ASCII information separators U+001C..U+001F.
pub(crate) fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn is_unicode_punctuation(c: char) -> bool {
    matches!(
        get_general_category(c),
        GeneralCategory::ConnectorPunctuation
            | GeneralCategory::DashPunctuation
            | GeneralCategory::OpenPunctuation
            | GeneralCategory::ClosePunctuation
            | GeneralCategory::InitialPunctuation
            | GeneralCategory::FinalPunctuation
            | GeneralCategory::OtherPunctuation
    )
}

/// Pieces whose characters never count as punctuation: `[...]`, `<...>`, `##...`, `▁...` and
/// whitespace-only pieces.
fn is_special_piece(piece: &str) -> bool {
    let wrapped = |open: char, close: char| {
        piece.chars().count() >= 2 && piece.starts_with(open) && piece.ends_with(close)
    };
    wrapped('[', ']')
        || wrapped('<', '>')
        || piece.starts_with("##")
        || piece.starts_with(SPACE_SYMBOL)
        || piece.chars().all(is_python_space)
}

/// The vocabulary of one model, ready to turn token ids into text.
#[derive(Debug, Clone)]
pub struct Detokenizer {
    pieces: Vec<String>,
    kinds: Vec<PieceKind>,
    /// Each id decoded on its own.
    single: Vec<String>,
    punctuation: BTreeSet<char>,
}

impl Detokenizer {
    /// `vocabulary`: SentencePiece pieces by id, blank excluded.
    pub fn new(vocabulary: &[String]) -> Self {
        let kinds: Vec<PieceKind> = vocabulary.iter().map(|p| piece_kind(p)).collect();
        let punctuation = vocabulary
            .iter()
            .filter(|p| !is_special_piece(p))
            .flat_map(|p| p.chars())
            .filter(|c| is_unicode_punctuation(*c))
            .collect();
        let mut detok = Self {
            pieces: vocabulary.to_vec(),
            kinds,
            single: Vec::new(),
            punctuation,
        };
        detok.single = (0..vocabulary.len())
            .map(|id| detok.decode(&[id as u32]))
            .collect();
        detok
    }

    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The raw piece (`▁the`), or `None` outside the vocabulary.
    pub fn piece(&self, id: u32) -> Option<&str> {
        self.pieces.get(id as usize).map(String::as_str)
    }

    /// The id decoded on its own (`▁the` -> `the`), or `None` outside the vocabulary.
    pub fn piece_text(&self, id: u32) -> Option<&str> {
        self.single.get(id as usize).map(String::as_str)
    }

    /// Punctuation marks found in the vocabulary (NeMo's `supported_punctuation`).
    pub fn punctuation(&self) -> &BTreeSet<char> {
        &self.punctuation
    }

    /// Whether `text` is exactly one supported punctuation mark.
    pub fn is_punctuation(&self, text: &str) -> bool {
        let mut chars = text.chars();
        match (chars.next(), chars.next()) {
            (Some(c), None) => self.punctuation.contains(&c),
            _ => false,
        }
    }

    /// SentencePiece `decode_ids`: pieces concatenated, `▁` as space, the first `▁` of the
    /// text dropped, `<unk>` as ` ⁇ `, control pieces invisible, byte pieces joined into UTF-8
    /// (each invalid byte becomes U+FFFD). Ids outside the vocabulary decode like `<unk>`.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut text = String::new();
        let mut bytes: Vec<u8> = Vec::new();
        for &id in ids {
            let kind = self
                .kinds
                .get(id as usize)
                .copied()
                .unwrap_or(PieceKind::Unknown);
            if let PieceKind::Byte(b) = kind {
                bytes.push(b);
                continue;
            }
            flush_bytes(&mut bytes, &mut text);
            match kind {
                PieceKind::Unknown => text.push_str(UNKNOWN_SURFACE),
                PieceKind::Control | PieceKind::Byte(_) => {}
                PieceKind::Normal => {
                    let piece = self.pieces[id as usize].as_str();
                    // Until something visible was written, a leading `▁` is the dummy prefix.
                    let piece = if text.is_empty() {
                        piece.strip_prefix(SPACE_SYMBOL).unwrap_or(piece)
                    } else {
                        piece
                    };
                    text.extend(
                        piece
                            .chars()
                            .map(|c| if c == SPACE_SYMBOL { ' ' } else { c }),
                    );
                }
            }
        }
        flush_bytes(&mut bytes, &mut text);
        text
    }

    /// NeMo removes one whitespace character before each supported punctuation mark
    /// (`space_before_punct_pattern`).
    pub fn remove_space_before_punctuation(&self, text: &str) -> String {
        let chars: Vec<char> = text.chars().collect();
        let mut out = String::with_capacity(text.len());
        for (i, c) in chars.iter().enumerate() {
            let before_punctuation = chars
                .get(i + 1)
                .is_some_and(|next| self.punctuation.contains(next));
            if !(is_python_space(*c) && before_punctuation) {
                out.push(*c);
            }
        }
        out
    }
}

/// SentencePiece's byte-piece decoding: one character at a time, a structurally invalid byte
/// (bad lead, bad continuation, overlong, surrogate, truncated) becomes one U+FFFD.
fn flush_bytes(bytes: &mut Vec<u8>, text: &mut String) {
    let mut offset = 0;
    while offset < bytes.len() {
        let lead = bytes[offset];
        let len = match lead {
            0x00..=0x7F => 1,
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 0,
        };
        let decoded = (len > 0)
            .then(|| bytes.get(offset..offset + len))
            .flatten()
            .and_then(|b| std::str::from_utf8(b).ok());
        match decoded {
            Some(s) => {
                text.push_str(s);
                offset += len;
            }
            None => {
                text.push(char::REPLACEMENT_CHARACTER);
                offset += 1;
            }
        }
    }
    bytes.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(pieces: &[&str]) -> Detokenizer {
        Detokenizer::new(&pieces.iter().map(|p| p.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn decode_follows_sentencepiece() {
        let d = vocab(&[
            "<unk>", "▁the", "re", "▁", ",", "<0xE2>", "<0x82>", "<0xAC>", "<0x41>", "<s>",
        ]);
        assert_eq!(d.decode(&[1, 2, 1]), "there the");
        assert_eq!(d.decode(&[2, 1]), "re the");
        // Bare markers before any text are all dummy prefixes; later ones are spaces.
        assert_eq!(d.decode(&[3, 1, 3]), "the ");
        assert_eq!(d.decode(&[0, 1]), " ⁇  the");
        assert_eq!(d.decode(&[9, 1]), "the");
        assert_eq!(d.decode(&[1, 5, 6, 7]), "the€");
        assert_eq!(d.decode(&[5, 6, 1]), "\u{fffd}\u{fffd} the");
        assert_eq!(d.decode(&[8, 1]), "A the");
        assert_eq!(d.decode(&[]), "");
        assert_eq!(d.piece_text(1), Some("the"));
        assert_eq!(d.piece_text(3), Some(""));
        assert_eq!(d.piece_text(10), None);
    }

    #[test]
    fn punctuation_comes_from_non_special_pieces() {
        let d = vocab(&["<unk>", "▁.", "[x!]", "##?", "'s", "-", "$", ";", "<0x2E>"]);
        let found: String = d.punctuation().iter().collect();
        assert_eq!(found, "'-;");
        assert!(d.is_punctuation("'"));
        assert!(!d.is_punctuation("'s"));
        assert!(!d.is_punctuation("$"));
        assert!(!d.is_punctuation("."));
        assert_eq!(
            d.remove_space_before_punctuation("a ; b  - c's ;"),
            "a; b - c's;"
        );
    }
}
