//! Scoring after decoding: the evaluations `model_core::scores` defines, run by `tdt_score`
//! (`kernels/decoder.cu`) on the projected encoder frames and the prediction outputs the
//! decoding kernel kept (`pred_hist`), in f32 with the build's joint output weights.

use cudarc::driver::{DevicePtr, LaunchConfig, PushKernelArg};
use model_core::scores::{score_items, DecoderScores};
use model_core::transcript::Hypothesis;

use crate::device::CudaEngine;
use crate::encoder::EncoderOutput;
use crate::error::Result;
use crate::kernels::Kernel;
use crate::ops::to_i32;

use super::gpu_decoder::GpuDecoder;
use super::layout::SCORED_TOKENS_PER_FRAME;
use super::workspace::DecoderWorkspace;

/// `SCORE_ITEMS` and `SCORE_THREADS` in decoder.cu.
const SCORE_ITEMS: usize = 8;
const SCORE_THREADS: u32 = 256;

/// Shared memory `tdt_score` needs for a joint of `joint_hidden` (its joint inputs).
pub(super) fn score_shared_bytes(joint_hidden: usize) -> usize {
    SCORE_ITEMS * joint_hidden * std::mem::size_of::<f32>()
}

/// Shared memory a launch gets without opting in.
pub(super) const DEFAULT_SHARED_BYTES: usize = 48 * 1024;

impl GpuDecoder {
    /// Fills each hypothesis's scores from the workspace its batch was just decoded on (the
    /// projected encoder frames and the kept prediction outputs). A row with more than
    /// [`SCORED_TOKENS_PER_FRAME`] tokens per frame stays unscored (`None`).
    pub(super) fn score(
        &self,
        engine: &CudaEngine,
        ws: &DecoderWorkspace,
        enc: &EncoderOutput,
        hyps: &mut [Hypothesis],
    ) -> Result<()> {
        let op = "tdt_score";
        let blank = self.blank() as u32;
        let mut items: Vec<i32> = Vec::new();
        // (hypothesis, first item, frames)
        let mut spans = Vec::with_capacity(hyps.len());
        for (b, hyp) in hyps.iter().enumerate() {
            let frames = enc.frames[b];
            if hyp.tokens.len() > SCORED_TOKENS_PER_FRAME * frames {
                continue;
            }
            let first = items.len() / 4;
            let max_symbols = self.cfg.max_symbols_per_step;
            for item in score_items(&hyp.tokens, frames, blank, max_symbols) {
                items.extend([
                    to_i32(op, "encoder row", b * enc.time + item.frame)?,
                    to_i32(op, "state row", item.state * ws.rows + b)?,
                    to_i32(op, "target", item.target as usize)?,
                    0,
                ]);
            }
            spans.push((b, first, frames));
        }
        let n = items.len() / 4;
        let logprobs = if n == 0 {
            Vec::new()
        } else {
            let items_dev = engine.upload(&items)?;
            let out = engine.zeros::<f32>(n)?;
            let stream = engine.stream();
            let (items_ptr, out_ptr) = (items_dev.device_ptr(stream).0, out.device_ptr(stream).0);
            let w = &self.weights.out;
            let (out_w, out_b) = (w.weight.address(stream), w.bias.device_ptr(stream).0);
            let n_items = to_i32(op, "items", n)?;
            let joint_hidden = to_i32(op, "joint_hidden", self.joint_hidden())?;
            let n_classes = to_i32(op, "n_classes", self.blank() + 1)?;
            let config = LaunchConfig {
                grid_dim: (n.div_ceil(SCORE_ITEMS) as u32, 1, 1),
                block_dim: (SCORE_THREADS, 1, 1),
                shared_mem_bytes: score_shared_bytes(self.joint_hidden()) as u32,
            };
            // SAFETY: the arguments follow tdt_score's signature. Each item's encoder row is
            // b * time + frame with frame below the row's valid frames (enc_proj holds batch
            // x time rows of J); its state row is k * ws.rows + b with k <= the row's tokens <=
            // SCORED_TOKENS_PER_FRAME x frames < hist_capacity (pred_hist holds hist_capacity x rows rows of J, and the decoding
            // kernel wrote every state `score_items` names: the ones it computed); its target
            // is a label below n_classes. out_w is the [n_out, J] joint output in the build's
            // storage, out_b its n_out biases, `out` holds n floats; the dynamic shared size is
            // SCORE_ITEMS x J floats, within the default checked at load.
            unsafe {
                engine.launch_as(
                    self.storage,
                    Kernel::TdtScore,
                    config,
                    || format!("items={n}"),
                    |args| {
                        args.arg(&items_ptr)
                            .arg(&n_items)
                            .arg(&ws.ptr.enc_proj)
                            .arg(&ws.ptr.pred_hist)
                            .arg(&out_w)
                            .arg(&out_b)
                            .arg(&joint_hidden)
                            .arg(&n_classes)
                            .arg(&out_ptr);
                    },
                )?;
            }
            let values = engine.download(&out)?;
            drop(items_dev);
            values
        };
        for (b, first, frames) in spans {
            let count = frames + hyps[b].tokens.len();
            hyps[b].scores = Some(DecoderScores::from_logprobs(
                &logprobs[first..first + count],
                frames,
            ));
        }
        Ok(())
    }
}
