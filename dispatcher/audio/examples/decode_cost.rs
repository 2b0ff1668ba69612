//! One core's cost of decoding recordings to 16 kHz mono, per audio second: the host's largest
//! cost per job on compressed formats. Each file is decoded from memory ROUNDS times on this
//! thread; prints, per file, milliseconds per audio second in all and in downmix and resampling
//! (the rest is demuxing and the codec). Times are wall time on one thread: on an otherwise idle
//! machine, one core's CPU.
//!
//! cargo run --release -p audio --example decode_cost -- [--rounds N] FILE...

use std::time::Instant;

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
struct Args {
    /// Decodes of each file; the result is their total time over their total audio.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Recordings to decode (any format the pipeline takes; the extension orders the probe).
    #[arg(required = true)]
    files: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    let Args { rounds, files } = Args::parse();
    let limits = audio::AudioLimits::default();
    println!("file\taudio_s\tms_per_audio_s\tresample_ms_per_audio_s");
    for path in files {
        let bytes = std::fs::read(&path).with_context(|| path.clone())?;
        let ext = std::path::Path::new(&path)
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_owned);
        let (mut total_s, mut resample_s, mut audio_s) = (0.0, 0.0, 0.0);
        for _ in 0..rounds {
            let started = Instant::now();
            let decoded = audio::decode(&bytes, ext.as_deref(), &limits)
                .with_context(|| format!("decoding {path}"))?;
            total_s += started.elapsed().as_secs_f64();
            resample_s += decoded.resample_s;
            audio_s += decoded.duration_s;
        }
        println!(
            "{path}\t{:.1}\t{:.3}\t{:.3}",
            audio_s / rounds as f64,
            1e3 * total_s / audio_s,
            1e3 * resample_s / audio_s
        );
    }
    Ok(())
}
