//! Resampling and downmix accuracy on synthetic signals with known answers.

mod common;

use audio::{decode, AudioLimits};
use common::{read, sine, tone_amplitude, wav_f32};

fn decode_wav(rate: u32, channels: u16, interleaved: &[f32]) -> Vec<f32> {
    let bytes = wav_f32(rate, channels, interleaved);
    decode(&bytes, Some("wav"), &AudioLimits::default())
        .expect("synthetic WAV decodes")
        .pcm_16k
}

#[test]
fn sine_1khz_at_44k1_keeps_frequency_amplitude_and_length() {
    let input = sine(1000.0, 0.5, 44_100, 44_100);
    let out = decode_wav(44_100, 1, &input);
    assert_eq!(out.len(), 16_000, "1 s in, 1 s out");
    // Skip the edges, where the resampler's filter sees the start/end of the clip.
    let mid = &out[1_000..15_000];
    let at_1k = tone_amplitude(mid, 1000.0, 16_000);
    assert!((at_1k - 0.5).abs() < 0.005, "1 kHz amplitude {at_1k}");
    // The energy is at 1 kHz, not next to it: a wrong ratio would shift the peak.
    for off in [950.0, 1050.0, 1200.0] {
        let leak = tone_amplitude(mid, off, 16_000);
        assert!(leak < 0.01, "{off} Hz has {leak}");
    }
    // Timing: the output is the same sine with no time offset. The FFT resampler's delay is
    // trimmed in whole output samples; the remainder (~0.2 sample = 11 us) gives up to
    // ~0.035 of error at 1 kHz, while a one-sample misalignment would give ~0.19.
    let expected = sine(1000.0, 0.5, 16_000, 16_000);
    let max_err = mid
        .iter()
        .zip(&expected[1_000..15_000])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(max_err < 0.05, "max sample error {max_err}");
}

#[test]
fn content_above_8khz_is_filtered_not_aliased() {
    // 11 kHz at 44.1 kHz would fold to 5 kHz at 16 kHz without an anti-aliasing filter.
    let input: Vec<f32> = sine(1000.0, 0.5, 44_100, 44_100)
        .iter()
        .zip(sine(11_000.0, 0.3, 44_100, 44_100))
        .map(|(a, b)| a + b)
        .collect();
    let out = decode_wav(44_100, 1, &input);
    let mid = &out[1_000..15_000];
    assert!(tone_amplitude(mid, 5_000.0, 16_000) < 0.001);
    assert!((tone_amplitude(mid, 1_000.0, 16_000) - 0.5).abs() < 0.005);
}

#[test]
fn upsampling_8k_keeps_the_tone() {
    let out = decode_wav(8_000, 1, &sine(440.0, 0.4, 8_000, 8_000));
    assert_eq!(out.len(), 16_000);
    let amp = tone_amplitude(&out[1_000..15_000], 440.0, 16_000);
    assert!((amp - 0.4).abs() < 0.005, "440 Hz amplitude {amp}");
}

#[test]
fn stereo_is_downmixed_to_the_mean_of_channels() {
    // Left 1 kHz, right 440 Hz, both 0.5 (tone_44k1_stereo.wav, made by sox): each at 0.25.
    let a = decode(
        &read("tone_44k1_stereo.wav"),
        Some("wav"),
        &AudioLimits::default(),
    )
    .expect("decodes");
    let mid = &a.pcm_16k[1_000..15_000];
    for freq in [1000.0, 440.0] {
        let amp = tone_amplitude(mid, freq, 16_000);
        assert!((amp - 0.25).abs() < 0.01, "{freq} Hz amplitude {amp}");
    }
    // Antiphase channels cancel exactly.
    let left = sine(300.0, 0.5, 16_000, 8_000);
    let interleaved: Vec<f32> = left.iter().flat_map(|&s| [s, -s]).collect();
    let out = decode_wav(16_000, 2, &interleaved);
    assert!(out.iter().all(|s| s.abs() < 1e-7));
}

#[test]
fn stereo_opus_is_decoded_to_16k_mono_by_libopus() {
    // tone_stereo.opus.ogg: tone_44k1_stereo.wav through ffmpeg's libopus at 64 kb/s. libopus
    // decodes it straight to 16 kHz mono; the recording is still reported as 48 kHz stereo.
    let a = decode(
        &read("tone_stereo.opus.ogg"),
        Some("ogg"),
        &AudioLimits::default(),
    )
    .expect("decodes");
    assert_eq!((a.source_sample_rate_hz, a.source_channels), (48_000, 2));
    assert_eq!(
        a.pcm_16k.len(),
        16_000,
        "1 s in, 1 s out (pre-skip and end trim applied)"
    );
    let mid = &a.pcm_16k[1_000..15_000];
    for freq in [1000.0, 440.0] {
        let amp = tone_amplitude(mid, freq, 16_000);
        assert!((amp - 0.25).abs() < 0.02, "{freq} Hz amplitude {amp}");
    }
}

#[test]
fn non_finite_float_samples_become_zero() {
    let mut input = sine(300.0, 0.5, 16_000, 16_000);
    input[100] = f32::NAN;
    input[200] = f32::INFINITY;
    input[300] = f32::NEG_INFINITY;
    let out = decode_wav(16_000, 1, &input);
    assert!(out.iter().all(|s| s.is_finite()));
    assert_eq!((out[100], out[200], out[300]), (0.0, 0.0, 0.0));
    assert_eq!(out[101], input[101], "16 kHz mono passes through unchanged");
}

#[test]
fn every_common_and_odd_rate_gives_the_right_length_and_tone() {
    // 44_101 Hz shares no factor with 16 kHz beyond 1: the worst case for block sizes.
    for rate in [
        8_000, 11_025, 12_000, 22_050, 24_000, 32_000, 44_100, 44_101, 48_000, 88_200, 96_000,
    ] {
        let frames = rate as usize * 3 / 2; // 1.5 s
        let out = decode_wav(rate, 1, &sine(700.0, 0.5, rate, frames));
        assert_eq!(out.len(), 24_000, "{rate} Hz: 1.5 s in, 1.5 s out");
        let amp = tone_amplitude(&out[2_000..22_000], 700.0, 16_000);
        assert!(
            (amp - 0.5).abs() < 0.005,
            "{rate} Hz: 700 Hz amplitude {amp}"
        );
    }
}
