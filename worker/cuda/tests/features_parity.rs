//! GPU log-mel features (`GpuFeatures`) against the CPU reference `FeatureExtractor::compute`:
//! every fixture clip alone and all in one mixed-length batch, then fresh random batches
//! (random lengths from empty through shorter than one window to seconds, noise at levels from
//! -80 dB to 0 dB, tones, band-limited audio, DC, digital silence) under both STFT paddings and
//! both normalisations. Outputs are poisoned with NaN before every run and are one element
//! longer than needed: every element of the layout must be written, frames past a clip's
//! valid count must be exactly zero, and the element past the layout must stay NaN.
//!
//! Tolerance, per element (NaN never passes). The GPU takes the DFT as an fp32 matmul, the CPU
//! as an f32 FFT; both have an absolute error in each DFT value X of about
//! `dx = 20 · 2⁻²⁴ · ‖span‖ · ‖basis row‖` (√K growth over the window's K = 400 terms; ‖span‖
//! ≤ √win · 1.97 · peak|x| after preemphasis, ‖basis row‖ = √(Σw²/2)). The power error
//! `2|X|dx` summed through a mel row with weight sum F is at most `2 dx √(F · mel)`
//! (Cauchy-Schwarz), so the log error is
//! `tol_log = 1e-4 + 2 dx √(F · mel) / (mel + guard)`, where 1e-4 covers the mel matmul's
//! and the logarithm's own rounding. It is tight where there is energy (an indexing or
//! layout bug is off by O(1) there) and loose only where power sits at the guard.
//! Normalised values `z = (v - μ) / (σ + 1e-5)` get
//! `(tol_log + mean(tol_log) + |z| · δσ) / (σ + 1e-5) + 1e-5 (1 + |z|)` with
//! `δσ = (rms(tol_log) + mean(tol_log)) · √(N/(N−1))`, μ and σ from the CPU's unnormalised
//! features (errors in v, in the mean, and in σ).
//! Calibration (a host emulation of this algorithm with sequential f32 sums, on the fixture
//! clips and on noise, tones, band-limited and loud/quiet audio at 0.3 to 1e-4, all four
//! variants): every error is below 0.02 of this tolerance, while comparing against the
//! neighbouring frame (an off-by-one frame bug) exceeds it 170 to 6000 times.
//! When normalising, digital silence and any clip of a single frame must give exactly 0.
//!
//! Without CUDA these tests print SKIPPED and pass, unless `REQUIRE_CUDA=1`. On the GPU machine:
//! `cargo test -p cuda-engine --release --test features_parity -- --nocapture`.

mod common;

use std::collections::BTreeMap;

use anyhow::{ensure, Context, Result};
use common::{check_close, engine, fixtures, poisoned_f32, read_wav, Rng, CLIPS, MODELS};
use cuda_engine::{CudaEngine, CudaEngineError, FeatureLayout, GpuEncoder, GpuFeatures};
use model_core::config::{FeatureConfig, FeatureNormalization, StftPadding};
use models::checkpoint::{Checkpoint, TensorMap};
use models::tensor::Tensor;
use models::{FeatureExtractor, Features};

const FILTERBANK: &str = "preprocessor.featurizer.fb";
const WINDOW: &str = "preprocessor.featurizer.window";

/// One configuration on both sides: the GPU extractor and the CPU reference, plus the CPU
/// extractor without normalisation (its log-mel values give the tolerance's mel and σ).
struct Pair {
    cfg: FeatureConfig,
    gpu: GpuFeatures,
    cpu: FeatureExtractor,
    cpu_unnormalized: FeatureExtractor,
    /// Σ_k fb[m, k] per mel bin.
    fb_row_sums: Vec<f64>,
    /// √(Σ w²/2): the norm of a DFT basis row.
    basis_row_norm: f64,
}

fn stored(ckpt: &Checkpoint) -> Result<(Tensor, Tensor)> {
    let cfg = &ckpt.config.features;
    let fb = ckpt
        .tensors
        .get(FILTERBANK, &[1, cfg.n_mels, cfg.n_fft / 2 + 1])?
        .clone();
    let window = ckpt.tensors.get(WINDOW, &[cfg.win_length_samples])?.clone();
    Ok((fb, window))
}

fn pair(engine: &CudaEngine, cfg: &FeatureConfig, fb: &Tensor, window: &Tensor) -> Result<Pair> {
    let unnormalized = FeatureConfig {
        normalization: FeatureNormalization::None,
        ..cfg.clone()
    };
    let n_freq = cfg.n_fft / 2 + 1;
    Ok(Pair {
        cfg: cfg.clone(),
        gpu: GpuFeatures::from_extractor(
            engine,
            &FeatureExtractor::new(cfg, Some(fb), Some(window))?,
        )?,
        cpu: FeatureExtractor::new(cfg, Some(fb), Some(window))?,
        cpu_unnormalized: FeatureExtractor::new(&unnormalized, Some(fb), Some(window))?,
        fb_row_sums: fb
            .data
            .chunks_exact(n_freq)
            .map(|row| row.iter().map(|v| f64::from(*v)).sum())
            .collect(),
        basis_row_norm: (window
            .data
            .iter()
            .map(|w| f64::from(*w).powi(2))
            .sum::<f64>()
            / 2.0)
            .sqrt(),
    })
}

/// Per-element tolerance for one clip, laid out like `Features::data` (`[n_mels, frames]`).
fn tolerance(pair: &Pair, pcm: &[f32], unnormalized: &Features) -> Vec<f64> {
    let cfg = &pair.cfg;
    let peak = pcm.iter().fold(0.0f64, |m, v| m.max(f64::from(v.abs())));
    let span_norm = (cfg.win_length_samples as f64).sqrt() * 1.97 * peak;
    let dx = 20.0 * 2f64.powi(-24) * span_norm * pair.basis_row_norm;
    let guard = f64::from(cfg.log_zero_guard);
    let frames = unnormalized.n_frames;
    let mut tol = vec![0.0; unnormalized.data.len()];
    for m in 0..unnormalized.n_mels {
        let row = &unnormalized.data[m * frames..(m + 1) * frames];
        let log_tol: Vec<f64> = row
            .iter()
            .map(|&v| {
                let mel = (f64::from(v).exp() - guard).max(0.0);
                1e-4 + 2.0 * dx * (pair.fb_row_sums[m] * mel).sqrt() / (mel + guard)
            })
            .collect();
        let out = &mut tol[m * frames..(m + 1) * frames];
        match cfg.normalization {
            FeatureNormalization::None => out.copy_from_slice(&log_tol),
            // One frame has no deviation: both sides give exactly 0.
            FeatureNormalization::PerFeature if frames == 1 => out.fill(0.0),
            FeatureNormalization::PerFeature => {
                let n = frames as f64;
                let mean = row.iter().map(|v| f64::from(*v)).sum::<f64>() / n;
                let std = if frames > 1 {
                    (row.iter()
                        .map(|v| (f64::from(*v) - mean).powi(2))
                        .sum::<f64>()
                        / (n - 1.0))
                        .sqrt()
                } else {
                    0.0
                };
                // Error of the mean: the mean error. Error of σ: the rms of (v error − mean
                // error), with the N−1 divisor.
                let mean_tol = log_tol.iter().sum::<f64>() / n;
                let rms_tol = (log_tol.iter().map(|t| t * t).sum::<f64>() / n).sqrt();
                let std_tol = (rms_tol + mean_tol) * (n / (n - 1.0)).sqrt();
                let denom = std + 1e-5;
                for ((slot, &v), lt) in out.iter_mut().zip(row).zip(&log_tol) {
                    let z = ((f64::from(v) - mean) / denom).abs();
                    *slot = (lt + mean_tol + z * std_tol) / denom + 1e-5 * (1.0 + z);
                }
            }
        }
    }
    tol
}

/// Runs one batch on the GPU into a poisoned buffer and checks every clip against the CPU.
/// Returns the failures (all clips are checked before a test fails).
fn check_batch(engine: &CudaEngine, pair: &Pair, label: &str, clips: &[Vec<f32>]) -> Vec<String> {
    let refs: Vec<&[f32]> = clips.iter().map(Vec::as_slice).collect();
    let layout = pair.gpu.layout(refs.iter().map(|c| c.len()));
    let n = layout.elements();
    // One element more than the layout: it must stay NaN.
    let mut out = poisoned_f32(engine, n + 1);
    let got_layout = match pair.gpu.compute_into(engine, &refs, &mut out) {
        Ok(layout) => layout,
        Err(e) => return vec![format!("{label}: compute failed: {e}")],
    };
    let host = match engine.download(&out) {
        Ok(host) => host,
        Err(e) => return vec![format!("{label}: download failed: {e}")],
    };
    let mut failures = Vec::new();
    if got_layout != layout {
        failures.push(format!(
            "{label}: layout {got_layout:?}, expected {layout:?}"
        ));
    }
    failures.extend(verify(pair, label, clips, &layout, &host));
    failures
}

/// Checks a downloaded `[batch, time, n_mels]` result (followed by at least one element that
/// was poisoned and must still be NaN) against the CPU, clip by clip.
fn verify(
    pair: &Pair,
    label: &str,
    clips: &[Vec<f32>],
    layout: &FeatureLayout,
    host: &[f32],
) -> Vec<String> {
    let n = layout.elements();
    let mut failures = Vec::new();
    if host.len() <= n {
        return vec![format!(
            "{label}: {} elements for a layout of {n}",
            host.len()
        )];
    }
    if !host[n].is_nan() {
        failures.push(format!("{label}: wrote past the layout ({})", host[n]));
    }
    let (time, n_mels) = (layout.time, layout.n_mels);
    for (b, pcm) in clips.iter().enumerate() {
        let want = pair.cpu.compute(pcm);
        let name = format!("{label} clip {b} ({} samples)", pcm.len());
        if layout.frames[b] != want.n_frames {
            failures.push(format!(
                "{name}: {} frames, CPU {}",
                layout.frames[b], want.n_frames
            ));
            continue;
        }
        let clip = &host[b * time * n_mels..(b + 1) * time * n_mels];
        let padding_ok = clip[want.n_frames * n_mels..].iter().all(|v| *v == 0.0);
        if !padding_ok {
            failures.push(format!("{name}: padded frames are not all zero"));
        }
        // GPU [time, n_mels] -> the CPU's [n_mels, frames].
        let frames = want.n_frames;
        let mut got = vec![0.0f32; n_mels * frames];
        for t in 0..frames {
            for m in 0..n_mels {
                got[m * frames + t] = clip[t * n_mels + m];
            }
        }
        // Normalised digital silence: every frame is log(guard), so exactly 0 on both sides.
        // (Unnormalised it is log(guard) itself, where logf may differ by an ulp: tolerance.)
        let silent = pcm.iter().all(|v| *v == 0.0);
        if silent && pair.cfg.normalization == FeatureNormalization::PerFeature {
            if !got.iter().all(|v| *v == 0.0) {
                failures.push(format!("{name}: digital silence is not exactly zero"));
            }
            continue;
        }
        let unnormalized = pair.cpu_unnormalized.compute(pcm);
        let tol = tolerance(pair, pcm, &unnormalized);
        let want: Vec<f64> = want.data.iter().map(|v| f64::from(*v)).collect();
        if let Err(message) = check_close(&name, &got, &want, |i| tol[i]) {
            failures.push(message);
        }
    }
    failures
}

fn fixture_clips() -> Result<Vec<Vec<f32>>> {
    CLIPS
        .iter()
        .map(|clip| read_wav(&fixtures().join("clips").join(format!("{clip}.wav"))))
        .collect()
}

#[test]
fn fixture_clips_match_the_cpu_extractor() -> Result<()> {
    let Some(engine) = engine("fixture_clips_match_the_cpu_extractor") else {
        return Ok(());
    };
    let clips = fixture_clips()?;
    let mut failures = Vec::new();
    for model in MODELS {
        let ckpt = Checkpoint::load(&fixtures().join(model).join("model.nemo"))?;
        let (fb, window) = stored(&ckpt)?;
        let p = pair(&engine, &ckpt.config.features, &fb, &window)?;
        // from_checkpoint must build the same extractor as the explicit tensors.
        let from_ckpt = GpuFeatures::from_checkpoint(&engine, &ckpt)?;
        ensure!(
            from_ckpt.config() == p.gpu.config(),
            "{model}: config differs"
        );
        for (clip, pcm) in CLIPS.iter().zip(&clips) {
            failures.extend(check_batch(
                &engine,
                &p,
                &format!("{model} {clip} alone"),
                std::slice::from_ref(pcm),
            ));
        }
        failures.extend(check_batch(
            &engine,
            &p,
            &format!("{model} all clips batched"),
            &clips,
        ));
    }
    ensure!(failures.is_empty(), "failures: {failures:#?}");
    Ok(())
}

/// A random clip of one of several kinds, `len` samples.
fn random_clip(rng: &mut Rng, len: usize) -> (String, Vec<f32>) {
    let level = 10f64.powf(-4.0 * rng.uniform());
    match rng.below(6) {
        0 => (
            format!("noise {level:.1e}"),
            rng.f32_vec(len, 0.0, level * 0.3),
        ),
        1 => {
            let f = 50.0 + rng.uniform() * 7000.0;
            let noise = rng.f32_vec(len, 0.0, level * 0.01);
            let tone = (0..len)
                .map(|i| {
                    let phase = std::f64::consts::TAU * f * i as f64 / 16_000.0;
                    (level * 0.5 * phase.sin()) as f32 + noise[i]
                })
                .collect();
            (format!("tone {f:.0} Hz {level:.1e}"), tone)
        }
        2 => {
            // Moving average of 8: almost no energy near Nyquist (mel bins at the guard).
            let white = rng.f32_vec(len + 8, 0.0, level);
            let smooth = (0..len)
                .map(|i| white[i..i + 8].iter().sum::<f32>() / 8.0)
                .collect();
            (format!("band-limited {level:.1e}"), smooth)
        }
        3 => {
            let dc = (level * 0.2) as f32;
            let mut x = rng.f32_vec(len, 0.0, level * 1e-3);
            x.iter_mut().for_each(|v| *v += dc);
            (format!("dc {dc:.1e}"), x)
        }
        4 => ("silence".into(), vec![0.0; len]),
        _ => {
            // Loud and quiet halves: per-frame energies spanning orders of magnitude.
            let mut x = rng.f32_vec(len, 0.0, 0.5);
            let half = len / 2;
            x[half..].iter_mut().for_each(|v| *v *= 1e-3);
            ("loud then quiet".into(), x)
        }
    }
}

fn random_length(rng: &mut Rng, win: usize) -> usize {
    match rng.below(4) {
        0 => rng.below(win),             // shorter than one window (0 included)
        1 => win + rng.below(2_000),     // a few frames
        _ => 16_000 + rng.below(48_000), // 1 to 4 seconds
    }
}

#[test]
fn random_audio_matches_the_cpu_extractor_in_every_variant() -> Result<()> {
    let Some(engine) = engine("random_audio_matches_the_cpu_extractor_in_every_variant") else {
        return Ok(());
    };
    let mut rng = Rng::fresh("random_audio_matches_the_cpu_extractor_in_every_variant");
    let ckpt = Checkpoint::load(&fixtures().join(MODELS[0]).join("model.nemo"))?;
    let (fb, window) = stored(&ckpt)?;
    let base = ckpt.config.features.clone();
    let mut failures = Vec::new();
    for padding in [StftPadding::Zeros, StftPadding::Reflect] {
        for normalization in [FeatureNormalization::PerFeature, FeatureNormalization::None] {
            let cfg = FeatureConfig {
                stft_padding: padding,
                normalization,
                ..base.clone()
            };
            let p = pair(&engine, &cfg, &fb, &window)?;
            let win = cfg.win_length_samples;
            // Edge lengths first, in one batch.
            let edges = [
                0,
                1,
                2,
                cfg.hop_length_samples - 1,
                cfg.hop_length_samples,
                win - 1,
            ];
            let edge_clips: Vec<Vec<f32>> = edges
                .iter()
                .map(|&len| random_clip(&mut rng, len).1)
                .collect();
            failures.extend(check_batch(
                &engine,
                &p,
                &format!("{padding:?}/{normalization:?} edge lengths {edges:?}"),
                &edge_clips,
            ));
            // Large, small, then large again: the second and third reuse a workspace holding
            // the previous batch's values.
            for batch in [7, 2, 5, 1] {
                let mut kinds = Vec::new();
                let clips: Vec<Vec<f32>> = (0..batch)
                    .map(|_| {
                        let len = random_length(&mut rng, win);
                        let (kind, clip) = random_clip(&mut rng, len);
                        kinds.push(format!("{kind} x{len}"));
                        clip
                    })
                    .collect();
                failures.extend(check_batch(
                    &engine,
                    &p,
                    &format!("{padding:?}/{normalization:?} batch [{}]", kinds.join(", ")),
                    &clips,
                ));
            }
        }
    }
    ensure!(failures.is_empty(), "failures: {failures:#?}");
    Ok(())
}

#[test]
fn recycled_output_buffers_are_reused_and_fully_rewritten() -> Result<()> {
    let Some(engine) = engine("recycled_output_buffers_are_reused_and_fully_rewritten") else {
        return Ok(());
    };
    let mut rng = Rng::fresh("recycled_output_buffers_are_reused_and_fully_rewritten");
    let ckpt = Checkpoint::load(&fixtures().join(MODELS[0]).join("model.nemo"))?;
    let (fb, window) = stored(&ckpt)?;
    let p = pair(&engine, &ckpt.config.features, &fb, &window)?;
    let mut failures = Vec::new();
    let mut previous_len = 0;
    // Large first; each later (smaller) batch must land in the recycled, poisoned buffer.
    for (round, (batch, max_len)) in [(4usize, 48_000usize), (3, 30_000), (1, 20_000)]
        .into_iter()
        .enumerate()
    {
        // The first clip is the longest, so every round needs less than the one before.
        let clips: Vec<Vec<f32>> = (0..batch)
            .map(|i| {
                let len = if i == 0 {
                    max_len
                } else {
                    16_000 + rng.below(max_len - 16_000)
                };
                random_clip(&mut rng, len).1
            })
            .collect();
        let refs: Vec<&[f32]> = clips.iter().map(Vec::as_slice).collect();
        let mut computed = p.gpu.compute(&engine, &refs)?;
        let len = computed.data.len();
        if round > 0 && len != previous_len {
            failures.push(format!(
                "round {round}: a new buffer of {len} instead of the recycled {previous_len}"
            ));
        }
        // A fresh buffer must still have room for the poisoned element `verify` looks at.
        if len <= computed.layout.elements() {
            let mut longer = poisoned_f32(&engine, computed.layout.elements() + 1);
            p.gpu.compute_into(&engine, &refs, &mut longer)?;
            computed.data = longer;
        }
        let host = engine.download(&computed.data)?;
        failures.extend(verify(
            &p,
            &format!("round {round} ({batch} clips)"),
            &clips,
            &computed.layout,
            &host,
        ));
        // Poison before handing it back: the next round must overwrite its whole layout.
        let mut data = computed.data;
        engine.upload_into(&vec![f32::NAN; data.len()], &mut data)?;
        previous_len = data.len();
        p.gpu.recycle(data);
    }
    ensure!(failures.is_empty(), "failures: {failures:#?}");
    Ok(())
}

#[test]
fn prepare_device_feeds_the_encoder_like_prepare() -> Result<()> {
    let Some(engine) = engine("prepare_device_feeds_the_encoder_like_prepare") else {
        return Ok(());
    };
    let ckpt = Checkpoint::load(&fixtures().join(MODELS[0]).join("model.nemo"))?;
    let encoder: GpuEncoder = GpuEncoder::from_checkpoint(&engine, &ckpt)?;
    let gpu_features = GpuFeatures::from_checkpoint(&engine, &ckpt)?;
    let cpu_features = FeatureExtractor::from_checkpoint(&ckpt)?;
    let clips = fixture_clips()?;
    let refs: Vec<&[f32]> = clips.iter().map(Vec::as_slice).collect();
    let host: Vec<Features> = clips.iter().map(|c| cpu_features.compute(c)).collect();
    let host_refs: Vec<&Features> = host.iter().collect();

    let from_host = encoder.prepare(&engine, &host_refs)?;
    let from_device = encoder.prepare_device(&engine, &gpu_features, &refs)?;
    let want = encoder.download(&engine, &encoder.run(&engine, &from_host)?)?;
    let got = encoder.download(&engine, &encoder.run(&engine, &from_device)?)?;
    let mut failures = Vec::new();
    for ((clip, g), w) in CLIPS.iter().zip(&got).zip(&want) {
        if g.frames != w.frames || g.dim != w.dim {
            failures.push(format!(
                "{clip}: {}x{} vs {}x{}",
                g.frames, g.dim, w.frames, w.dim
            ));
            continue;
        }
        let (mut err, mut norm) = (0.0f64, 0.0f64);
        for (a, b) in g.data.iter().zip(&w.data) {
            err += (f64::from(*a) - f64::from(*b)).powi(2);
            norm += f64::from(*b).powi(2);
        }
        let rel = (err / norm.max(f64::MIN_POSITIVE)).sqrt();
        eprintln!("RESULT encoder from device features vs host features, {clip}: rel L2 {rel:.2e}");
        // The feature difference (≲1e-4) only flips occasional bf16 roundings inside the
        // encoder; 1e-2 is the encoder's own tolerance against the f32 CPU engine, far below
        // what a layout or length error gives.
        if rel.is_nan() || rel > 1e-2 {
            failures.push(format!("{clip}: rel L2 {rel:.2e}"));
        }
    }
    ensure!(failures.is_empty(), "failures: {failures:#?}");
    Ok(())
}

#[test]
fn checkpoints_without_stored_arrays_work_and_wrong_widths_are_refused() -> Result<()> {
    let Some(engine) =
        engine("checkpoints_without_stored_arrays_work_and_wrong_widths_are_refused")
    else {
        return Ok(());
    };
    let ckpt = Checkpoint::load(&fixtures().join(MODELS[0]).join("model.nemo"))?;
    // Without the stored filterbank and window: the computed ones, the same as the CPU's.
    let tensors: BTreeMap<String, Tensor> = ckpt
        .tensors
        .names()
        .filter(|name| *name != FILTERBANK && *name != WINDOW)
        .filter_map(|name| {
            ckpt.tensors
                .get_any_shape(name)
                .map(|t| (name.to_owned(), t.clone()))
        })
        .collect();
    let stripped = Checkpoint {
        config: ckpt.config.clone(),
        tensors: TensorMap::new(ckpt.tensors.source.clone(), tensors),
        vocabulary: ckpt.vocabulary.clone(),
    };
    let computed_gpu = GpuFeatures::from_checkpoint(&engine, &stripped)?;
    let computed_cpu = FeatureExtractor::from_checkpoint(&stripped)?;
    let pcm: Vec<f32> = (0..24_000)
        .map(|i| 0.1 * (i as f32 * 0.013).sin())
        .collect();
    let got = computed_gpu.compute(&engine, &[pcm.as_slice()])?;
    let want = computed_cpu.compute(&pcm);
    let got_host = engine.download(&got.data)?;
    let mut max_err = 0.0f32;
    for m in 0..want.n_mels {
        for t in 0..want.n_frames {
            let g = got_host[t * want.n_mels + m];
            max_err = max_err.max((g - want.data[m * want.n_frames + t]).abs());
        }
    }
    eprintln!("RESULT computed filterbank and window: max_abs_err={max_err:.3e}");
    ensure!(
        max_err < 1e-2,
        "computed filterbank/window features differ from the CPU by {max_err}"
    );
    // Features of another width than the encoder takes.
    let encoder: GpuEncoder = GpuEncoder::from_checkpoint(&engine, &ckpt)?;
    let n_mels = ckpt.config.features.n_mels + 1;
    let n_freq = ckpt.config.features.n_fft / 2 + 1;
    let wide = FeatureConfig {
        n_mels,
        ..ckpt.config.features.clone()
    };
    let wide_fb = Tensor::new(vec![n_mels, n_freq], vec![0.01; n_mels * n_freq]);
    let (_, window) = stored(&ckpt)?;
    let wide_features = GpuFeatures::from_extractor(
        &engine,
        &FeatureExtractor::new(&wide, Some(&wide_fb), Some(&window))?,
    )?;
    let pcm = vec![0.1f32; 16_000];
    match encoder.prepare_device(&engine, &wide_features, &[pcm.as_slice()]) {
        Err(CudaEngineError::Shape { .. }) => {}
        Err(other) => anyhow::bail!("wrong error for mismatched mels: {other}"),
        Ok(_) => anyhow::bail!("accepted features of the wrong width"),
    }
    engine.synchronize().context("stream after the refusals")?;
    Ok(())
}

#[test]
#[ignore = "timing run for the GPU machine"]
fn features_throughput() -> Result<()> {
    let Some(engine) = engine("features_throughput") else {
        return Ok(());
    };
    let mut rng = Rng::fresh("features_throughput");
    let ckpt = Checkpoint::load(&fixtures().join(MODELS[0]).join("model.nemo"))?;
    let gpu = GpuFeatures::from_checkpoint(&engine, &ckpt)?;
    let cpu = FeatureExtractor::from_checkpoint(&ckpt)?;
    for (batch, seconds) in [(1usize, 10usize), (16, 25), (64, 25)] {
        let clips: Vec<Vec<f32>> = (0..batch)
            .map(|_| rng.f32_vec(seconds * 16_000, 0.0, 0.1))
            .collect();
        let refs: Vec<&[f32]> = clips.iter().map(Vec::as_slice).collect();
        // Warm: workspace sized, cuBLASLt heuristics cached.
        gpu.compute(&engine, &refs)?;
        engine.synchronize()?;
        let runs = 5;
        let started = std::time::Instant::now();
        for _ in 0..runs {
            gpu.compute(&engine, &refs)?;
        }
        engine.synchronize()?;
        let gpu_ms = started.elapsed().as_secs_f64() * 1e3 / runs as f64;
        let started = std::time::Instant::now();
        cpu.compute(&clips[0]);
        let cpu_ms = started.elapsed().as_secs_f64() * 1e3 * batch as f64;
        eprintln!(
            "RESULT features {batch} x {seconds} s: GPU {gpu_ms:.2} ms per batch (upload \
             included), CPU one thread {cpu_ms:.0} ms"
        );
    }
    Ok(())
}
