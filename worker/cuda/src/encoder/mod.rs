//! The FastConformer encoder (NeMo `ConformerEncoder`, `rel_pos` or `rel_pos_local_attn`) on the GPU in
//! bf16 with fp32 accumulation and an fp32 residual stream, for a padded batch of utterances.
//!
//! Every utterance of a batch gets what it would get alone: padded feature frames read as zero in
//! the subsampling convolutions, attention ignores padded keys, the depthwise conv reads padded
//! frames as zero, and everything else is per frame.

mod device_input;
mod layer;
mod pos_table;
mod profile;
mod subsampling;
mod weights;
mod workspace;

use std::sync::{Mutex, PoisonError};

use cudarc::driver::CudaSlice;
use models::checkpoint::{Checkpoint, TensorMap};
use models::config::{AttentionModel, EncoderConfig};
use models::features::Features;
use models::tdt::EncodedUtterance;
use models::ModelError;

use crate::device::CudaEngine;
use crate::error::{CudaEngineError, DriverContext, Result};
use crate::ops::HeadShape;
use layer::ConformerLayer;
pub use profile::StageTimes;
use profile::{lap, Laps, Stage};
use subsampling::{StageLengths, Subsampling};
use workspace::{Workspace, WorkspaceSize};

/// Encoder weights on one GPU, converted once from a checkpoint.
pub struct GpuEncoder {
    cfg: EncoderConfig,
    subsampling: Subsampling,
    layers: Vec<ConformerLayer>,
    /// The last pass's buffers, reused while the padded shape stays the same.
    workspace: Mutex<Option<Workspace>>,
}

/// A batch of features on the device: `[batch, time, feat_in]` f32, zero-padded.
pub struct EncoderInput {
    features: CudaSlice<f32>,
    lengths: StageLengths,
    batch: usize,
    time: usize,
}

/// The encoder's output on the device: `[batch, time, d_model]` f32, frames past each
/// utterance's length are padding.
pub struct EncoderOutput {
    pub x: CudaSlice<f32>,
    pub batch: usize,
    pub time: usize,
    pub d_model: usize,
    /// Valid frames per utterance.
    pub frames: Vec<usize>,
}

impl GpuEncoder {
    pub fn from_checkpoint(engine: &CudaEngine, ckpt: &Checkpoint) -> Result<Self> {
        Self::load(engine, &ckpt.tensors, &ckpt.config.encoder)
    }

    /// Converts the `encoder.*` tensors of `tensors` to device buffers.
    pub fn load(engine: &CudaEngine, tensors: &TensorMap, cfg: &EncoderConfig) -> Result<Self> {
        if let AttentionModel::RelPosLocal { left, right } = cfg.attention {
            if left.max(right) == 0 {
                return Err(ModelError::InvalidConfig {
                    file: tensors.source.clone(),
                    key: "encoder.att_context_size".into(),
                    problem: "local attention needs a context larger than 0".into(),
                }
                .into());
            }
        }
        if cfg.n_heads == 0
            || !cfg.d_model.is_multiple_of(cfg.n_heads)
            || cfg.conv_kernel_size.is_multiple_of(2)
        {
            return Err(ModelError::InvalidConfig {
                file: tensors.source.clone(),
                key: "encoder".into(),
                problem: format!(
                    "d_model {} must split into {} heads and conv kernel {} must be odd",
                    cfg.d_model, cfg.n_heads, cfg.conv_kernel_size
                ),
            }
            .into());
        }
        let layers = (0..cfg.n_layers)
            .map(|l| ConformerLayer::load(engine, tensors, &format!("encoder.layers.{l}"), cfg))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            cfg: cfg.clone(),
            subsampling: Subsampling::load(engine, tensors, cfg)?,
            layers,
            workspace: Mutex::new(None),
        })
    }

    pub fn config(&self) -> &EncoderConfig {
        &self.cfg
    }

    /// Pads and uploads a batch of `[n_mels, frames]` features.
    pub fn prepare(&self, engine: &CudaEngine, batch: &[&Features]) -> Result<EncoderInput> {
        let feat_in = self.cfg.feat_in;
        for (i, f) in batch.iter().enumerate() {
            if f.n_mels != feat_in || f.data.len() != f.n_mels * f.n_frames {
                return Err(CudaEngineError::Shape {
                    op: "GpuEncoder::prepare",
                    detail: format!(
                        "utterance {i}: {} mels x {} frames ({} values), encoder takes {feat_in} mels",
                        f.n_mels,
                        f.n_frames,
                        f.data.len()
                    ),
                });
            }
        }
        let time = batch.iter().map(|f| f.n_frames).max().unwrap_or(0);
        let mut host = vec![0.0f32; batch.len() * time * feat_in];
        for (b, f) in batch.iter().enumerate() {
            let dst = &mut host[b * time * feat_in..];
            for m in 0..feat_in {
                for t in 0..f.n_frames {
                    dst[t * feat_in + m] = f.data[m * f.n_frames + t];
                }
            }
        }
        if host.is_empty() {
            // Nothing to encode (`run` returns empty utterances); CUDA refuses 0-byte uploads.
            host.push(0.0);
        }
        let frames: Vec<usize> = batch.iter().map(|f| f.n_frames).collect();
        Ok(EncoderInput {
            features: engine.upload(&host)?,
            lengths: self.subsampling.lengths(engine, &frames)?,
            batch: batch.len(),
            time,
        })
    }

    /// The forward pass, all on the engine's stream (nothing waits for the GPU).
    pub fn run(&self, engine: &CudaEngine, input: &EncoderInput) -> Result<EncoderOutput> {
        self.forward(engine, input, &mut None)
    }

    /// [`GpuEncoder::run`] with a stream synchronize after every stage, to see where time goes.
    pub fn run_profiled(
        &self,
        engine: &CudaEngine,
        input: &EncoderInput,
    ) -> Result<(EncoderOutput, StageTimes)> {
        let mut laps = Some(Laps::start(engine)?);
        let output = self.forward(engine, input, &mut laps)?;
        let times = laps.map(|l| l.times).unwrap_or_default();
        Ok((output, times))
    }

    fn forward(
        &self,
        engine: &CudaEngine,
        input: &EncoderInput,
        laps: &mut Option<Laps>,
    ) -> Result<EncoderOutput> {
        let d = self.cfg.d_model;
        let time = self.subsampling.out_time(input.time);
        let frames = input
            .lengths
            .host
            .last()
            .expect("stage lengths are never empty (bug)")
            .clone();
        if input.batch == 0 || time == 0 {
            return Ok(EncoderOutput {
                x: engine.zeros(1)?,
                batch: input.batch,
                time: 0,
                d_model: d,
                frames,
            });
        }
        let shape = HeadShape {
            batch: input.batch,
            time,
            heads: self.cfg.n_heads,
            head_dim: d / self.cfg.n_heads,
        };
        let size = WorkspaceSize {
            key: (input.batch, input.time),
            attention: self.cfg.attention,
            shape,
            ff_hidden: self.cfg.ff_hidden,
            subsampling_elements: self.subsampling.scratch_elements(input.batch, input.time),
        };
        let mut cached = self
            .workspace
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if cached.as_ref().is_none_or(|ws| ws.key != size.key) {
            // Free the old buffers before sizing new ones.
            *cached = None;
            *cached = Some(Workspace::new(engine, &size)?);
        }
        let ws = cached.as_mut().expect("workspace was just set (bug)");
        ws.lengths = input
            .lengths
            .device
            .last()
            .expect("stage lengths are never empty (bug)")
            .clone();
        self.subsampling.forward(
            engine,
            &input.features,
            &input.lengths,
            (input.batch, input.time),
            (&mut ws.subsampling_a, &mut ws.subsampling_b),
            &mut ws.x,
        )?;
        lap(laps, engine, Stage::Subsampling)?;
        for layer in &self.layers {
            layer.forward(engine, ws, laps)?;
        }
        // A copy, so the cached workspace can serve the next pass (ordered on the same stream).
        let x = engine
            .stream()
            .clone_dtod(&ws.x)
            .context(|| "copying the encoder output".into())?;
        Ok(EncoderOutput {
            x,
            batch: input.batch,
            time,
            d_model: d,
            frames,
        })
    }

    /// Copies the valid frames of every utterance back to the host (waits for the stream).
    pub fn download(
        &self,
        engine: &CudaEngine,
        output: &EncoderOutput,
    ) -> Result<Vec<EncodedUtterance>> {
        let d = output.d_model;
        let host = if output.time == 0 {
            Vec::new()
        } else {
            engine.download(&output.x)?
        };
        Ok(output
            .frames
            .iter()
            .enumerate()
            .map(|(b, &frames)| {
                let start = b * output.time * d;
                EncodedUtterance {
                    frames,
                    dim: d,
                    data: host
                        .get(start..start + frames * d)
                        .map(<[f32]>::to_vec)
                        .unwrap_or_default(),
                }
            })
            .collect())
    }

    /// `prepare`, `run` and `download` in one call.
    pub fn encode(
        &self,
        engine: &CudaEngine,
        batch: &[&Features],
    ) -> Result<Vec<EncodedUtterance>> {
        let input = self.prepare(engine, batch)?;
        let output = self.run(engine, &input)?;
        self.download(engine, &output)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn gpu_encoder_can_be_shared_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<super::GpuEncoder>();
    }
}
