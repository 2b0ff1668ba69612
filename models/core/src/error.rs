//! The core crate's one error type.

#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// Decoder output that breaks the TDT or timestamp rules (a bug or a corrupt model).
    #[error("decoding failed: {0}")]
    Decode(String),

    /// An output format name that `render::OutputFormat` does not know.
    #[error("unknown output format `{0}` (expected json, verbose_json, text, srt, vtt or rttm)")]
    UnknownOutputFormat(String),
}
