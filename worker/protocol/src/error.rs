use thiserror::Error;

/// Why a frame could not be read, written or understood. Any of these ends the connection:
/// after a bad frame the stream position can no longer be trusted.
#[derive(Debug, Error)]
pub enum ProtocolError {
    #[error("socket i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("peer closed the connection")]
    Closed,
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge { len: u64, max: u32 },
    #[error("undecodable frame body ({len} bytes): {source}")]
    Decode {
        len: usize,
        #[source]
        source: postcard::Error,
    },
    #[error("message could not be encoded: {0}")]
    Encode(#[source] postcard::Error),
    #[error("protocol version mismatch: ours {ours}, peer's {theirs}")]
    VersionMismatch { ours: u16, theirs: u16 },
    #[error("unexpected message: {0}")]
    Unexpected(String),
}

impl ProtocolError {
    /// Short stable label for logs and metrics.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::Io(_) => "io",
            Self::Closed => "closed",
            Self::FrameTooLarge { .. } => "frame_too_large",
            Self::Decode { .. } => "decode",
            Self::Encode(_) => "encode",
            Self::VersionMismatch { .. } => "version_mismatch",
            Self::Unexpected(_) => "unexpected",
        }
    }
}
