//! The checked-in corpus (scripts/make_audio_corpus.sh): every file ends in exactly one typed
//! outcome, quickly, and the good formats decode to the right length and content.

mod common;

use std::time::{Duration, Instant};

use audio::{decode, decode_file, AudioLimits, DecodedAudio};
use common::{correlation, data_dir, ext, read};

/// Generous for CI machines; real decodes of these files take milliseconds.
const TIME_LIMIT: Duration = Duration::from_secs(5);

enum Expect {
    /// Decodes, with this source sample rate and channel count.
    Ok(u32, usize),
    /// Fails with this reason code.
    Err(&'static str),
}
use Expect::{Err, Ok};

const CORPUS: &[(&str, Expect)] = &[
    // Good formats.
    ("speech_16k_mono.wav", Ok(16_000, 1)),
    ("tone_44k1_stereo.wav", Ok(44_100, 2)),
    ("speech.flac", Ok(16_000, 1)),
    ("speech.mp3", Ok(44_100, 2)),
    ("speech.m4a", Ok(44_100, 2)),
    ("speech.ogg", Ok(44_100, 1)),
    ("speech.opus.ogg", Ok(48_000, 1)),
    // Stereo Opus, decoded by libopus straight to 16 kHz mono; reported as the container says.
    ("tone_stereo.opus.ogg", Ok(48_000, 2)),
    // Matroska carries the encoder's input rate; libopus decodes straight to it.
    ("speech.webm", Ok(16_000, 1)),
    ("speech_ima_adpcm.wav", Ok(16_000, 1)),
    // MPEG audio inside WAVE (format tags 0x0055, 0x0050): rate and channels from the stream.
    ("speech_mp3.wav", Ok(44_100, 1)),
    ("speech_mp2.wav", Ok(44_100, 1)),
    // Documented successes from the bad-audio list.
    ("mp3_named.wav", Ok(44_100, 2)), // content decides, not the extension
    ("clip_160ms.wav", Ok(16_000, 1)), // exactly the minimum
    ("silence_2s.wav", Ok(16_000, 1)), // transcribes to empty text
    ("rate_8k.wav", Ok(8_000, 1)),
    ("rate_96k.wav", Ok(96_000, 1)),
    ("streaming_header.wav", Ok(16_000, 1)), // 0xFFFFFFFF sizes = length unknown
    // Microphone arrays are downmixed by the mean, up to 32 channels by default.
    ("channels_8.wav", Ok(16_000, 8)),
    ("channels_32.wav", Ok(8_000, 32)),
    // Typed failures.
    ("empty.wav", Err("empty")),
    ("truncated.wav", Err("truncated")),
    ("truncated.mp3", Err("truncated")),
    // One packet fails to decode and the demuxer resyncs past the rest of the garbage; the
    // frames lost (0.27 s of 3.7 s) exceed the shortfall tolerance, so it is corrupt.
    ("corrupt_middle.mp3", Err("corrupt")),
    ("random.bin", Err("unsupported_format")),
    ("text_named.mp3", Err("unsupported_format")),
    // symphonia's WAV reader refuses unknown format tags while probing the container.
    ("gsm.wav", Err("unsupported_format")),
    ("ac3.mka", Err("unsupported_codec")),
    ("clip_100ms.wav", Err("too_short")),
    ("rate_4k.wav", Err("unsupported_sample_rate")),
    ("channels_33.wav", Err("too_many_channels")),
    ("lying_header_long.wav", Err("truncated")),
    ("lying_header_huge.wav", Err("too_long")),
    ("lying_header_inconsistent.wav", Err("corrupt")),
];

fn timed_decode(name: &str) -> (Result<DecodedAudio, audio::AudioError>, Duration) {
    let bytes = read(name);
    let started = Instant::now();
    let result = decode(&bytes, ext(name), &AudioLimits::default());
    (result, started.elapsed())
}

#[test]
fn every_corpus_file_has_one_typed_outcome_within_the_time_limit() {
    let mut failures = Vec::new();
    for (name, expect) in CORPUS {
        let (result, took) = timed_decode(name);
        assert!(took < TIME_LIMIT, "{name} took {took:?}");
        match (expect, &result) {
            (Ok(rate, channels), std::result::Result::Ok(a)) => {
                assert_eq!(
                    (a.source_sample_rate_hz, a.source_channels),
                    (*rate, *channels),
                    "{name}"
                );
                assert!(a.pcm_16k.iter().all(|s| s.is_finite()), "{name}");
                assert!((a.duration_s - a.pcm_16k.len() as f64 / 16_000.0).abs() < 1e-9);
            }
            (Err(code), std::result::Result::Err(e)) => {
                assert_eq!(e.reason_code(), *code, "{name}: {e}");
                assert!(e.is_permanent(), "{name}: {e} must not be retried");
            }
            _ => failures.push(format!(
                "{name}: got {:?}",
                result.as_ref().map(|a| a.duration_s)
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "unexpected outcomes:\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_file_in_the_corpus_folder_is_in_the_table() {
    let listed: Vec<&str> = CORPUS.iter().map(|(n, _)| *n).collect();
    for entry in std::fs::read_dir(data_dir()).expect("tests/data exists") {
        let name = entry.expect("dir entry").file_name();
        let name = name.to_string_lossy();
        assert!(
            listed.contains(&name.as_ref()),
            "{name} has no expected outcome"
        );
    }
}

#[test]
fn silence_decodes_to_zeros_not_an_error() {
    let a = timed_decode("silence_2s.wav").0.expect("silence decodes");
    assert_eq!(a.pcm_16k.len(), 32_000);
    assert_eq!(a.peak_abs, 0.0);
}

#[test]
fn minimum_duration_boundary_is_exact() {
    let ok = timed_decode("clip_160ms.wav")
        .0
        .expect("160 ms is accepted");
    assert_eq!(ok.pcm_16k.len(), 2_560);
    let stricter = AudioLimits {
        min_duration_ms: 161,
        ..AudioLimits::default()
    };
    let e = decode(&read("clip_160ms.wav"), Some("wav"), &stricter).expect_err("161 ms minimum");
    assert_eq!(e.reason_code(), "too_short");
}

/// Output length for each good format against the 16 kHz WAV they were all made from.
/// Lossless and gapless formats match to the sample; the others carry known extra frames:
/// - M4A: symphonia does not apply the MP4 edit list, so the AAC encoder priming (1024 frames
///   at 44.1 kHz, plus padding to the last 1024-frame block) stays in: about +42 ms;
/// - WebM/MKA Opus: Matroska's CodecDelay (pre-skip, 312 frames at 48 kHz) is not trimmed,
///   plus the final frame's padding: about +11 ms;
/// - IMA ADPCM: the last block is padded to full size: about +13 ms;
/// - MP3 / MP2 inside WAVE: no LAME tag tells the decoder the encoder delay and padding, so
///   both stay in: MP3 starts 1105 frames at 44.1 kHz late (+45 ms in all), MP2 481 (+19 ms).
#[test]
fn good_formats_decode_to_the_reference_length_and_content() {
    let reference = timed_decode("speech_16k_mono.wav")
        .0
        .expect("reference decodes");
    let n = reference.pcm_16k.len() as i64;
    // (file, allowed extra samples at 16 kHz, expected start delay in samples, min correlation)
    let cases: &[(&str, i64, usize, f64)] = &[
        ("speech.flac", 0, 0, 0.999_999),
        ("streaming_header.wav", 0, 0, 0.999_999),
        ("mp3_named.wav", 1, 0, 0.95),
        ("speech.mp3", 1, 0, 0.95),
        ("speech.ogg", 1, 0, 0.95),
        ("speech.opus.ogg", 0, 0, 0.9),
        ("speech.m4a", 700, 371, 0.9),
        ("speech.webm", 200, 0, 0.9),
        ("speech_ima_adpcm.wav", 220, 0, 0.95),
        ("speech_mp3.wav", 730, 401, 0.95),
        ("speech_mp2.wav", 310, 175, 0.9),
    ];
    for &(name, extra, delay, min_corr) in cases {
        let a = timed_decode(name)
            .0
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = a.pcm_16k.len() as i64;
        assert!(
            (n..=n + extra).contains(&got),
            "{name}: {got} samples, expected {n}..={}",
            n + extra
        );
        // The decoded signal must be the reference speech, starting `delay` samples late.
        let (best_lag, best) = (0..=extra as usize)
            .map(|lag| (lag, correlation(&reference.pcm_16k, &a.pcm_16k, lag)))
            .fold((0, f64::MIN), |b, c| if c.1 > b.1 { c } else { b });
        assert!(
            best_lag.abs_diff(delay) <= 2 && best >= min_corr,
            "{name}: best correlation {best:.4} at lag {best_lag}, expected >= {min_corr} at {delay}"
        );
    }
}

/// MPEG inside WAVE trusts no chunk size: a `data` size past the end or 0xFFFFFFFF means "to
/// the end of the input", and a chunk without MPEG frames is a typed error.
#[test]
fn mpeg_in_wave_edge_cases_have_typed_outcomes() {
    let src = read("speech_mp3.wav");
    let at = src
        .windows(4)
        .position(|w| w == b"data")
        .expect("data chunk");
    let body = at + 8;
    let decode_wav = |bytes: &[u8]| decode(bytes, Some("wav"), &AudioLimits::default());
    let full = decode_wav(&src).expect("decodes").pcm_16k.len();
    // Cut in half: the frames present decode (no frame count to call it truncated).
    let half = decode_wav(&src[..body + (src.len() - body) / 2]).expect("half decodes");
    assert!(
        half.pcm_16k.len().abs_diff(full / 2) < 1_000,
        "{}",
        half.pcm_16k.len()
    );
    // Streaming writers' sizes, and a chunk after the data chunk.
    let mut streaming = src.clone();
    streaming[4..8].copy_from_slice(&[0xFF; 4]);
    streaming[at + 4..body].copy_from_slice(&[0xFF; 4]);
    assert_eq!(decode_wav(&streaming).expect("decodes").pcm_16k.len(), full);
    let trailing = [&src[..], b"LIST\x04\0\0\0abcd"].concat();
    assert_eq!(decode_wav(&trailing).expect("decodes").pcm_16k.len(), full);
    // A complete chunk with no MPEG frame in it; a header whose data never arrived.
    let mut zeros = src.clone();
    zeros[body..].fill(0);
    let code = |bytes: &[u8]| decode_wav(bytes).err().map(|e| e.reason_code());
    assert_eq!(code(&zeros), Some("corrupt"));
    assert_eq!(code(&src[..body]), Some("truncated"));
}

#[test]
fn decoding_from_a_file_matches_decoding_from_bytes() {
    // One symphonia container, and both of the crate's own WAVE paths (MPEG inside, 32 channels).
    for name in ["speech.opus.ogg", "speech_mp3.wav", "channels_32.wav"] {
        let path = data_dir().join(name);
        let from_file = decode_file(
            std::fs::File::open(&path).expect("open"),
            ext(name),
            &AudioLimits::default(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let from_bytes = timed_decode(name).0.expect("bytes decode");
        assert_eq!(from_file.pcm_16k, from_bytes.pcm_16k, "{name}");
    }
}
