//! Untrusted bytes → 16 kHz mono f32: probe, check limits, decode packet by packet, downmix,
//! resample. Any panic inside the decoders is caught and becomes a typed error.

use std::io::{Cursor, Seek, SeekFrom};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;
use std::time::Instant;

use symphonia::core::audio::{Audio, Channels, GenericAudioBufferRef, Position};
use symphonia::core::codecs::audio::well_known::CODEC_ID_OPUS;
use symphonia::core::codecs::audio::{AudioCodecParameters, AudioDecoderOptions};
use symphonia::core::codecs::registry::CodecRegistry;
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, FormatReader, TrackType};
use symphonia::core::io::{MediaSource, MediaSourceStream, ReadOnlySource};
use symphonia::core::meta::MetadataOptions;
use symphonia::core::packet::Packet;
use symphonia::core::units::Duration;
use symphonia::default::formats::MpaReader;

use crate::error::AudioError;
use crate::limits::AudioLimits;
use crate::resample::{MonoResampler, TARGET_SAMPLE_RATE_HZ};
use crate::wave::{self, WaveCodec};

/// A decoded recording, ready for the model.
#[derive(Clone, Debug)]
pub struct DecodedAudio {
    /// 16 kHz mono samples, nominally in [-1, 1] (float sources may exceed it; never NaN/inf).
    pub pcm_16k: Vec<f32>,
    pub source_sample_rate_hz: u32,
    pub source_channels: usize,
    /// `pcm_16k.len() / 16000`.
    pub duration_s: f64,
    /// Largest absolute sample: 0.0 means digital silence (which decodes fine, to empty text).
    pub peak_abs: f32,
    /// Seconds of this decode spent downmixing and resampling (the rest is demuxing and the
    /// codec): where the host's time goes, for the pipeline's stage metrics.
    pub resample_s: f64,
}

/// Output growth step: at least one minute of 16 kHz audio, so capacity stays within about
/// 1.25x of what was decoded instead of doubling past the duration budget.
const MIN_GROWTH_FRAMES: usize = 60 * TARGET_SAMPLE_RATE_HZ as usize;

/// Rejects an input by size alone; call it with the object size before downloading.
pub fn check_input_size(bytes: u64, limits: &AudioLimits) -> Result<(), AudioError> {
    if bytes == 0 {
        return Err(AudioError::Empty);
    }
    if bytes > limits.max_input_bytes {
        return Err(AudioError::TooLarge {
            bytes,
            max_bytes: limits.max_input_bytes,
        });
    }
    Ok(())
}

/// Decodes a whole recording held in memory. `hint_ext` (e.g. `"mp3"`, from the object key) only
/// orders the probe; the content decides, so a wrongly named file still decodes.
pub fn decode(
    bytes: &[u8],
    hint_ext: Option<&str>,
    limits: &AudioLimits,
) -> Result<DecodedAudio, AudioError> {
    check_input_size(bytes.len() as u64, limits)?;
    guarded(|| {
        decode_source(
            Box::new(Cursor::new(bytes)),
            Origin::Memory,
            hint_ext,
            limits,
        )
    })
}

/// Decodes from a file without holding its compressed bytes in memory.
pub fn decode_file(
    file: std::fs::File,
    hint_ext: Option<&str>,
    limits: &AudioLimits,
) -> Result<DecodedAudio, AudioError> {
    check_input_size(file.metadata()?.len(), limits)?;
    guarded(|| decode_source(Box::new(file), Origin::File, hint_ext, limits))
}

/// Last line of defence: symphonia has panicked on malformed files before. The decoder state
/// is dropped with the closure, so nothing half-updated survives the panic.
fn guarded(
    run: impl FnOnce() -> Result<DecodedAudio, AudioError>,
) -> Result<DecodedAudio, AudioError> {
    catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|payload| {
        let detail = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "non-string panic payload".to_owned());
        tracing::error!(%detail, "audio decoder panicked; input rejected");
        Err(AudioError::DecoderPanicked { detail })
    })
}

/// Symphonia's decoders plus libopus (symphonia 0.6 has no Opus decoder of its own).
fn codecs() -> &'static CodecRegistry {
    static REGISTRY: OnceLock<CodecRegistry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut registry = CodecRegistry::new();
        symphonia::default::register_enabled_codecs(&mut registry);
        registry.register_audio_decoder::<symphonia_adapter_libopus::OpusDecoder>();
        registry
    })
}

/// Where the bytes come from decides what a read error means.
#[derive(Clone, Copy, PartialEq)]
enum Origin {
    /// Reads cannot fail; an I/O error is the demuxer running off malformed content.
    Memory,
    /// A read error other than end-of-file is the disk's fault and may pass on retry.
    File,
}

fn decode_source(
    source: Box<dyn MediaSource + '_>,
    origin: Origin,
    hint_ext: Option<&str>,
    limits: &AudioLimits,
) -> Result<DecodedAudio, AudioError> {
    let started = Instant::now();
    let Demuxed {
        mut packets,
        track_id,
        params,
        declared_frames,
    } = demux(source, origin, hint_ext)?;
    check_declared(&params, declared_frames, limits)?;
    let output = DecoderOutput::for_stream(&params);
    let mut decoder = codecs()
        .make_audio_decoder(&output.params, &AudioDecoderOptions::default())
        .map_err(|e| AudioError::UnsupportedCodec {
            codec: params.codec.to_string(),
            detail: e.to_string(),
        })?;

    let mut state = DecodeState::new(limits);
    let mut ended_early = false;
    // Bounded twice over: the wall-clock check and the frame budget below. Demuxers consume
    // bytes on every call, so the byte length bounds the iterations as well.
    loop {
        if started.elapsed().as_secs() >= limits.decode_timeout_s {
            return Err(AudioError::DecodeTimeout {
                timeout_s: limits.decode_timeout_s,
            });
        }
        let mut packet = match packets.next_packet() {
            Ok(Some(packet)) => packet,
            Ok(None) => break,
            Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                ended_early = true;
                break;
            }
            Err(SymError::IoError(e)) if origin == Origin::File => return Err(AudioError::Io(e)),
            // Some demuxers resync after garbage (MP3); others repeat the error, which the
            // corrupt-packet budget ends quickly.
            Err(SymError::DecodeError(msg)) => {
                state.note_corrupt(msg)?;
                continue;
            }
            Err(e) => return Err(stream_error(e)),
        };
        if packet.track_id != track_id {
            continue;
        }
        output.rescale_trims(&mut packet);
        match decoder.decode(&packet) {
            Ok(buffer) => {
                let spec = buffer.spec();
                let (rate, channels) = (spec.rate(), spec.channels().count());
                if buffer.frames() == 0 {
                    continue;
                }
                state.begin_or_check(rate, channels)?;
                state.push(&buffer)?;
            }
            Err(SymError::DecodeError(msg)) => state.note_corrupt(msg)?,
            Err(SymError::Unsupported(feature)) => {
                return Err(AudioError::UnsupportedCodec {
                    codec: params.codec.to_string(),
                    detail: format!("unsupported feature: {feature}"),
                })
            }
            Err(e) => return Err(stream_error(e)),
        }
    }
    let mut audio = state.finish(declared_frames.map(|f| output.frames(f)), ended_early)?;
    output.report_source(&params, &mut audio);
    Ok(audio)
}

/// What the decoder is asked to output, when that differs from the stream the container
/// declares. Opus: libopus decodes straight to 16 kHz mono (Opus defines decoding at 8-48 kHz
/// and to fewer channels than coded), which skips its own upsampling to 48 kHz and our
/// resampling back down: 0.89 instead of 1.71 ms per audio second (a 10-minute recording, one
/// core of the developer machine). The Ogg demuxer still counts frames and trims at 48 kHz.
struct DecoderOutput {
    params: AudioCodecParameters,
    /// (container frames, decoded frames) per the same span of time; (1, 1) when unchanged.
    ratio: (u64, u64),
    /// Whether `params` differ from the container's (rate or channels).
    changed: bool,
}

impl DecoderOutput {
    fn for_stream(params: &AudioCodecParameters) -> Self {
        let unchanged = Self {
            params: params.clone(),
            ratio: (1, 1),
            changed: false,
        };
        let stereo_at_most = params.channels.as_ref().is_some_and(|c| c.count() <= 2);
        let (CODEC_ID_OPUS, Some(rate), true) = (params.codec, params.sample_rate, stereo_at_most)
        else {
            // Multistream Opus (3+ channels) is refused by the decoder as it is declared.
            return unchanged;
        };
        let mut decoded = params.clone();
        decoded
            .with_sample_rate(TARGET_SAMPLE_RATE_HZ)
            .with_channels(Channels::Positioned(Position::FRONT_LEFT));
        Self {
            params: decoded,
            ratio: (u64::from(rate), u64::from(TARGET_SAMPLE_RATE_HZ)),
            changed: true,
        }
    }

    /// Container frames as decoded frames.
    fn frames(&self, container_frames: u64) -> u64 {
        container_frames * self.ratio.1 / self.ratio.0
    }

    /// The demuxer's trims are in container frames; the decoder applies them to its output.
    fn rescale_trims(&self, packet: &mut Packet) {
        if self.ratio.0 != self.ratio.1 {
            packet.trim_start = Duration::new(self.frames(packet.trim_start.get()));
            packet.trim_end = Duration::new(self.frames(packet.trim_end.get()));
        }
    }

    /// Reports the recording as the container declares it, not as it was asked to decode.
    fn report_source(&self, params: &AudioCodecParameters, audio: &mut DecodedAudio) {
        if self.changed {
            audio.source_sample_rate_hz = params.sample_rate.unwrap_or(audio.source_sample_rate_hz);
            audio.source_channels = params
                .channels
                .as_ref()
                .map_or(audio.source_channels, Channels::count);
        }
    }
}

/// The one audio track to decode, and where its packets come from.
struct Demuxed<'s> {
    packets: Packets<'s>,
    track_id: u32,
    params: AudioCodecParameters,
    declared_frames: Option<u64>,
}

enum Packets<'s> {
    Container(Box<dyn FormatReader + 's>),
    /// WAVE PCM with more channels than symphonia's WAV reader maps.
    WavePcm(wave::PcmPackets<'s>),
}

impl Packets<'_> {
    fn next_packet(&mut self) -> symphonia::core::errors::Result<Option<Packet>> {
        match self {
            Packets::Container(format) => format.next_packet(),
            Packets::WavePcm(pcm) => Ok(pcm.next_packet()?),
        }
    }
}

/// Probes the content, except for the WAVE files symphonia refuses (`wave`): MPEG audio inside
/// WAVE is demuxed from the `data` chunk as an MPEG stream, many-channel PCM by `wave` itself.
fn demux<'s>(
    mut source: Box<dyn MediaSource + 's>,
    origin: Origin,
    hint_ext: Option<&str>,
) -> Result<Demuxed<'s>, AudioError> {
    let wave = match source.byte_len() {
        Some(len) => wave::read_header(&mut source, len)?,
        None => None,
    };
    let format = match wave {
        None => {
            source.seek(SeekFrom::Start(0))?;
            probe(source, hint_ext).map_err(|e| open_error(e, origin))?
        }
        Some(header) => match &header.codec {
            WaveCodec::Mpeg => {
                let cut = header.is_cut();
                if cut {
                    tracing::warn!(
                        declared = header.declared_data_len,
                        present = header.data.end - header.data.start,
                        "MPEG-in-WAVE data chunk is cut short; decoding the frames present"
                    );
                }
                let data = ReadOnlySource::new(wave::data_reader(source, &header.data)?);
                let stream = MediaSourceStream::new(Box::new(data), Default::default());
                // The reader searches the whole chunk for a first frame: finding none in a
                // complete chunk means it holds no MPEG audio, not that it ends early.
                let reader =
                    MpaReader::try_new(stream, FormatOptions::default()).map_err(|e| match e {
                        SymError::IoError(io)
                            if io.kind() == std::io::ErrorKind::UnexpectedEof && !cut =>
                        {
                            AudioError::Corrupt {
                                detail: "no MPEG audio frame in the WAVE data chunk".to_owned(),
                            }
                        }
                        other => open_error(other, origin),
                    })?;
                Box::new(reader)
            }
            WaveCodec::Pcm(format) => {
                let (params, declared_frames, packets) =
                    wave::PcmPackets::open(source, format, &header)?;
                return Ok(Demuxed {
                    packets: Packets::WavePcm(packets),
                    track_id: 0,
                    params,
                    declared_frames,
                });
            }
        },
    };
    let (track_id, params, declared_frames) = select_track(format.as_ref())?;
    Ok(Demuxed {
        packets: Packets::Container(format),
        track_id,
        params,
        declared_frames,
    })
}

fn probe<'s>(
    source: Box<dyn MediaSource + 's>,
    hint_ext: Option<&str>,
) -> symphonia::core::errors::Result<Box<dyn FormatReader + 's>> {
    let mut hint = Hint::new();
    if let Some(ext) = hint_ext {
        hint.with_extension(ext.trim_start_matches('.'));
    }
    let stream = MediaSourceStream::new(source, Default::default());
    symphonia::default::get_probe().probe(
        &hint,
        stream,
        FormatOptions::default(),
        MetadataOptions::default(),
    )
}

/// A read error from a file (other than its end) is the disk's; the rest is the content's.
fn open_error(e: SymError, origin: Origin) -> AudioError {
    match e {
        SymError::IoError(io)
            if origin == Origin::File && io.kind() != std::io::ErrorKind::UnexpectedEof =>
        {
            AudioError::Io(io)
        }
        other => probe_error(other),
    }
}

fn select_track(
    format: &dyn FormatReader,
) -> Result<(u32, AudioCodecParameters, Option<u64>), AudioError> {
    let track = format
        .default_track(TrackType::Audio)
        .filter(|t| t.codec_params.as_ref().and_then(|p| p.audio()).is_some())
        .or_else(|| {
            format
                .tracks()
                .iter()
                .find(|t| t.codec_params.as_ref().and_then(|p| p.audio()).is_some())
        })
        .ok_or(AudioError::NoAudioTrack)?;
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .cloned()
        .ok_or(AudioError::NoAudioTrack)?;
    Ok((track.id, params, track.num_frames))
}

/// Limits checkable from the container header alone, before any decoding or allocation.
fn check_declared(
    params: &AudioCodecParameters,
    declared_frames: Option<u64>,
    limits: &AudioLimits,
) -> Result<(), AudioError> {
    if let Some(channels) = &params.channels {
        check_channels(channels.count(), limits)?;
    }
    if let Some(rate) = params.sample_rate {
        check_rate(rate, limits)?;
        if let Some(frames) = declared_frames {
            // A header may lie; if it claims more than the limit we refuse without decoding
            // (a real file that long would be refused anyway).
            if frames > limits.max_source_frames(rate) {
                return Err(AudioError::TooLong {
                    duration_s: frames as f64 / f64::from(rate),
                    max_duration_s: limits.max_duration_s,
                });
            }
        }
    }
    Ok(())
}

fn check_channels(channels: usize, limits: &AudioLimits) -> Result<(), AudioError> {
    if channels > limits.max_channels {
        return Err(AudioError::TooManyChannels {
            channels,
            max_channels: limits.max_channels,
        });
    }
    if channels == 0 {
        return Err(AudioError::Corrupt {
            detail: "zero channels".to_owned(),
        });
    }
    Ok(())
}

fn check_rate(rate: u32, limits: &AudioLimits) -> Result<(), AudioError> {
    if !(limits.min_sample_rate_hz..=limits.max_sample_rate_hz).contains(&rate) {
        return Err(AudioError::UnsupportedSampleRate {
            sample_rate_hz: rate,
            min_hz: limits.min_sample_rate_hz,
            max_hz: limits.max_sample_rate_hz,
        });
    }
    Ok(())
}

fn probe_error(e: SymError) -> AudioError {
    match e {
        SymError::Unsupported(detail) => AudioError::UnsupportedFormat {
            detail: detail.to_owned(),
        },
        SymError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            AudioError::Truncated {
                detail: format!("ends inside the container header ({io})"),
            }
        }
        other => stream_error(other),
    }
}

/// Errors that end the decode. Read errors from a file were split off by the caller, so an
/// I/O error left here is the demuxer failing on the content: corrupt.
fn stream_error(e: SymError) -> AudioError {
    match e {
        SymError::Unsupported(detail) => AudioError::UnsupportedFormat {
            detail: detail.to_owned(),
        },
        SymError::ResetRequired => AudioError::UnsupportedFormat {
            detail: "stream parameters change mid-stream (chained streams)".to_owned(),
        },
        other => AudioError::Corrupt {
            detail: other.to_string(),
        },
    }
}

/// Everything that accumulates while packets decode.
struct DecodeState<'l> {
    limits: &'l AudioLimits,
    /// Set by the first decoded buffer: the decoder's output spec is authoritative (the header
    /// may be missing or wrong, e.g. HE-AAC doubles the rate).
    stream: Option<(u32, usize, MonoResampler)>,
    source_frames: u64,
    corrupt_packets: u32,
    /// A decoded buffer's channels as f32, for sample types other than f32.
    planes: Vec<Vec<f32>>,
    mono: Vec<f32>,
    pcm_16k: Vec<f32>,
    /// Time spent in downmix and resampling so far.
    resampling: std::time::Duration,
}

impl<'l> DecodeState<'l> {
    fn new(limits: &'l AudioLimits) -> Self {
        Self {
            limits,
            stream: None,
            source_frames: 0,
            corrupt_packets: 0,
            planes: Vec::new(),
            mono: Vec::new(),
            pcm_16k: Vec::new(),
            resampling: std::time::Duration::ZERO,
        }
    }

    fn note_corrupt(&mut self, msg: &str) -> Result<(), AudioError> {
        self.corrupt_packets += 1;
        tracing::debug!(msg, count = self.corrupt_packets, "skipping corrupt packet");
        if self.corrupt_packets > self.limits.max_corrupt_packets {
            return Err(AudioError::Corrupt {
                detail: format!(
                    "more than {} undecodable packets (last: {msg})",
                    self.limits.max_corrupt_packets
                ),
            });
        }
        Ok(())
    }

    fn begin_or_check(&mut self, rate: u32, channels: usize) -> Result<(), AudioError> {
        match &self.stream {
            None => {
                check_rate(rate, self.limits)?;
                check_channels(channels, self.limits)?;
                self.stream = Some((rate, channels, MonoResampler::new(rate)?));
                Ok(())
            }
            Some((r, c, _)) if (*r, *c) == (rate, channels) => Ok(()),
            Some((r, c, _)) => Err(AudioError::Corrupt {
                detail: format!(
                    "stream changes from {r} Hz x{c} to {rate} Hz x{channels} mid-stream"
                ),
            }),
        }
    }

    /// Downmixes one decoded buffer (mean of channels), then resamples it into `pcm_16k`.
    fn push(&mut self, buffer: &GenericAudioBufferRef<'_>) -> Result<(), AudioError> {
        let frames = buffer.frames();
        let Some((rate, _, resampler)) = self.stream.as_mut() else {
            return Ok(());
        };
        self.source_frames += frames as u64;
        // The running budget: holds however the header lied about the length.
        if self.source_frames > self.limits.max_source_frames(*rate) {
            return Err(AudioError::TooLong {
                duration_s: self.source_frames as f64 / f64::from(*rate),
                max_duration_s: self.limits.max_duration_s,
            });
        }
        let started = std::time::Instant::now();
        // f32 planes (most codecs' output) are read where they lie; other sample types are
        // converted once. Plane by plane, not frame by frame: the loops vectorize.
        let planes: Vec<&[f32]> = match buffer {
            GenericAudioBufferRef::F32(buf) => buf.iter_planes().collect(),
            other => {
                other.copy_to_vecs_planar(&mut self.planes);
                self.planes.iter().map(Vec::as_slice).collect()
            }
        };
        downmix(&planes, &mut self.mono);
        let grow_by = (self.mono.len() * TARGET_SAMPLE_RATE_HZ as usize) / *rate as usize + 2;
        if self.pcm_16k.capacity() - self.pcm_16k.len() < grow_by {
            self.pcm_16k
                .reserve_exact(grow_by.max(self.pcm_16k.len() / 4).max(MIN_GROWTH_FRAMES));
        }
        let pushed = resampler.push(&self.mono, &mut self.pcm_16k);
        self.resampling += started.elapsed();
        pushed
    }

    fn finish(
        mut self,
        declared_frames: Option<u64>,
        ended_early: bool,
    ) -> Result<DecodedAudio, AudioError> {
        let Some((rate, channels, resampler)) = self.stream.take() else {
            return Err(match (self.corrupt_packets, ended_early) {
                (1.., _) => AudioError::Corrupt {
                    detail: "no packet could be decoded".to_owned(),
                },
                (0, true) => AudioError::Truncated {
                    detail: "ends before the first audio packet".to_owned(),
                },
                (0, false) => AudioError::TooShort {
                    duration_ms: 0,
                    min_duration_ms: self.limits.min_duration_ms,
                },
            });
        };
        if let Some(declared) = declared_frames {
            // Tolerate 100 ms or 0.5 % of shortfall (decoder delay and padding handling
            // differs by codec); more means the file was cut or its header lies.
            let tolerance = (u64::from(rate) / 10).max(declared / 200);
            if self.source_frames + tolerance < declared {
                let detail = format!(
                    "header declares {declared} frames, only {} decodable",
                    self.source_frames
                );
                // Frames lost to skipped packets mean damage inside the stream, not a cut.
                return Err(if self.corrupt_packets > 0 {
                    AudioError::Corrupt {
                        detail: format!("{detail} ({} corrupt packets)", self.corrupt_packets),
                    }
                } else {
                    AudioError::Truncated { detail }
                });
            }
        }
        if ended_early {
            tracing::warn!(
                frames = self.source_frames,
                "stream ends mid-packet without a declared length; keeping what decoded"
            );
        }
        if self.source_frames < self.limits.min_source_frames(rate) {
            return Err(AudioError::TooShort {
                duration_ms: self.source_frames * 1000 / u64::from(rate),
                min_duration_ms: self.limits.min_duration_ms,
            });
        }
        let started = std::time::Instant::now();
        resampler.finish(&mut self.pcm_16k)?;
        self.resampling += started.elapsed();
        let peak_abs = self.pcm_16k.iter().fold(0.0f32, |m, s| m.max(s.abs()));
        Ok(DecodedAudio {
            duration_s: self.pcm_16k.len() as f64 / f64::from(TARGET_SAMPLE_RATE_HZ),
            pcm_16k: self.pcm_16k,
            source_sample_rate_hz: rate,
            source_channels: channels,
            peak_abs,
            resample_s: self.resampling.as_secs_f64(),
        })
    }
}

/// The mean of the channels, frame by frame, summed in channel order (as a frame's
/// `iter().sum()` would), with non-finite results zeroed.
fn downmix(planes: &[&[f32]], mono: &mut Vec<f32>) {
    mono.clear();
    let Some((first, rest)) = planes.split_first() else {
        return;
    };
    mono.extend_from_slice(first);
    for plane in rest {
        for (sum, sample) in mono.iter_mut().zip(plane.iter()) {
            *sum += sample;
        }
    }
    let scale = 1.0 / planes.len() as f32;
    for sample in mono.iter_mut() {
        *sample = finite_or_zero(*sample * scale);
    }
}

/// Float sources can carry NaN or infinities, which would poison every later feature frame.
fn finite_or_zero(sample: f32) -> f32 {
    if sample.is_finite() {
        sample
    } else {
        0.0
    }
}
