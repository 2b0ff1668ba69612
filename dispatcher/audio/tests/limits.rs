//! Each limit in `AudioLimits` rejects with its own reason code, before the work it protects.

mod common;

use audio::{check_input_size, decode, AudioError, AudioLimits, SegmenterConfig};
use common::{read, sine, wav_f32};

fn with(f: impl FnOnce(&mut AudioLimits)) -> AudioLimits {
    let mut limits = AudioLimits::default();
    f(&mut limits);
    limits
}

#[test]
fn size_limit_is_checked_before_decoding() {
    let bytes = read("speech.flac");
    let limits = with(|l| l.max_input_bytes = bytes.len() as u64 - 1);
    let e = decode(&bytes, Some("flac"), &limits).expect_err("one byte over");
    assert_eq!(e.reason_code(), "too_large");
    assert!(check_input_size(bytes.len() as u64, &AudioLimits::default()).is_ok());
    assert_eq!(
        check_input_size(0, &AudioLimits::default()).map_err(|e| e.reason_code()),
        Err("empty")
    );
}

#[test]
fn declared_length_over_the_limit_is_rejected_without_decoding() {
    // The WAV header declares 3.74 s; nothing needs decoding to know it is over 1 s.
    let e = decode(
        &read("speech_16k_mono.wav"),
        Some("wav"),
        &with(|l| l.max_duration_s = 1),
    )
    .expect_err("3.7 s > 1 s");
    match e {
        AudioError::TooLong { duration_s, .. } => assert!((duration_s - 3.74).abs() < 0.01),
        other => panic!("expected too_long, got {other}"),
    }
}

#[test]
fn running_budget_stops_a_stream_without_a_declared_length() {
    // 0xFFFFFFFF sizes: no declared length, so only the running frame budget can stop it, and
    // it must stop right after the limit instead of decoding everything first.
    let e = decode(
        &read("streaming_header.wav"),
        Some("wav"),
        &with(|l| l.max_duration_s = 1),
    )
    .expect_err("3.7 s stream > 1 s");
    match e {
        AudioError::TooLong { duration_s, .. } => {
            assert!(
                (1.0..1.2).contains(&duration_s),
                "stopped at {duration_s} s"
            )
        }
        other => panic!("expected too_long, got {other}"),
    }
}

#[test]
fn channel_limit_is_configurable() {
    // 33 channels (plain PCM, as ffmpeg writes it) are one over the default limit.
    let bytes = read("channels_33.wav");
    let e = decode(&bytes, Some("wav"), &AudioLimits::default()).expect_err("33 > 32");
    assert_eq!(e.reason_code(), "too_many_channels");
    let a = decode(&bytes, Some("wav"), &with(|l| l.max_channels = 33)).expect("33 allowed");
    assert_eq!(a.source_channels, 33);
    // All channels carry the same sine, so the mean is that sine (peak ~0.5).
    assert!((a.peak_abs - 0.5).abs() < 0.01, "peak {}", a.peak_abs);
    // Both demuxers enforce a lower limit: symphonia's (8) and the crate's own (32).
    for (name, channels) in [("channels_8.wav", 8), ("channels_32.wav", 32)] {
        let bytes = read(name);
        let limits = with(|l| l.max_channels = channels);
        assert_eq!(
            decode(&bytes, Some("wav"), &limits)
                .expect(name)
                .source_channels,
            channels
        );
        let limits = with(|l| l.max_channels = channels - 1);
        let e = decode(&bytes, Some("wav"), &limits).expect_err(name);
        assert_eq!(e.reason_code(), "too_many_channels", "{name}");
    }
}

#[test]
fn many_channels_of_float_are_downmixed_by_the_mean() {
    // 32 channels of IEEE float, a sine of 0.8 in the even channels and silence in the odd:
    // the mean is a sine of 0.4.
    let tone = sine(300.0, 0.8, 16_000, 16_000);
    let interleaved: Vec<f32> = tone
        .iter()
        .flat_map(|&s| (0..32).map(move |c| if c % 2 == 0 { s } else { 0.0 }))
        .collect();
    let a = decode(
        &wav_f32(16_000, 32, &interleaved),
        Some("wav"),
        &AudioLimits::default(),
    )
    .expect("32 channels decode");
    assert_eq!((a.source_channels, a.pcm_16k.len()), (32, 16_000));
    assert!((a.peak_abs - 0.4).abs() < 0.01, "peak {}", a.peak_abs);
}

#[test]
fn sample_rate_range_is_configurable() {
    let e = decode(
        &read("rate_96k.wav"),
        Some("wav"),
        &with(|l| l.max_sample_rate_hz = 48_000),
    )
    .expect_err("96 kHz > 48 kHz");
    assert_eq!(e.reason_code(), "unsupported_sample_rate");
    let a = decode(
        &read("rate_4k.wav"),
        Some("wav"),
        &with(|l| l.min_sample_rate_hz = 4_000),
    )
    .expect("4 kHz allowed");
    assert_eq!(a.pcm_16k.len(), 8_000);
}

#[test]
fn wall_clock_budget_ends_the_decode() {
    let bytes = wav_f32(16_000, 1, &sine(300.0, 0.5, 16_000, 16_000));
    let e = decode(&bytes, Some("wav"), &with(|l| l.decode_timeout_s = 0)).expect_err("0 s");
    assert_eq!(e.reason_code(), "decode_timeout");
}

#[test]
fn only_io_errors_are_transient() {
    let io = AudioError::Io(std::io::Error::other("disk gone"));
    assert_eq!(io.reason_code(), "io");
    assert!(!io.is_permanent());
    assert!(AudioError::Empty.is_permanent());
    assert!(AudioError::DecoderPanicked { detail: "x".into() }.is_permanent());
}

#[test]
fn configs_deserialize_with_defaults_and_reject_unknown_fields() {
    let limits: AudioLimits =
        serde_json::from_str(r#"{"max_duration_s": 60}"#).expect("partial config");
    assert_eq!(limits.max_duration_s, 60);
    assert_eq!(limits.max_channels, AudioLimits::default().max_channels);
    assert!(serde_json::from_str::<AudioLimits>(r#"{"max_duration": 60}"#).is_err());
    let seg: SegmenterConfig =
        serde_json::from_str(r#"{"max_segment_s": 20.0}"#).expect("partial config");
    assert_eq!(seg.max_segment_s, 20.0);
    assert_eq!(
        seg.energy_frame_ms,
        SegmenterConfig::default().energy_frame_ms
    );
}

#[test]
fn output_capacity_stays_near_the_decoded_length() {
    // 5 min at 8 kHz (no declared-length shortcut matters here: the buffer grows as it
    // decodes). Growth is at most a quarter or one minute at a time, never a doubling.
    let minutes = 5;
    let input = sine(440.0, 0.3, 8_000, 8_000 * 60 * minutes);
    let a = decode(
        &wav_f32(8_000, 1, &input),
        Some("wav"),
        &AudioLimits::default(),
    )
    .expect("decodes");
    let len = a.pcm_16k.len();
    assert_eq!(len, 16_000 * 60 * minutes);
    let slack = (len / 4).max(16_000 * 60) + 16_000;
    assert!(
        a.pcm_16k.capacity() <= len + slack,
        "capacity {} for {len}",
        a.pcm_16k.capacity()
    );
}
