//! Every kernel against a straightforward CPU reference (f64 over the exact bf16 inputs), on fresh
//! seeded random inputs of several shapes, odd sizes included, with outputs poisoned (NaN) first.
//!
//! Tolerances (per element, NaN never passes):
//! - elementwise, LayerNorm, softmax, depthwise conv: `|err| <= |ref| / 256 + small abs term`
//!   (one bf16 ulp; the abs term covers f32 accumulation, see each test);
//! - matmul: `|err| <= |ref| / 256 (bf16 out only) + 2e-4 * sum_k |a b| (+|bias|)`: fp32
//!   accumulation over k terms in any order, far below the error of a wrong index; bf16 output
//!   with bias also allows `|a.b| / 256` (cuBLASLt rounds the product before the bias add).
//!
//! The storage-dependent kernels run twice: bf16 storage, then the f32-storage build (tolerance
//! `TestStorage::ULP`: one bf16 ulp, or a few f32 ulps for the kernels' own f32 arithmetic).
//!
//! Without CUDA these tests print SKIPPED and pass, unless `REQUIRE_CUDA=1`.

mod common;

use common::{
    assert_close, check_close, engine, for_each_storage, poisoned_bf16, poisoned_f32, to_f32,
    widen, Rng, TestStorage, BF16_ULP,
};
use cuda_engine::internals::{
    fold_batch_norm, AttentionShape, BLayout, BatchNorm, DepthwiseShape, LayerNormWeights,
    MatmulSpec, Residual, RowShape,
};
use cuda_engine::{bf16, CudaEngine, CudaEngineError, DropErrors, StorageKind};

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

#[test]
fn f32_to_bf16_matches_half_crate_rounding_bit_for_bit() {
    let Some(engine) = engine("f32_to_bf16") else {
        return;
    };
    let mut rng = Rng::fresh("f32_to_bf16");
    let specials = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
        1e-40,
        f32::MAX,
        1.0 + 1.0 / 256.0, // tie: rounds to even (1.0)
        1.0 + 3.0 / 256.0, // tie: rounds to even (1 + 4/256)
    ];
    for n in [1usize, 1000, 100_003] {
        let mut host: Vec<f32> = (0..n)
            .map(|_| (rng.normal() * 2f64.powf(rng.uniform() * 60.0 - 30.0)) as f32)
            .collect();
        for (slot, special) in host.iter_mut().zip(specials) {
            *slot = special;
        }
        let x = engine.upload(&host).expect("upload");
        let mut y = poisoned_bf16(&engine, n);
        engine.f32_to_storage(&x, &mut y).expect("launch");
        let got = engine.download(&y).expect("download");
        let mut mismatches = 0;
        for (i, (&g, &v)) in got.iter().zip(&host).enumerate() {
            let want = bf16::from_f32(v);
            let same = if v.is_nan() {
                g.is_nan()
            } else {
                g.to_bits() == want.to_bits()
            };
            if !same {
                mismatches += 1;
                eprintln!(
                    "[{i}] {v:e}: got {:#06x} want {:#06x}",
                    g.to_bits(),
                    want.to_bits()
                );
            }
        }
        eprintln!("RESULT f32_to_bf16 n={n}: bit mismatches={mismatches}");
        assert_eq!(mismatches, 0, "n={n}");
    }
}

#[test]
fn bf16_to_f32_is_exact_for_every_bit_pattern() {
    let Some(engine) = engine("bf16_to_f32") else {
        return;
    };
    let host: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
    let x = engine.upload(&host).expect("upload");
    let mut y = poisoned_f32(&engine, host.len());
    engine.storage_to_f32(&x, &mut y).expect("launch");
    let got = engine.download(&y).expect("download");
    let mismatches = got
        .iter()
        .zip(&host)
        .filter(|(g, v)| {
            let want = v.to_f32();
            if want.is_nan() {
                !g.is_nan()
            } else {
                g.to_bits() != want.to_bits()
            }
        })
        .count();
    eprintln!("RESULT bf16_to_f32 all 65536 patterns: mismatches={mismatches}");
    assert_eq!(mismatches, 0);
}

#[test]
fn silu_matches_reference() {
    let Some(engine) = engine("silu") else {
        return;
    };
    for_each_storage(&engine, silu_case::<bf16>, silu_case::<f32>);
}

fn silu_case<S: TestStorage>(engine: &CudaEngine) {
    let mut rng = Rng::fresh(&format!("silu {}", S::NAME));
    // Whole 16-byte packs only (4096), packs plus a tail, and tails alone.
    for n in [1usize, 7, 33, 4096, 4097, 300_001] {
        let host = S::random(&mut rng, n, 0.0, 4.0);
        let x = engine.upload(&host).expect("upload");
        let mut y = S::poisoned(engine, n);
        engine.silu(&x, &mut y).expect("launch");
        let got = S::to_f32(&engine.download(&y).expect("download"));
        let want: Vec<f64> = S::widen(&host).iter().map(|&v| v * sigmoid(v)).collect();
        assert_close(&format!("silu n={n}"), &got, &want, |i| {
            S::ULP * want[i].abs() + 1e-6
        });
    }
}

#[test]
fn glu_matches_reference() {
    let Some(engine) = engine("glu") else {
        return;
    };
    for_each_storage(&engine, glu_case::<bf16>, glu_case::<f32>);
}

fn glu_case<S: TestStorage>(engine: &CudaEngine) {
    let mut rng = Rng::fresh(&format!("glu {}", S::NAME));
    // half = 12 is whole packs for f32 storage only; 40 for both.
    for (rows, half) in [
        (1usize, 1usize),
        (7, 33),
        (130, 257),
        (64, 512),
        (5, 12),
        (9, 40),
    ] {
        let host = S::random(&mut rng, rows * 2 * half, 0.0, 3.0);
        let x = engine.upload(&host).expect("upload");
        let mut y = S::poisoned(engine, rows * half);
        engine.glu(&x, rows, half, &mut y).expect("launch");
        let got = S::to_f32(&engine.download(&y).expect("download"));
        let wide = S::widen(&host);
        let want: Vec<f64> = (0..rows * half)
            .map(|i| {
                let (r, c) = (i / half, i % half);
                wide[r * 2 * half + c] * sigmoid(wide[r * 2 * half + half + c])
            })
            .collect();
        assert_close(&format!("glu rows={rows} half={half}"), &got, &want, |i| {
            S::ULP * want[i].abs() + 1e-6
        });
    }
}

/// LayerNorm of one row in f64.
fn layer_norm_ref(row: &[f64], gamma: &[f32], beta: &[f32], eps: f64) -> Vec<f64> {
    let n = row.len() as f64;
    let mean = row.iter().sum::<f64>() / n;
    let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    let inv_std = 1.0 / (var + eps).sqrt();
    row.iter()
        .enumerate()
        .map(|(c, v)| (v - mean) * inv_std * f64::from(gamma[c]) + f64::from(beta[c]))
        .collect()
}

const LAYER_NORM_SHAPES: [(usize, usize); 5] = [(1, 1), (3, 7), (17, 257), (33, 1024), (5, 1500)];

#[test]
fn layer_norm_matches_reference() {
    let Some(engine) = engine("layer_norm") else {
        return;
    };
    for_each_storage(&engine, layer_norm_case::<bf16>, layer_norm_case::<f32>);
}

fn layer_norm_case<S: TestStorage>(engine: &CudaEngine) {
    let mut rng = Rng::fresh(&format!("layer_norm {}", S::NAME));
    let eps = 1e-5f32;
    for (rows, cols) in LAYER_NORM_SHAPES {
        // A mean offset of 3 makes a one-pass variance or a missing mean subtraction visible.
        let host = S::random(&mut rng, rows * cols, 3.0, 2.0);
        let gamma_host = rng.f32_vec(cols, 1.0, 0.2);
        let beta_host = rng.f32_vec(cols, 0.0, 0.2);
        let x = engine.upload(&host).expect("upload");
        let gamma = engine.upload(&gamma_host).expect("upload");
        let beta = engine.upload(&beta_host).expect("upload");
        let weights = LayerNormWeights {
            gamma: &gamma,
            beta: &beta,
            eps,
        };
        let mut y = S::poisoned(engine, rows * cols);
        engine
            .layer_norm(&x, &weights, RowShape { rows, cols }, &mut y)
            .expect("launch");
        let got = S::to_f32(&engine.download(&y).expect("download"));
        let wide = S::widen(&host);
        let want: Vec<f64> = wide
            .chunks(cols)
            .flat_map(|row| layer_norm_ref(row, &gamma_host, &beta_host, f64::from(eps)))
            .collect();
        assert_close(
            &format!("layer_norm rows={rows} cols={cols}"),
            &got,
            &want,
            |i| S::ULP * want[i].abs() + 1e-4,
        );
    }
}

#[test]
fn add_layer_norm_matches_reference_and_writes_the_sum() {
    let Some(engine) = engine("add_layer_norm") else {
        return;
    };
    for_each_storage(
        &engine,
        add_layer_norm_case::<bf16>,
        add_layer_norm_case::<f32>,
    );
}

fn add_layer_norm_case<S: TestStorage>(engine: &CudaEngine) {
    let mut rng = Rng::fresh(&format!("add_layer_norm {}", S::NAME));
    let eps = 1e-5f32;
    for (rows, cols) in LAYER_NORM_SHAPES {
        let alpha = 0.5f32;
        let x_host = S::random(&mut rng, rows * cols, 3.0, 2.0);
        let r_host = S::random(&mut rng, rows * cols, -1.0, 3.0);
        let gamma_host = rng.f32_vec(cols, 1.0, 0.2);
        let beta_host = rng.f32_vec(cols, 0.0, 0.2);
        let x = engine.upload(&x_host).expect("upload");
        let r = engine.upload(&r_host).expect("upload");
        let gamma = engine.upload(&gamma_host).expect("upload");
        let beta = engine.upload(&beta_host).expect("upload");
        let weights = LayerNormWeights {
            gamma: &gamma,
            beta: &beta,
            eps,
        };
        let mut sum = S::poisoned(engine, rows * cols);
        let mut y = S::poisoned(engine, rows * cols);
        engine
            .add_layer_norm(
                &x,
                Residual { r: &r, alpha },
                &weights,
                RowShape { rows, cols },
                &mut sum,
                &mut y,
            )
            .expect("launch");
        let got_sum = S::to_f32(&engine.download(&sum).expect("download"));
        let got_y = S::to_f32(&engine.download(&y).expect("download"));
        let want_sum: Vec<f64> = S::widen(&x_host)
            .iter()
            .zip(S::widen(&r_host))
            .map(|(x, r)| x + f64::from(alpha) * r)
            .collect();
        let want_y: Vec<f64> = want_sum
            .chunks(cols)
            .flat_map(|row| layer_norm_ref(row, &gamma_host, &beta_host, f64::from(eps)))
            .collect();
        let label = format!("rows={rows} cols={cols}");
        assert_close(
            &format!("add_layer_norm sum {label}"),
            &got_sum,
            &want_sum,
            |i| S::ULP * want_sum[i].abs() + 1e-6,
        );
        assert_close(&format!("add_layer_norm y {label}"), &got_y, &want_y, |i| {
            S::ULP * want_y[i].abs() + 1e-4
        });
    }
}

#[test]
fn masked_softmax_matches_reference_and_zeroes_masked_positions() {
    let Some(engine) = engine("masked_softmax") else {
        return;
    };
    for_each_storage(
        &engine,
        masked_softmax_case::<bf16>,
        masked_softmax_case::<f32>,
    );
}

fn masked_softmax_case<S: TestStorage>(engine: &CudaEngine) {
    let mut rng = Rng::fresh(&format!("masked_softmax {}", S::NAME));
    let cases: [(AttentionShape, Vec<i32>); 5] = [
        (
            AttentionShape {
                batch: 1,
                heads: 1,
                tq: 1,
                tk: 1,
            },
            vec![1],
        ),
        (
            AttentionShape {
                batch: 2,
                heads: 3,
                tq: 17,
                tk: 17,
            },
            vec![17, 5],
        ),
        (
            AttentionShape {
                batch: 3,
                heads: 8,
                tq: 130,
                tk: 130,
            },
            vec![130, 0, 77],
        ),
        (
            AttentionShape {
                batch: 2,
                heads: 2,
                tq: 257,
                tk: 257,
            },
            vec![200, 257],
        ),
        (
            AttentionShape {
                batch: 1,
                heads: 2,
                tq: 5,
                tk: 1033,
            },
            vec![1000],
        ),
    ];
    let scale = 0.125f32;
    for (shape, lengths_host) in cases {
        let AttentionShape {
            batch,
            heads,
            tq,
            tk,
        } = shape;
        let n = batch * heads * tq * tk;
        let scores_host = rng.f32_vec(n, 0.0, 8.0);
        let scores = engine.upload(&scores_host).expect("upload");
        let lengths = engine.upload(&lengths_host).expect("upload");
        let mut probs = S::poisoned(engine, n);
        engine
            .masked_softmax(&scores, &lengths, scale, shape, tk, &mut probs)
            .expect("launch");
        let got = S::to_f32(&engine.download(&probs).expect("download"));
        let mut want = vec![0.0f64; n];
        for (row, out) in want.chunks_mut(tk).enumerate() {
            let q = row % tq;
            let valid = (lengths_host[row / (heads * tq)].max(0) as usize).min(tk);
            if q >= valid {
                continue;
            }
            let s = &scores_host[row * tk..row * tk + valid];
            let max = s
                .iter()
                .map(|&v| f64::from(v) * f64::from(scale))
                .fold(f64::MIN, f64::max);
            let total: f64 = s
                .iter()
                .map(|&v| (f64::from(v) * f64::from(scale) - max).exp())
                .sum();
            for (c, &v) in s.iter().enumerate() {
                out[c] = (f64::from(v) * f64::from(scale) - max).exp() / total;
            }
        }
        // Masked positions must be exactly 0: their bound is 0.
        assert_close(
            &format!("masked_softmax {shape:?} lengths={lengths_host:?}"),
            &got,
            &want,
            |i| {
                if want[i] == 0.0 {
                    0.0
                } else {
                    S::ULP * want[i] + 1e-7
                }
            },
        );
    }
}

#[test]
fn depthwise_conv_with_folded_batch_norm_matches_conv_then_batch_norm() {
    let Some(engine) = engine("depthwise_conv1d") else {
        return;
    };
    for_each_storage(&engine, depthwise_case::<bf16>, depthwise_case::<f32>);
}

fn depthwise_case<S: TestStorage>(engine: &CudaEngine) {
    let mut rng = Rng::fresh(&format!("depthwise_conv1d {}", S::NAME));
    let cases: [(DepthwiseShape, Vec<i32>, bool); 8] = [
        (
            DepthwiseShape {
                batch: 1,
                time: 1,
                channels: 1,
                kernel: 1,
            },
            vec![1],
            false,
        ),
        (
            DepthwiseShape {
                batch: 2,
                time: 17,
                channels: 33,
                kernel: 9,
            },
            vec![17, 9],
            true,
        ),
        (
            DepthwiseShape {
                batch: 3,
                time: 130,
                channels: 257,
                kernel: 9,
            },
            vec![130, 1, 64],
            false,
        ),
        (
            DepthwiseShape {
                batch: 2,
                time: 64,
                channels: 1024,
                kernel: 31,
            },
            vec![64, 40],
            true,
        ),
        (
            DepthwiseShape {
                batch: 2,
                time: 5,
                channels: 7,
                kernel: 9,
            },
            vec![3, 0],
            true,
        ),
        // Whole packs, a partly filled channel block, several time steps per thread.
        (
            DepthwiseShape {
                batch: 2,
                time: 200,
                channels: 24,
                kernel: 9,
            },
            vec![200, 111],
            true,
        ),
        // Several channel blocks, the last one partial.
        (
            DepthwiseShape {
                batch: 2,
                time: 23,
                channels: 520,
                kernel: 9,
            },
            vec![23, 20],
            false,
        ),
        // A kernel whose weights make the launch use narrower channel blocks.
        (
            DepthwiseShape {
                batch: 1,
                time: 40,
                channels: 256,
                kernel: 65,
            },
            vec![37],
            true,
        ),
    ];
    for (shape, lengths_host, apply_silu) in cases {
        let DepthwiseShape {
            batch,
            time,
            channels,
            kernel,
        } = shape;
        let x_host = S::random(&mut rng, batch * time * channels, 0.0, 1.0);
        let weight = rng.f32_vec(channels * kernel, 0.0, 0.3);
        let conv_bias = rng.f32_vec(channels, 0.0, 0.1);
        let gamma = rng.f32_vec(channels, 1.0, 0.2);
        let beta = rng.f32_vec(channels, 0.0, 0.2);
        let mean = rng.f32_vec(channels, 0.0, 0.3);
        let var: Vec<f32> = (0..channels)
            .map(|_| (0.2 + rng.uniform()) as f32)
            .collect();
        let bn = BatchNorm {
            gamma: &gamma,
            beta: &beta,
            running_mean: &mean,
            running_var: &var,
            eps: 1e-5,
        };
        let folded =
            fold_batch_norm(&weight, Some(&conv_bias), channels, kernel, &bn).expect("fold");
        let x = engine.upload(&x_host).expect("upload");
        let w = engine.upload(&folded.weight).expect("upload");
        let b = engine.upload(&folded.bias).expect("upload");
        let lengths = engine.upload(&lengths_host).expect("upload");
        let mut y = S::poisoned(engine, x_host.len());
        engine
            .depthwise_conv1d(&x, &w, &b, &lengths, shape, apply_silu, &mut y)
            .expect("launch");
        let got = S::to_f32(&engine.download(&y).expect("download"));

        // Reference: mask padding, convolve with the unfolded weights, BatchNorm, optional SiLU;
        // padding frames of the output are zero.
        let wide = S::widen(&x_host);
        let pad = (kernel - 1) / 2;
        let mut want = vec![0.0f64; wide.len()];
        let mut magnitude = vec![0.0f64; wide.len()];
        for bi in 0..batch {
            let valid = (lengths_host[bi].max(0) as usize).min(time);
            for t in 0..valid {
                for c in 0..channels {
                    let mut acc = f64::from(conv_bias[c]);
                    let mut mag = 0.0;
                    for k in 0..kernel {
                        let src = t as isize + k as isize - pad as isize;
                        if src >= 0 && (src as usize) < valid {
                            let term = f64::from(weight[c * kernel + k])
                                * wide[(bi * time + src as usize) * channels + c];
                            acc += term;
                            mag += term.abs();
                        }
                    }
                    let scale = f64::from(gamma[c]) / (f64::from(var[c]) + 1e-5f64).sqrt();
                    let mut v = (acc - f64::from(mean[c])) * scale + f64::from(beta[c]);
                    if apply_silu {
                        v *= sigmoid(v);
                    }
                    let i = (bi * time + t) * channels + c;
                    want[i] = v;
                    magnitude[i] = (mag + f64::from(conv_bias[c]).abs() + f64::from(mean[c]).abs())
                        * scale.abs()
                        + f64::from(beta[c]).abs();
                }
            }
        }
        assert_close(
            &format!("depthwise_conv1d {shape:?} lengths={lengths_host:?} silu={apply_silu}"),
            &got,
            &want,
            |i| {
                if magnitude[i] == 0.0 {
                    0.0 // padding frame: must be exactly zero
                } else {
                    S::ULP * want[i].abs() + 1e-5 * magnitude[i] + 1e-6
                }
            },
        );
    }
}

/// `out[batch, m, n] = alpha * a . op(b) + bias` in f64, plus each element's magnitude sum.
fn matmul_ref(
    spec: &MatmulSpec,
    a: &[f64],
    b: &[f64],
    bias: Option<&[f64]>,
) -> (Vec<f64>, Vec<f64>) {
    let MatmulSpec { batch, m, n, k, .. } = *spec;
    let mut out = vec![0.0; batch * m * n];
    let mut mag = vec![0.0; batch * m * n];
    for bi in 0..batch {
        let b_base = if spec.b_shared { 0 } else { bi * n * k };
        for i in 0..m {
            let a_row = &a[(bi * m + i) * k..(bi * m + i + 1) * k];
            for j in 0..n {
                let (mut acc, mut abs) = (0.0, 0.0);
                for (kk, &av) in a_row.iter().enumerate() {
                    let bv = match spec.b_layout {
                        BLayout::NByK => b[b_base + j * k + kk],
                        BLayout::KByN => b[b_base + kk * n + j],
                    };
                    acc += av * bv;
                    abs += (av * bv).abs();
                }
                let bias_j = bias.map_or(0.0, |bias| bias[j]);
                let alpha = f64::from(spec.alpha);
                out[(bi * m + i) * n + j] = alpha * acc + bias_j;
                mag[(bi * m + i) * n + j] = alpha.abs() * abs + bias_j.abs();
            }
        }
    }
    (out, mag)
}

fn random_operands<S: TestStorage>(rng: &mut Rng, spec: &MatmulSpec) -> (Vec<S>, Vec<S>) {
    let b_batches = if spec.b_shared { 1 } else { spec.batch };
    let a = S::random(rng, spec.batch * spec.m * spec.k, 0.0, 1.0);
    let b = S::random(
        rng,
        b_batches * spec.n * spec.k,
        0.0,
        1.0 / (spec.k as f64).sqrt(),
    );
    (a, b)
}

const MATMUL_ACCUMULATION_TOL: f64 = 2e-4;

#[test]
fn matmul_linear_bf16_output_matches_reference_with_and_without_bias() {
    let Some(engine) = engine("matmul_linear_bf16") else {
        return;
    };
    let mut rng = Rng::fresh("matmul_linear_bf16");
    let shapes = [
        (1usize, 1usize, 1usize),
        (37, 67, 129),
        (130, 257, 33),
        (256, 1024, 1024),
    ];
    let mut failures = Vec::new();
    for (rows, in_features, out_features) in shapes {
        for with_bias in [false, true] {
            let spec = MatmulSpec::linear(rows, in_features, out_features);
            let (a_host, b_host) = random_operands(&mut rng, &spec);
            let bias_host = rng.bf16_vec(out_features, 0.0, 0.5);
            let a = engine.upload(&a_host).expect("upload");
            let b = engine.upload(&b_host).expect("upload");
            let bias = engine.upload(&bias_host).expect("upload");
            let mut out = poisoned_bf16(&engine, rows * out_features);
            engine
                .matmul(&spec, &a, &b, with_bias.then_some(&bias), &mut out)
                .expect("matmul");
            let got = to_f32(&engine.download(&out).expect("download"));
            let bias_wide = widen(&bias_host);
            let (want, mag) = matmul_ref(
                &spec,
                &widen(&a_host),
                &widen(&b_host),
                with_bias.then_some(bias_wide.as_slice()),
            );
            let label = format!(
                "matmul bf16-out{} {}",
                if with_bias { "+bias" } else { "" },
                describe(&spec)
            );
            // Without bias: one rounding of the fp32 result. With bias, cuBLASLt 13.0 was
            // measured to round the product a.b to bf16 before adding the bias in some kernels,
            // so one more bf16 ulp of |a.b| = |ref - bias| is allowed.
            let checked = check_close(&label, &got, &want, |i| {
                let product = if with_bias {
                    (want[i] - bias_wide[i % out_features]).abs()
                } else {
                    0.0
                };
                BF16_ULP * (want[i].abs() + product) + MATMUL_ACCUMULATION_TOL * mag[i]
            });
            if let Err(message) = checked {
                failures.push(message);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every product's cuBLASLt descriptors (and the engine's NVRTC programs) were destroyed
    // without an error for Drop to record.
    assert_eq!(cuda_engine::drop_errors(), DropErrors::default());
}

/// bf16 operands (the encoder's products), then f32 operands (the f32-storage encoder and the
/// decoder's encoder projection), where the tighter bound (1e-5 of the summed magnitudes) also
/// catches TF32: its 10-bit-mantissa products err by about 5e-4 each.
#[test]
fn matmul_batched_f32_output_matches_reference() {
    let Some(engine) = engine("matmul_batched_f32") else {
        return;
    };
    for_each_storage(
        &engine,
        matmul_f32_out_case::<bf16>,
        matmul_f32_out_case::<f32>,
    );
}

fn matmul_f32_out_case<S: TestStorage>(engine: &CudaEngine) {
    let mut rng = Rng::fresh(&format!("matmul_batched_f32 {} operands", S::NAME));
    let tolerance = match S::KIND {
        StorageKind::Bf16 => MATMUL_ACCUMULATION_TOL,
        StorageKind::F32 => 1e-5,
    };
    let specs = [
        // Attention probabilities . values: b is [k, n] per batch entry.
        MatmulSpec {
            batch: 3,
            m: 17,
            n: 65,
            k: 40,
            b_layout: BLayout::KByN,
            b_shared: false,
            alpha: 1.0,
            strides: Default::default(),
        },
        // Queries . keysᵀ with the 1/sqrt(d) scale folded into alpha.
        MatmulSpec {
            batch: 8,
            m: 130,
            n: 130,
            k: 64,
            b_layout: BLayout::NByK,
            b_shared: false,
            alpha: 0.125,
            strides: Default::default(),
        },
        // One weight shared by every batch entry.
        MatmulSpec {
            batch: 3,
            m: 33,
            n: 47,
            k: 129,
            b_layout: BLayout::NByK,
            b_shared: true,
            alpha: 1.0,
            strides: Default::default(),
        },
        MatmulSpec {
            batch: 2,
            m: 5,
            n: 7,
            k: 3,
            b_layout: BLayout::KByN,
            b_shared: true,
            alpha: -2.0,
            strides: Default::default(),
        },
    ];
    for spec in specs {
        let (a_host, b_host) = random_operands::<S>(&mut rng, &spec);
        let with_bias = spec.b_shared;
        let bias_host = rng.f32_vec(spec.n, 0.0, 0.5);
        let a = engine.upload(&a_host).expect("upload");
        let b = engine.upload(&b_host).expect("upload");
        let bias = engine.upload(&bias_host).expect("upload");
        let mut out = poisoned_f32(engine, spec.batch * spec.m * spec.n);
        engine
            .matmul(&spec, &a, &b, with_bias.then_some(&bias), &mut out)
            .expect("matmul");
        let got = engine.download(&out).expect("download");
        let bias_wide: Vec<f64> = bias_host.iter().map(|&v| f64::from(v)).collect();
        let (want, mag) = matmul_ref(
            &spec,
            &S::widen(&a_host),
            &S::widen(&b_host),
            with_bias.then_some(bias_wide.as_slice()),
        );
        let label = format!(
            "matmul {}-operands f32-out{} {}",
            S::NAME,
            if with_bias { "+bias" } else { "" },
            describe(&spec)
        );
        assert_close(&label, &got, &want, |i| tolerance * mag[i] + 1e-7);
    }
}

fn describe(spec: &MatmulSpec) -> String {
    format!(
        "batch={} m={} n={} k={} {:?}{} alpha={}",
        spec.batch,
        spec.m,
        spec.n,
        spec.k,
        spec.b_layout,
        if spec.b_shared { " shared-b" } else { "" },
        spec.alpha
    )
}

#[test]
fn short_buffers_are_rejected_before_launch() {
    let Some(engine) = engine("shape_checks") else {
        return;
    };
    let x = engine.zeros::<bf16>(10).expect("alloc");
    let mut y = engine.zeros::<bf16>(9).expect("alloc");
    assert!(matches!(
        engine.silu(&x, &mut y),
        Err(CudaEngineError::Shape { op: "silu", .. })
    ));
    let gamma = engine.zeros::<f32>(4).expect("alloc");
    let weights = LayerNormWeights {
        gamma: &gamma,
        beta: &gamma,
        eps: 1e-5,
    };
    let err = engine.layer_norm(&x, &weights, RowShape { rows: 2, cols: 5 }, &mut y);
    assert!(matches!(err, Err(CudaEngineError::Shape { .. })), "{err:?}");
    let spec = MatmulSpec::linear(2, 5, 3);
    let mut out = engine.zeros::<f32>(6).expect("alloc");
    let err = engine.matmul::<bf16, f32>(&spec, &x, &y, None, &mut out);
    assert!(
        matches!(err, Err(CudaEngineError::Shape { op: "matmul", .. })),
        "{err:?}"
    );
    engine
        .synchronize()
        .expect("no fault after rejected launches");
}
