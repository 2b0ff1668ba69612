//! Launches of the decoder's kernels (`kernels/decoder.cu`) on a workspace's fixed device
//! addresses, and the CUDA graph that replays a run of steps.

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, LaunchConfig, PushKernelArg};

use crate::device::{elementwise_config, CudaEngine};
use crate::error::{CudaEngineError, DriverContext, Result};
use crate::kernels::Kernel;
use crate::ops::{to_i32, to_i64};

use super::workspace::{DecoderWorkspace, Pointers};
use super::GpuDecoder;

/// Rows per block and warps per block of the matrix-vector kernels (`ROWS_PER_BLOCK`,
/// `WARPS_PER_BLOCK` in `decoder.cu`).
pub(crate) const ROWS_PER_BLOCK: usize = 8;
const WARPS_PER_BLOCK: usize = 8;
/// Default dynamic shared memory limit every CUDA GPU grants without opt-in.
pub(crate) const MAX_SHARED_BYTES: usize = 48 * 1024;

/// Shared memory of `tdt_lstm_step` (x and h of a block's rows).
pub(crate) fn lstm_shared_bytes(hidden: usize) -> usize {
    2 * ROWS_PER_BLOCK * hidden * 4
}

/// Shared memory of the matrix-vector kernels with `in_dim` inputs per row.
pub(crate) fn rows_shared_bytes(in_dim: usize) -> usize {
    ROWS_PER_BLOCK * in_dim * 4
}

fn matvec_config(outputs: usize, rows: usize, shared: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            outputs.div_ceil(WARPS_PER_BLOCK) as u32,
            rows.div_ceil(ROWS_PER_BLOCK) as u32,
            1,
        ),
        block_dim: ((WARPS_PER_BLOCK * 32) as u32, 1, 1),
        shared_mem_bytes: shared as u32,
    }
}

/// A captured run of decoding steps on one workspace (its device addresses are baked in).
pub(crate) struct StepGraph {
    graph: CudaGraph,
    pub(crate) steps: usize,
}

// SAFETY: a CUDA graph exec may be launched from any thread as long as calls are not
// concurrent; the graph lives inside the decoder's workspace, which a mutex guards.
unsafe impl Send for StepGraph {}

impl StepGraph {
    pub(crate) fn launch(&self) -> Result<()> {
        self.graph
            .launch()
            .context(|| format!("replaying {} decoder steps", self.steps))
    }
}

impl GpuDecoder {
    /// Resets every row of `ws` for a batch of `frames` (rows past the batch are unused).
    pub(crate) fn reset(
        &self,
        engine: &CudaEngine,
        ws: &DecoderWorkspace,
        batch: usize,
    ) -> Result<()> {
        let op = "tdt_reset";
        let p = &ws.ptr;
        let state_len = self.layers() * ws.rows * self.hidden();
        let (batch, rows) = (to_i32(op, "batch", batch)?, to_i32(op, "rows", ws.rows)?);
        let blank = to_i32(op, "blank", self.blank())?;
        let state = to_i64(op, "state", state_len)?;
        // SAFETY: the arguments follow tdt_reset's signature; h/c hold `state_len` floats and
        // rs/frames/enc_rows hold `ws.rows` rows (workspace invariants).
        unsafe {
            engine.launch(
                Kernel::TdtReset,
                elementwise_config(state_len.max(ws.rows)),
                || format!("rows={rows}"),
                |args| {
                    args.arg(&p.rs)
                        .arg(&p.frames)
                        .arg(&p.enc_rows)
                        .arg(&batch)
                        .arg(&rows)
                        .arg(&blank)
                        .arg(&p.h)
                        .arg(&p.c)
                        .arg(&state);
                },
            )
        }
    }

    /// Queues `steps` decoding steps on the engine's stream.
    pub(crate) fn launch_steps(
        &self,
        engine: &CudaEngine,
        ws: &DecoderWorkspace,
        steps: usize,
    ) -> Result<()> {
        for _ in 0..steps {
            self.launch_step(engine, ws)?;
        }
        Ok(())
    }

    fn launch_step(&self, engine: &CudaEngine, ws: &DecoderWorkspace) -> Result<()> {
        let op = "tdt_step";
        let p: &Pointers = &ws.ptr;
        let (h, j, n_out) = (self.hidden(), self.joint_hidden(), self.n_out());
        let rows = to_i32(op, "rows", ws.rows)?;
        let hidden = to_i32(op, "hidden", h)?;
        let joint_hidden = to_i32(op, "joint_hidden", j)?;
        let n_out_i = to_i32(op, "n_out", n_out)?;
        let n_classes = to_i32(op, "n_classes", self.blank() + 1)?;
        let n_durations = to_i32(op, "durations", self.cfg.durations.len())?;
        let max_symbols = to_i32(op, "max_symbols", self.cfg.max_symbols_per_step)?;
        let token_capacity = to_i32(op, "token_capacity", ws.token_capacity)?;
        let layers = to_i32(op, "layers", self.layers())?;
        let layer_bytes = (ws.rows * h * std::mem::size_of::<f32>()) as u64;
        let at = |base: u64, layer: usize| base + layer as u64 * layer_bytes;
        let shape = || format!("rows={rows} hidden={hidden} joint={joint_hidden} out={n_out_i}");
        let w = &self.weights;

        for (l, lstm) in w.lstm.iter().enumerate() {
            let below = at(p.h_new, l.saturating_sub(1));
            let from_embedding = i32::from(l == 0);
            let (h_l, c_l) = (at(p.h, l), at(p.c, l));
            let (h_new_l, c_new_l) = (at(p.h_new, l), at(p.c_new, l));
            // SAFETY: arguments follow tdt_lstm_step's signature. The state buffers are
            // [layers, rows, hidden] floats, so every layer offset stays inside them; the weights
            // are [4H, H] and the bias [4H]; labels index the [vocab + 1, H] embedding (the
            // advance kernel only stores argmax indices < vocab + 1).
            unsafe {
                engine.launch(
                    Kernel::TdtLstmStep,
                    matvec_config(h, ws.rows, lstm_shared_bytes(h)),
                    shape,
                    |args| {
                        args.arg(&p.rs)
                            .arg(&rows)
                            .arg(&w.embedding)
                            .arg(&below)
                            .arg(&from_embedding)
                            .arg(&lstm.w_ih)
                            .arg(&lstm.w_hh)
                            .arg(&lstm.bias)
                            .arg(&h_l)
                            .arg(&c_l)
                            .arg(&h_new_l)
                            .arg(&c_new_l)
                            .arg(&hidden);
                    },
                )?;
            }
        }
        let h_top_new = at(p.h_new, self.layers().saturating_sub(1));
        // SAFETY: tdt_pred_project's signature; pred weight [J, H], bias [J], pred_proj
        // [rows, J], h_top_new one [rows, H] layer.
        unsafe {
            engine.launch(
                Kernel::TdtPredProject,
                matvec_config(j, ws.rows, rows_shared_bytes(h)),
                shape,
                |args| {
                    args.arg(&p.rs)
                        .arg(&rows)
                        .arg(&h_top_new)
                        .arg(&w.pred.weight)
                        .arg(&w.pred.bias)
                        .arg(&p.pred_proj)
                        .arg(&hidden)
                        .arg(&joint_hidden);
                },
            )?;
        }
        // SAFETY: tdt_joint's signature; enc_proj holds every row's frames at RS_ENC_ROW
        // (written by `decode` for rows < batch, whose times stay below their frame counts
        // while active), out weight [n_out, J], logits [rows, n_out].
        unsafe {
            engine.launch(
                Kernel::TdtJoint,
                matvec_config(n_out, ws.rows, rows_shared_bytes(j)),
                shape,
                |args| {
                    args.arg(&p.rs)
                        .arg(&rows)
                        .arg(&p.enc_proj)
                        .arg(&p.pred_proj)
                        .arg(&w.out.weight)
                        .arg(&w.out.bias)
                        .arg(&p.logits)
                        .arg(&joint_hidden)
                        .arg(&n_out_i);
                },
            )?;
        }
        // SAFETY: tdt_advance's signature; one block of 256 threads per row, tokens [rows, capacity, 3],
        // durations [n_durations], state buffers [layers, rows, hidden].
        unsafe {
            engine.launch(
                Kernel::TdtAdvance,
                LaunchConfig {
                    grid_dim: (ws.rows as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                },
                shape,
                |args| {
                    args.arg(&p.rs)
                        .arg(&rows)
                        .arg(&p.logits)
                        .arg(&n_out_i)
                        .arg(&n_classes)
                        .arg(&w.durations)
                        .arg(&n_durations)
                        .arg(&max_symbols)
                        .arg(&p.tokens)
                        .arg(&token_capacity)
                        .arg(&p.h)
                        .arg(&p.c)
                        .arg(&p.h_new)
                        .arg(&p.c_new)
                        .arg(&layers)
                        .arg(&hidden);
                },
            )?;
        }
        Ok(())
    }

    /// Captures `steps` decoding steps on `ws` into a graph (warm-up only: under MPS a capture
    /// while sibling processes run work is not safe).
    pub(crate) fn capture(
        &self,
        engine: &CudaEngine,
        ws: &DecoderWorkspace,
        steps: usize,
    ) -> Result<StepGraph> {
        let stream = engine.stream();
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .context(|| "starting the decoder graph capture".into())?;
        let queued = self.launch_steps(engine, ws, steps);
        let ended = stream.end_capture(CUgraphInstantiate_flags(0));
        queued?;
        let graph = ended
            .context(|| format!("capturing {steps} decoder steps"))?
            .ok_or_else(|| CudaEngineError::Decoder("stream capture produced no graph".into()))?;
        graph
            .upload()
            .context(|| "uploading the decoder graph".into())?;
        Ok(StepGraph { graph, steps })
    }
}
