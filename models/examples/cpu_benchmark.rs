//! CPU benchmark of the f32 reference model: load time, peak RSS and RTFx per clip length.
//!
//! `cargo run --release -p models --example cpu_benchmark -- --model M.nemo --audio CLIP.wav`
//! The clip is tiled to each requested length, so the encoder sees real speech throughout.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use models::checkpoint::Checkpoint;
use models::ParakeetModel;

#[derive(Debug, Parser)]
struct Args {
    /// `.nemo` checkpoint.
    #[arg(long)]
    model: PathBuf,
    /// 16 kHz mono WAV tiled to each length.
    #[arg(long)]
    audio: PathBuf,
    /// Clip lengths to time, in seconds.
    #[arg(long, value_delimiter = ',', default_value = "10,30,60")]
    lengths_s: Vec<f64>,
    /// Timed runs per length (after one untimed warm-up run).
    #[arg(long, default_value_t = 2)]
    runs: usize,
}

/// Peak resident set size of this process (Linux `VmHWM`), in MiB.
fn peak_rss_mib() -> anyhow::Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .context("no VmHWM in /proc/self/status")?;
    let kib: f64 = line
        .split_whitespace()
        .nth(1)
        .context("malformed VmHWM")?
        .parse()?;
    Ok(kib / 1024.0)
}

fn read_wav(path: &PathBuf) -> anyhow::Result<Vec<f32>> {
    let mut reader = hound::WavReader::open(path)?;
    anyhow::ensure!(reader.spec().sample_rate == 16_000, "need 16 kHz audio");
    anyhow::ensure!(reader.spec().channels == 1, "need mono audio");
    Ok(reader
        .samples::<i16>()
        .map(|s| s.map(|v| f32::from(v) / 32768.0))
        .collect::<Result<_, _>>()?)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let speech = read_wav(&args.audio)?;
    anyhow::ensure!(!speech.is_empty(), "empty audio");

    let started = Instant::now();
    let checkpoint = Checkpoint::load(&args.model)?;
    let checkpoint_s = started.elapsed().as_secs_f64();
    let model = ParakeetModel::from_checkpoint(&checkpoint)?;
    drop(checkpoint);
    let load_s = started.elapsed().as_secs_f64();
    println!(
        "load: checkpoint {checkpoint_s:.2} s, ready {load_s:.2} s, peak RSS {:.0} MiB",
        peak_rss_mib()?
    );

    println!(
        "| length (s) | features (s) | encoder (s) | decoder (s) | total (s) | RTFx | tokens |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &length_s in &args.lengths_s {
        let n = (length_s * 16_000.0) as usize;
        let pcm: Vec<f32> = speech.iter().copied().cycle().take(n).collect();
        let mut best: Option<(f64, f64, f64, usize)> = None;
        for run in 0..=args.runs {
            let t0 = Instant::now();
            let features = model.features(&pcm);
            let t1 = Instant::now();
            let encoded = model.encode(&features)?;
            let t2 = Instant::now();
            let hyps = model.decode(std::slice::from_ref(&encoded))?;
            let t3 = Instant::now();
            let times = (
                (t1 - t0).as_secs_f64(),
                (t2 - t1).as_secs_f64(),
                (t3 - t2).as_secs_f64(),
                hyps[0].tokens.len(),
            );
            let total = times.0 + times.1 + times.2;
            if run > 0 && best.is_none_or(|b| total < b.0 + b.1 + b.2) {
                best = Some(times);
            }
        }
        let (f, e, d, tokens) = best.context("no timed run (use --runs >= 1)")?;
        let total = f + e + d;
        println!(
            "| {length_s:.0} | {f:.3} | {e:.2} | {d:.2} | {total:.2} | {:.2} | {tokens} |",
            length_s / total
        );
    }
    println!("peak RSS {:.0} MiB", peak_rss_mib()?);
    Ok(())
}
