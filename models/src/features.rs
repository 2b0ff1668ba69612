//! Log-mel features exactly as NeMo's `FilterbankFeatures` computes them at inference:
//! preemphasis (first sample kept), centred STFT (zero or reflect padding), power spectrum,
//! mel filterbank, `log(mel + guard)`, per-feature normalisation over the valid frames.

use std::sync::Arc;

use rustfft::num_complex::Complex32;
use rustfft::{Fft, FftPlanner};

use crate::error::ModelError;
use crate::linalg::matmul;
use crate::tensor::Tensor;
use model_core::config::{FeatureConfig, FeatureNormalization, StftPadding};

/// Added to the per-feature standard deviation (NeMo's `CONSTANT`).
const NORMALIZE_STD_EPS: f32 = 1e-5;

/// Log-mel features of one utterance, `[n_mels, n_frames]` row-major (NeMo's `[features, T]`),
/// valid frames only.
#[derive(Debug, Clone, PartialEq)]
pub struct Features {
    pub n_mels: usize,
    pub n_frames: usize,
    pub data: Vec<f32>,
}

/// Computes [`Features`] from 16 kHz mono PCM. The FFT is planned once.
pub struct FeatureExtractor {
    cfg: FeatureConfig,
    /// `[n_mels, n_fft / 2 + 1]`.
    filterbank: Vec<f32>,
    /// The analysis window zero-padded and centred in `n_fft`.
    window: Vec<f32>,
    fft: Arc<dyn Fft<f32>>,
}

impl std::fmt::Debug for FeatureExtractor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeatureExtractor")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

const FILTERBANK: &str = "preprocessor.featurizer.fb";
const WINDOW: &str = "preprocessor.featurizer.window";

fn invalid(key: &str, problem: String) -> ModelError {
    ModelError::InvalidConfig {
        file: "preprocessor".into(),
        key: key.to_string(),
        problem,
    }
}

impl FeatureExtractor {
    /// The extractor a checkpoint describes, with its stored filterbank and window if present.
    pub fn from_checkpoint(ckpt: &crate::checkpoint::Checkpoint) -> Result<Self, ModelError> {
        let cfg = &ckpt.config.features;
        let n_freq = cfg.n_fft / 2 + 1;
        let filterbank = ckpt
            .tensors
            .get_optional(FILTERBANK, &[1, cfg.n_mels, n_freq])?;
        let window = ckpt
            .tensors
            .get_optional(WINDOW, &[cfg.win_length_samples])?;
        Self::new(cfg, filterbank, window)
    }

    /// `filterbank` (`preprocessor.featurizer.fb`, `[1, n_mels, n_fft/2+1]`) and `window`
    /// (`preprocessor.featurizer.window`, `[win_length]`) are used when given; otherwise a
    /// slaney mel filterbank and a symmetric Hann window are computed.
    pub fn new(
        cfg: &FeatureConfig,
        filterbank: Option<&Tensor>,
        window: Option<&Tensor>,
    ) -> Result<Self, ModelError> {
        let n_fft = cfg.n_fft;
        let win = cfg.win_length_samples;
        if n_fft == 0 || win == 0 || win > n_fft || cfg.hop_length_samples == 0 || cfg.n_mels == 0 {
            return Err(invalid(
                "n_fft/window_size/window_stride/features",
                format!(
                    "n_fft {n_fft}, window {win}, hop {}, mels {} cannot form an STFT",
                    cfg.hop_length_samples, cfg.n_mels
                ),
            ));
        }
        let n_freq = n_fft / 2 + 1;
        let filterbank = match filterbank {
            Some(t) => {
                if t.shape != [1, cfg.n_mels, n_freq] && t.shape != [cfg.n_mels, n_freq] {
                    return Err(invalid(
                        "preprocessor.featurizer.fb",
                        format!(
                            "shape {:?}, expected [1, {}, {n_freq}]",
                            t.shape, cfg.n_mels
                        ),
                    ));
                }
                t.data.clone()
            }
            None => slaney_mel_filterbank(
                cfg.sample_rate_hz as f64,
                n_fft,
                cfg.n_mels,
                cfg.low_freq_hz as f64,
                cfg.high_freq_hz as f64,
            ),
        };
        let short_window = match window {
            Some(t) => {
                if t.shape != [win] {
                    return Err(invalid(
                        "preprocessor.featurizer.window",
                        format!("shape {:?}, expected [{win}]", t.shape),
                    ));
                }
                t.data.clone()
            }
            None => symmetric_hann(win),
        };
        // torch.stft pads a shorter window on both sides to centre it in n_fft.
        let offset = (n_fft - win) / 2;
        let mut window = vec![0.0; n_fft];
        window[offset..offset + win].copy_from_slice(&short_window);
        let fft = FftPlanner::<f32>::new().plan_fft_forward(n_fft);
        Ok(Self {
            cfg: cfg.clone(),
            filterbank,
            window,
            fft,
        })
    }

    pub fn config(&self) -> &FeatureConfig {
        &self.cfg
    }

    /// The mel filterbank, `[n_mels, n_fft / 2 + 1]` row-major (the checkpoint's or Slaney's).
    pub fn filterbank(&self) -> &[f32] {
        &self.filterbank
    }

    /// The analysis window, zero-padded and centred in `n_fft` samples (the checkpoint's or a
    /// symmetric Hann window).
    pub fn window(&self) -> &[f32] {
        &self.window
    }

    /// Number of valid feature frames for `n_samples` samples.
    pub fn valid_frames(&self, n_samples: usize) -> usize {
        if n_samples == 0 {
            return 0;
        }
        let frames = n_samples / self.cfg.hop_length_samples;
        match self.cfg.stft_padding {
            StftPadding::Zeros => frames,
            StftPadding::Reflect => frames + 1,
        }
    }

    pub fn compute(&self, pcm_16k: &[f32]) -> Features {
        let n_mels = self.cfg.n_mels;
        let n_frames = self.valid_frames(pcm_16k.len());
        let signal = self.preemphasize(pcm_16k);
        let power = self.power_spectrogram(&signal, n_frames);

        let n_freq = self.cfg.n_fft / 2 + 1;
        let mut data = vec![0.0; n_mels * n_frames];
        matmul(
            &self.filterbank,
            n_mels,
            n_freq,
            &power,
            n_frames,
            &mut data,
        );
        let guard = self.cfg.log_zero_guard;
        for v in data.iter_mut() {
            *v = (*v + guard).ln();
        }
        if self.cfg.normalization == FeatureNormalization::PerFeature {
            normalize_per_feature(&mut data, n_frames);
        }
        Features {
            n_mels,
            n_frames,
            data,
        }
    }

    fn preemphasize(&self, pcm: &[f32]) -> Vec<f32> {
        match self.cfg.preemphasis {
            Some(a) if !pcm.is_empty() => {
                let mut out = Vec::with_capacity(pcm.len());
                out.push(pcm[0]);
                out.extend(pcm.windows(2).map(|w| w[1] - a * w[0]));
                out
            }
            _ => pcm.to_vec(),
        }
    }

    /// `[n_freq, n_frames]` power spectrogram of the first `n_frames` centred STFT frames.
    fn power_spectrogram(&self, signal: &[f32], n_frames: usize) -> Vec<f32> {
        let n_fft = self.cfg.n_fft;
        let hop = self.cfg.hop_length_samples;
        let n_freq = n_fft / 2 + 1;
        let half = (n_fft / 2) as isize;
        let len = signal.len() as isize;
        let mut out = vec![0.0; n_freq * n_frames];
        let mut buf = vec![Complex32::new(0.0, 0.0); n_fft];
        let mut scratch = vec![Complex32::new(0.0, 0.0); self.fft.get_inplace_scratch_len()];
        for frame in 0..n_frames {
            let start = (frame * hop) as isize - half;
            for (i, (b, w)) in buf.iter_mut().zip(&self.window).enumerate() {
                let sample = self.padded_sample(signal, start + i as isize, len);
                *b = Complex32::new(sample * w, 0.0);
            }
            self.fft.process_with_scratch(&mut buf, &mut scratch);
            for (k, c) in buf.iter().take(n_freq).enumerate() {
                // torch: |X| = sqrt(re² + im²), then |X|^mag_power.
                let magnitude = (c.re * c.re + c.im * c.im).sqrt();
                out[k * n_frames + frame] = if self.cfg.mag_power == 2.0 {
                    magnitude * magnitude
                } else if self.cfg.mag_power == 1.0 {
                    magnitude
                } else {
                    magnitude.powf(self.cfg.mag_power)
                };
            }
        }
        out
    }

    /// Sample `index` of the centre-padded signal (`index` relative to the signal start).
    fn padded_sample(&self, signal: &[f32], index: isize, len: isize) -> f32 {
        if (0..len).contains(&index) {
            return signal[index as usize];
        }
        match self.cfg.stft_padding {
            StftPadding::Zeros => 0.0,
            StftPadding::Reflect => {
                if len == 1 {
                    return signal[0];
                }
                // Reflection without repeating the edge sample, folded until it lands inside.
                let period = 2 * (len - 1);
                let mut i = index.rem_euclid(period);
                if i >= len {
                    i = period - i;
                }
                signal[i as usize]
            }
        }
    }
}

/// Per mel bin: subtract the mean and divide by (N−1 standard deviation + 1e-5), over the
/// valid frames. A single frame has no deviation (NeMo maps the NaN to 0), so it becomes 0.
fn normalize_per_feature(data: &mut [f32], n_frames: usize) {
    if n_frames == 0 {
        return;
    }
    for row in data.chunks_exact_mut(n_frames) {
        let n = n_frames as f64;
        let mean = row.iter().map(|v| *v as f64).sum::<f64>() / n;
        let sq: f64 = row
            .iter()
            .map(|v| {
                let d = *v as f64 - mean;
                d * d
            })
            .sum();
        let std = if n_frames > 1 {
            (sq / (n - 1.0)).sqrt() as f32
        } else {
            0.0
        };
        let denom = std + NORMALIZE_STD_EPS;
        let mean = mean as f32;
        for v in row.iter_mut() {
            *v = (*v - mean) / denom;
        }
    }
}

/// `torch.hann_window(n, periodic=False)`.
fn symmetric_hann(n: usize) -> Vec<f32> {
    if n == 1 {
        return vec![1.0];
    }
    (0..n)
        .map(|i| {
            let phase = 2.0 * std::f64::consts::PI * i as f64 / (n - 1) as f64;
            (0.5 - 0.5 * phase.cos()) as f32
        })
        .collect()
}

/// Slaney mel scale (librosa `hz_to_mel(htk=False)`): linear below 1 kHz, logarithmic above.
fn hz_to_mel(hz: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = (6.4f64).ln() / 27.0;
    if hz >= min_log_hz {
        min_log_mel + (hz / min_log_hz).ln() / logstep
    } else {
        hz / f_sp
    }
}

fn mel_to_hz(mel: f64) -> f64 {
    let f_sp = 200.0 / 3.0;
    let min_log_hz = 1000.0;
    let min_log_mel = min_log_hz / f_sp;
    let logstep = (6.4f64).ln() / 27.0;
    if mel >= min_log_mel {
        min_log_hz * (logstep * (mel - min_log_mel)).exp()
    } else {
        f_sp * mel
    }
}

/// librosa `filters.mel(sr, n_fft, n_mels, fmin, fmax, htk=False, norm="slaney")`,
/// `[n_mels, n_fft/2+1]`.
fn slaney_mel_filterbank(sr: f64, n_fft: usize, n_mels: usize, fmin: f64, fmax: f64) -> Vec<f32> {
    let n_freq = n_fft / 2 + 1;
    let fft_freqs: Vec<f64> = (0..n_freq)
        .map(|i| i as f64 * (sr / 2.0) / (n_freq - 1).max(1) as f64)
        .collect();
    let (mel_min, mel_max) = (hz_to_mel(fmin), hz_to_mel(fmax));
    let mel_points: Vec<f64> = (0..n_mels + 2)
        .map(|i| mel_to_hz(mel_min + (mel_max - mel_min) * i as f64 / (n_mels + 1) as f64))
        .collect();
    let mut weights = vec![0.0f32; n_mels * n_freq];
    for m in 0..n_mels {
        let (lo, centre, hi) = (mel_points[m], mel_points[m + 1], mel_points[m + 2]);
        let enorm = 2.0 / (hi - lo);
        for (k, f) in fft_freqs.iter().enumerate() {
            let lower = (f - lo) / (centre - lo);
            let upper = (hi - f) / (hi - centre);
            let w = lower.min(upper).max(0.0) as f32;
            weights[m * n_freq + k] = (w as f64 * enorm) as f32;
        }
    }
    weights
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(padding: StftPadding) -> FeatureConfig {
        FeatureConfig {
            sample_rate_hz: 16000,
            win_length_samples: 400,
            hop_length_samples: 160,
            n_fft: 512,
            n_mels: 80,
            preemphasis: Some(0.97),
            mag_power: 2.0,
            log_zero_guard: 2f32.powi(-24),
            normalization: FeatureNormalization::PerFeature,
            stft_padding: padding,
            low_freq_hz: 0.0,
            high_freq_hz: 8000.0,
        }
    }

    #[test]
    fn frame_counts_follow_the_padding_variant() {
        let zeros = FeatureExtractor::new(&config(StftPadding::Zeros), None, None).expect("new");
        let reflect =
            FeatureExtractor::new(&config(StftPadding::Reflect), None, None).expect("new");
        assert_eq!(zeros.valid_frames(16000), 100);
        assert_eq!(reflect.valid_frames(16000), 101);
        assert_eq!(zeros.valid_frames(159), 0);
        assert_eq!(zeros.valid_frames(0), 0);
        let pcm: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.05).sin()).collect();
        assert_eq!(reflect.compute(&pcm).n_frames, 7);
        let f = zeros.compute(&pcm);
        assert_eq!((f.n_mels, f.n_frames, f.data.len()), (80, 6, 480));
        assert!(f.data.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn reflect_padding_mirrors_without_repeating_the_edge() {
        let fx = FeatureExtractor::new(&config(StftPadding::Reflect), None, None).expect("new");
        let signal = [10.0, 11.0, 12.0, 13.0];
        let at = |i: isize| fx.padded_sample(&signal, i, 4);
        assert_eq!([at(-1), at(-2), at(-3)], [11.0, 12.0, 13.0]);
        assert_eq!([at(4), at(5), at(6)], [12.0, 11.0, 10.0]);
        // Longer than the signal: keeps folding (torch would refuse; we stay defined).
        assert_eq!([at(-4), at(7), at(9)], [12.0, 11.0, 13.0]);
        let zeros = FeatureExtractor::new(&config(StftPadding::Zeros), None, None).expect("new");
        assert_eq!(zeros.padded_sample(&signal, -1, 4), 0.0);
        assert_eq!(zeros.padded_sample(&signal, 4, 4), 0.0);
    }

    #[test]
    fn digital_silence_gives_zero_features() {
        let fx = FeatureExtractor::new(&config(StftPadding::Zeros), None, None).expect("new");
        let f = fx.compute(&vec![0.0; 16000]);
        assert_eq!(f.n_frames, 100);
        assert!(f.data.iter().all(|v| *v == 0.0));
        assert_eq!(fx.compute(&[]).n_frames, 0);
    }

    #[test]
    fn single_frame_normalises_to_zero() {
        let zeros = FeatureExtractor::new(&config(StftPadding::Zeros), None, None).expect("new");
        let pcm: Vec<f32> = (0..200).map(|i| (i as f32 * 0.3).sin()).collect();
        let f = zeros.compute(&pcm);
        assert_eq!(f.n_frames, 1);
        assert!(f.data.iter().all(|v| *v == 0.0));
    }

    #[test]
    fn slaney_filterbank_rows_are_triangles() {
        let fb = slaney_mel_filterbank(16000.0, 512, 128, 0.0, 8000.0);
        assert_eq!(fb.len(), 128 * 257);
        for row in fb.chunks_exact(257) {
            assert!(row.iter().all(|v| *v >= 0.0));
            assert!(row.iter().any(|v| *v > 0.0));
        }
    }
}
