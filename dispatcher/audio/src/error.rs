//! The one error type of this crate, with a stable machine reason code per variant.

/// Why a recording could not be turned into 16 kHz mono PCM.
///
/// Every variant maps to a stable [`reason_code`](AudioError::reason_code) that goes into failure
/// records and metric labels; the `Display` text is for humans and may change.
#[derive(Debug, thiserror::Error)]
pub enum AudioError {
    #[error("input is empty (0 bytes)")]
    Empty,

    #[error("input is {bytes} bytes, over the limit of {max_bytes} bytes (raise max_input_bytes to accept it)")]
    TooLarge { bytes: u64, max_bytes: u64 },

    #[error("not a recognised audio container ({detail}); give WAV, FLAC, MP3, M4A/AAC, Ogg (Opus, Vorbis), WebM/MKV, CAF or AIFF")]
    UnsupportedFormat { detail: String },

    #[error("the container holds no audio track")]
    NoAudioTrack,

    #[error("unsupported audio codec ({codec}): {detail}")]
    UnsupportedCodec { codec: String, detail: String },

    #[error("the stream ends early: {detail}")]
    Truncated { detail: String },

    #[error("the stream is corrupt: {detail}")]
    Corrupt { detail: String },

    #[error("audio lasts {duration_ms} ms, under the minimum of {min_duration_ms} ms")]
    TooShort {
        duration_ms: u64,
        min_duration_ms: u64,
    },

    #[error("audio lasts at least {duration_s:.1} s, over the limit of {max_duration_s} s (raise max_audio_duration_s, or split the recording)")]
    TooLong {
        duration_s: f64,
        max_duration_s: u64,
    },

    #[error("audio has {channels} channels, over the limit of {max_channels}")]
    TooManyChannels {
        channels: usize,
        max_channels: usize,
    },

    #[error("sample rate {sample_rate_hz} Hz is outside the accepted {min_hz}..={max_hz} Hz")]
    UnsupportedSampleRate {
        sample_rate_hz: u32,
        min_hz: u32,
        max_hz: u32,
    },

    #[error("decoding took longer than {timeout_s} s")]
    DecodeTimeout { timeout_s: u64 },

    /// A decoder panicked on this input; caught so one file cannot take the process down.
    #[error("the decoder crashed on this input: {detail}")]
    DecoderPanicked { detail: String },

    /// Reading the source failed (a local file, not the bytes' content): may succeed on retry.
    #[error("reading the audio source failed: {0}")]
    Io(#[from] std::io::Error),

    /// A resampler could not be built or run for parameters we already accepted (a bug).
    #[error("internal resampling error: {detail}")]
    Internal { detail: String },
}

impl AudioError {
    /// Stable reason code for failure records and metric labels. Never rename a code once shipped.
    pub fn reason_code(&self) -> &'static str {
        match self {
            AudioError::Empty => "empty",
            AudioError::TooLarge { .. } => "too_large",
            AudioError::UnsupportedFormat { .. } => "unsupported_format",
            AudioError::NoAudioTrack => "no_audio_track",
            AudioError::UnsupportedCodec { .. } => "unsupported_codec",
            AudioError::Truncated { .. } => "truncated",
            AudioError::Corrupt { .. } => "corrupt",
            AudioError::TooShort { .. } => "too_short",
            AudioError::TooLong { .. } => "too_long",
            AudioError::TooManyChannels { .. } => "too_many_channels",
            AudioError::UnsupportedSampleRate { .. } => "unsupported_sample_rate",
            AudioError::DecodeTimeout { .. } => "decode_timeout",
            AudioError::DecoderPanicked { .. } => "decoder_panic",
            AudioError::Io(_) => "io",
            AudioError::Internal { .. } => "internal",
        }
    }

    /// True when retrying the same input cannot help: the failure follows from the bytes and the
    /// limits alone, so the job should end in a failure record instead of a retry.
    ///
    /// Only source I/O errors are transient. A decoder panic or timeout is deterministic for
    /// the same bytes, so it is permanent too (retrying would only repeat it).
    pub fn is_permanent(&self) -> bool {
        !matches!(self, AudioError::Io(_))
    }
}
