//! The fused first subsampling kernel (`subsample_conv0_depthwise`: conv0 + ReLU + stage 1's
//! depthwise, conv0's output kept on chip) must give exactly what the two-kernel path gives
//! (`subsample_conv0_relu`, stored in the storage type, then `subsample_depthwise`): against a
//! CPU replica of that path's f32 arithmetic (FMA taps, rounding to storage in between) bit for
//! bit, against an f64 reference within rounding, and against the two kernels on the GPU bit for
//! bit. Several shapes (odd sizes, partial channel packs, several channel blocks), lengths
//! shorter than the padded time and a zero length, and several column-run splits; outputs
//! poisoned (NaN) before each launch; for bf16 storage and for the f32-storage build.
//!
//! Without CUDA these tests print SKIPPED and pass, unless `REQUIRE_CUDA=1`.

mod common;

use common::{check_close, engine, for_each_storage, Rng, TestStorage};
use cuda_engine::internals::{stride2_out_len, Conv2dShape, Conv3x3};
use cuda_engine::{bf16, CudaEngine};

/// Shapes of conv0's input and the valid feature frames per utterance.
fn cases() -> Vec<(Conv2dShape, Vec<i32>)> {
    let shape = |batch, time, freq, channels| Conv2dShape {
        batch,
        time,
        freq,
        channels,
    };
    vec![
        (shape(1, 1, 1, 1), vec![1]),
        (shape(1, 2, 3, 8), vec![2]),
        (shape(2, 13, 11, 5), vec![13, 6]),
        (shape(3, 40, 128, 32), vec![40, 1, 27]),
        (shape(2, 101, 80, 33), vec![0, 101]),
        // Whole packs for f32 storage only.
        (shape(2, 9, 7, 12), vec![9, 4]),
        // Several channel blocks, the last one partial.
        (shape(1, 6, 10, 2056), vec![5]),
        // The encoder's shapes (128 mels, 256 channels), odd padded time, masked tails.
        (shape(3, 301, 128, 256), vec![301, 123, 2]),
        (shape(1, 64, 128, 256), vec![61]),
    ]
}

/// Conv0 frames per utterance (`lengths` of the depthwise stage).
fn next_lengths(lengths: &[i32]) -> Vec<i32> {
    lengths
        .iter()
        .map(|&n| stride2_out_len(n.max(0) as usize) as i32)
        .collect()
}

/// A 3x3 stride-2 convolution output at `(t, f)` of a plane whose rows `>= valid` and columns
/// outside it read as zero (taps skipped), taps in row-major order. `tap(acc, w, v)` is the
/// accumulation step; returns the accumulator started at `bias`.
fn conv_at<T: Copy>(
    plane: impl Fn(usize, usize) -> T,
    (rows, cols, valid): (usize, usize, usize),
    w: &[T],
    bias: T,
    (t, f): (usize, usize),
    tap: impl Fn(T, T, T) -> T,
) -> T {
    let mut acc = bias;
    for ki in 0..3 {
        let Some(r) = (2 * t + ki).checked_sub(1).filter(|&r| r < valid.min(rows)) else {
            continue;
        };
        for kj in 0..3 {
            let Some(c) = (2 * f + kj).checked_sub(1).filter(|&c| c < cols) else {
                continue;
            };
            acc = tap(acc, w[ki * 3 + kj], plane(r, c));
        }
    }
    acc
}

/// The two-stage subsampling front in the arithmetic type `T`: conv0 + ReLU, then `round` (the
/// storage rounding), then the depthwise convolution and `round` again. Returns
/// `[batch, out_time, out_freq, channels]`.
fn reference<T: Copy + Default>(
    shape: Conv2dShape,
    lengths: &[i32],
    x: &[T],
    [w0, b0, w1, b1]: [&[T]; 4],
    tap: impl Fn(T, T, T) -> T + Copy,
    relu: impl Fn(T) -> T,
    round: impl Fn(T) -> T,
) -> Vec<T> {
    let Conv2dShape {
        batch,
        time,
        freq,
        channels,
    } = shape;
    let mid = shape.next();
    let out = mid.next();
    let lengths1 = next_lengths(lengths);
    let mut y = Vec::with_capacity(out.batch * out.time * out.freq * channels);
    for b in 0..batch {
        let valid0 = lengths[b].max(0) as usize;
        let valid1 = lengths1[b] as usize;
        let mut conv0 = vec![T::default(); mid.time * mid.freq * channels];
        for t in 0..mid.time {
            for f in 0..mid.freq {
                for c in 0..channels {
                    let plane = |r: usize, col: usize| x[(b * time + r) * freq + col];
                    let acc = conv_at(
                        plane,
                        (time, freq, valid0),
                        &w0[c * 9..c * 9 + 9],
                        b0[c],
                        (t, f),
                        tap,
                    );
                    conv0[(t * mid.freq + f) * channels + c] = round(relu(acc));
                }
            }
        }
        for t in 0..out.time {
            for f in 0..out.freq {
                for c in 0..channels {
                    let plane = |r: usize, col: usize| conv0[(r * mid.freq + col) * channels + c];
                    let acc = conv_at(
                        plane,
                        (mid.time, mid.freq, valid1),
                        &w1[c * 9..c * 9 + 9],
                        b1[c],
                        (t, f),
                        tap,
                    );
                    y.push(round(acc));
                }
            }
        }
    }
    y
}

/// Inputs of one case on the host and the device.
struct Inputs {
    x: Vec<f32>,
    /// conv0 weight, conv0 bias, depthwise weight, depthwise bias.
    params: [Vec<f32>; 4],
}

fn random_inputs(rng: &mut Rng, shape: Conv2dShape) -> Inputs {
    let c = shape.channels;
    Inputs {
        x: rng.f32_vec(shape.batch * shape.time * shape.freq, 0.5, 2.0),
        params: [
            rng.f32_vec(c * 9, 0.0, 0.5),
            rng.f32_vec(c, 0.0, 0.5),
            rng.f32_vec(c * 9, 0.0, 0.5),
            rng.f32_vec(c, 0.0, 0.5),
        ],
    }
}

/// Runs the fused kernel with `column_runs`; returns the output widened to f32.
fn run_fused<S: TestStorage>(
    engine: &CudaEngine,
    shape: Conv2dShape,
    lengths: &[i32],
    inputs: &Inputs,
    column_runs: Option<usize>,
) -> Vec<f32> {
    let up = |v: &[f32]| engine.upload(v).expect("upload");
    let x = up(&inputs.x);
    let [w0, b0, w1, b1] = inputs.params.each_ref().map(|p| up(p));
    let l0 = engine.upload(lengths).expect("lengths");
    let l1 = engine.upload(&next_lengths(lengths)).expect("lengths");
    let mut y = S::poisoned(engine, shape.next().out_elements().max(1));
    engine
        .subsample_conv0_depthwise(
            &x,
            [&l0, &l1],
            [
                Conv3x3 {
                    weight: &w0,
                    bias: &b0,
                },
                Conv3x3 {
                    weight: &w1,
                    bias: &b1,
                },
            ],
            shape,
            column_runs,
            &mut y,
        )
        .expect("fused conv0 + depthwise");
    S::to_f32(&engine.download(&y).expect("download"))
}

/// The two-kernel path: conv0 + ReLU into a storage buffer, then the depthwise convolution.
fn run_two_kernels<S: TestStorage>(
    engine: &CudaEngine,
    shape: Conv2dShape,
    lengths: &[i32],
    inputs: &Inputs,
) -> Vec<f32> {
    let up = |v: &[f32]| engine.upload(v).expect("upload");
    let x = up(&inputs.x);
    let [w0, b0, w1, b1] = inputs.params.each_ref().map(|p| up(p));
    let l0 = engine.upload(lengths).expect("lengths");
    let l1 = engine.upload(&next_lengths(lengths)).expect("lengths");
    let mut mid = S::poisoned(engine, shape.out_elements());
    engine
        .subsample_conv0_relu(&x, &l0, &w0, &b0, shape, &mut mid)
        .expect("conv0");
    let mut y = S::poisoned(engine, shape.next().out_elements());
    engine
        .subsample_depthwise(&mid, &l1, &w1, &b1, shape.next(), &mut y)
        .expect("depthwise");
    S::to_f32(&engine.download(&y).expect("download"))
}

/// Positions where `got` and `want` differ in their bits (or either is NaN), with the first few.
fn bit_mismatches(got: &[f32], want: &[f32], same_zero: bool) -> (usize, Vec<String>) {
    assert_eq!(got.len(), want.len(), "length mismatch");
    let bad: Vec<usize> = (0..got.len())
        .filter(|&i| {
            let (g, w) = (got[i], want[i]);
            let zeros = same_zero && g == 0.0 && w == 0.0;
            g.is_nan() || w.is_nan() || (g.to_bits() != w.to_bits() && !zeros)
        })
        .collect();
    let shown = bad
        .iter()
        .take(8)
        .map(|&i| format!("[{i}] got {} want {}", got[i], want[i]))
        .collect();
    (bad.len(), shown)
}

/// Column-run splits to exercise: the launch's own choice, whole rows, and uneven runs.
fn column_runs(shape: Conv2dShape) -> Vec<Option<usize>> {
    let out_freq = shape.next().next().freq;
    vec![None, Some(1), Some(3), Some(out_freq)]
}

/// What one case must give on the CPU.
struct Expected {
    /// f32 with FMA taps and the storage rounding: the two-kernel path's exact arithmetic.
    exact: Vec<f32>,
    /// f64 without intermediate rounding: checks the semantics (masks, taps) independently.
    ideal: Vec<f64>,
    /// Allowed distance from `ideal`: the storage rounding of conv0's values (bounded through
    /// the depthwise over |weights|) and of the output, then f32 accumulation (bounded through
    /// the whole chain over |inputs|), 2% more for second-order terms.
    bound: Vec<f64>,
}

fn expected<S: TestStorage>(shape: Conv2dShape, lengths: &[i32], inputs: &Inputs) -> Expected {
    let [w0, b0, w1, b1] = &inputs.params;
    let exact = reference(
        shape,
        lengths,
        &inputs.x,
        [w0, b0, w1, b1],
        |acc: f32, w, v| w.mul_add(v, acc),
        |v| v.max(0.0),
        |v| S::to_f32(&[S::from_f32(v)])[0],
    );
    let wide = |v: &[f32]| v.iter().map(|&e| f64::from(e)).collect::<Vec<_>>();
    let abs = |v: &[f32]| v.iter().map(|&e| f64::from(e.abs())).collect::<Vec<_>>();
    let (x64, p64) = (wide(&inputs.x), inputs.params.each_ref().map(|p| wide(p)));
    let p_abs = inputs.params.each_ref().map(|p| abs(p));
    let f64_ref = |x: &[f64], p: [&[f64]; 4], relu: fn(f64) -> f64| {
        reference(shape, lengths, x, p, |acc, w, v| acc + w * v, relu, |v| v)
    };
    let ideal = f64_ref(&x64, p64.each_ref().map(Vec::as_slice), |v| v.max(0.0));
    let mag = f64_ref(&x64, [&p64[0], &p64[1], &p_abs[2], &p_abs[3]], |v| {
        v.max(0.0)
    });
    let full = f64_ref(&abs(&inputs.x), p_abs.each_ref().map(Vec::as_slice), |v| v);
    let bound = (0..ideal.len())
        .map(|i| 1.02 * S::ULP * (ideal[i].abs() + mag[i]) + 1e-6 * full[i] + 1e-7)
        .collect();
    Expected {
        exact,
        ideal,
        bound,
    }
}

/// The CPU replica itself (what the GPU must match bit for bit) is a correct convolution chain:
/// within rounding of the f64 reference. Runs without a GPU.
#[test]
fn cpu_replica_matches_f64_reference() {
    for (shape, lengths) in cases() {
        let mut rng = Rng::fresh("subsampling_fused_replica");
        let inputs = random_inputs(&mut rng, shape);
        for (name, e) in [
            ("bf16", expected::<bf16>(shape, &lengths, &inputs)),
            ("f32", expected::<f32>(shape, &lengths, &inputs)),
        ] {
            let label = format!("replica {name} {shape:?} lengths {lengths:?}");
            assert!(e.exact.iter().all(|v| v.is_finite()), "{label}: not finite");
            common::assert_close(&label, &e.exact, &e.ideal, |i| e.bound[i]);
        }
    }
}

#[test]
fn fused_conv0_depthwise_matches_cpu_replica_bitwise() {
    let Some(engine) = engine("subsampling_fused_cpu") else {
        return;
    };
    for_each_storage(&engine, cpu_case::<bf16>, cpu_case::<f32>);
}

fn cpu_case<S: TestStorage>(engine: &CudaEngine) {
    let mut rng = Rng::fresh(&format!("subsampling_fused_cpu {}", S::NAME));
    let mut failures = Vec::new();
    for (shape, lengths) in cases() {
        let inputs = random_inputs(&mut rng, shape);
        let want = expected::<S>(shape, &lengths, &inputs);
        for runs in column_runs(shape) {
            let got = run_fused::<S>(engine, shape, &lengths, &inputs, runs);
            let label = format!("{} {shape:?} lengths {lengths:?} runs {runs:?}", S::NAME);
            let (n, shown) = bit_mismatches(&got, &want.exact, true);
            eprintln!(
                "RESULT fused vs CPU replica {label}: n={} bit mismatches={n}",
                got.len()
            );
            if n > 0 {
                failures.push(format!("{label}: {n} differ from the replica: {shown:?}"));
            }
            let close = check_close(&format!("fused vs f64 {label}"), &got, &want.ideal, |i| {
                want.bound[i]
            });
            if let Err(e) = close {
                failures.push(e);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{}",
        failures.join(
            "
"
        )
    );
}

#[test]
fn fused_conv0_depthwise_matches_two_kernel_path_bitwise() {
    let Some(engine) = engine("subsampling_fused_gpu") else {
        return;
    };
    for_each_storage(&engine, gpu_case::<bf16>, gpu_case::<f32>);
}

fn gpu_case<S: TestStorage>(engine: &CudaEngine) {
    let mut rng = Rng::fresh(&format!("subsampling_fused_gpu {}", S::NAME));
    let mut failures = Vec::new();
    for (shape, lengths) in cases() {
        let inputs = random_inputs(&mut rng, shape);
        let want = run_two_kernels::<S>(engine, shape, &lengths, &inputs);
        for runs in column_runs(shape) {
            let got = run_fused::<S>(engine, shape, &lengths, &inputs, runs);
            let label = format!("{} {shape:?} lengths {lengths:?} runs {runs:?}", S::NAME);
            let (n, shown) = bit_mismatches(&got, &want, false);
            eprintln!(
                "RESULT fused vs two kernels {label}: n={} bit mismatches={n}",
                got.len()
            );
            if n > 0 {
                failures.push(format!("{label}: {n} differ: {shown:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
