//! Streaming Sortformer on the GPU, in both storage types, against the CPU f32 network (which
//! matches NeMo's recording, see `models/tests/sortformer_parity.rs`), on the NeMo-made tiny
//! fixture and its 29 s three-speaker clip (longer than the speaker cache, so compression runs).
//!
//! - Per streaming step, both networks get the same input (the CPU run's state): the chunk's
//!   pre-encoded frames and every frame's speaker probabilities agree within the precision's
//!   bounds.
//! - The whole GPU run (its own state) gives probabilities close to the CPU run's and the same
//!   frame-level speaker activity almost everywhere; in f32, the very same speaker segments.
//!
//! Without CUDA these tests print SKIPPED and pass, unless `REQUIRE_CUDA=1`.

mod common;

use anyhow::{ensure, Result};
use common::{engine, fixtures, read_wav};
use cuda_engine::{EncoderPrecision, GpuSortformer};
use models::sortformer::{SortformerModel, SpeakerNetwork, StreamingState};

/// What one storage type must reach against the CPU network.
struct Bounds {
    label: &'static str,
    /// Per step: pre-encoded frames, relative L2.
    step_pre_encode_rel_l2: f64,
    /// Per step: speaker probabilities, relative L2 and largest difference.
    step_probs_rel_l2: f64,
    step_probs_max_abs: f64,
    /// Whole run (each engine with its own streaming state).
    run_probs_rel_l2: f64,
    run_activity_agreement: f64,
    /// Whole run: `diarize` gives exactly the CPU's segments.
    same_segments: bool,
}

/// bf16 matmul inputs with f32 accumulation, through 17 conformer + 18 transformer layers.
/// Measured on an H200 on 2026-11-30: per step probs rel_l2 1.6e-2..2.4e-2, max_abs up to
/// 8.2e-2, pre-encode rel_l2 about 3e-3; whole run rel_l2 8.9e-2, activity agreement 0.9738.
/// The bounds are those plus headroom.
const BF16: Bounds = Bounds {
    label: "bf16",
    step_pre_encode_rel_l2: 1e-2,
    step_probs_rel_l2: 5e-2,
    step_probs_max_abs: 0.15,
    run_probs_rel_l2: 0.2,
    run_activity_agreement: 0.95,
    same_segments: false,
};

/// f32 storage, fp32 matmuls: the parity bound against NeMo (1e-4 relative L2, which
/// the CPU engine meets), so the GPU is as close to the CPU as both are to NeMo. The largest
/// difference of one probability (not in the issue) is a loose guard against a single bad
/// frame hidden in the L2; an activity flip needs a probability within ~1e-4 of 0.5.
const F32: Bounds = Bounds {
    label: "f32",
    step_pre_encode_rel_l2: 1e-4,
    step_probs_rel_l2: 1e-4,
    step_probs_max_abs: 1e-3,
    run_probs_rel_l2: 1e-4,
    run_activity_agreement: 0.999,
    same_segments: true,
};

fn bounds(precision: EncoderPrecision) -> &'static Bounds {
    match precision {
        EncoderPrecision::Bf16 => &BF16,
        EncoderPrecision::F32 => &F32,
    }
}

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

fn load(test: &str, precision: EncoderPrecision) -> Result<Option<Models>> {
    if engine(test).is_none() {
        return Ok(None);
    }
    let dir = fixtures().join("sortformer-tiny");
    let path = dir.join("model.nemo");
    Ok(Some(Models {
        cpu: SortformerModel::load(&path)?,
        gpu: GpuSortformer::load_with(&path, 0, precision)?,
        pcm: read_wav(&dir.join("three_speakers.wav"))?,
    }))
}

#[test]
fn bf16_gpu_network_matches_cpu_network_on_every_streaming_step() -> Result<()> {
    network_matches_on_every_step(
        "bf16_gpu_network_matches_cpu_network_on_every_streaming_step",
        EncoderPrecision::Bf16,
    )
}

#[test]
fn f32_gpu_network_matches_cpu_network_on_every_streaming_step() -> Result<()> {
    network_matches_on_every_step(
        "f32_gpu_network_matches_cpu_network_on_every_streaming_step",
        EncoderPrecision::F32,
    )
}

fn network_matches_on_every_step(test: &str, precision: EncoderPrecision) -> Result<()> {
    let Some(m) = load(test, precision)? else {
        return Ok(());
    };
    ensure!(
        m.gpu.precision() == precision,
        "loaded {:?}",
        m.gpu.precision()
    );
    let bounds = bounds(precision);
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
            "RESULT precision={} step {i} frames={t} pre_encode rel_l2={:.2e} max_abs={:.2e} \
             probs rel_l2={:.2e} max_abs={:.2e}",
            bounds.label, pre.0, pre.1, probs.0, probs.1
        );
        if pre.0 > bounds.step_pre_encode_rel_l2
            || probs.0 > bounds.step_probs_rel_l2
            || probs.1 > bounds.step_probs_max_abs
        {
            failures.push(i);
        }
        // Advance with the CPU's result, so every step compares the networks on one input.
        m.cpu
            .step(&mut state, &features, span.left_context, span.right_context)?;
    }
    ensure!(saw_full_cache, "the clip never filled the speaker cache");
    ensure!(
        failures.is_empty(),
        "{}: steps out of tolerance: {failures:?}",
        bounds.label
    );
    Ok(())
}

#[test]
fn bf16_gpu_streaming_run_agrees_with_cpu_run() -> Result<()> {
    streaming_run_agrees(
        "bf16_gpu_streaming_run_agrees_with_cpu_run",
        EncoderPrecision::Bf16,
    )
}

#[test]
fn f32_gpu_streaming_run_agrees_with_cpu_run() -> Result<()> {
    streaming_run_agrees(
        "f32_gpu_streaming_run_agrees_with_cpu_run",
        EncoderPrecision::F32,
    )
}

fn streaming_run_agrees(test: &str, precision: EncoderPrecision) -> Result<()> {
    let Some(m) = load(test, precision)? else {
        return Ok(());
    };
    let bounds = bounds(precision);
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
        "RESULT precision={} whole run: {} frames x {k} speakers, probs rel_l2={rel:.2e} \
         max_abs={:.2e}, activity agreement {:.4}",
        bounds.label,
        cpu.len() / k,
        max_abs(&gpu, &cpu),
        agree
    );
    let cpu_segments = m.cpu.diarize(&m.pcm)?;
    let gpu_segments = m.gpu.diarize(&m.pcm)?;
    eprintln!(
        "RESULT precision={} segments: gpu {} cpu {} identical={}",
        bounds.label,
        gpu_segments.len(),
        cpu_segments.len(),
        gpu_segments == cpu_segments
    );
    ensure!(
        rel <= bounds.run_probs_rel_l2,
        "{}: probability rel L2 {rel:.3e}",
        bounds.label
    );
    ensure!(
        agree >= bounds.run_activity_agreement,
        "{}: frame activity agreement {agree:.4}",
        bounds.label
    );
    ensure!(!gpu_segments.is_empty(), "no speaker segments");
    if bounds.same_segments {
        ensure!(
            gpu_segments == cpu_segments,
            "{}: segments differ\n gpu {gpu_segments:?}\n cpu {cpu_segments:?}",
            bounds.label
        );
    }
    Ok(())
}
