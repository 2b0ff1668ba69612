//! Streaming Sortformer with the bf16 GPU network against the CPU f32 network (which matches
//! NeMo's recording, see `models/tests/sortformer_parity.rs`), on the NeMo-made tiny fixture and
//! its 29 s three-speaker clip (longer than the speaker cache, so compression runs).
//!
//! - Per streaming step, both networks get the same input (the CPU run's state): the chunk's
//!   pre-encoded frames and every frame's speaker probabilities agree within bf16 accuracy.
//! - The whole GPU run (its own state) gives probabilities close to the CPU run's and the same
//!   frame-level speaker activity almost everywhere.
//!
//! Without CUDA these tests print SKIPPED and pass, unless `REQUIRE_CUDA=1`.

mod common;

use anyhow::{ensure, Result};
use common::{engine, fixtures, read_wav};
use cuda_engine::GpuSortformer;
use models::sortformer::{SortformerModel, SpeakerNetwork, StreamingState};

/// bf16 matmul inputs with f32 accumulation, through 17 conformer + 18 transformer layers.
const MAX_REL_L2: f64 = 1e-2;
/// Probabilities are in [0, 1]; one bf16-sized wobble on a steep sigmoid stays well below this.
const MAX_ABS_PROB: f64 = 5e-2;

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        diff += (f64::from(g) - f64::from(w)).powi(2);
        norm += f64::from(w).powi(2);
    }
    (diff / norm.max(f64::MIN_POSITIVE)).sqrt()
}

fn max_abs(got: &[f32], want: &[f32]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - f64::from(w)).abs())
        .fold(0.0, f64::max)
}

struct Models {
    cpu: SortformerModel,
    gpu: GpuSortformer,
    pcm: Vec<f32>,
}

fn load(test: &str) -> Result<Option<Models>> {
    if engine(test).is_none() {
        return Ok(None);
    }
    let dir = fixtures().join("sortformer-tiny");
    let path = dir.join("model.nemo");
    Ok(Some(Models {
        cpu: SortformerModel::load(&path)?,
        gpu: GpuSortformer::load(&path, 0)?,
        pcm: read_wav(&dir.join("three_speakers.wav"))?,
    }))
}

#[test]
fn gpu_network_matches_cpu_network_on_every_streaming_step() -> Result<()> {
    let Some(m) = load("gpu_network_matches_cpu_network_on_every_streaming_step")? else {
        return Ok(());
    };
    let (cpu_net, gpu_net) = (m.cpu.network(), m.gpu.model().network());
    let cfg = m.cpu.config();
    let total = m.cpu.valid_feature_frames(m.pcm.len());
    let spans = m.cpu.chunk_spans(total);
    ensure!(
        spans.len() >= 3,
        "the clip gives only {} chunks",
        spans.len()
    );
    let mut state = StreamingState::new(cfg.encoder.d_model, cfg.num_speakers);
    let mut saw_full_cache = false;
    let mut failures = Vec::new();
    for (i, span) in spans.iter().enumerate() {
        let features = m
            .cpu
            .feature_frames(&m.pcm, span.first_frame, span.last_frame);
        let (cpu_chunk, n) = cpu_net.pre_encode(&features)?;
        let (gpu_chunk, gpu_n) = gpu_net.pre_encode(&features)?;
        ensure!(n == gpu_n, "step {i}: {gpu_n} pre-encoded frames, CPU {n}");
        let pre = (
            rel_l2(&gpu_chunk, &cpu_chunk),
            max_abs(&gpu_chunk, &cpu_chunk),
        );

        let mut x = state.context();
        x.extend_from_slice(&cpu_chunk);
        let t = state.spkcache_frames() + state.fifo_frames() + n;
        saw_full_cache |= state.spkcache_frames() >= cfg.streaming.spkcache_len_frames;
        let cpu_probs = cpu_net.speaker_probabilities(x.clone(), t)?;
        let gpu_probs = gpu_net.speaker_probabilities(x, t)?;
        ensure!(gpu_probs.len() == cpu_probs.len(), "step {i}: length");
        let probs = (
            rel_l2(&gpu_probs, &cpu_probs),
            max_abs(&gpu_probs, &cpu_probs),
        );
        eprintln!(
            "RESULT step {i} frames={t} pre_encode rel_l2={:.2e} max_abs={:.2e} probs rel_l2={:.2e} max_abs={:.2e}",
            pre.0, pre.1, probs.0, probs.1
        );
        if pre.0 > MAX_REL_L2 || probs.0 > MAX_REL_L2 || probs.1 > MAX_ABS_PROB {
            failures.push(i);
        }
        // Advance with the CPU's result, so every step compares the networks on one input.
        m.cpu
            .step(&mut state, &features, span.left_context, span.right_context)?;
    }
    ensure!(saw_full_cache, "the clip never filled the speaker cache");
    ensure!(failures.is_empty(), "steps out of tolerance: {failures:?}");
    Ok(())
}

#[test]
fn gpu_streaming_run_agrees_with_cpu_run() -> Result<()> {
    let Some(m) = load("gpu_streaming_run_agrees_with_cpu_run")? else {
        return Ok(());
    };
    m.gpu.warm_up()?;
    let cpu = m.cpu.probabilities(&m.pcm)?;
    let gpu = m.gpu.model().probabilities(&m.pcm)?;
    ensure!(gpu.len() == cpu.len() && !cpu.is_empty(), "lengths");
    let k = m.cpu.num_speakers();
    let active = |p: &[f32]| -> Vec<bool> { p.iter().map(|&v| v > 0.5).collect() };
    let (a, b) = (active(&cpu), active(&gpu));
    let agree = a.iter().zip(&b).filter(|(x, y)| x == y).count() as f64 / a.len() as f64;
    let rel = rel_l2(&gpu, &cpu);
    eprintln!(
        "RESULT whole run: {} frames x {k} speakers, probs rel_l2={rel:.2e} max_abs={:.2e}, \
         activity agreement {:.4}",
        cpu.len() / k,
        max_abs(&gpu, &cpu),
        agree
    );
    ensure!(rel <= 2.0 * MAX_REL_L2, "probability rel L2 {rel:.3e}");
    ensure!(agree >= 0.99, "frame activity agreement {agree:.4}");
    let segments = m.gpu.diarize(&m.pcm)?;
    ensure!(!segments.is_empty(), "no speaker segments");
    Ok(())
}
