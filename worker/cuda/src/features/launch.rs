//! Typed launches of the feature kernels (`kernels/features.cu`). Shapes are checked against
//! the buffers before anything is launched.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use crate::device::CudaEngine;
use crate::driver::launch::{elementwise_config, BLOCK_THREADS};
use crate::error::{CudaEngineError, Result};
use crate::kernels::Kernel;
use crate::ops::{check_len, to_i32, to_i64};

/// How frames are cut from the packed clips.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Framing {
    pub(crate) batch: usize,
    /// Padded frames per clip.
    pub(crate) time: usize,
    /// Samples per frame that reach the DFT (the window's span).
    pub(crate) win: usize,
    pub(crate) hop: usize,
    /// Sample index of frame 0's first span sample (negative: the centre padding).
    pub(crate) first: isize,
    pub(crate) preemphasis: Option<f32>,
    pub(crate) reflect: bool,
}

/// `[batch, time, n_mels]` output of the log/normalisation step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LogMel {
    pub(crate) batch: usize,
    pub(crate) time: usize,
    pub(crate) n_mels: usize,
    pub(crate) guard: f32,
    pub(crate) normalize: bool,
}

impl CudaEngine {
    /// `frames[batch * time, win]` from the packed clips `pcm`; `clips` is the
    /// `[starts; samples; valid frames]` table (`3 * batch`), each start + samples within `pcm`
    /// (the caller builds both from the same host slices).
    pub(crate) fn feature_frames(
        &self,
        pcm: &CudaSlice<f32>,
        clips: &CudaSlice<i64>,
        framing: Framing,
        frames: &mut CudaSlice<f32>,
    ) -> Result<()> {
        const OP: &str = "feature_frames";
        let n = framing.batch * framing.time * framing.win;
        check_len(OP, "clips", clips.len(), 3 * framing.batch)?;
        check_len(OP, "frames", frames.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let batch = to_i32(OP, "batch", framing.batch)?;
        let time = to_i32(OP, "time", framing.time)?;
        let win = to_i32(OP, "win", framing.win)?;
        let hop = to_i32(OP, "hop", framing.hop)?;
        let first = i32::try_from(framing.first).map_err(|_| CudaEngineError::Shape {
            op: OP,
            detail: format!("first sample {} does not fit 32 bits", framing.first),
        })?;
        let preemph = framing.preemphasis.unwrap_or(0.0);
        let has_preemph = i32::from(framing.preemphasis.is_some());
        let reflect = i32::from(framing.reflect);
        // SAFETY: signature (const float* pcm, const long long* clips, int batch, int time,
        // int win, int hop, int first, float preemph, int has_preemph, int reflect,
        // float* frames). frames holds batch*time*win elements and clips 3*batch (checked above);
        // the kernel reads pcm only inside [start, start + samples) of each clip, which the
        // caller guarantees lie inside pcm.
        unsafe {
            self.launch(
                Kernel::FeatureFrames,
                elementwise_config(n),
                || format!("{framing:?}"),
                |args| {
                    args.arg(pcm)
                        .arg(clips)
                        .arg(&batch)
                        .arg(&time)
                        .arg(&win)
                        .arg(&hop)
                        .arg(&first)
                        .arg(&preemph)
                        .arg(&has_preemph)
                        .arg(&reflect)
                        .arg(frames);
                },
            )
        }
    }

    /// `power[rows, n_freq] = |X|^mag_power` from `spectrum[rows, 2 * n_freq]` (re, then im).
    pub(crate) fn power_spectrum(
        &self,
        spectrum: &CudaSlice<f32>,
        (rows, n_freq): (usize, usize),
        mag_power: f32,
        power: &mut CudaSlice<f32>,
    ) -> Result<()> {
        const OP: &str = "power_spectrum";
        let n = rows * n_freq;
        check_len(OP, "spectrum", spectrum.len(), 2 * n)?;
        check_len(OP, "power", power.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let rows_arg = to_i64(OP, "rows", rows)?;
        let n_freq_arg = to_i32(OP, "n_freq", n_freq)?;
        // SAFETY: signature (const float* spectrum, long long rows, int n_freq, float mag_power,
        // float* power); spectrum holds 2*rows*n_freq and power rows*n_freq elements (checked).
        unsafe {
            self.launch(
                Kernel::PowerSpectrum,
                elementwise_config(n),
                || format!("rows={rows} n_freq={n_freq}"),
                |args| {
                    args.arg(spectrum)
                        .arg(&rows_arg)
                        .arg(&n_freq_arg)
                        .arg(&mag_power)
                        .arg(power);
                },
            )
        }
    }

    /// `out[batch, time, n_mels]` = log(mel + guard), normalised per clip and mel bin over the
    /// clip's valid frames (the third row of `clips`), zero past them.
    pub(crate) fn log_mel_normalize(
        &self,
        mel: &CudaSlice<f32>,
        clips: &CudaSlice<i64>,
        shape: LogMel,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        const OP: &str = "log_mel_normalize";
        let n = shape.batch * shape.time * shape.n_mels;
        check_len(OP, "mel", mel.len(), n)?;
        check_len(OP, "clips", clips.len(), 3 * shape.batch)?;
        check_len(OP, "out", out.len(), n)?;
        if n == 0 {
            return Ok(());
        }
        let grid_y = u32::try_from(shape.batch)
            .ok()
            .filter(|&b| b <= 65_535)
            .ok_or_else(|| CudaEngineError::Shape {
                op: OP,
                detail: format!("batch {} exceeds the grid's 65535", shape.batch),
            })?;
        let grid_x = u32::try_from(shape.n_mels)
            .ok()
            .filter(|&m| m <= i32::MAX as u32)
            .ok_or_else(|| CudaEngineError::Shape {
                op: OP,
                detail: format!("{} mel bins exceed the grid", shape.n_mels),
            })?;
        let batch = to_i32(OP, "batch", shape.batch)?;
        let time = to_i32(OP, "time", shape.time)?;
        let n_mels = to_i32(OP, "n_mels", shape.n_mels)?;
        let normalize = i32::from(shape.normalize);
        let guard = shape.guard;
        let config = LaunchConfig {
            grid_dim: (grid_x, grid_y, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: signature (const float* mel, const long long* clips, int batch, int time,
        // int n_mels, float guard, int normalize, float* out); mel and out hold
        // batch*time*n_mels elements and clips 3*batch (checked above); the grid is exactly
        // (n_mels, batch) and the kernel clamps each clip's valid count to [0, time].
        unsafe {
            self.launch(
                Kernel::LogMelNormalize,
                config,
                || format!("{shape:?}"),
                |args| {
                    args.arg(mel)
                        .arg(clips)
                        .arg(&batch)
                        .arg(&time)
                        .arg(&n_mels)
                        .arg(&guard)
                        .arg(&normalize)
                        .arg(out);
                },
            )
        }
    }
}
