//! The FastConformer encoder (NeMo `ConformerEncoder`, `rel_pos` or `rel_pos_local_attn`) on the GPU in
//! bf16 with fp32 accumulation and an fp32 residual stream, for a padded batch of utterances.
//!
//! Every utterance of a batch gets what it would get alone: padded feature frames read as zero in
//! the subsampling convolutions, attention ignores padded keys, the depthwise conv reads padded
//! frames as zero, and everything else is per frame.

mod device_input;
mod layer;
mod profile;
mod subsampling;
pub(crate) mod weights;
mod workspace;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cudarc::driver::CudaSlice;
use model_core::config::{AttentionModel, EncoderConfig};
use model_core::long_audio::LongAudio;
use model_core::tdt::EncodedUtterance;
use models::checkpoint::{Checkpoint, TensorMap};
use models::features::Features;
use models::ModelError;

use crate::device::CudaEngine;
use crate::error::{CudaEngineError, DriverContext, Result};
use crate::ops::HeadShape;
use crate::shared_memory::SharedDeviceMemory;
use crate::storage::{Storage, StorageKind};
use crate::weight_arena::{adopt_arena, move_into_arena, Adoption, WeightBuffer};
use half::bf16;
use layer::ConformerLayer;
pub use profile::StageTimes;
use profile::{lap, Laps, Stage};
use subsampling::{StageLengths, Subsampling};
use workspace::{Workspace, WorkspaceKey, WorkspaceSize};

/// Encoder weights on one GPU, converted once from a checkpoint.
pub struct GpuEncoder<S = bf16> {
    cfg: EncoderConfig,
    subsampling: Subsampling<S>,
    layers: Vec<ConformerLayer<S>>,
    /// The last pass's buffers, reused while the padded shape stays the same.
    workspace: Mutex<Option<Workspace<S>>>,
    /// [`GpuEncoder::pre_encode`]'s buffers, kept apart so that streaming (pre-encode a chunk,
    /// then run the layers on a longer sequence) does not resize the main workspace every step.
    pre_encode_workspace: Mutex<Option<PreEncodeWorkspace<S>>>,
    subsampling_scratch_bytes: usize,
    /// Whether full relative-position attention may run as the one fused kernel (bf16, head
    /// dim 128, compute capability 8.0+); otherwise the unfused products and softmax.
    fused_attention: bool,
    /// Where a long utterance leaves full attention, and seconds per encoder frame; `None`:
    /// always the checkpoint's attention (Sortformer's encoder).
    long_audio: Option<(LongAudio, f64)>,
}

/// Each of the two subsampling scratch buffers holds the first stage's output (conv0's, 4x
/// larger, stays on chip in the fused kernel): 12.3 MB per 30 s utterance at Parakeet's shapes
/// in bf16, so a 16 × 30 s batch would need 2 × 197 MB. With this cap the batch is subsampled
/// in groups of 5 utterances of 30 s (the grouping the old 256 MiB cap gave for conv0's
/// output), the same results (`tests/encoder_parity.rs` checks groups of one against the whole
/// batch).
pub const DEFAULT_SUBSAMPLING_SCRATCH_BYTES: usize = 64 << 20;

struct PreEncodeWorkspace<S> {
    /// Feature frames this was sized for.
    frames: usize,
    a: CudaSlice<S>,
    b: CudaSlice<S>,
    x: CudaSlice<f32>,
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

impl<S: Storage> GpuEncoder<S> {
    pub fn from_checkpoint(engine: &CudaEngine, ckpt: &Checkpoint) -> Result<Self> {
        Self::load(engine, &ckpt.tensors, &ckpt.config.encoder)
    }

    /// Converts the `encoder.*` tensors of `tensors` to device buffers in the storage type `S`
    /// (compiling the f32-storage kernels first when `S` is f32).
    pub fn load(engine: &CudaEngine, tensors: &TensorMap, cfg: &EncoderConfig) -> Result<Self> {
        if S::KIND == StorageKind::F32 {
            engine.load_f32_storage()?;
        }
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
            pre_encode_workspace: Mutex::new(None),
            subsampling_scratch_bytes: DEFAULT_SUBSAMPLING_SCRATCH_BYTES,
            fused_attention: true,
            long_audio: None,
        })
    }

    /// Every matmul weight, in the shared arena's order.
    fn weights_mut(&mut self) -> Vec<&mut WeightBuffer<S>> {
        let mut weights = self.subsampling.weights_mut();
        for layer in &mut self.layers {
            weights.extend(layer.weights_mut());
        }
        weights
    }

    /// Moves the matmul weights into a new shareable arena and returns it (the private copies
    /// are freed).
    pub(crate) fn move_weights_into_arena(
        &mut self,
        engine: &CudaEngine,
    ) -> Result<Arc<SharedDeviceMemory>> {
        move_into_arena(engine, &mut self.weights_mut())
    }

    /// Switches the matmul weights to `arena` if it holds exactly this encoder's weights.
    pub(crate) fn adopt_weight_arena(
        &mut self,
        engine: &CudaEngine,
        arena: &Arc<SharedDeviceMemory>,
    ) -> Result<Adoption> {
        adopt_arena(engine, &mut self.weights_mut(), arena)
    }

    /// Allows (default) or forbids the fused attention kernel where it applies (for side-by-side
    /// benchmarks and as a fallback). Takes effect at the next workspace (shape change).
    pub fn set_fused_attention(&mut self, allowed: bool) {
        self.fused_attention = allowed;
        *self
            .workspace
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Long utterances (over `long_audio`'s limit; `frame_s` seconds per encoder frame) run
    /// with local attention, as NeMo's long-audio recipe does. Takes effect at the next
    /// workspace.
    pub fn set_long_audio(&mut self, long_audio: LongAudio, frame_s: f64) {
        self.long_audio = Some((long_audio, frame_s));
        *self
            .workspace
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// The attention of a pass over `time` encoder frames.
    fn attention(&self, time: usize) -> AttentionModel {
        match self.long_audio {
            Some((policy, frame_s)) => {
                policy.attention_for(self.cfg.attention, time as f64 * frame_s)
            }
            None => self.cfg.attention,
        }
    }

    /// Whether a pass of `shape` with `attention` runs the fused attention kernel.
    fn fuses_attention(
        &self,
        engine: &CudaEngine,
        shape: &HeadShape,
        attention: AttentionModel,
    ) -> bool {
        self.fused_attention
            && matches!(attention, AttentionModel::RelPos)
            && engine.supports_fused_attention::<S>(shape)
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
        let group = self.subsampling_group(input.batch, input.time);
        let grouped = group < input.batch;
        let size = WorkspaceSize {
            key: WorkspaceKey::Features {
                batch: input.batch,
                frames: input.time,
                subsampling_group: group,
            },
            attention: self.attention(shape.time),
            fused_attention: self.fuses_attention(engine, &shape, self.attention(shape.time)),
            shape,
            ff_hidden: self.cfg.ff_hidden,
            subsampling_elements: self.subsampling.scratch_elements(group, input.time),
            group_features_elements: if grouped {
                group * input.time * self.cfg.feat_in
            } else {
                1
            },
            group_x_elements: if grouped { group * time * d } else { 1 },
        };
        let mut cached = self.lock_workspace(engine, &size)?;
        let ws = cached.as_mut().expect("workspace was just sized (bug)");
        ws.lengths = input
            .lengths
            .device
            .last()
            .expect("stage lengths are never empty (bug)")
            .clone();
        if grouped {
            self.subsample_in_groups(engine, input, group, ws)?;
        } else {
            self.subsampling.forward(
                engine,
                &input.features,
                &input.lengths,
                (input.batch, input.time),
                (&mut ws.subsampling_a, &mut ws.subsampling_b),
                &mut ws.x,
            )?;
        }
        lap(laps, engine, Stage::Subsampling)?;
        let x = self.layers_forward(engine, ws, laps)?;
        Ok(EncoderOutput {
            x,
            batch: input.batch,
            time,
            d_model: d,
            frames,
        })
    }

    /// Caps each of the two subsampling scratch buffers (default
    /// [`DEFAULT_SUBSAMPLING_SCRATCH_BYTES`]); a batch whose first stage output is larger is
    /// subsampled a group of utterances at a time. At least one utterance always fits.
    pub fn set_subsampling_scratch_limit_bytes(&mut self, bytes: usize) {
        self.subsampling_scratch_bytes = bytes;
    }

    /// Utterances subsampled at once for a batch of `batch` × `frames` feature frames.
    fn subsampling_group(&self, batch: usize, frames: usize) -> usize {
        let per_utterance = self.subsampling.scratch_elements(1, frames) * size_of::<S>();
        (self.subsampling_scratch_bytes / per_utterance.max(1)).clamp(1, batch.max(1))
    }

    /// Subsampling a group of utterances at a time: each group's features are copied into a
    /// group-sized buffer, subsampled with the group's own lengths, and its output copied to its
    /// place in the residual stream. Every utterance is computed as it would be alone.
    fn subsample_in_groups(
        &self,
        engine: &CudaEngine,
        input: &EncoderInput,
        group: usize,
        ws: &mut Workspace<S>,
    ) -> Result<()> {
        let (feat_in, d) = (self.cfg.feat_in, self.cfg.d_model);
        let out_time = self.subsampling.out_time(input.time);
        let frames = &input.lengths.host[0];
        let feature_stride = input.time * feat_in;
        let out_stride = out_time * d;
        for first in (0..input.batch).step_by(group) {
            let end = (first + group).min(input.batch);
            let n = end - first;
            let lengths = self.subsampling.lengths(engine, &frames[first..end])?;
            let source = input
                .features
                .slice(first * feature_stride..end * feature_stride);
            engine
                .stream()
                .memcpy_dtod(
                    &source,
                    &mut ws.group_features.slice_mut(0..n * feature_stride),
                )
                .context(|| format!("copying features of utterances {first}..{end}"))?;
            self.subsampling.forward(
                engine,
                &ws.group_features,
                &lengths,
                (n, input.time),
                (&mut ws.subsampling_a, &mut ws.subsampling_b),
                &mut ws.group_x,
            )?;
            engine
                .stream()
                .memcpy_dtod(
                    &ws.group_x.slice(0..n * out_stride),
                    &mut ws.x.slice_mut(first * out_stride..end * out_stride),
                )
                .context(|| format!("placing subsampled utterances {first}..{end}"))?;
        }
        Ok(())
    }

    /// The cached workspace, first resized if it was sized for another shape.
    fn lock_workspace(
        &self,
        engine: &CudaEngine,
        size: &WorkspaceSize,
    ) -> Result<MutexGuard<'_, Option<Workspace<S>>>> {
        let mut cached = self
            .workspace
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if cached.as_ref().is_none_or(|ws| ws.key != size.key) {
            // Free the old buffers before sizing new ones.
            *cached = None;
            *cached = Some(Workspace::new(engine, size)?);
        }
        Ok(cached)
    }

    /// The conformer layers over `ws.x` (lengths set); returns a copy of the result, so the
    /// cached workspace can serve the next pass (ordered on the same stream).
    fn layers_forward(
        &self,
        engine: &CudaEngine,
        ws: &mut Workspace<S>,
        laps: &mut Option<Laps>,
    ) -> Result<CudaSlice<f32>> {
        for layer in &self.layers {
            layer.forward(engine, ws, laps)?;
        }
        engine
            .stream()
            .clone_dtod(&ws.x)
            .context(|| "copying the encoder output".into())
    }

    /// Subsampling only (NeMo `encoder.pre_encode`) of one utterance's `[n_mels, frames]`
    /// features: `([frames', d_model], frames')` on the host, before x-scaling (what Streaming
    /// Sortformer caches). Waits for the stream.
    pub fn pre_encode(
        &self,
        engine: &CudaEngine,
        features: &Features,
    ) -> Result<(Vec<f32>, usize)> {
        let input = self.prepare(engine, &[features])?;
        let time = self.subsampling.out_time(input.time);
        if time == 0 {
            return Ok((Vec::new(), 0));
        }
        let mut cached = self
            .pre_encode_workspace
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if cached.as_ref().is_none_or(|w| w.frames != input.time) {
            *cached = None;
            let elements = self.subsampling.scratch_elements(1, input.time);
            *cached = Some(PreEncodeWorkspace {
                frames: input.time,
                a: engine.zeros(elements)?,
                b: engine.zeros(elements)?,
                x: engine.zeros(time * self.cfg.d_model)?,
            });
        }
        let ws = cached
            .as_mut()
            .expect("pre-encode workspace was just sized (bug)");
        self.subsampling.forward(
            engine,
            &input.features,
            &input.lengths,
            (1, input.time),
            (&mut ws.a, &mut ws.b),
            &mut ws.x,
        )?;
        let mut host = engine.download(&ws.x)?;
        // x-scaling is folded into the subsampling's output layer; undo it here (the layers'
        // entry point applies it again), so the cache holds NeMo's unscaled embeddings.
        let scale = self.subsampling.xscale();
        if scale != 1.0 {
            host.iter_mut().for_each(|v| *v /= scale);
        }
        Ok((host, time))
    }

    /// Everything after subsampling (NeMo `bypass_pre_encode=True`) on one utterance of `frames`
    /// pre-encoded, unscaled embeddings `[frames, d_model]` from the host: x-scaling, then the
    /// conformer layers. Nothing waits for the GPU.
    pub fn forward_pre_encoded(
        &self,
        engine: &CudaEngine,
        pre_encoded: &[f32],
        frames: usize,
    ) -> Result<EncoderOutput> {
        let d = self.cfg.d_model;
        if pre_encoded.len() != frames * d {
            return Err(CudaEngineError::Shape {
                op: "GpuEncoder::forward_pre_encoded",
                detail: format!(
                    "{} values for {frames} frames of width {d}",
                    pre_encoded.len()
                ),
            });
        }
        if frames == 0 {
            return Ok(EncoderOutput {
                x: engine.zeros(1)?,
                batch: 1,
                time: 0,
                d_model: d,
                frames: vec![0],
            });
        }
        let scale = self.subsampling.xscale();
        let scaled: Vec<f32> = pre_encoded.iter().map(|v| v * scale).collect();
        let pre_encoded_shape = HeadShape {
            batch: 1,
            time: frames,
            heads: self.cfg.n_heads,
            head_dim: d / self.cfg.n_heads,
        };
        let size = WorkspaceSize {
            key: WorkspaceKey::PreEncoded { batch: 1, frames },
            attention: self.attention(frames),
            fused_attention: self.fuses_attention(
                engine,
                &pre_encoded_shape,
                self.attention(frames),
            ),
            shape: pre_encoded_shape,
            ff_hidden: self.cfg.ff_hidden,
            subsampling_elements: 1,
            group_features_elements: 1,
            group_x_elements: 1,
        };
        let mut cached = self.lock_workspace(engine, &size)?;
        let ws = cached.as_mut().expect("workspace was just sized (bug)");
        engine.upload_into(&scaled, &mut ws.x)?;
        ws.lengths = engine.upload(&[i32::try_from(frames).unwrap_or(i32::MAX)])?;
        let x = self.layers_forward(engine, ws, &mut None)?;
        Ok(EncoderOutput {
            x,
            batch: 1,
            time: frames,
            d_model: d,
            frames: vec![frames],
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
