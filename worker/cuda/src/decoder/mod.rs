//! Batched label-looping TDT greedy decoding entirely on the GPU.
//!
//! Two builds of the decoding kernel: f32 (exact: NeMo's tokens on the fixtures) and bf16
//! (the bf16 engine's: bf16 weights and product inputs on the tensor cores, f32 accumulation
//! and cell state).
//!
//! The encoder-side joint projection runs once per batch (cuBLASLt, fp32). Then one persistent
//! cooperative kernel (`kernels/decoder.cu`) loops over the steps on the device until every row
//! is done: each step runs the prediction network for the rows that emitted a label, the joint
//! for the active rows, and the choice of label and duration, with no host round trip. The
//! blocks hand values to each other tagged with the step that wrote them, so a reader's load is
//! its wait: there is no grid-wide barrier. Inside the envelope sized at warm-up that launch
//! replays a captured CUDA graph; larger batches launch the same kernel on a temporary
//! workspace, with the same results.
//!
//! Every decoded batch is then scored (`score.rs`): the decoding kernel keeps each row's
//! prediction outputs, and one more kernel evaluates the joint at every frame and token
//! (`model_core::scores`).

mod gpu_decoder;
mod layout;
mod score;
mod steps;
mod weights;
mod workspace;

pub use gpu_decoder::GpuDecoder;
pub use layout::SCORED_TOKENS_PER_FRAME;

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use model_core::config::DecoderConfig;
use model_core::transcript::{DecodedToken, Hypothesis};
use models::checkpoint::Checkpoint;
use models::ModelError;

use crate::device::CudaEngine;
use crate::encoder::EncoderOutput;
use crate::error::{CudaEngineError, Result};
use crate::kernels::Kernel;
use crate::matmul::MatmulSpec;
use crate::storage::StorageKind;
use layout::{
    DecodeLayout, DecoderDims, DECODE_THREADS, DS_STEPS, RS_FIELDS, RS_FRAMES, RS_TIME, RS_TOKENS,
};
use weights::DecoderWeights;
use workspace::DecoderWorkspace;

/// Joint outputs (labels, blank, durations) the decoding kernel can index (16 bits).
const MAX_OUTPUTS: usize = 0xffff;

/// The batch shapes the decoder keeps a workspace and a captured graph for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderEnvelope {
    pub max_batch: usize,
    /// Encoder frames (after subsampling) per utterance.
    pub max_frames: usize,
}

impl GpuDecoder {
    /// The build a decoder for `cfg` runs when `wanted` is asked for: bf16 needs hidden sizes
    /// that are multiples of 16 (the tensor cores' k-steps); other sizes get the exact f32
    /// build.
    pub fn storage_for(cfg: &DecoderConfig, wanted: StorageKind) -> StorageKind {
        let bf16_fits = cfg.pred_hidden.is_multiple_of(16) && cfg.joint_hidden.is_multiple_of(16);
        match wanted {
            StorageKind::Bf16 if bf16_fits => StorageKind::Bf16,
            _ => StorageKind::F32,
        }
    }

    /// The decoder of `ckpt` in `storage`: f32 is exact (the CPU reference's choices); bf16
    /// is the bf16 engine's, on the tensor cores.
    pub fn from_checkpoint(
        engine: &CudaEngine,
        ckpt: &Checkpoint,
        storage: StorageKind,
    ) -> Result<Self> {
        let cfg = &ckpt.config.decoder;
        let d_model = ckpt.config.encoder.d_model;
        // f32 rows move as float4s; bf16 products take k in steps of 16.
        let multiple = match storage {
            StorageKind::F32 => 4,
            StorageKind::Bf16 => 16,
        };
        // The choice keys hold an output's index in 16 bits (`choice_key` in decoder.cu).
        let outputs = DecoderDims::of(cfg).n_out;
        if cfg.pred_rnn_layers == 0
            || cfg.durations.is_empty()
            || outputs > MAX_OUTPUTS
            || score::score_shared_bytes(cfg.joint_hidden) > score::DEFAULT_SHARED_BYTES
            || !cfg.pred_hidden.is_multiple_of(multiple)
            || !cfg.joint_hidden.is_multiple_of(multiple)
        {
            return Err(ModelError::InvalidConfig {
                file: ckpt.tensors.source.clone(),
                key: "decoder".into(),
                problem: format!(
                    "the {} GPU decoder needs at least one LSTM layer and one duration, at \
                     most {MAX_OUTPUTS} joint outputs, joint_hidden at most {}, and hidden \
                     sizes that are multiples of {multiple}; got {} layers, {} durations, {outputs} outputs, pred_hidden \
                     {}, joint_hidden {}",
                    storage.name(),
                    score::DEFAULT_SHARED_BYTES / score::score_shared_bytes(1),
                    cfg.pred_rnn_layers,
                    cfg.durations.len(),
                    cfg.pred_hidden,
                    cfg.joint_hidden
                ),
            }
            .into());
        }
        if storage == StorageKind::F32 {
            engine.load_f32_storage()?;
        }
        // One block per SM this context may use (an MPS client's share, not the device's).
        let grid = (engine.context_sm_count()? as usize).max(1);
        let (max_shared_bytes, resident) =
            engine.allow_max_shared_bytes(storage, Kernel::TdtDecode, DECODE_THREADS)?;
        let dims = DecoderDims::of(cfg);
        if resident == 0
            || DecodeLayout::new(dims, storage, 1, grid, max_shared_bytes, None).is_none()
        {
            return Err(ModelError::InvalidConfig {
                file: ckpt.tensors.source.clone(),
                key: "decoder.prednet.pred_hidden".into(),
                problem: format!(
                    "the GPU decoder cannot lay out pred_hidden {} and joint_hidden {} in the \
                     {max_shared_bytes} bytes of shared memory this GPU allows per block \
                     ({resident} blocks resident per multiprocessor)",
                    cfg.pred_hidden, cfg.joint_hidden
                ),
            }
            .into());
        }
        Ok(Self {
            weights: DecoderWeights::load(
                engine,
                &ckpt.tensors,
                &ckpt.config.encoder,
                cfg,
                storage,
            )?,
            cfg: cfg.clone(),
            storage,
            d_model,
            grid,
            max_shared_bytes,
            piece_rows: None,
            warm: Mutex::new(None),
        })
    }

    /// For tests and benchmarks, before [`GpuDecoder::warm_up`]: run the decoding kernel on
    /// `grid` blocks (at most one per multiprocessor this context may use, as under an MPS
    /// share) and stream its weights in pieces of `piece_rows` rows even where they would stay
    /// resident. The results are the same bits whatever the grid and the weights' placement.
    pub fn with_layout(mut self, grid: Option<usize>, piece_rows: Option<usize>) -> Result<Self> {
        if let Some(grid) = grid {
            if grid == 0 || grid > self.grid {
                return Err(CudaEngineError::Shape {
                    op: "GpuDecoder::with_layout",
                    detail: format!("grid {grid}: this context runs 1 to {} blocks", self.grid),
                });
            }
            self.grid = grid;
        }
        self.piece_rows = piece_rows.filter(|rows| *rows > 0);
        Ok(self)
    }

    /// Allocates the envelope's workspace and captures its step graph. Call once, before
    /// serving (never while sibling MPS clients run work).
    pub fn warm_up(&self, engine: &CudaEngine, envelope: DecoderEnvelope) -> Result<()> {
        let mut ws = self.new_workspace(engine, envelope.max_batch, envelope.max_frames)?;
        // Capture only records; the rows are reset (all unused) so nothing stale is ever live.
        self.reset(engine, &ws, 0)?;
        // A launch with no active rows returns at once; it settles the grid the driver accepts.
        self.launch_decode(engine, &mut ws, 0)?;
        let max_steps = ws.step_bound(ws.max_frames);
        ws.graph = Some(self.capture(engine, &ws, max_steps)?);
        engine.synchronize()?;
        *self.warm.lock().unwrap_or_else(PoisonError::into_inner) = Some(ws);
        Ok(())
    }

    /// Decodes a batch of encoder outputs; one hypothesis per utterance, each equal to what the
    /// utterance gets alone.
    pub fn decode(&self, engine: &CudaEngine, enc: &EncoderOutput) -> Result<Vec<Hypothesis>> {
        Ok(self.decode_counting_steps(engine, enc)?.0)
    }

    /// [`GpuDecoder::decode`], also returning how many steps ran (for benchmarks).
    pub fn decode_counting_steps(
        &self,
        engine: &CudaEngine,
        enc: &EncoderOutput,
    ) -> Result<(Vec<Hypothesis>, usize)> {
        let (hyps, steps, _) = self.decode_timed(engine, enc, false)?;
        Ok((hyps, steps))
    }

    /// [`GpuDecoder::decode_counting_steps`], also returning the time of the decoding launch
    /// alone (the device synchronized before and after it: for benchmarks, the same span as
    /// a CUDA-graph step loop timed elsewhere, without the encoder-side projection and the
    /// downloads).
    pub fn decode_timing_launch(
        &self,
        engine: &CudaEngine,
        enc: &EncoderOutput,
    ) -> Result<(Vec<Hypothesis>, usize, Duration)> {
        self.decode_timed(engine, enc, true)
    }

    fn decode_timed(
        &self,
        engine: &CudaEngine,
        enc: &EncoderOutput,
        time_launch: bool,
    ) -> Result<(Vec<Hypothesis>, usize, Duration)> {
        if enc.batch == 0 {
            return Ok((Vec::new(), 0, Duration::ZERO));
        }
        if enc.time == 0 || enc.frames.iter().all(|f| *f == 0) {
            return Ok((
                vec![Hypothesis::without_frames(); enc.batch],
                0,
                Duration::ZERO,
            ));
        }
        if enc.d_model != self.d_model || enc.frames.len() != enc.batch {
            return Err(CudaEngineError::Shape {
                op: "GpuDecoder::decode",
                detail: format!(
                    "encoder output of {} utterances x {} (frames for {}), decoder takes {}",
                    enc.batch,
                    enc.d_model,
                    enc.frames.len(),
                    self.d_model
                ),
            });
        }
        let mut warm = self.warm.lock().unwrap_or_else(PoisonError::into_inner);
        let mut eager;
        let ws = match warm.as_mut() {
            Some(ws) if ws.fits(enc.batch, enc.time) => ws,
            _ => {
                eager = self.new_workspace(engine, enc.batch, enc.time)?;
                &mut eager
            }
        };
        self.run(engine, ws, enc, time_launch)
    }

    fn run(
        &self,
        engine: &CudaEngine,
        ws: &mut DecoderWorkspace,
        enc: &EncoderOutput,
        time_launch: bool,
    ) -> Result<(Vec<Hypothesis>, usize, Duration)> {
        let (batch, time) = (enc.batch, enc.time);
        // Project every encoder frame once: enc_proj[b * time + t] = joint.enc(x[b, t]).
        let n = batch * time * self.d_model;
        if enc.x.len() != n {
            return Err(CudaEngineError::Shape {
                op: "GpuDecoder::decode",
                detail: format!("encoder output holds {} values, not {n}", enc.x.len()),
            });
        }
        let enc_linear = &self.weights.enc;
        engine.matmul(
            &MatmulSpec::linear(batch * time, self.d_model, self.joint_hidden()),
            &enc.x,
            &enc_linear.weight,
            Some(&enc_linear.bias),
            &mut ws.enc_proj,
        )?;

        let frames: Vec<i32> = enc.frames.iter().map(|f| *f as i32).collect();
        let enc_rows: Vec<i32> = (0..batch).map(|b| (b * time) as i32).collect();
        engine.upload_into(&frames, &mut ws.frames)?;
        engine.upload_into(&enc_rows, &mut ws.enc_rows)?;
        self.reset(engine, ws, batch)?;

        let max_steps = ws.step_bound(time);
        if time_launch {
            engine.synchronize()?;
        }
        let started = Instant::now();
        match &ws.graph {
            Some(graph) => graph.launch()?,
            None => self.launch_decode(engine, ws, max_steps)?,
        }
        if time_launch {
            engine.synchronize()?;
        }
        let launch = started.elapsed();
        let rs = engine.download(&ws.rs)?;
        let steps = engine.download(&ws.ds)?[DS_STEPS] as usize;
        if rs
            .chunks(RS_FIELDS)
            .any(|row| row[RS_TIME] < row[RS_FRAMES])
        {
            return Err(CudaEngineError::Decoder(format!(
                "rows still active after {steps} steps for {time} frames (bug)"
            )));
        }

        // Tokens are stored n-th of every row together, so the first `most` of every row are
        // one download.
        let counts: Vec<usize> = (0..batch)
            .map(|b| rs[b * RS_FIELDS + RS_TOKENS] as usize)
            .collect();
        if let Some(b) = counts.iter().position(|&n| n > ws.token_capacity) {
            return Err(CudaEngineError::Decoder(format!(
                "utterance {b} emitted more than {} tokens (bug)",
                ws.token_capacity
            )));
        }
        let most = counts.iter().copied().max().unwrap_or(0);
        let raw = if most == 0 {
            Vec::new()
        } else {
            engine.download(&ws.tokens.slice(0..most * ws.rows * 3))?
        };
        let mut hyps: Vec<Hypothesis> = counts
            .iter()
            .enumerate()
            .map(|(b, &count)| Hypothesis {
                scores: None,
                tokens: (0..count)
                    .map(|n| {
                        let t = &raw[(n * ws.rows + b) * 3..][..3];
                        DecodedToken {
                            id: t[0] as u32,
                            frame: t[1] as usize,
                            duration: t[2] as usize,
                        }
                    })
                    .collect(),
            })
            .collect();
        self.score(engine, ws, enc, &mut hyps)?;
        Ok((hyps, steps, launch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoder(pred_hidden: usize, joint_hidden: usize) -> DecoderConfig {
        DecoderConfig {
            vocab_size: 1024,
            pred_hidden,
            pred_rnn_layers: 2,
            joint_hidden,
            durations: vec![0, 1, 2, 3, 4],
            max_symbols_per_step: 10,
        }
    }

    #[test]
    fn the_bf16_build_is_used_where_the_hidden_sizes_fit_its_k_steps() {
        let parakeet = decoder(640, 640);
        assert_eq!(
            GpuDecoder::storage_for(&parakeet, StorageKind::Bf16),
            StorageKind::Bf16
        );
        assert_eq!(
            GpuDecoder::storage_for(&parakeet, StorageKind::F32),
            StorageKind::F32,
            "the exact engine keeps the exact decoder"
        );
        for (pred, joint) in [(648, 640), (640, 40), (36, 36)] {
            assert_eq!(
                GpuDecoder::storage_for(&decoder(pred, joint), StorageKind::Bf16),
                StorageKind::F32,
                "pred_hidden {pred}, joint_hidden {joint}"
            );
        }
    }
}
