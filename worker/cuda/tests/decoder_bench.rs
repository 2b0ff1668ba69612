//! Time per label-looping step of the GPU decoder at Parakeet TDT 0.6B v2's decoder size
//! (2-layer LSTM 640, joint 640, 1024 tokens + blank, durations 0-4), random weights built in
//! memory, random encoder output. Random weights make almost every joint evaluation emit a
//! label, so nearly every step runs the prediction network and the joint for every row: the
//! most expensive kind of step.
//!
//! Ignored by default; run on a GPU with `REQUIRE_CUDA=1 ./decoder_bench --ignored --nocapture`
//! (`DECODER_BENCH_ONLY` picks cases by label).
//! Two figures per case, each a median over repeated decodes divided by the steps the kernel
//! ran: the whole decode of the batch (the encoder-side joint projection, the graph replay, the
//! row-state and token downloads included), and the decoding launch alone (the graph replay,
//! the device synchronized before and after: the span `scripts/bench/pytorch_decoder_step.py`
//! times for PyTorch, whose encoder projection is also outside its step).

mod common;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use common::{engine, fixtures, Rng};
use cuda_engine::{DecoderEnvelope, EncoderOutput, GpuDecoder, StorageKind};
use models::checkpoint::{Checkpoint, TensorMap};

const D_MODEL: usize = 1024;
const HIDDEN: usize = 640;
const JOINT: usize = 640;
const VOCAB: usize = 1024;
const DURATIONS: [usize; 5] = [0, 1, 2, 3, 4];
/// Encoder frames of a 30 s clip (80 ms per frame).
const FRAMES: usize = 375;

/// The fixture's config with the decoder resized to the real model's, and random weights.
fn checkpoint(rng: &mut Rng) -> Result<Checkpoint> {
    let mut config = Checkpoint::load(&fixtures().join("tdt-real-options/model.nemo"))?.config;
    config.decoder.vocab_size = VOCAB;
    config.decoder.pred_hidden = HIDDEN;
    config.decoder.pred_rnn_layers = 2;
    config.decoder.joint_hidden = JOINT;
    config.decoder.durations = DURATIONS.to_vec();
    config.encoder.d_model = D_MODEL;

    let map = common::random_decoder_tensors(rng, &config.decoder, D_MODEL, 1.0, 0.0);
    Ok(Checkpoint {
        config,
        tensors: TensorMap::new(PathBuf::from("random decoder weights"), map),
        vocabulary: Vec::new(),
    })
}

#[test]
#[ignore = "benchmark: run explicitly on a GPU"]
fn decoder_step_time_full_size_random_weights() -> Result<()> {
    let Some(engine) = engine("decoder_bench") else {
        return Ok(());
    };
    let mut rng = Rng::fresh("decoder_bench");
    let ckpt = checkpoint(&mut rng)?;
    // Both builds (f32: exact; bf16: the bf16 engine's, on the tensor cores), each on the whole
    // GPU (weights resident in shared memory where they fit) and on 33 blocks: the
    // multiprocessors of a 25 % MPS share of a 132-SM GPU (weights streamed).
    let sms = engine.context_sm_count()? as usize;
    let mut decoders = Vec::new();
    for storage in [StorageKind::F32, StorageKind::Bf16] {
        let name = storage.name();
        let whole = GpuDecoder::from_checkpoint(&engine, &ckpt, storage)?;
        decoders.push((format!("{name} whole GPU"), whole));
        let quarter = GpuDecoder::from_checkpoint(&engine, &ckpt, storage)?
            .with_layout(Some(sms.min(33)), None)?;
        decoders.push((format!("{name} 33 blocks"), quarter));
    }
    // DECODER_BENCH_ONLY="bf16 whole" runs only the cases whose label contains it (a quick
    // A/B, or a variant kernel that only some layouts launch). Skipped cases draw no inputs,
    // so the others decode different random inputs than in a full run.
    let only = std::env::var("DECODER_BENCH_ONLY").unwrap_or_default();
    decoders.retain(|(label, _)| label.contains(only.as_str()));
    for (label, decoder) in &decoders {
        decoder.warm_up(
            &engine,
            DecoderEnvelope {
                max_batch: 16,
                max_frames: FRAMES,
            },
        )?;
        for batch in [1usize, 4, 16] {
            let host: Vec<f32> = (0..batch * FRAMES * D_MODEL)
                .map(|_| (rng.uniform() * 2.0 - 1.0) as f32)
                .collect();
            let enc = EncoderOutput {
                x: engine.upload(&host)?,
                batch,
                time: FRAMES,
                d_model: D_MODEL,
                frames: vec![FRAMES; batch],
            };
            let (hyps, _) = decoder.decode_counting_steps(&engine, &enc)?;
            let (mut whole, mut launch) = (Vec::new(), Vec::new());
            let mut steps = 0;
            for _ in 0..7 {
                let started = Instant::now();
                let (_, ran) = decoder.decode_counting_steps(&engine, &enc)?;
                whole.push(started.elapsed().as_secs_f64() / ran as f64);
                let (_, ran, launched) = decoder.decode_timing_launch(&engine, &enc)?;
                launch.push(launched.as_secs_f64() / ran as f64);
                steps = ran;
            }
            let median = |mut v: Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2] * 1e6
            };
            let tokens: usize = hyps.iter().map(|h| h.tokens.len()).sum();
            eprintln!(
                "RESULT decoder step {label} batch={batch} frames={FRAMES}: {:.2} us/step \
                 median, launch alone {:.2} us/step ({steps} steps, {tokens} tokens emitted in \
                 the batch)",
                median(whole),
                median(launch)
            );
        }
    }
    Ok(())
}
