//! Rough kernel timings at encoder-sized shapes (Parakeet TDT 0.6B, batch 16 x 30 s: 375 frames
//! after 8x subsampling, d_model 1024, 8 heads, feed-forward 4096, conv kernel 9).
//!
//! Ignored by default: `REQUIRE_CUDA=1 <test binary> --ignored --test-threads=1 --nocapture`.
//! Each row: median of 20 timed launches (CUDA events) after 3 warm-up launches, random inputs.
//! Memory-bound ops rotate over `SETS` buffer sets (> 150 MB together) so that the 50 MB L2
//! cannot hold one launch's data for the next.
//! "GB/s" counts the fewest bytes the op must move (each input read once, each output written
//! once), so it is comparable with the copy bandwidth; re-reads inside a kernel do not count.

mod common;

use common::{engine, Rng};
use cuda_engine::internals::{
    AttentionShape, BLayout, DepthwiseShape, LayerNormWeights, MatmulSpec, Residual, RowShape,
};
use cuda_engine::{bf16, CudaEngine};
use cudarc::driver::sys::CUevent_flags;

const BATCH: usize = 16;
const FRAMES: usize = 375;
const D_MODEL: usize = 1024;
const HEADS: usize = 8;
const D_FF: usize = 4096;
const CONV_KERNEL: usize = 9;
const ROWS: usize = BATCH * FRAMES;
const SETS: usize = 4;

/// `op(i)` runs launch `i`; ops that rotate buffers use `i % SETS`.
fn median_us(engine: &CudaEngine, mut op: impl FnMut(usize)) -> f64 {
    let stream = engine.stream();
    for i in 0..3 {
        op(i);
    }
    let mut times: Vec<f64> = (0..20)
        .map(|i| {
            let start = stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .expect("event");
            op(i);
            let end = stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .expect("event");
            end.synchronize().expect("sync");
            f64::from(start.elapsed_ms(&end).expect("elapsed")) * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn report_bandwidth(name: &str, micros: f64, bytes: usize) {
    eprintln!(
        "BENCH {name:<44} {micros:>9.1} us {:>8.0} GB/s",
        bytes as f64 / micros / 1e3
    );
}

fn report_flops(name: &str, micros: f64, flops: f64) {
    eprintln!(
        "BENCH {name:<44} {micros:>9.1} us {:>8.1} TFLOP/s",
        flops / micros / 1e6
    );
}

fn random_bf16(engine: &CudaEngine, rng: &mut Rng, n: usize) -> cuda_engine::CudaSlice<bf16> {
    engine.upload(&rng.bf16_vec(n, 0.0, 1.0)).expect("upload")
}

#[test]
#[ignore = "timing run for the GPU machine"]
fn bench_encoder_shapes() {
    let Some(engine) = engine("bench") else {
        return;
    };
    let mut rng = Rng::fresh("bench");
    let sets = |rng: &mut Rng, n: usize| -> Vec<_> {
        (0..SETS).map(|_| random_bf16(&engine, rng, n)).collect()
    };
    let zeros = |n: usize| -> Vec<_> {
        (0..SETS)
            .map(|_| engine.zeros::<bf16>(n).expect("alloc"))
            .collect()
    };
    let xs = sets(&mut rng, ROWS * D_MODEL);
    let rs = sets(&mut rng, ROWS * D_MODEL);
    let gamma = engine
        .upload(&rng.f32_vec(D_MODEL, 1.0, 0.1))
        .expect("upload");
    let beta = engine
        .upload(&rng.f32_vec(D_MODEL, 0.0, 0.1))
        .expect("upload");
    let weights = LayerNormWeights {
        gamma: &gamma,
        beta: &beta,
        eps: 1e-5,
    };
    let shape = RowShape {
        rows: ROWS,
        cols: D_MODEL,
    };
    let mut ys = zeros(ROWS * D_MODEL);
    let mut sums = zeros(ROWS * D_MODEL);
    let bytes_rd = ROWS * D_MODEL * 2;

    let t = median_us(&engine, |i| {
        let s = i % SETS;
        engine
            .layer_norm(&xs[s], &weights, shape, &mut ys[s])
            .expect("ln");
    });
    report_bandwidth("layer_norm 6000x1024", t, 2 * bytes_rd);
    let t = median_us(&engine, |i| {
        let s = i % SETS;
        let residual = Residual {
            r: &rs[s],
            alpha: 0.5,
        };
        engine
            .add_layer_norm(&xs[s], residual, &weights, shape, &mut sums[s], &mut ys[s])
            .expect("add_ln");
    });
    report_bandwidth("add_layer_norm 6000x1024 (+sum out)", t, 4 * bytes_rd);

    let wides = sets(&mut rng, ROWS * D_FF);
    let mut wide_outs = zeros(ROWS * D_FF);
    let t = median_us(&engine, |i| {
        let s = i % SETS;
        engine.silu(&wides[s], &mut wide_outs[s]).expect("silu")
    });
    report_bandwidth("silu 6000x4096", t, 2 * ROWS * D_FF * 2);
    let t = median_us(&engine, |i| {
        let s = i % SETS;
        engine
            .glu(&wides[s], ROWS, D_FF / 2, &mut wide_outs[s])
            .expect("glu")
    });
    report_bandwidth("glu 6000x4096 -> 6000x2048", t, ROWS * D_FF * 2 * 3 / 2);

    let lengths_host: Vec<i32> = (0..BATCH).map(|b| (FRAMES - 7 * b) as i32).collect();
    let lengths = engine.upload(&lengths_host).expect("upload");
    let conv_w = engine
        .upload(&rng.f32_vec(D_MODEL * CONV_KERNEL, 0.0, 0.3))
        .expect("upload");
    let conv_b = engine
        .upload(&rng.f32_vec(D_MODEL, 0.0, 0.1))
        .expect("upload");
    let conv_shape = DepthwiseShape {
        batch: BATCH,
        time: FRAMES,
        channels: D_MODEL,
        kernel: CONV_KERNEL,
    };
    let t = median_us(&engine, |i| {
        let s = i % SETS;
        engine
            .depthwise_conv1d(
                &xs[s], &conv_w, &conv_b, &lengths, conv_shape, true, &mut ys[s],
            )
            .expect("conv")
    });
    report_bandwidth("depthwise_conv1d 16x375x1024 k9 +silu", t, 2 * bytes_rd);

    let attention = AttentionShape {
        batch: BATCH,
        heads: HEADS,
        tq: FRAMES,
        tk: FRAMES,
    };
    let score_count = BATCH * HEADS * FRAMES * FRAMES;
    let scores: Vec<_> = (0..2)
        .map(|_| {
            engine
                .upload(&rng.f32_vec(score_count, 0.0, 3.0))
                .expect("upload")
        })
        .collect();
    let mut probs: Vec<_> = (0..2)
        .map(|_| engine.zeros::<bf16>(score_count).expect("alloc"))
        .collect();
    let t = median_us(&engine, |i| {
        let s = i % 2;
        engine
            .masked_softmax(
                &scores[s],
                &lengths,
                0.125,
                attention,
                FRAMES,
                &mut probs[s],
            )
            .expect("softmax")
    });
    report_bandwidth("masked_softmax 16x8x375x375 f32->bf16", t, score_count * 6);

    let (x, r) = (&xs[0], &rs[0]);
    let weight = random_bf16(&engine, &mut rng, D_FF * D_MODEL);
    let bias = random_bf16(&engine, &mut rng, D_FF);
    let mut ff = engine.zeros::<bf16>(ROWS * D_FF).expect("alloc");
    let spec = MatmulSpec::linear(ROWS, D_MODEL, D_FF);
    let t = median_us(&engine, |_| {
        engine
            .matmul(&spec, x, &weight, Some(&bias), &mut ff)
            .expect("matmul")
    });
    report_flops(
        "matmul 6000x1024 . (4096x1024)T +bias bf16",
        t,
        2.0 * (ROWS * D_MODEL * D_FF) as f64,
    );

    let head_dim = D_MODEL / HEADS;
    let qk = MatmulSpec {
        batch: BATCH * HEADS,
        m: FRAMES,
        n: FRAMES,
        k: head_dim,
        b_layout: BLayout::NByK,
        b_shared: false,
        alpha: 1.0 / (head_dim as f32).sqrt(),
        strides: Default::default(),
    };
    let mut scores_out = engine.zeros::<f32>(score_count).expect("alloc");
    let t = median_us(&engine, |_| {
        engine.matmul(&qk, x, r, None, &mut scores_out).expect("qk")
    });
    report_flops(
        "matmul QKt 128x(375x128 . 375x128T) f32 out",
        t,
        2.0 * (score_count * head_dim) as f64,
    );

    let device_copy = median_us(&engine, |i| {
        let s = i % SETS;
        engine
            .stream()
            .memcpy_dtod(&wides[s], &mut wide_outs[s])
            .expect("copy");
    });
    report_bandwidth(
        "reference: device copy 49 MB",
        device_copy,
        2 * ROWS * D_FF * 2,
    );
}
