//! Length-prefixed frames: `u32` big-endian body length, then the postcard body.

use std::io::{ErrorKind, Read, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::ProtocolError;

/// Largest body accepted or sent: 3 GiB, almost 14 hours of 16 kHz f32 PCM, so a whole
/// recording at the dispatcher's 12-hour limit fits one request (a diarization request carries
/// the whole recording; a transcription request one segment, 24 minutes by default); it still
/// bounds what a lying length can make a reader allocate.
pub const MAX_FRAME_BYTES: u32 = 3 << 30;

/// Most samples one request's audio may hold (what [`MAX_FRAME_BYTES`] leaves after the
/// request's other fields, generously).
pub const MAX_REQUEST_SAMPLES: usize = (MAX_FRAME_BYTES as usize - (1 << 20)) / 4;
// A 12-hour recording (the dispatcher's default limit) fits one diarization request.
const _: () = assert!(MAX_REQUEST_SAMPLES >= 12 * 3600 * 16_000);

/// Largest buffer a connection keeps between frames: every request of the 5-60 s clips and of
/// segments up to 8 minutes then reuses memory already mapped, instead of faulting in (and the
/// kernel zeroing) a fresh megabytes-long buffer per request; a larger frame gets its own, which
/// is freed after it.
pub const KEPT_BUFFER_BYTES: usize = 32 << 20;

/// The frame (length prefix + body) of one message.
pub fn encode_frame<T: Serialize>(message: &T) -> Result<Vec<u8>, ProtocolError> {
    let mut frame = Vec::new();
    encode_frame_into(message, &mut frame)?;
    Ok(frame)
}

/// [`encode_frame`] into `frame` (cleared first), reusing its memory.
pub fn encode_frame_into<T: Serialize>(
    message: &T,
    frame: &mut Vec<u8>,
) -> Result<(), ProtocolError> {
    // Body written after a placeholder prefix, so the frame is built in one buffer, sized
    // first (a counting pass) so that a clip's megabytes are not regrown and copied.
    let size = postcard::experimental::serialized_size(message).map_err(ProtocolError::Encode)?;
    let mut buffer = std::mem::take(frame);
    buffer.clear();
    buffer.reserve(4 + size);
    buffer.extend_from_slice(&[0u8; 4]);
    let mut out = postcard::to_extend(message, buffer).map_err(ProtocolError::Encode)?;
    let len = out.len() - 4;
    let len_u32 = u32::try_from(len)
        .ok()
        .filter(|&l| l <= MAX_FRAME_BYTES)
        .ok_or(ProtocolError::FrameTooLarge {
            len: len as u64,
            max: MAX_FRAME_BYTES,
        })?;
    out[..4].copy_from_slice(&len_u32.to_be_bytes());
    *frame = out;
    Ok(())
}

/// Frees `buffer` if it grew beyond [`KEPT_BUFFER_BYTES`].
fn keep_or_free(buffer: &mut Vec<u8>) {
    if buffer.capacity() > KEPT_BUFFER_BYTES {
        *buffer = Vec::new();
    }
}

/// Decodes one frame body; trailing bytes are an error (a body is exactly one message).
pub fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ProtocolError> {
    let decode_err = |source| ProtocolError::Decode {
        len: body.len(),
        source,
    };
    let (message, rest) = postcard::take_from_bytes(body).map_err(decode_err)?;
    if !rest.is_empty() {
        return Err(decode_err(postcard::Error::DeserializeBadEncoding));
    }
    Ok(message)
}

fn checked_len(prefix: [u8; 4]) -> Result<usize, ProtocolError> {
    let len = u32::from_be_bytes(prefix);
    if len > MAX_FRAME_BYTES {
        return Err(ProtocolError::FrameTooLarge {
            len: u64::from(len),
            max: MAX_FRAME_BYTES,
        });
    }
    Ok(len as usize)
}

fn eof_as_closed(e: std::io::Error) -> ProtocolError {
    if e.kind() == ErrorKind::UnexpectedEof {
        ProtocolError::Closed
    } else {
        ProtocolError::Io(e)
    }
}

/// Reads one message; [`ProtocolError::Closed`] on a clean end of stream.
pub fn read_frame<T: DeserializeOwned>(reader: &mut impl Read) -> Result<T, ProtocolError> {
    let mut prefix = [0u8; 4];
    reader.read_exact(&mut prefix).map_err(eof_as_closed)?;
    let mut body = vec![0u8; checked_len(prefix)?];
    reader.read_exact(&mut body).map_err(eof_as_closed)?;
    decode_body(&body)
}

pub fn write_frame<T: Serialize>(
    writer: &mut impl Write,
    message: &T,
) -> Result<(), ProtocolError> {
    write_frame_reusing(writer, message, &mut Vec::new())
}

/// [`write_frame`] through `buffer`, kept for the connection's next frame (a writer that sends
/// clip after clip).
pub fn write_frame_reusing<T: Serialize>(
    writer: &mut impl Write,
    message: &T,
    buffer: &mut Vec<u8>,
) -> Result<(), ProtocolError> {
    encode_frame_into(message, buffer)?;
    let written = writer.write_all(buffer).and_then(|()| writer.flush());
    keep_or_free(buffer);
    Ok(written?)
}

#[cfg(feature = "tokio")]
pub async fn read_frame_async<T: DeserializeOwned>(
    reader: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Result<T, ProtocolError> {
    read_frame_async_reusing(reader, &mut Vec::new()).await
}

/// [`read_frame_async`] into `body`, kept for the connection's next frame (a reader that
/// receives clip after clip).
#[cfg(feature = "tokio")]
pub async fn read_frame_async_reusing<T: DeserializeOwned>(
    reader: &mut (impl tokio::io::AsyncRead + Unpin),
    body: &mut Vec<u8>,
) -> Result<T, ProtocolError> {
    use tokio::io::AsyncReadExt;
    let mut prefix = [0u8; 4];
    reader
        .read_exact(&mut prefix)
        .await
        .map_err(eof_as_closed)?;
    body.clear();
    body.resize(checked_len(prefix)?, 0);
    let read = reader.read_exact(body).await.map_err(eof_as_closed);
    let message = read.and_then(|_| decode_body(body));
    keep_or_free(body);
    message
}

#[cfg(feature = "tokio")]
pub async fn write_frame_async<T: Serialize>(
    writer: &mut (impl tokio::io::AsyncWrite + Unpin),
    message: &T,
) -> Result<(), ProtocolError> {
    use tokio::io::AsyncWriteExt;
    writer.write_all(&encode_frame(message)?).await?;
    writer.flush().await?;
    Ok(())
}
