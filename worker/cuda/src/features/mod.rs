//! Log-mel features on the GPU, equal (to fp32 rounding) to `models::FeatureExtractor::compute`,
//! so the host only decodes audio and uploads PCM.
//!
//! Pipeline for a batch of clips, packed one after another on the device:
//! 1. `feature_frames`: preemphasis and centre padding, the window's span of every frame
//!    (`[batch·time, win]`, zero rows past each clip's frames);
//! 2. fp32 cuBLASLt matmul with the window-folded DFT basis (`[2·n_freq, win]`, built on the host
//!    at load): the real and imaginary parts; `power_spectrum`: `|X|^mag_power`;
//! 3. fp32 matmul with the mel filterbank; `log_mel_normalize`: `log(mel + guard)` and the
//!    per-feature normalisation, written as the encoder's `[batch, time, n_mels]` input.
//!
//! Why a DFT matmul and not an FFT: no extra CUDA library (cuFFT) to load and ship, the matmul
//! runs on the engine's stream like everything else, and at 400 × 514 per frame it is about
//! 2.5 GFLOP per minute of audio (tens of microseconds on an H200). The fp32 compute type
//! (`CUBLAS_COMPUTE_32F`, never TF32) keeps it as accurate as the CPU's f32 FFT (the parity
//! test measures both against each other). Only the window's span (`win` of `n_fft` samples)
//! is multiplied: the zero-padded rest of the window contributes nothing.

mod basis;
mod launch;

use std::sync::{Mutex, PoisonError};

use cudarc::driver::CudaSlice;
use model_core::config::{FeatureConfig, FeatureNormalization, StftPadding};
use models::checkpoint::Checkpoint;
use models::FeatureExtractor;

use crate::device::CudaEngine;
use crate::error::{DriverContext, Result};
use crate::matmul::MatmulSpec;
use crate::ops::check_len;
use basis::{dft_basis, valid_frames, window_span};
use launch::{Framing, LogMel};

/// The feature extractor's constants on one GPU, and its reusable intermediate buffers.
pub struct GpuFeatures {
    cfg: FeatureConfig,
    n_freq: usize,
    /// `[2·n_freq, win]` f32: the window-folded DFT (cosine rows, then sine rows).
    basis: CudaSlice<f32>,
    /// `[n_mels, n_freq]` f32.
    filterbank: CudaSlice<f32>,
    /// Intermediate buffers, grown to the largest batch seen and then reused.
    workspace: Mutex<Option<Workspace>>,
    /// An output buffer handed back by [`GpuFeatures::recycle`], reused by the next `compute`
    /// that fits in it.
    spare_output: Mutex<Option<CudaSlice<f32>>>,
}

/// The shape of a batch's features: `[batch, time, n_mels]`, `time` the longest clip's frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureLayout {
    pub batch: usize,
    pub time: usize,
    pub n_mels: usize,
    /// Valid frames per clip; frames past them are zero.
    pub frames: Vec<usize>,
}

impl FeatureLayout {
    /// Elements of the `[batch, time, n_mels]` buffer.
    pub fn elements(&self) -> usize {
        self.batch * self.time * self.n_mels
    }
}

/// A batch's features on the device.
pub struct DeviceFeatures {
    /// `[batch, time, n_mels]` f32 in its first [`FeatureLayout::elements`] (a recycled buffer
    /// may be longer; at least one element, so an empty batch has a buffer too).
    pub data: CudaSlice<f32>,
    pub layout: FeatureLayout,
}

impl GpuFeatures {
    /// The extractor a checkpoint describes (its stored filterbank and window, or the computed
    /// ones where it has none), exactly as `FeatureExtractor::from_checkpoint` builds it.
    pub fn from_checkpoint(engine: &CudaEngine, ckpt: &Checkpoint) -> Result<Self> {
        Self::from_extractor(engine, &FeatureExtractor::from_checkpoint(ckpt)?)
    }

    /// The GPU twin of a (validated) host extractor: same config, filterbank and window.
    pub fn from_extractor(engine: &CudaEngine, extractor: &FeatureExtractor) -> Result<Self> {
        let cfg = extractor.config();
        // Every variant of the config is implemented; a new one must be added here (and in the
        // kernel) before this compiles.
        match cfg.normalization {
            FeatureNormalization::PerFeature | FeatureNormalization::None => {}
        }
        let (offset, win) = window_span(cfg);
        let basis = dft_basis(cfg.n_fft, offset, &extractor.window()[offset..offset + win]);
        Ok(Self {
            cfg: cfg.clone(),
            n_freq: cfg.n_fft / 2 + 1,
            basis: engine.upload(&basis)?,
            filterbank: engine.upload(extractor.filterbank())?,
            workspace: Mutex::new(None),
            spare_output: Mutex::new(None),
        })
    }

    pub fn config(&self) -> &FeatureConfig {
        &self.cfg
    }

    pub fn n_mels(&self) -> usize {
        self.cfg.n_mels
    }

    /// The layout `compute` produces for clips of these sample counts.
    pub fn layout(&self, samples: impl IntoIterator<Item = usize>) -> FeatureLayout {
        let frames: Vec<usize> = samples
            .into_iter()
            .map(|n| valid_frames(&self.cfg, n))
            .collect();
        FeatureLayout {
            batch: frames.len(),
            time: frames.iter().copied().max().unwrap_or(0),
            n_mels: self.cfg.n_mels,
            frames,
        }
    }

    /// Features of a batch of 16 kHz mono clips (ordered on the engine's stream; nothing waits
    /// for the GPU), into the recycled buffer when it is large enough, else a new one.
    pub fn compute(&self, engine: &CudaEngine, pcm: &[&[f32]]) -> Result<DeviceFeatures> {
        let layout = self.layout(pcm.iter().map(|clip| clip.len()));
        // CUDA refuses 0-byte allocations; an empty batch still gets a (never read) element.
        let need = layout.elements().max(1);
        let spare = self
            .spare_output
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .filter(|buffer| buffer.len() >= need);
        let mut data = match spare {
            Some(buffer) => buffer,
            None => engine
                .stream()
                .alloc_zeros::<f32>(need)
                .context(|| format!("allocating features {layout:?}"))?,
        };
        self.compute_into(engine, pcm, &mut data)?;
        Ok(DeviceFeatures { data, layout })
    }

    /// Hands an output buffer of [`GpuFeatures::compute`] back for the next batch, so batches
    /// of shapes already seen allocate nothing. Call it once every use of the buffer has been
    /// queued on this engine's stream: the stream orders the next batch's writes after them.
    pub fn recycle(&self, data: CudaSlice<f32>) {
        let mut spare = self
            .spare_output
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if spare.as_ref().is_none_or(|kept| kept.len() < data.len()) {
            *spare = Some(data);
        }
    }

    /// [`GpuFeatures::compute`] into `out` (at least [`FeatureLayout::elements`] long; only that
    /// prefix is written). Every element of the prefix is written, padding included.
    pub fn compute_into(
        &self,
        engine: &CudaEngine,
        pcm: &[&[f32]],
        out: &mut CudaSlice<f32>,
    ) -> Result<FeatureLayout> {
        const OP: &str = "GpuFeatures::compute";
        let layout = self.layout(pcm.iter().map(|clip| clip.len()));
        check_len(OP, "out", out.len(), layout.elements())?;
        if layout.elements() == 0 {
            return Ok(layout);
        }
        let cfg = &self.cfg;
        let (offset, win) = window_span(cfg);
        let rows = layout.batch * layout.time;
        let total_samples: usize = pcm.iter().map(|clip| clip.len()).sum();
        let need = WorkspaceSize {
            samples: total_samples.max(1),
            clips: 3 * layout.batch,
            frames_then_power: rows * win.max(self.n_freq),
            spectrum_then_mel: rows * (2 * self.n_freq).max(cfg.n_mels),
        };

        let mut cached = self
            .workspace
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let size = match cached.as_ref() {
            Some(ws) if ws.size.holds(&need) => None,
            Some(ws) => Some(ws.size.max(&need)),
            None => Some(need),
        };
        if let Some(size) = size {
            // Free the old buffers before allocating the larger ones.
            *cached = None;
            *cached = Some(Workspace::new(engine, size)?);
        }
        let ws = cached.as_mut().expect("workspace was just set (bug)");

        // Upload: each clip straight into its place (no host-side concatenation), then the
        // table of starts, sample counts and valid frame counts.
        let mut table = vec![0i64; 3 * layout.batch];
        let mut start = 0usize;
        for (b, clip) in pcm.iter().enumerate() {
            table[b] = start as i64;
            table[layout.batch + b] = clip.len() as i64;
            table[2 * layout.batch + b] = layout.frames[b] as i64;
            if !clip.is_empty() {
                let mut view = ws.pcm.slice_mut(start..start + clip.len());
                engine
                    .stream()
                    .memcpy_htod(*clip, &mut view)
                    .context(|| format!("uploading clip {b} ({} samples)", clip.len()))?;
            }
            start += clip.len();
        }
        engine.upload_into(&table, &mut ws.clips)?;

        let framing = Framing {
            batch: layout.batch,
            time: layout.time,
            win,
            hop: cfg.hop_length_samples,
            first: offset as isize - (cfg.n_fft / 2) as isize,
            preemphasis: cfg.preemphasis,
            reflect: match cfg.stft_padding {
                StftPadding::Reflect => true,
                StftPadding::Zeros => false,
            },
        };
        // Two buffers, each step reading one and writing the other (all ordered on the stream).
        let (frames, spectrum) = (&mut ws.frames_then_power, &mut ws.spectrum_then_mel);
        engine.feature_frames(&ws.pcm, &ws.clips, framing, frames)?;
        let dft = MatmulSpec::linear(rows, win, 2 * self.n_freq);
        engine.matmul::<f32, f32>(&dft, frames, &self.basis, None, spectrum)?;
        let power = frames;
        engine.power_spectrum(spectrum, (rows, self.n_freq), cfg.mag_power, power)?;
        let mel = spectrum;
        let mel_spec = MatmulSpec::linear(rows, self.n_freq, cfg.n_mels);
        engine.matmul::<f32, f32>(&mel_spec, power, &self.filterbank, None, mel)?;
        let log_mel = LogMel {
            batch: layout.batch,
            time: layout.time,
            n_mels: cfg.n_mels,
            guard: cfg.log_zero_guard,
            normalize: match cfg.normalization {
                FeatureNormalization::PerFeature => true,
                FeatureNormalization::None => false,
            },
        };
        engine.log_mel_normalize(mel, &ws.clips, log_mel, out)?;
        Ok(layout)
    }
}

/// Element counts of the intermediate buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WorkspaceSize {
    samples: usize,
    clips: usize,
    frames_then_power: usize,
    spectrum_then_mel: usize,
}

impl WorkspaceSize {
    fn fields(&self) -> [usize; 4] {
        [
            self.samples,
            self.clips,
            self.frames_then_power,
            self.spectrum_then_mel,
        ]
    }

    fn holds(&self, need: &Self) -> bool {
        self.fields()
            .iter()
            .zip(need.fields())
            .all(|(have, need)| *have >= need)
    }

    /// Large enough for both, so alternating shapes do not reallocate every time.
    fn max(&self, other: &Self) -> Self {
        Self {
            samples: self.samples.max(other.samples),
            clips: self.clips.max(other.clips),
            frames_then_power: self.frames_then_power.max(other.frames_then_power),
            spectrum_then_mel: self.spectrum_then_mel.max(other.spectrum_then_mel),
        }
    }
}

struct Workspace {
    size: WorkspaceSize,
    /// The batch's clips, packed.
    pcm: CudaSlice<f32>,
    /// `[starts; samples; valid frames]`, `3·batch`.
    clips: CudaSlice<i64>,
    /// The frames `[rows, win]`, later the power spectrum `[rows, n_freq]`.
    frames_then_power: CudaSlice<f32>,
    /// The DFT `[rows, 2·n_freq]`, later the mel energies `[rows, n_mels]`.
    spectrum_then_mel: CudaSlice<f32>,
}

impl Workspace {
    fn new(engine: &CudaEngine, size: WorkspaceSize) -> Result<Self> {
        Ok(Self {
            size,
            pcm: engine.zeros(size.samples)?,
            clips: engine.zeros(size.clips.max(1))?,
            frames_then_power: engine.zeros(size.frames_then_power.max(1))?,
            spectrum_then_mel: engine.zeros(size.spectrum_then_mel.max(1))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_features_can_be_shared_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<GpuFeatures>();
    }

    #[test]
    fn workspace_grows_to_hold_both_shapes() {
        let a = WorkspaceSize {
            samples: 10,
            clips: 3,
            frames_then_power: 5,
            spectrum_then_mel: 7,
        };
        let b = WorkspaceSize {
            samples: 4,
            clips: 6,
            ..a
        };
        assert!(!a.holds(&b));
        let both = a.max(&b);
        assert!(both.holds(&a) && both.holds(&b));
        assert_eq!((both.samples, both.clips), (10, 6));
    }
}
