//! Streaming Sortformer on the GPU: milliseconds per streaming step (one 188-frame, 15 s chunk
//! with the real model's settings) on a `.nemo` given by `SORTFORMER_BENCH_MODEL` (the full-size
//! random one from `scripts/make_full_size_sortformer.py`).
//!
//! Ignored by default; run on a GPU with
//! `SORTFORMER_BENCH_MODEL=/tmp/sortformer.nemo ./sortformer_bench --ignored --nocapture`.
//! Several copies at once under MPS give the per-instance figure of a shared GPU
//! (`scripts/bench/sortformer_gpu.sh`). A step is timed from the end of the previous one to the
//! end of this one: the chunk's log-mel features on the host, the pre-encode, the upload of
//! `[spkcache; fifo; chunk]`, the network, the download and the cache update, i.e. what a
//! worker spends per chunk. Steps before the cache and FIFO are full (shorter inputs) are
//! reported apart from the steady state. The recording is seeded noise under a speech-like
//! envelope (the weights are random, so content does not matter; the cost per step does not
//! depend on it). `SORTFORMER_BENCH_PRECISION=bf16|f32` picks the storage type (default bf16).

mod common;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use common::{engine, Rng};
use cuda_engine::{EncoderPrecision, GpuSortformer};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `SORTFORMER_BENCH_PRECISION`, default bf16; anything else is an error, not a silent default.
fn precision() -> Result<(EncoderPrecision, &'static str)> {
    match std::env::var("SORTFORMER_BENCH_PRECISION").as_deref() {
        Err(_) | Ok("bf16") => Ok((EncoderPrecision::Bf16, "bf16")),
        Ok("f32") => Ok((EncoderPrecision::F32, "f32")),
        Ok(other) => bail!("SORTFORMER_BENCH_PRECISION={other}: expected bf16 or f32"),
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

#[test]
#[ignore = "benchmark: needs a GPU and SORTFORMER_BENCH_MODEL"]
fn sortformer_ms_per_chunk() -> Result<()> {
    if engine("sortformer_ms_per_chunk").is_none() {
        return Ok(());
    }
    let path = PathBuf::from(
        std::env::var("SORTFORMER_BENCH_MODEL").context("set SORTFORMER_BENCH_MODEL")?,
    );
    let seconds: f64 = env_or("SORTFORMER_BENCH_SECONDS", 600.0);
    let (precision, precision_label) = precision()?;
    let started = Instant::now();
    let model = GpuSortformer::load_with(&path, 0, precision)?;
    let loaded_s = started.elapsed().as_secs_f64();
    model.warm_up()?;
    let ready_s = started.elapsed().as_secs_f64();

    let mut rng = Rng::fresh("sortformer_ms_per_chunk");
    let rate = 16_000.0;
    let samples = (seconds * rate) as usize;
    let pcm: Vec<f32> = (0..samples)
        .map(|i| {
            let t = i as f64 / rate;
            let envelope = 0.5 + 0.5 * (t * 3.1).sin() * (t * 0.37).cos();
            (0.1 * envelope * rng.normal()) as f32
        })
        .collect();

    let s = model.model().streaming_params().clone();
    let mut steps: Vec<(usize, f64)> = Vec::new();
    let mut last = Instant::now();
    let mut full_input_frames = 0;
    let run_started = Instant::now();
    model.model().probabilities_with(&pcm, |step| {
        let now = Instant::now();
        let frames = step.state.spkcache_frames() + step.state.fifo_frames();
        steps.push((frames, (now - last).as_secs_f64() * 1e3));
        full_input_frames = full_input_frames.max(frames);
        last = now;
    })?;
    let total_s = run_started.elapsed().as_secs_f64();
    // Steady state: the step started with cache and FIFO full (the previous step ended full).
    let full = s.spkcache_len_frames + s.fifo_len_frames;
    let mut steady: Vec<f64> = steps
        .windows(2)
        .filter(|w| w[0].0 >= full)
        .map(|w| w[1].1)
        .collect();
    steady.sort_by(f64::total_cmp);
    anyhow::ensure!(!steady.is_empty(), "no steady-state step in {seconds} s");
    let mean = steady.iter().sum::<f64>() / steady.len() as f64;
    let mps = std::env::var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").unwrap_or_else(|_| "-".into());
    println!(
        "RESULT sortformer precision={precision_label} chunk_frames={} steps={} steady_steps={} mean_ms={mean:.2} \
         p50_ms={:.2} p95_ms={:.2} max_ms={:.2} first_step_ms={:.2} recording_s={seconds} \
         run_s={total_s:.2} rtfx={:.1} load_s={loaded_s:.2} ready_s={ready_s:.2} mps_pct={mps}",
        s.chunk_len_frames,
        steps.len(),
        steady.len(),
        percentile(&steady, 0.5),
        percentile(&steady, 0.95),
        steady[steady.len() - 1],
        steps.first().map_or(0.0, |s| s.1),
        seconds / total_s,
    );
    Ok(())
}
