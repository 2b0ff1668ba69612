//! Deterministic mutation fuzzing of the good corpus: whatever the damage, decoding returns
//! (Ok or one typed error) quickly and never lets a panic escape.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use audio::{decode, AudioLimits};
use common::{ext, read};

const FILES: &[&str] = &[
    "speech_16k_mono.wav",
    "speech.flac",
    "speech.mp3",
    "speech.m4a",
    "speech.ogg",
    "speech.opus.ogg",
    "speech.webm",
    "speech_ima_adpcm.wav",
    "speech_mp3.wav",
    "channels_32.wav",
];
/// Per file; `AUDIO_FUZZ_MUTATIONS=5000` for a longer local run.
fn mutations_per_file() -> usize {
    std::env::var("AUDIO_FUZZ_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40)
}
const TIME_LIMIT: Duration = Duration::from_secs(5);

/// xorshift64*: reproducible without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(original: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut data = original.to_vec();
    let len = data.len();
    match rng.below(5) {
        // Flip random bytes, concentrated in the header where parsers trust sizes.
        0 => {
            for _ in 0..1 + rng.below(16) {
                let at = rng.below(len.min(512));
                data[at] = rng.next() as u8;
            }
        }
        // Overwrite a random run anywhere with random bytes.
        1 => {
            let at = rng.below(len);
            for b in data.iter_mut().skip(at).take(1 + rng.below(4096)) {
                *b = rng.next() as u8;
            }
        }
        // Cut at a random point.
        2 => data.truncate(rng.below(len)),
        // Zero a random run.
        3 => {
            let at = rng.below(len);
            for b in data.iter_mut().skip(at).take(1 + rng.below(2048)) {
                *b = 0;
            }
        }
        // Duplicate a random run in place (repeated pages/frames/chunks).
        _ => {
            let at = rng.below(len);
            let run: Vec<u8> = data[at..(at + 1 + rng.below(4096)).min(len)].to_vec();
            data.splice(at..at, run);
        }
    }
    data
}

#[test]
fn mutated_files_never_panic_or_hang() {
    let mut outcomes: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut rng = Rng(0x5EED_2026_1130);
    let per_file = mutations_per_file();
    for name in FILES {
        let original = read(name);
        for i in 0..per_file {
            let data = mutate(&original, &mut rng);
            let started = Instant::now();
            let result = decode(&data, ext(name), &AudioLimits::default());
            let took = started.elapsed();
            assert!(took < TIME_LIMIT, "{name} mutation {i} took {took:?}");
            if let Ok(a) = &result {
                assert!(
                    a.pcm_16k.iter().all(|s| s.is_finite()),
                    "{name} mutation {i}"
                );
            }
            *outcomes
                .entry(result.as_ref().map_or_else(|e| e.reason_code(), |_| "ok"))
                .or_default() += 1;
        }
    }
    // Shown with --nocapture; decoder_panic entries are caught symphonia panics.
    println!("fuzz outcomes: {outcomes:?}");
    assert_eq!(outcomes.values().sum::<usize>(), FILES.len() * per_file);
}

/// symphonia-format-riff 0.6.1 shifts a u32 by the number of channels missing from a
/// WAVE_FORMAT_EXTENSIBLE channel mask (wave/chunks.rs:690), which overflows at 32 channels
/// without a mask. The crate demuxes many-channel PCM itself but leaves A-law to symphonia, so
/// channels_32.wav relabelled as 8-bit A-law still reaches that shift. With overflow checks
/// (debug/test builds) it is a panic, which must come back as `decoder_panic`; without them
/// (release) the mask stays empty and the reader refuses a zero-width frame (`corrupt`).
#[test]
fn a_decoder_panic_is_caught_and_typed() {
    let mut data = read("channels_32.wav");
    assert_eq!(
        &data[20..24],
        b"\xfe\xff\x20\x00",
        "EXTENSIBLE, 32 channels"
    );
    data[34..36].copy_from_slice(&8u16.to_le_bytes()); // bits per sample
    data[38..40].copy_from_slice(&8u16.to_le_bytes()); // valid bits per sample
    data[44] = 0x06; // sub-format GUID: KSDATAFORMAT_SUBTYPE_ALAW
    let e = decode(&data, Some("wav"), &AudioLimits::default()).expect_err("must not decode");
    let expected = if cfg!(debug_assertions) {
        "decoder_panic"
    } else {
        "corrupt"
    };
    assert_eq!(e.reason_code(), expected, "{e}");
    assert!(e.is_permanent());
}

/// Found by the fuzzer above: a `fmt ` chunk with 65535 channels of 32-bit PCM made
/// symphonia-format-riff overflow a u16 multiply (wave/chunks.rs:100). The crate demuxes PCM of
/// more than 18 channels itself now, so the channel limit refuses it before anything is read.
#[test]
fn a_huge_channel_count_is_refused_before_decoding() {
    let mut data = read("speech_16k_mono.wav");
    data[22..24].copy_from_slice(&u16::MAX.to_le_bytes()); // channels
    data[34..36].copy_from_slice(&32u16.to_le_bytes()); // bits per sample
    let e = decode(&data, Some("wav"), &AudioLimits::default()).expect_err("must not decode");
    assert_eq!(e.reason_code(), "too_many_channels", "{e}");
}
