//! Sortformer after the FastConformer on the GPU: `encoder_proj`, the post-LN transformer (NeMo
//! `TransformerEncoder`, no positional encoding) and the speaker layers, for one sequence.
//!
//! Transformer layer: `x = LN1(x + MHA(x)); x = LN2(x + W_out·ReLU(W_in·x))`, the residual
//! stream in f32, matmul inputs in the storage type `S` (bf16 or f32, as in the conformer).
//! Speaker layers:
//! `W_spk · ReLU(W_hh · ReLU(x))`; the sigmoid is applied on the host to the downloaded logits.

use std::sync::{Mutex, PoisonError};

use cudarc::driver::CudaSlice;
use models::checkpoint::TensorMap;
use models::sortformer::SortformerConfig;

use crate::device::CudaEngine;
use crate::encoder::weights::{DeviceLayerNorm, DeviceLinear};
use crate::encoder::EncoderOutput;
use crate::error::{CudaEngineError, DriverContext, Result};
use crate::ops::{AttentionShape, HeadShape, QkvHeads, ResidualF32, RowShape};
use crate::storage::{Storage, StorageKind};
use half::bf16;

/// torch `nn.LayerNorm`'s default, which NeMo's transformer uses.
const LAYER_NORM_EPS: f32 = 1e-5;

struct TransformerLayer<S> {
    /// query, key and value nets stacked: `[3d, d]`.
    qkv: DeviceLinear<S>,
    out: DeviceLinear<S>,
    layer_norm_1: DeviceLayerNorm,
    dense_in: DeviceLinear<S>,
    dense_out: DeviceLinear<S>,
    layer_norm_2: DeviceLayerNorm,
}

impl<S: Storage> TransformerLayer<S> {
    fn load(
        engine: &CudaEngine,
        tensors: &TensorMap,
        prefix: &str,
        d: usize,
        inner: usize,
    ) -> Result<Self> {
        let att = format!("{prefix}.first_sub_layer");
        let mut weight = Vec::with_capacity(3 * d * d);
        let mut bias = Vec::with_capacity(3 * d);
        for name in ["query_net", "key_net", "value_net"] {
            weight.extend_from_slice(&tensors.get(&format!("{att}.{name}.weight"), &[d, d])?.data);
            bias.extend_from_slice(&tensors.get(&format!("{att}.{name}.bias"), &[d])?.data);
        }
        let ffn = format!("{prefix}.second_sub_layer");
        let linear = |name: &str, dims| DeviceLinear::load(engine, tensors, name, dims, false);
        let norm = |name: &str| {
            DeviceLayerNorm::load_sized(
                engine,
                tensors,
                &format!("{prefix}.{name}"),
                d,
                LAYER_NORM_EPS,
            )
        };
        Ok(Self {
            qkv: DeviceLinear::new(engine, d, 3 * d, &weight, Some(&bias))?,
            out: linear(&format!("{att}.out_projection"), (d, d))?,
            layer_norm_1: norm("layer_norm_1")?,
            dense_in: linear(&format!("{ffn}.dense_in"), (d, inner))?,
            dense_out: linear(&format!("{ffn}.dense_out"), (inner, d))?,
            layer_norm_2: norm("layer_norm_2")?,
        })
    }

    fn forward(
        &self,
        engine: &CudaEngine,
        zero_bias: &CudaSlice<f32>,
        ws: &mut HeadWorkspace<S>,
    ) -> Result<()> {
        let shape = ws.shape;
        let rows = shape.time;
        let row_shape = RowShape {
            rows,
            cols: shape.d_model(),
        };
        engine.f32_to_storage(&ws.x, &mut ws.normed)?;
        self.qkv
            .forward_storage(engine, &ws.normed, rows, &mut ws.qkv)?;
        // No positional biases: the split's bias inputs are zero, `q_v` is unused.
        engine.split_qkv_heads(
            &ws.qkv,
            zero_bias,
            zero_bias,
            shape,
            QkvHeads {
                q_u: &mut ws.q,
                q_v: &mut ws.q_unused,
                k: &mut ws.k,
                v: &mut ws.v,
            },
        )?;
        let no_bias: Option<&CudaSlice<f32>> = None;
        engine.matmul(
            &shape.scores_matmul(),
            &ws.q,
            &ws.k,
            no_bias,
            &mut ws.scores,
        )?;
        // NeMo scales queries and keys by d_h^(-1/4) each: 1/√d_h on the product.
        engine.masked_softmax(
            &ws.scores,
            &ws.lengths,
            1.0 / (shape.head_dim as f32).sqrt(),
            AttentionShape {
                batch: 1,
                heads: shape.heads,
                tq: shape.time,
                tk: shape.time,
            },
            shape.score_row(),
            &mut ws.probs,
        )?;
        engine.attend(
            &ws.probs,
            shape.score_row(),
            &ws.v,
            shape,
            &mut ws.context_heads,
            &mut ws.context,
        )?;
        self.out
            .forward_f32(engine, &ws.context, rows, &mut ws.branch)?;
        engine.add_layer_norm_f32_inplace(
            &mut ws.x,
            ResidualF32 {
                h: &ws.branch,
                alpha: 1.0,
            },
            &self.layer_norm_1.weights(),
            row_shape,
        )?;

        engine.f32_to_storage(&ws.x, &mut ws.normed)?;
        self.dense_in
            .forward_storage(engine, &ws.normed, rows, &mut ws.hidden)?;
        let hidden = ws.hidden.len();
        engine.relu_inplace(&mut ws.hidden, hidden)?;
        self.dense_out
            .forward_f32(engine, &ws.hidden, rows, &mut ws.branch)?;
        engine.add_layer_norm_f32_inplace(
            &mut ws.x,
            ResidualF32 {
                h: &ws.branch,
                alpha: 1.0,
            },
            &self.layer_norm_2.weights(),
            row_shape,
        )
    }
}

/// Device buffers for one sequence length.
struct HeadWorkspace<S> {
    shape: HeadShape,
    /// The conformer output in storage `[t, d_model]`.
    encoded: CudaSlice<S>,
    /// The residual stream `[t, d]` f32.
    x: CudaSlice<f32>,
    normed: CudaSlice<S>,
    qkv: CudaSlice<S>,
    q: CudaSlice<S>,
    q_unused: CudaSlice<S>,
    k: CudaSlice<S>,
    v: CudaSlice<S>,
    scores: CudaSlice<f32>,
    probs: CudaSlice<S>,
    context_heads: CudaSlice<S>,
    context: CudaSlice<S>,
    branch: CudaSlice<f32>,
    hidden: CudaSlice<S>,
    speaker_hidden: CudaSlice<S>,
    logits: CudaSlice<f32>,
    /// `[1]`: the sequence length, every key valid.
    lengths: CudaSlice<i32>,
}

impl<S: Storage> HeadWorkspace<S> {
    fn new(engine: &CudaEngine, shape: HeadShape, dims: &HeadDims) -> Result<Self> {
        let t = shape.time;
        let n = shape.elements();
        let scores = shape.score_elements();
        Ok(Self {
            shape,
            encoded: engine.zeros(t * dims.encoder)?,
            x: engine.zeros(n)?,
            normed: engine.zeros(n)?,
            qkv: engine.zeros(3 * n)?,
            q: engine.zeros(n)?,
            q_unused: engine.zeros(n)?,
            k: engine.zeros(n)?,
            v: engine.zeros(n)?,
            scores: engine.zeros(scores)?,
            probs: engine.zeros(scores)?,
            context_heads: engine.zeros(n)?,
            context: engine.zeros(n)?,
            branch: engine.zeros(n)?,
            hidden: engine.zeros(t * dims.inner)?,
            speaker_hidden: engine.zeros(n)?,
            logits: engine.zeros(t * dims.speakers)?,
            lengths: engine.upload(&[i32::try_from(t).unwrap_or(i32::MAX)])?,
        })
    }
}

struct HeadDims {
    encoder: usize,
    hidden: usize,
    inner: usize,
    heads: usize,
    speakers: usize,
}

/// Everything between the conformer output and the speaker logits, on one GPU.
pub(crate) struct GpuSpeakerHead<S = bf16> {
    dims: HeadDims,
    encoder_proj: Option<DeviceLinear<S>>,
    layers: Vec<TransformerLayer<S>>,
    hidden_to_hidden: DeviceLinear<S>,
    hidden_to_speakers: DeviceLinear<S>,
    /// `[hidden]` zeros: the positional biases the attention split takes.
    zero_bias: CudaSlice<f32>,
    workspace: Mutex<Option<HeadWorkspace<S>>>,
}

impl<S: Storage> GpuSpeakerHead<S> {
    pub(crate) fn load(
        engine: &CudaEngine,
        tensors: &TensorMap,
        cfg: &SortformerConfig,
    ) -> Result<Self> {
        if S::KIND == StorageKind::F32 {
            // Idempotent; the encoder of the same network has usually done it already.
            engine.load_f32_storage()?;
        }
        let tf = &cfg.transformer;
        let dims = HeadDims {
            encoder: cfg.encoder.d_model,
            hidden: tf.hidden,
            inner: tf.inner,
            heads: tf.n_heads,
            speakers: cfg.num_speakers,
        };
        if dims.heads == 0 || !dims.hidden.is_multiple_of(dims.heads) {
            return Err(CudaEngineError::Shape {
                op: "GpuSpeakerHead::load",
                detail: format!(
                    "hidden size {} does not split into {} heads",
                    dims.hidden, dims.heads
                ),
            });
        }
        let m = "sortformer_modules";
        let linear = |name: &str, dims| DeviceLinear::load(engine, tensors, name, dims, false);
        let encoder_proj = if cfg.has_encoder_projection() {
            Some(linear(
                &format!("{m}.encoder_proj"),
                (dims.encoder, dims.hidden),
            )?)
        } else {
            None
        };
        let layers = (0..tf.n_layers)
            .map(|l| {
                TransformerLayer::load(
                    engine,
                    tensors,
                    &format!("transformer_encoder.layers.{l}"),
                    dims.hidden,
                    dims.inner,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            encoder_proj,
            layers,
            hidden_to_hidden: linear(
                &format!("{m}.first_hidden_to_hidden"),
                (dims.hidden, dims.hidden),
            )?,
            hidden_to_speakers: linear(
                &format!("{m}.single_hidden_to_spks"),
                (dims.hidden, dims.speakers),
            )?,
            zero_bias: engine.zeros(dims.hidden)?,
            dims,
            workspace: Mutex::new(None),
        })
    }

    /// The conformer output of one sequence → speaker logits `[t, num_speakers]` on the host
    /// (waits for the stream).
    pub(crate) fn logits(&self, engine: &CudaEngine, encoded: &EncoderOutput) -> Result<Vec<f32>> {
        let t = encoded.time;
        if encoded.batch != 1 || encoded.d_model != self.dims.encoder {
            return Err(CudaEngineError::Shape {
                op: "GpuSpeakerHead::logits",
                detail: format!(
                    "batch {} of width {}; the head takes one sequence of width {}",
                    encoded.batch, encoded.d_model, self.dims.encoder
                ),
            });
        }
        if t == 0 {
            return Ok(Vec::new());
        }
        let shape = HeadShape {
            batch: 1,
            time: t,
            heads: self.dims.heads,
            head_dim: self.dims.hidden / self.dims.heads,
        };
        let mut cached = self
            .workspace
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if cached.as_ref().is_none_or(|ws| ws.shape != shape) {
            *cached = None;
            *cached = Some(HeadWorkspace::new(engine, shape, &self.dims)?);
        }
        let ws = cached
            .as_mut()
            .expect("head workspace was just sized (bug)");
        match &self.encoder_proj {
            Some(proj) => {
                engine.f32_to_storage(&encoded.x, &mut ws.encoded)?;
                proj.forward_f32(engine, &ws.encoded, t, &mut ws.x)?;
            }
            None => engine
                .stream()
                .memcpy_dtod(&encoded.x, &mut ws.x)
                .context(|| "copying the encoder output".into())?,
        }
        for layer in &self.layers {
            layer.forward(engine, &self.zero_bias, ws)?;
        }
        engine.f32_to_storage(&ws.x, &mut ws.normed)?;
        let n = ws.normed.len();
        engine.relu_inplace(&mut ws.normed, n)?;
        self.hidden_to_hidden
            .forward_storage(engine, &ws.normed, t, &mut ws.speaker_hidden)?;
        engine.relu_inplace(&mut ws.speaker_hidden, n)?;
        self.hidden_to_speakers
            .forward_f32(engine, &ws.speaker_hidden, t, &mut ws.logits)?;
        engine.download(&ws.logits)
    }
}
