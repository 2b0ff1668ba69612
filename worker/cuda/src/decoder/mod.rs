//! Batched label-looping TDT greedy decoding entirely on the GPU.
//!
//! The encoder-side joint projection runs once per batch (cuBLASLt, fp32). Then every step runs the
//! prediction network for the rows that emitted a label, the joint for the active rows, and
//! the choice of label and duration, all on the device (`kernels/decoder.cu`): the host only
//! looks at the rows' progress after each run of [`STEPS_PER_LAUNCH`] steps. Inside the
//! envelope sized at warm-up those runs replay a captured CUDA graph; larger batches run the
//! same kernels eagerly on a temporary workspace, with the same results.

mod steps;
mod weights;
mod workspace;

use std::sync::{Mutex, PoisonError};

use models::checkpoint::Checkpoint;
use models::config::DecoderConfig;
use models::transcript::{DecodedToken, Hypothesis};
use models::ModelError;

use crate::device::CudaEngine;
use crate::encoder::EncoderOutput;
use crate::error::{CudaEngineError, Result};
use crate::matmul::MatmulSpec;
use steps::{lstm_shared_bytes, rows_shared_bytes, MAX_SHARED_BYTES};
use weights::DecoderWeights;
use workspace::{DecoderWorkspace, RS_FIELDS, RS_FRAMES, RS_TIME, RS_TOKENS};

/// Steps queued (or replayed as one graph) between two looks at the rows' progress.
pub const STEPS_PER_LAUNCH: usize = 32;

/// The batch shapes the decoder keeps a workspace and a captured graph for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecoderEnvelope {
    pub max_batch: usize,
    /// Encoder frames (after subsampling) per utterance.
    pub max_frames: usize,
}

pub struct GpuDecoder {
    cfg: DecoderConfig,
    d_model: usize,
    weights: DecoderWeights,
    /// The envelope's workspace (with its graph), once warmed up.
    warm: Mutex<Option<DecoderWorkspace>>,
}

impl GpuDecoder {
    pub fn from_checkpoint(engine: &CudaEngine, ckpt: &Checkpoint) -> Result<Self> {
        let cfg = &ckpt.config.decoder;
        let d_model = ckpt.config.encoder.d_model;
        let too_big = |what: &str, bytes: usize| -> Result<()> {
            if bytes > MAX_SHARED_BYTES {
                return Err(ModelError::InvalidConfig {
                    file: ckpt.tensors.source.clone(),
                    key: what.into(),
                    problem: format!(
                        "the GPU decoder stages {bytes} bytes per block for this size, more than \
                         {MAX_SHARED_BYTES}"
                    ),
                }
                .into());
            }
            Ok(())
        };
        too_big(
            "decoder.prednet.pred_hidden",
            lstm_shared_bytes(cfg.pred_hidden),
        )?;
        too_big(
            "joint.jointnet.joint_hidden",
            rows_shared_bytes(cfg.joint_hidden),
        )?;
        if cfg.pred_rnn_layers == 0
            || cfg.durations.is_empty()
            || !cfg.pred_hidden.is_multiple_of(4)
            || !cfg.joint_hidden.is_multiple_of(4)
        {
            return Err(ModelError::InvalidConfig {
                file: ckpt.tensors.source.clone(),
                key: "decoder".into(),
                problem: format!(
                    "the GPU decoder needs at least one LSTM layer and one duration, and hidden \
                     sizes that are multiples of 4 (float4 loads); got {} layers, {} durations, \
                     pred_hidden {}, joint_hidden {}",
                    cfg.pred_rnn_layers,
                    cfg.durations.len(),
                    cfg.pred_hidden,
                    cfg.joint_hidden
                ),
            }
            .into());
        }
        Ok(Self {
            weights: DecoderWeights::load(engine, &ckpt.tensors, &ckpt.config.encoder, cfg)?,
            cfg: cfg.clone(),
            d_model,
            warm: Mutex::new(None),
        })
    }

    pub(crate) fn hidden(&self) -> usize {
        self.cfg.pred_hidden
    }
    pub(crate) fn joint_hidden(&self) -> usize {
        self.cfg.joint_hidden
    }
    pub(crate) fn layers(&self) -> usize {
        self.cfg.pred_rnn_layers
    }
    pub(crate) fn blank(&self) -> usize {
        self.cfg.blank_id()
    }
    pub(crate) fn n_out(&self) -> usize {
        self.cfg.vocab_size + 1 + self.cfg.durations.len()
    }

    /// Allocates the envelope's workspace and captures its step graph. Call once, before
    /// serving (never while sibling MPS clients run work).
    pub fn warm_up(&self, engine: &CudaEngine, envelope: DecoderEnvelope) -> Result<()> {
        let mut ws = DecoderWorkspace::new(engine, self, envelope.max_batch, envelope.max_frames)?;
        // Capture only records; the rows are reset (all unused) so nothing stale is ever live.
        self.reset(engine, &ws, 0)?;
        ws.graph = Some(self.capture(engine, &ws, STEPS_PER_LAUNCH)?);
        engine.synchronize()?;
        *self.warm.lock().unwrap_or_else(PoisonError::into_inner) = Some(ws);
        Ok(())
    }

    /// Decodes a batch of encoder outputs; one hypothesis per utterance, each equal to what the
    /// utterance gets alone.
    pub fn decode(&self, engine: &CudaEngine, enc: &EncoderOutput) -> Result<Vec<Hypothesis>> {
        Ok(self.decode_counting_steps(engine, enc)?.0)
    }

    /// [`GpuDecoder::decode`], also returning how many steps were launched (for benchmarks).
    pub fn decode_counting_steps(
        &self,
        engine: &CudaEngine,
        enc: &EncoderOutput,
    ) -> Result<(Vec<Hypothesis>, usize)> {
        if enc.batch == 0 {
            return Ok((Vec::new(), 0));
        }
        if enc.time == 0 || enc.frames.iter().all(|f| *f == 0) {
            return Ok((vec![Hypothesis::default(); enc.batch], 0));
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
                eager = DecoderWorkspace::new(engine, self, enc.batch, enc.time)?;
                &mut eager
            }
        };
        self.run(engine, ws, enc)
    }

    fn run(
        &self,
        engine: &CudaEngine,
        ws: &mut DecoderWorkspace,
        enc: &EncoderOutput,
    ) -> Result<(Vec<Hypothesis>, usize)> {
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

        // Each step advances a row by at least one frame or emits one of at most
        // `token_capacity` labels, so this bound is never reached unless the kernels are wrong.
        let max_steps = time + ws.token_capacity + STEPS_PER_LAUNCH;
        let mut steps = 0;
        let rs = loop {
            match &ws.graph {
                Some(graph) => graph.launch()?,
                None => self.launch_steps(engine, ws, STEPS_PER_LAUNCH)?,
            }
            steps += STEPS_PER_LAUNCH;
            let rs = engine.download(&ws.rs)?;
            let active = rs
                .chunks(RS_FIELDS)
                .any(|row| row[RS_TIME] < row[RS_FRAMES]);
            if !active {
                break rs;
            }
            if steps > max_steps {
                return Err(CudaEngineError::Decoder(format!(
                    "rows still active after {steps} steps for {time} frames (bug)"
                )));
            }
        };

        let mut hyps = Vec::with_capacity(batch);
        for b in 0..batch {
            let count = rs[b * RS_FIELDS + RS_TOKENS] as usize;
            if count > ws.token_capacity {
                return Err(CudaEngineError::Decoder(format!(
                    "utterance {b} emitted more than {} tokens (bug)",
                    ws.token_capacity
                )));
            }
            let start = b * ws.token_capacity * 3;
            let raw = if count == 0 {
                Vec::new()
            } else {
                engine.download(&ws.tokens.slice(start..start + count * 3))?
            };
            hyps.push(Hypothesis {
                tokens: raw
                    .chunks_exact(3)
                    .map(|t| DecodedToken {
                        id: t[0] as u32,
                        frame: t[1] as usize,
                        duration: t[2] as usize,
                    })
                    .collect(),
            });
        }
        Ok((hyps, steps))
    }
}
