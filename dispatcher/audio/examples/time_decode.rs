//! Times decoding one file three times: `cargo run --profile test -p audio --example time_decode FILE`
//! (the test profile is optimised; plain dev builds run the resampler unoptimised, ~30x slower).
fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: time_decode FILE"))?;
    let bytes = std::fs::read(&path)?;
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let a = audio::decode(&bytes, None, &audio::AudioLimits::default())?;
        println!(
            "{path}: {:.2} s of audio in {:?} (downmix and resampling {:.1} ms)",
            a.duration_s,
            started.elapsed(),
            a.resample_s * 1000.0
        );
    }
    Ok(())
}
