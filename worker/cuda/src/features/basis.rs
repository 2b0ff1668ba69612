//! The host-side constants of the device features: the window-folded real DFT basis.

use model_core::config::FeatureConfig;

/// Samples of a frame that the window covers: the centred window's offset inside `n_fft`, and
/// its length. Only these samples reach the DFT, so the basis is `win` wide, not `n_fft`.
pub(crate) fn window_span(cfg: &FeatureConfig) -> (usize, usize) {
    let win = cfg.win_length_samples;
    ((cfg.n_fft - win) / 2, win)
}

/// `[2 * n_freq, win]` row-major: row `k < n_freq` is `w[i] · cos(2π k (offset + i) / n_fft)`,
/// row `n_freq + k` is `−w[i] · sin(…)`, for the window's samples `i` (`n_freq = n_fft / 2 + 1`).
/// A frame's window span times this basis, transposed, is its windowed DFT (real, imaginary).
/// Computed in f64 and rounded once; the phase is reduced modulo `n_fft` exactly in integers.
pub(crate) fn dft_basis(n_fft: usize, offset: usize, window: &[f32]) -> Vec<f32> {
    let n_freq = n_fft / 2 + 1;
    let win = window.len();
    let mut basis = vec![0.0f32; 2 * n_freq * win];
    let (cos_rows, sin_rows) = basis.split_at_mut(n_freq * win);
    for k in 0..n_freq {
        for (i, &w) in window.iter().enumerate() {
            let phase = (k * (offset + i)) % n_fft;
            let angle = std::f64::consts::TAU * phase as f64 / n_fft as f64;
            let w = f64::from(w);
            cos_rows[k * win + i] = (w * angle.cos()) as f32;
            sin_rows[k * win + i] = (-w * angle.sin()) as f32;
        }
    }
    basis
}

/// Valid feature frames of a clip of `n_samples` samples (as `FeatureExtractor::valid_frames`).
pub(crate) fn valid_frames(cfg: &FeatureConfig, n_samples: usize) -> usize {
    if n_samples == 0 {
        return 0;
    }
    let frames = n_samples / cfg.hop_length_samples;
    match cfg.stft_padding {
        model_core::config::StftPadding::Zeros => frames,
        model_core::config::StftPadding::Reflect => frames + 1,
    }
}

#[cfg(test)]
mod tests {
    //! The device algorithm emulated on the host in f32 (framing of the window span, basis
    //! product, power, mel, log, normalisation) against the CPU reference: proves the basis's
    //! phase, offset and window folding, and measures the error the parity test allows for.
    use super::*;
    use model_core::config::{FeatureNormalization, StftPadding};
    use models::tensor::Tensor;
    use models::FeatureExtractor;

    fn config(padding: StftPadding, normalization: FeatureNormalization) -> FeatureConfig {
        FeatureConfig {
            sample_rate_hz: 16000,
            win_length_samples: 400,
            hop_length_samples: 160,
            n_fft: 512,
            n_mels: 80,
            preemphasis: Some(0.97),
            mag_power: 2.0,
            log_zero_guard: 2f32.powi(-24),
            normalization,
            stft_padding: padding,
            low_freq_hz: 0.0,
            high_freq_hz: 8000.0,
        }
    }

    /// Deterministic pseudo-random values in [-1, 1).
    fn noise(n: usize, mut state: u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn hann(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let phase = std::f64::consts::TAU * i as f64 / (n - 1) as f64;
                (0.5 - 0.5 * phase.cos()) as f32
            })
            .collect()
    }

    /// Triangular, non-negative rows (any filterbank works; both sides get the same one).
    fn filterbank(n_mels: usize, n_freq: usize) -> Vec<f32> {
        let mut fb = vec![0.0f32; n_mels * n_freq];
        for m in 0..n_mels {
            let centre = (m + 1) as f64 * n_freq as f64 / (n_mels + 1) as f64;
            let width = 2.0 + 0.05 * centre;
            for k in 0..n_freq {
                let w = 1.0 - (k as f64 - centre).abs() / width;
                fb[m * n_freq + k] = w.max(0.0) as f32 * 0.01;
            }
        }
        fb
    }

    /// What the device computes, with the matmuls as sequential f32 sums.
    fn emulate(cfg: &FeatureConfig, fb: &[f32], window: &[f32], pcm: &[f32]) -> Vec<f32> {
        let (offset, win) = window_span(cfg);
        let n_freq = cfg.n_fft / 2 + 1;
        let basis = dft_basis(cfg.n_fft, offset, window);
        let frames = valid_frames(cfg, pcm.len());
        let a = cfg.preemphasis.unwrap_or(0.0);
        let len = pcm.len() as isize;
        let sample = |mut j: isize| -> f32 {
            if !(0..len).contains(&j) {
                match cfg.stft_padding {
                    StftPadding::Zeros => return 0.0,
                    StftPadding::Reflect if len == 1 => j = 0,
                    StftPadding::Reflect => {
                        let period = 2 * (len - 1);
                        j = j.rem_euclid(period);
                        if j >= len {
                            j = period - j;
                        }
                    }
                }
            }
            let j = j as usize;
            if j == 0 || cfg.preemphasis.is_none() {
                pcm[j]
            } else {
                pcm[j] - a * pcm[j - 1]
            }
        };
        let first = offset as isize - (cfg.n_fft / 2) as isize;
        let mut out = vec![0.0f32; cfg.n_mels * frames];
        for t in 0..frames {
            let span: Vec<f32> = (0..win)
                .map(|i| sample((t * cfg.hop_length_samples) as isize + first + i as isize))
                .collect();
            let dot = |row: usize| -> f32 {
                let b = &basis[row * win..(row + 1) * win];
                span.iter()
                    .zip(b)
                    .fold(0.0f32, |acc, (x, w)| x.mul_add(*w, acc))
            };
            let power: Vec<f32> = (0..n_freq)
                .map(|k| {
                    let (re, im) = (dot(k), dot(n_freq + k));
                    let magnitude = (re * re + im * im).sqrt();
                    magnitude * magnitude
                })
                .collect();
            for m in 0..cfg.n_mels {
                let row = &fb[m * n_freq..(m + 1) * n_freq];
                let mel = row
                    .iter()
                    .zip(&power)
                    .fold(0.0f32, |s, (w, p)| w.mul_add(*p, s));
                out[m * frames + t] = (mel + cfg.log_zero_guard).ln();
            }
        }
        if cfg.normalization == FeatureNormalization::PerFeature && frames > 0 {
            for row in out.chunks_exact_mut(frames) {
                let n = frames as f64;
                let mean = row.iter().map(|v| f64::from(*v)).sum::<f64>() / n;
                let sq: f64 = row.iter().map(|v| (f64::from(*v) - mean).powi(2)).sum();
                let std = if frames > 1 {
                    (sq / (n - 1.0)).sqrt() as f32
                } else {
                    0.0
                };
                for v in row.iter_mut() {
                    *v = (*v - mean as f32) / (std + 1e-5);
                }
            }
        }
        out
    }

    #[test]
    fn basis_rows_are_the_windowed_dft() {
        // Bin 3 of a 32-point DFT, rectangular window over the middle 20 samples.
        let (n_fft, offset, window) = (32usize, 6usize, vec![1.0f32; 20]);
        let basis = dft_basis(n_fft, offset, &window);
        let n_freq = n_fft / 2 + 1;
        assert_eq!(basis.len(), 2 * n_freq * 20);
        for i in 0..20 {
            let n = (offset + i) as f64;
            let want_cos = (std::f64::consts::TAU * 3.0 * n / 32.0).cos();
            let want_sin = -(std::f64::consts::TAU * 3.0 * n / 32.0).sin();
            assert!((f64::from(basis[3 * 20 + i]) - want_cos).abs() < 1e-7);
            assert!((f64::from(basis[(n_freq + 3) * 20 + i]) - want_sin).abs() < 1e-7);
        }
        // Bin 0 is the window itself, its sine row is zero.
        assert!(basis[..20].iter().all(|v| *v == 1.0));
        assert!(basis[n_freq * 20..(n_freq + 1) * 20]
            .iter()
            .all(|v| *v == 0.0));
    }

    #[test]
    fn valid_frames_match_the_cpu_extractor() {
        for padding in [StftPadding::Zeros, StftPadding::Reflect] {
            let cfg = config(padding, FeatureNormalization::PerFeature);
            let cpu = FeatureExtractor::new(&cfg, None, None).expect("extractor");
            for n in [0, 1, 159, 160, 161, 399, 400, 16_000, 16_159, 123_457] {
                assert_eq!(
                    valid_frames(&cfg, n),
                    cpu.valid_frames(n),
                    "{padding:?} {n}"
                );
            }
        }
    }

    /// The largest log-domain error over clips of speech-like levels, noise and near-silence,
    /// both paddings, both normalisations.
    #[test]
    fn emulated_device_algorithm_matches_the_cpu_reference() {
        let n_freq = 257;
        let fb = filterbank(80, n_freq);
        let window = hann(400);
        let fb_tensor = Tensor::new(vec![80, n_freq], fb.clone());
        let window_tensor = Tensor::new(vec![400], window.clone());
        let clips: Vec<Vec<f32>> = vec![
            noise(16_000, 1).iter().map(|v| v * 0.3).collect(),
            noise(3_217, 2).iter().map(|v| v * 1e-4).collect(),
            (0..8_000).map(|i| 0.5 * (i as f32 * 0.07).sin()).collect(),
            noise(150, 3),
            noise(1, 4),
            vec![0.0; 4_000],
        ];
        for padding in [StftPadding::Zeros, StftPadding::Reflect] {
            for normalization in [FeatureNormalization::None, FeatureNormalization::PerFeature] {
                let cfg = config(padding, normalization);
                let cpu = FeatureExtractor::new(&cfg, Some(&fb_tensor), Some(&window_tensor))
                    .expect("extractor");
                for (c, pcm) in clips.iter().enumerate() {
                    let want = cpu.compute(pcm);
                    let got = emulate(&cfg, &fb, &window, pcm);
                    assert_eq!(got.len(), want.data.len());
                    let worst = got
                        .iter()
                        .zip(&want.data)
                        .map(|(g, w)| (g - w).abs())
                        .fold(0.0f32, f32::max);
                    eprintln!("{padding:?} {normalization:?} clip {c}: max |err| {worst:.3e}");
                    assert!(worst < 1e-3, "clip {c}: {worst}");
                }
            }
        }
    }
}
