//! Untrusted audio bytes to 16 kHz mono f32 PCM, and long recordings cut into segments.
//!
//! Decoding: symphonia (WAV, FLAC, MP3, AAC in M4A/ADTS, Vorbis, OGG, MKV/WebM, CAF, AIFF, ADPCM,
//! ALAC) plus Opus through libopus, and MPEG audio or 19+ channels of PCM inside WAVE, which
//! symphonia's WAV reader refuses; channels are averaged to mono and resampled with libsoxr
//! (Opus is decoded by libopus straight to 16 kHz mono). Every failure is one [`AudioError`] with a stable
//! [`reason_code`](AudioError::reason_code); malformed input never panics or hangs the caller
//! (limits are checked before allocation, the frame budget and a wall-clock budget bound the
//! decode loop, and decoder panics are caught).

mod decode;
mod error;
mod limits;
mod resample;
mod segment;
mod wave;

pub use decode::{check_input_size, decode, decode_file, DecodedAudio};
pub use error::AudioError;
pub use limits::AudioLimits;
pub use resample::TARGET_SAMPLE_RATE_HZ;
pub use segment::{segments, Segment, SegmenterConfig, Segments};
