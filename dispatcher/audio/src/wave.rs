//! The RIFF/WAVE files symphonia's WAV reader refuses, found by a small chunk walk before the
//! probe: MPEG audio inside WAVE (format tags 0x0055 MP3 and 0x0050 MP1/MP2, written by phones
//! and dictation systems), and PCM with more channels than WAVE has speaker positions (18:
//! symphonia-format-riff 0.6.1 refuses more in an EXTENSIBLE header, more than 26 in a plain
//! one, and panics on an EXTENSIBLE header of 32+ channels without a channel mask, as sox
//! writes them).
//!
//! No size is trusted: every read is checked against the input length, odd chunks are padded,
//! and a `data` size of 0xFFFFFFFF (streaming writers) or past the end means "to the end".

use std::io::{Read, Seek, SeekFrom, Take};
use std::ops::Range;

use symphonia::core::audio::Channels;
use symphonia::core::codecs::audio::well_known::{
    CODEC_ID_PCM_F32LE, CODEC_ID_PCM_F64LE, CODEC_ID_PCM_S16LE, CODEC_ID_PCM_S24LE,
    CODEC_ID_PCM_S32LE, CODEC_ID_PCM_U8,
};
use symphonia::core::codecs::audio::{AudioCodecId, AudioCodecParameters};
use symphonia::core::io::MediaSource;
use symphonia::core::packet::Packet;
use symphonia::core::units::{Duration, Timestamp};

use crate::error::AudioError;

const WAVE_FORMAT_PCM: u16 = 0x0001;
const WAVE_FORMAT_IEEE_FLOAT: u16 = 0x0003;
const WAVE_FORMAT_MPEG: u16 = 0x0050;
const WAVE_FORMAT_MPEGLAYER3: u16 = 0x0055;
const WAVE_FORMAT_EXTENSIBLE: u16 = 0xFFFE;
/// Bytes 2..16 of every `KSDATAFORMAT_SUBTYPE_*` GUID derived from a format tag.
const SUBTYPE_GUID_TAIL: [u8; 14] = [
    0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80, 0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71,
];
/// symphonia maps WAVE channels to speaker positions; past these it refuses or panics.
const SYMPHONIA_MAX_POSITIONED: u16 = 18;
/// Raw PCM is cut into packets of about this many bytes.
const PCM_PACKET_BYTES: usize = 64 * 1024;

/// What this crate decodes itself instead of leaving the file to symphonia's WAV reader.
#[derive(Debug, PartialEq)]
pub(crate) enum WaveCodec {
    /// The `data` chunk is an MPEG audio stream (rate and channels come from its frames).
    Mpeg,
    /// Interleaved little-endian PCM in discrete channels.
    Pcm(PcmFormat),
}

#[derive(Debug, PartialEq)]
pub(crate) struct PcmFormat {
    codec: AudioCodecId,
    bits: u16,
    channels: u16,
    sample_rate_hz: u32,
}

#[derive(Debug, PartialEq)]
pub(crate) struct WaveHeader {
    pub(crate) codec: WaveCodec,
    /// The `data` chunk's bytes present in the input.
    pub(crate) data: Range<u64>,
    /// The `data` chunk's declared size; `None` for the streaming 0xFFFFFFFF.
    pub(crate) declared_data_len: Option<u64>,
}

impl WaveHeader {
    /// The `data` chunk declares more bytes than the input holds: the file was cut.
    pub(crate) fn is_cut(&self) -> bool {
        self.declared_data_len
            .is_some_and(|declared| declared > self.data.end - self.data.start)
    }
}

/// Walks the chunks of a RIFF/WAVE input of `len` bytes. `Ok(None)`: not RIFF/WAVE, or a WAVE
/// that symphonia decodes (or refuses) itself; what follows its `fmt ` chunk is then not read.
pub(crate) fn read_header<R: Read + Seek>(
    src: &mut R,
    len: u64,
) -> Result<Option<WaveHeader>, AudioError> {
    if len < 12 {
        return Ok(None);
    }
    let mut riff = [0u8; 12];
    read_at(src, 0, &mut riff)?;
    if &riff[..4] != b"RIFF" || &riff[8..] != b"WAVE" {
        return Ok(None);
    }
    let mut codec = None;
    let mut pos = 12u64;
    loop {
        if len - pos < 8 {
            let next = if codec.is_none() { "fmt" } else { "data" };
            return Err(AudioError::Truncated {
                detail: format!("WAVE ends before its {next} chunk"),
            });
        }
        let mut chunk = [0u8; 8];
        read_at(src, pos, &mut chunk)?;
        let size = u64::from(u32::from_le_bytes([chunk[4], chunk[5], chunk[6], chunk[7]]));
        let body = pos + 8;
        match &chunk[..4] {
            b"fmt " if codec.is_none() => match read_fmt(src, body, size, len)? {
                Some(found) => codec = Some(found),
                None => return Ok(None),
            },
            b"data" => {
                let Some(codec) = codec else {
                    return Err(AudioError::Corrupt {
                        detail: "WAVE data chunk before its fmt chunk".to_owned(),
                    });
                };
                let declared_data_len = (size != u64::from(u32::MAX)).then_some(size);
                let end = declared_data_len.map_or(len, |size| (body + size).min(len));
                return Ok(Some(WaveHeader {
                    codec,
                    data: body..end,
                    declared_data_len,
                }));
            }
            _ => {}
        }
        // body <= len and size < 2^32: no overflow; a size past the end ends the walk.
        pos = (body + size + (size & 1)).min(len);
    }
}

fn read_at<R: Read + Seek>(src: &mut R, pos: u64, buf: &mut [u8]) -> std::io::Result<()> {
    src.seek(SeekFrom::Start(pos))?;
    src.read_exact(buf)
}

/// The `fmt ` chunk of `size` bytes at `body`: what to decode ourselves, or `None`.
fn read_fmt<R: Read + Seek>(
    src: &mut R,
    body: u64,
    size: u64,
    len: u64,
) -> Result<Option<WaveCodec>, AudioError> {
    if size < 16 {
        return Err(AudioError::Corrupt {
            detail: format!("WAVE fmt chunk of {size} bytes (at least 16)"),
        });
    }
    let mut fmt = [0u8; 40];
    let wanted = size.min(40);
    if len - body < wanted {
        return Err(AudioError::Truncated {
            detail: "WAVE ends inside its fmt chunk".to_owned(),
        });
    }
    let fmt = &mut fmt[..wanted as usize];
    read_at(src, body, fmt)?;
    let u16_at = |at: usize| u16::from_le_bytes([fmt[at], fmt[at + 1]]);
    let (mut tag, channels, bits) = (u16_at(0), u16_at(2), u16_at(14));
    let sample_rate_hz = u32::from_le_bytes([fmt[4], fmt[5], fmt[6], fmt[7]]);
    // EXTENSIBLE: the real format tag opens the sub-format GUID.
    if tag == WAVE_FORMAT_EXTENSIBLE && fmt.len() == 40 && fmt[26..] == SUBTYPE_GUID_TAIL {
        tag = u16_at(24);
    }
    let codec = match (tag, bits) {
        (WAVE_FORMAT_MPEG | WAVE_FORMAT_MPEGLAYER3, _) => return Ok(Some(WaveCodec::Mpeg)),
        _ if channels <= SYMPHONIA_MAX_POSITIONED => return Ok(None),
        (WAVE_FORMAT_PCM, 8) => CODEC_ID_PCM_U8,
        (WAVE_FORMAT_PCM, 16) => CODEC_ID_PCM_S16LE,
        (WAVE_FORMAT_PCM, 24) => CODEC_ID_PCM_S24LE,
        (WAVE_FORMAT_PCM, 32) => CODEC_ID_PCM_S32LE,
        (WAVE_FORMAT_IEEE_FLOAT, 32) => CODEC_ID_PCM_F32LE,
        (WAVE_FORMAT_IEEE_FLOAT, 64) => CODEC_ID_PCM_F64LE,
        _ => return Ok(None),
    };
    Ok(Some(WaveCodec::Pcm(PcmFormat {
        codec,
        bits,
        channels,
        sample_rate_hz,
    })))
}

/// The `data` chunk's bytes, read from their start.
pub(crate) fn data_reader<'s>(
    mut src: Box<dyn MediaSource + 's>,
    data: &Range<u64>,
) -> std::io::Result<Take<Box<dyn MediaSource + 's>>> {
    src.seek(SeekFrom::Start(data.start))?;
    Ok(src.take(data.end - data.start))
}

/// Packets of whole frames from a PCM `data` chunk, for symphonia's PCM decoder.
pub(crate) struct PcmPackets<'s> {
    data: Take<Box<dyn MediaSource + 's>>,
    frame_bytes: usize,
    packet_bytes: u64,
    next_ts: i64,
}

impl<'s> PcmPackets<'s> {
    /// The decoder's parameters, the frames the header declares, and the packet source.
    pub(crate) fn open(
        src: Box<dyn MediaSource + 's>,
        format: &PcmFormat,
        header: &WaveHeader,
    ) -> std::io::Result<(AudioCodecParameters, Option<u64>, Self)> {
        let &PcmFormat {
            codec,
            bits,
            channels,
            sample_rate_hz,
        } = format;
        let frame_bytes = usize::from(channels) * usize::from(bits / 8);
        let frames_per_packet = (PCM_PACKET_BYTES / frame_bytes).max(1);
        let mut params = AudioCodecParameters::new();
        params
            .for_codec(codec)
            .with_sample_rate(sample_rate_hz)
            .with_channels(Channels::Discrete(channels))
            .with_bits_per_sample(u32::from(bits))
            .with_bits_per_coded_sample(u32::from(bits))
            .with_max_frames_per_packet(frames_per_packet as u64);
        let declared_frames = header
            .declared_data_len
            .map(|bytes| bytes / frame_bytes as u64);
        let packets = Self {
            data: data_reader(src, &header.data)?,
            frame_bytes,
            packet_bytes: (frames_per_packet * frame_bytes) as u64,
            next_ts: 0,
        };
        Ok((params, declared_frames, packets))
    }

    /// The next packet; `None` at the end of the chunk (a trailing partial frame is dropped).
    pub(crate) fn next_packet(&mut self) -> std::io::Result<Option<Packet>> {
        let mut buf = Vec::new();
        (&mut self.data)
            .take(self.packet_bytes)
            .read_to_end(&mut buf)?;
        let frames = buf.len() / self.frame_bytes;
        if frames == 0 {
            return Ok(None);
        }
        buf.truncate(frames * self.frame_bytes);
        let packet = Packet::new(
            0,
            Timestamp::new(self.next_ts),
            Duration::from(frames as u64),
            buf,
        );
        self.next_ts += frames as i64;
        Ok(Some(packet))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    /// A RIFF/WAVE of these chunks; `riff_size` as written (the walk ignores it).
    fn wave(chunks: &[(&[u8; 4], u32, &[u8])]) -> Vec<u8> {
        let mut out = b"RIFF\xff\xff\xff\xffWAVE".to_vec();
        for (id, size, body) in chunks {
            out.extend_from_slice(*id);
            out.extend_from_slice(&size.to_le_bytes());
            out.extend_from_slice(body);
        }
        out
    }

    fn fmt(tag: u16, channels: u16, rate: u32, bits: u16) -> Vec<u8> {
        let block_align = channels * bits.max(8) / 8;
        let mut fmt = Vec::new();
        fmt.extend_from_slice(&tag.to_le_bytes());
        fmt.extend_from_slice(&channels.to_le_bytes());
        fmt.extend_from_slice(&rate.to_le_bytes());
        fmt.extend_from_slice(&(rate * u32::from(block_align)).to_le_bytes());
        fmt.extend_from_slice(&block_align.to_le_bytes());
        fmt.extend_from_slice(&bits.to_le_bytes());
        fmt
    }

    fn walk(bytes: &[u8]) -> Result<Option<WaveHeader>, AudioError> {
        read_header(&mut Cursor::new(bytes), bytes.len() as u64)
    }

    fn code(bytes: &[u8]) -> &'static str {
        walk(bytes).expect_err("malformed").reason_code()
    }

    #[test]
    fn mp3_in_wave_is_found_past_other_chunks_and_padding() {
        let mp3 = fmt(WAVE_FORMAT_MPEGLAYER3, 1, 44_100, 0);
        // An odd-sized chunk is followed by one pad byte.
        let bytes = wave(&[
            (b"fmt ", 16, &mp3),
            (b"LIST", 3, b"abc\0"),
            (b"data", 4, b"\xff\xfb\x90\x00"),
        ]);
        let header = walk(&bytes).expect("walks").expect("MPEG");
        assert_eq!(header.codec, WaveCodec::Mpeg);
        assert_eq!(header.data, bytes.len() as u64 - 4..bytes.len() as u64);
        assert_eq!(header.declared_data_len, Some(4));
    }

    #[test]
    fn data_sizes_past_the_end_or_unknown_mean_to_the_end() {
        let mp2 = fmt(WAVE_FORMAT_MPEG, 1, 44_100, 0);
        for size in [u32::MAX, u32::MAX - 1, 5] {
            let bytes = wave(&[(b"fmt ", 16, &mp2), (b"data", size, b"\xff\xfd")]);
            let header = walk(&bytes).expect("walks").expect("MPEG");
            assert_eq!(header.data.end, bytes.len() as u64, "size {size:#x}");
            assert_eq!(header.declared_data_len.is_none(), size == u32::MAX);
            assert_eq!(header.is_cut(), size != u32::MAX, "size {size:#x}");
        }
    }

    #[test]
    fn other_formats_and_few_channels_are_left_to_symphonia() {
        let pcm = wave(&[(b"fmt ", 16, &fmt(WAVE_FORMAT_PCM, 8, 16_000, 16))]);
        assert_eq!(walk(&pcm).expect("walks"), None, "8-channel PCM");
        let gsm = wave(&[(b"fmt ", 16, &fmt(0x0031, 1, 8_000, 0))]);
        assert_eq!(walk(&gsm).expect("walks"), None, "GSM");
        assert_eq!(walk(b"fLaC\0\0\0\x22").expect("walks"), None);
        assert_eq!(walk(b"RIFF").expect("walks"), None, "too short to be WAVE");
    }

    #[test]
    fn many_channels_of_pcm_or_float_are_decoded_here() {
        let float = fmt(WAVE_FORMAT_IEEE_FLOAT, 32, 8_000, 32);
        let bytes = wave(&[(b"fmt ", 16, &float), (b"data", 256, &[0; 256])]);
        let header = walk(&bytes).expect("walks").expect("32-channel float");
        assert_eq!(
            header.codec,
            WaveCodec::Pcm(PcmFormat {
                codec: CODEC_ID_PCM_F32LE,
                bits: 32,
                channels: 32,
                sample_rate_hz: 8_000
            })
        );
        // EXTENSIBLE, as sox writes it: the PCM sub-format GUID, no channel mask.
        let mut ext = fmt(WAVE_FORMAT_EXTENSIBLE, 32, 8_000, 16);
        ext.extend_from_slice(&22u16.to_le_bytes());
        ext.extend_from_slice(&16u16.to_le_bytes());
        ext.extend_from_slice(&0u32.to_le_bytes());
        ext.extend_from_slice(&WAVE_FORMAT_PCM.to_le_bytes());
        ext.extend_from_slice(&SUBTYPE_GUID_TAIL);
        let bytes = wave(&[(b"fmt ", 40, &ext), (b"data", 128, &[0; 128])]);
        let header = walk(&bytes).expect("walks").expect("32-channel PCM");
        assert!(matches!(
            header.codec,
            WaveCodec::Pcm(PcmFormat {
                codec: CODEC_ID_PCM_S16LE,
                ..
            })
        ));
    }

    #[test]
    fn malformed_headers_are_typed_errors() {
        let mp3 = fmt(WAVE_FORMAT_MPEGLAYER3, 1, 44_100, 0);
        // fmt chunk cut short, or declaring fewer than 16 bytes.
        assert_eq!(code(&wave(&[(b"fmt ", 16, &mp3[..10])])), "truncated");
        assert_eq!(code(&wave(&[(b"fmt ", 12, &mp3[..12])])), "corrupt");
        // A chunk before fmt whose size runs past the end (and one of 4 GiB).
        for size in [100, u32::MAX] {
            let bytes = wave(&[(b"LIST", size, b"abcd"), (b"fmt ", 16, &mp3)]);
            assert_eq!(code(&bytes), "truncated", "size {size:#x}");
        }
        // No data chunk after an MPEG fmt, or a data chunk before any fmt.
        assert_eq!(code(&wave(&[(b"fmt ", 16, &mp3)])), "truncated");
        let bytes = wave(&[(b"fmt ", 16, &mp3), (b"LIST", 4, b"abcd")]);
        assert_eq!(code(&bytes), "truncated");
        assert_eq!(code(&wave(&[(b"data", 2, b"ab")])), "corrupt");
        // Only the 12-byte RIFF header.
        assert_eq!(code(&wave(&[])), "truncated");
    }

    #[test]
    fn pcm_packets_hold_whole_frames_and_declare_the_chunk_length() {
        let float = fmt(WAVE_FORMAT_IEEE_FLOAT, 32, 8_000, 32);
        // Declares 4 frames of 128 bytes; 2.5 are present.
        let bytes = wave(&[(b"fmt ", 16, &float), (b"data", 512, &[0; 320])]);
        let header = walk(&bytes).expect("walks").expect("PCM");
        let WaveCodec::Pcm(format) = &header.codec else {
            panic!("expected PCM, got {:?}", header.codec);
        };
        let (params, declared, mut packets) =
            PcmPackets::open(Box::new(Cursor::new(bytes)), format, &header).expect("opens");
        assert_eq!(params.channels.map(|c| c.count()), Some(32));
        assert_eq!(declared, Some(4));
        let packet = packets.next_packet().expect("reads").expect("a packet");
        assert_eq!(packet.data.len(), 256);
        assert!(packets.next_packet().expect("reads").is_none());
    }
}
