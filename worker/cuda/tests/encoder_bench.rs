//! Encoder throughput of our engine alone (no PyTorch side by side): Parakeet TDT 0.6B v2 shapes
//! (24 layers, d_model 1024, 8 heads, ff 4096, 128 mels, dw_striding x8 with 256 channels,
//! conv kernel 9, xscaling off, no biases) with random weights built in memory, random features.
//!
//! Ignored by default; run on a GPU with
//! `REQUIRE_CUDA=1 ./encoder_bench --ignored --nocapture`. Each figure is the median over
//! repeated `GpuEncoder::run` calls (workspace allocation included), timed on the host around a
//! stream synchronize, after warm-ups. `ENCODER_BENCH_SHAPES` (e.g. `1x30,4x30,16x30,16x60`:
//! batch x seconds, fractional seconds allowed) overrides the default shapes;
//! `ENCODER_FUSED_ATTENTION=0` runs the unfused attention (products, softmax) for comparison.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use common::{engine, Rng};
use cuda_engine::GpuEncoder;
use model_core::config::{AttentionModel, EncoderConfig};
use models::checkpoint::TensorMap;
use models::tensor::Tensor;
use models::Features;

fn full_size_config() -> EncoderConfig {
    EncoderConfig {
        feat_in: 128,
        n_layers: 24,
        d_model: 1024,
        n_heads: 8,
        ff_hidden: 4096,
        subsampling_factor: 8,
        subsampling_conv_channels: 256,
        xscaling: false,
        conv_kernel_size: 9,
        attention: AttentionModel::RelPos,
        use_bias: false,
        layer_norm_eps: 1e-5,
        batch_norm_eps: 1e-5,
    }
}

/// Random encoder tensors with fan-in scaled weights, so activations stay in a sane range.
fn random_tensors(cfg: &EncoderConfig, rng: &mut Rng) -> TensorMap {
    let mut map = BTreeMap::new();
    fn add(
        map: &mut BTreeMap<String, Tensor>,
        name: String,
        shape: Vec<usize>,
        fan_in: usize,
        rng: &mut Rng,
    ) {
        let n = shape.iter().product();
        let std = 1.0 / (fan_in as f64).sqrt();
        map.insert(name, Tensor::new(shape, rng.f32_vec(n, 0.0, std)));
    }
    let (d, c, ff, k) = (
        cfg.d_model,
        cfg.subsampling_conv_channels,
        cfg.ff_hidden,
        cfg.conv_kernel_size,
    );
    let p = "encoder.pre_encode";
    add(
        &mut map,
        format!("{p}.conv.0.weight"),
        vec![c, 1, 3, 3],
        9,
        rng,
    );
    add(&mut map, format!("{p}.conv.0.bias"), vec![c], 9, rng);
    for (dw, pw) in [(2, 3), (5, 6)] {
        add(
            &mut map,
            format!("{p}.conv.{dw}.weight"),
            vec![c, 1, 3, 3],
            9,
            rng,
        );
        add(&mut map, format!("{p}.conv.{dw}.bias"), vec![c], 9, rng);
        add(
            &mut map,
            format!("{p}.conv.{pw}.weight"),
            vec![c, c, 1, 1],
            c,
            rng,
        );
        add(&mut map, format!("{p}.conv.{pw}.bias"), vec![c], c, rng);
    }
    let freq = cfg.feat_in / 8;
    add(
        &mut map,
        format!("{p}.out.weight"),
        vec![d, c * freq],
        c * freq,
        rng,
    );
    add(&mut map, format!("{p}.out.bias"), vec![d], c * freq, rng);
    let ones = |n: usize| Tensor::new(vec![n], vec![1.0; n]);
    let zeros = |n: usize| Tensor::new(vec![n], vec![0.0; n]);
    for l in 0..cfg.n_layers {
        let lp = format!("encoder.layers.{l}");
        for norm in [
            "norm_feed_forward1",
            "norm_self_att",
            "norm_conv",
            "norm_feed_forward2",
            "norm_out",
        ] {
            map.insert(format!("{lp}.{norm}.weight"), ones(d));
            map.insert(format!("{lp}.{norm}.bias"), zeros(d));
        }
        for ffm in ["feed_forward1", "feed_forward2"] {
            add(
                &mut map,
                format!("{lp}.{ffm}.linear1.weight"),
                vec![ff, d],
                d,
                rng,
            );
            add(
                &mut map,
                format!("{lp}.{ffm}.linear2.weight"),
                vec![d, ff],
                ff,
                rng,
            );
        }
        for lin in [
            "linear_q",
            "linear_k",
            "linear_v",
            "linear_out",
            "linear_pos",
        ] {
            add(
                &mut map,
                format!("{lp}.self_attn.{lin}.weight"),
                vec![d, d],
                d,
                rng,
            );
        }
        let dk = d / cfg.n_heads;
        add(
            &mut map,
            format!("{lp}.self_attn.pos_bias_u"),
            vec![cfg.n_heads, dk],
            1,
            rng,
        );
        add(
            &mut map,
            format!("{lp}.self_attn.pos_bias_v"),
            vec![cfg.n_heads, dk],
            1,
            rng,
        );
        add(
            &mut map,
            format!("{lp}.conv.pointwise_conv1.weight"),
            vec![2 * d, d, 1],
            d,
            rng,
        );
        add(
            &mut map,
            format!("{lp}.conv.depthwise_conv.weight"),
            vec![d, 1, k],
            k,
            rng,
        );
        add(
            &mut map,
            format!("{lp}.conv.pointwise_conv2.weight"),
            vec![d, d, 1],
            d,
            rng,
        );
        map.insert(format!("{lp}.conv.batch_norm.weight"), ones(d));
        map.insert(format!("{lp}.conv.batch_norm.bias"), zeros(d));
        map.insert(format!("{lp}.conv.batch_norm.running_mean"), zeros(d));
        map.insert(format!("{lp}.conv.batch_norm.running_var"), ones(d));
    }
    TensorMap::new(PathBuf::from("<random full-size encoder>"), map)
}

/// `(batch, seconds)` pairs from `ENCODER_BENCH_SHAPES`, or 1/4/16 x 30 s.
fn bench_shapes() -> Result<Vec<(usize, f64)>> {
    let Ok(spec) = std::env::var("ENCODER_BENCH_SHAPES") else {
        return Ok(vec![(1, 30.0), (4, 30.0), (16, 30.0)]);
    };
    spec.split(',')
        .map(|pair| {
            let (b, s) = pair
                .trim()
                .split_once('x')
                .ok_or_else(|| anyhow::anyhow!("shape {pair:?} is not BATCHxSECONDS"))?;
            Ok((b.parse()?, s.parse()?))
        })
        .collect()
}

#[test]
#[ignore = "GPU timing; run explicitly on a device"]
fn encoder_throughput_full_size_random_weights() -> Result<()> {
    let Some(engine) = engine("encoder_bench") else {
        return Ok(());
    };
    let cfg = full_size_config();
    let mut rng = Rng::fresh("encoder_bench");
    let started = Instant::now();
    let tensors = random_tensors(&cfg, &mut rng);
    let mut encoder: GpuEncoder = GpuEncoder::load(&engine, &tensors, &cfg)?;
    let fused = std::env::var("ENCODER_FUSED_ATTENTION").as_deref() != Ok("0");
    encoder.set_fused_attention(fused);
    eprintln!("fused attention allowed: {fused}");
    engine.synchronize()?;
    drop(tensors);
    eprintln!(
        "random full-size encoder built and loaded in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let frames_per_second = 100.0;
    for (batch, seconds) in bench_shapes()? {
        let frames = (seconds * frames_per_second).round() as usize;
        let features: Vec<Features> = (0..batch)
            .map(|_| Features {
                n_mels: cfg.feat_in,
                n_frames: frames,
                data: rng.f32_vec(cfg.feat_in * frames, 0.0, 1.0),
            })
            .collect();
        let refs: Vec<&Features> = features.iter().collect();
        let input = encoder.prepare(&engine, &refs)?;
        for _ in 0..3 {
            encoder.run(&engine, &input)?;
        }
        engine.synchronize()?;
        let mut times = Vec::new();
        for _ in 0..10 {
            let t0 = Instant::now();
            let out = encoder.run(&engine, &input)?;
            engine.synchronize()?;
            times.push(t0.elapsed().as_secs_f64());
            drop(out);
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let audio = batch as f64 * seconds;
        // Sanity: the output is finite.
        let out = encoder.download(&engine, &encoder.run(&engine, &input)?)?;
        let finite = out.iter().all(|u| u.data.iter().all(|v| v.is_finite()));
        eprintln!(
            "RESULT encoder batch={batch} x {seconds} s: median {:.2} ms (min {:.2}, max {:.2}) \
             = {:.0} audio-s per GPU-s; output finite: {finite}",
            median * 1e3,
            times[0] * 1e3,
            times[times.len() - 1] * 1e3,
            audio / median
        );
        anyhow::ensure!(finite, "non-finite encoder output");
        let (_, stages) = encoder.run_profiled(&engine, &input)?;
        eprintln!(
            "RESULT stages batch={batch} x {seconds} s (synchronized after each stage, ms): \
             subsampling+workspace {:.2}, feed-forward x2 {:.2}, attention {:.2}, conv {:.2}, \
             residual+LayerNorm {:.2}",
            stages.subsampling_s * 1e3,
            stages.feed_forward_s * 1e3,
            stages.attention_s * 1e3,
            stages.conv_s * 1e3,
            stages.norms_s * 1e3
        );
    }
    Ok(())
}
