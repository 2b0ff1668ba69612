//! The encoder's own kernels (subsampling convolutions, fp32-residual LayerNorms, attention head
//! split/merge and the relative-shift softmax) against straightforward CPU references in f64
//! over the exact device inputs, on fresh random inputs of several shapes (odd sizes and masked
//! lengths included), outputs poisoned (NaN) before each launch; each for bf16 storage and for
//! the f32-storage build.
//!
//! Without CUDA these tests print SKIPPED and pass, unless `REQUIRE_CUDA=1`.

mod common;

use common::{assert_close, engine, for_each_storage, Rng, TestStorage};
use cuda_engine::internals::{
    stride2_out_len, Conv2dShape, HeadShape, LayerNormWeights, QkvHeads, ResidualF32, RowShape,
    ScoreRows,
};
use cuda_engine::{bf16, CudaEngine};

/// Reference 3x3 stride-2 convolution of one channel plane, input frames `>= valid` as zero.
/// Returns `(sum, sum of |terms|)`.
fn conv3x3_s2(
    plane: impl Fn(usize, usize) -> f64,
    (time, freq, valid): (usize, usize, usize),
    w: &[f64],
    bias: f64,
    (t, f): (usize, usize),
) -> (f64, f64) {
    let (mut acc, mut mag) = (bias, bias.abs());
    for ki in 0..3 {
        let Some(r) = (2 * t + ki).checked_sub(1).filter(|&r| r < valid.min(time)) else {
            continue;
        };
        for kj in 0..3 {
            let Some(c) = (2 * f + kj).checked_sub(1).filter(|&c| c < freq) else {
                continue;
            };
            let term = w[ki * 3 + kj] * plane(r, c);
            acc += term;
            mag += term.abs();
        }
    }
    (acc, mag)
}

#[test]
fn subsampling_convolutions_match_reference_with_length_masking() {
    let Some(engine) = engine("subsampling_convs") else {
        return;
    };
    for_each_storage(&engine, subsampling_case::<bf16>, subsampling_case::<f32>);
}

fn subsampling_case<S: TestStorage>(engine: &CudaEngine) {
    let mut rng = Rng::fresh(&format!("subsampling_convs {}", S::NAME));
    let cases = [
        (
            Conv2dShape {
                batch: 1,
                time: 1,
                freq: 1,
                channels: 1,
            },
            vec![1],
        ),
        (
            Conv2dShape {
                batch: 2,
                time: 13,
                freq: 11,
                channels: 5,
            },
            vec![13, 6],
        ),
        (
            Conv2dShape {
                batch: 3,
                time: 40,
                freq: 128,
                channels: 32,
            },
            vec![40, 1, 27],
        ),
        (
            Conv2dShape {
                batch: 2,
                time: 101,
                freq: 80,
                channels: 33,
            },
            vec![0, 101],
        ),
        // The encoder's channel count: whole 16-byte packs.
        (
            Conv2dShape {
                batch: 1,
                time: 20,
                freq: 128,
                channels: 256,
            },
            vec![17],
        ),
        // Whole packs for f32 storage only.
        (
            Conv2dShape {
                batch: 2,
                time: 9,
                freq: 7,
                channels: 12,
            },
            vec![9, 4],
        ),
        // Several channel blocks, the last one partial.
        (
            Conv2dShape {
                batch: 1,
                time: 6,
                freq: 10,
                channels: 2056,
            },
            vec![5],
        ),
    ];
    for (shape, lengths_host) in cases {
        let Conv2dShape {
            batch,
            time,
            freq,
            channels,
        } = shape;
        let (ot, of) = (stride2_out_len(time), stride2_out_len(freq));
        let lengths = engine.upload(&lengths_host).expect("upload");
        let w_host = rng.f32_vec(channels * 9, 0.0, 0.5);
        let b_host = rng.f32_vec(channels, 0.0, 0.5);
        let (w, b) = (
            engine.upload(&w_host).expect("w"),
            engine.upload(&b_host).expect("b"),
        );
        let w64: Vec<f64> = w_host.iter().map(|v| f64::from(*v)).collect();

        // First convolution: f32 input [batch, time, freq], ReLU, storage-type output.
        let x_host = rng.f32_vec(batch * time * freq, 0.5, 2.0);
        let x = engine.upload(&x_host).expect("x");
        let mut y = S::poisoned(engine, shape.out_elements());
        engine
            .subsample_conv0_relu(&x, &lengths, &w, &b, shape, &mut y)
            .expect("conv0");
        let got = S::to_f32(&engine.download(&y).expect("download"));
        let (mut want, mut mags) = (Vec::new(), Vec::new());
        for bi in 0..batch {
            let valid = lengths_host[bi].max(0) as usize;
            for t in 0..ot {
                for f in 0..of {
                    for c in 0..channels {
                        let plane =
                            |r: usize, col: usize| f64::from(x_host[(bi * time + r) * freq + col]);
                        let (acc, mag) = conv3x3_s2(
                            plane,
                            (time, freq, valid),
                            &w64[c * 9..c * 9 + 9],
                            f64::from(b_host[c]),
                            (t, f),
                        );
                        want.push(acc.max(0.0));
                        mags.push(mag);
                    }
                }
            }
        }
        assert_close(
            &format!("subsample_conv0_relu {shape:?}"),
            &got,
            &want,
            |i| S::ULP * want[i].abs() + 1e-6 * mags[i] + 1e-7,
        );

        // Depthwise stage: storage-type input [batch, time, freq, channels].
        let xd_host = S::random(&mut rng, batch * time * freq * channels, 0.0, 1.5);
        let xd = engine.upload(&xd_host).expect("xd");
        let xd64 = S::widen(&xd_host);
        let mut yd = S::poisoned(engine, shape.out_elements());
        engine
            .subsample_depthwise(&xd, &lengths, &w, &b, shape, &mut yd)
            .expect("depthwise");
        let got = S::to_f32(&engine.download(&yd).expect("download"));
        let (mut want, mut mags) = (Vec::new(), Vec::new());
        for bi in 0..batch {
            let valid = lengths_host[bi].max(0) as usize;
            for t in 0..ot {
                for f in 0..of {
                    for c in 0..channels {
                        let plane = |r: usize, col: usize| {
                            xd64[((bi * time + r) * freq + col) * channels + c]
                        };
                        let (acc, mag) = conv3x3_s2(
                            plane,
                            (time, freq, valid),
                            &w64[c * 9..c * 9 + 9],
                            f64::from(b_host[c]),
                            (t, f),
                        );
                        want.push(acc);
                        mags.push(mag);
                    }
                }
            }
        }
        assert_close(
            &format!("subsample_depthwise {shape:?}"),
            &got,
            &want,
            |i| S::ULP * want[i].abs() + 1e-6 * mags[i] + 1e-7,
        );
    }
}

#[test]
fn relu_inplace_clamps_exactly_the_first_n() {
    let Some(engine) = engine("relu_inplace") else {
        return;
    };
    for_each_storage(&engine, relu_case::<bf16>, relu_case::<f32>);
}

fn relu_case<S: TestStorage>(engine: &CudaEngine) {
    let mut rng = Rng::fresh(&format!("relu_inplace {}", S::NAME));
    for n in [1usize, 257, 4096, 100_003] {
        let host = S::random(&mut rng, n + 5, 0.0, 3.0);
        let mut x = engine.upload(&host).expect("upload");
        engine.relu_inplace(&mut x, n).expect("relu");
        let got = S::to_f32(&engine.download(&x).expect("download"));
        let wrong = got
            .iter()
            .zip(S::to_f32(&host))
            .enumerate()
            .filter(|(i, (g, h))| {
                let want = if *i < n { h.max(0.0) } else { *h };
                g.to_bits() != want.to_bits()
            })
            .count();
        eprintln!("RESULT relu_inplace n={n}: mismatches={wrong}");
        assert_eq!(wrong, 0, "n={n}");
    }
}

fn layer_norm_ref(v: &[f64], gamma: &[f32], beta: &[f32], eps: f32) -> Vec<f64> {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    let inv = 1.0 / (var + f64::from(eps)).sqrt();
    v.iter()
        .zip(gamma.iter().zip(beta))
        .map(|(x, (g, b))| (x - mean) * inv * f64::from(*g) + f64::from(*b))
        .collect()
}

#[test]
fn residual_layer_norms_match_reference() {
    let Some(engine) = engine("residual_layer_norms") else {
        return;
    };
    for_each_storage(
        &engine,
        residual_norm_case::<bf16>,
        residual_norm_case::<f32>,
    );
}

fn residual_norm_case<S: TestStorage>(engine: &CudaEngine) {
    let mut rng = Rng::fresh(&format!("residual_layer_norms {}", S::NAME));
    for shape in [
        RowShape { rows: 1, cols: 1 },
        RowShape { rows: 7, cols: 64 },
        RowShape {
            rows: 33,
            cols: 1024,
        },
        RowShape {
            rows: 5,
            cols: 1500,
        },
    ] {
        let n = shape.rows * shape.cols;
        let x_host = rng.f32_vec(n, 3.0, 2.0);
        let h_host = rng.f32_vec(n, -1.0, 4.0);
        let gamma_host = rng.f32_vec(shape.cols, 1.0, 0.3);
        let beta_host = rng.f32_vec(shape.cols, 0.0, 0.3);
        let (gamma, beta) = (
            engine.upload(&gamma_host).expect("gamma"),
            engine.upload(&beta_host).expect("beta"),
        );
        let weights = LayerNormWeights {
            gamma: &gamma,
            beta: &beta,
            eps: 1e-5,
        };
        let h = engine.upload(&h_host).expect("h");
        let alpha = 0.5f32;
        let sum: Vec<f64> = x_host
            .iter()
            .zip(&h_host)
            .map(|(x, h)| f64::from(*x) + f64::from(alpha) * f64::from(*h))
            .collect();
        let normed = |v: &[f64]| -> Vec<f64> {
            v.chunks(shape.cols)
                .flat_map(|row| layer_norm_ref(row, &gamma_host, &beta_host, 1e-5))
                .collect()
        };
        let x64: Vec<f64> = x_host.iter().map(|v| f64::from(*v)).collect();

        // y = LN(x), x untouched.
        let x = engine.upload(&x_host).expect("x");
        let mut y = S::poisoned(engine, n);
        engine
            .layer_norm_f32(&x, &weights, shape, &mut y)
            .expect("ln");
        let want = normed(&x64);
        let got = S::to_f32(&engine.download(&y).expect("y"));
        assert_close(&format!("layer_norm_f32 {shape:?}"), &got, &want, |i| {
            S::ULP * want[i].abs() + 1e-4
        });

        // x += alpha h; y = LN(x).
        let mut x = engine.upload(&x_host).expect("x");
        let mut y = S::poisoned(engine, n);
        engine
            .add_layer_norm_f32(
                &mut x,
                ResidualF32 { h: &h, alpha },
                &weights,
                shape,
                &mut y,
            )
            .expect("add_ln");
        let want = normed(&sum);
        let got = S::to_f32(&engine.download(&y).expect("y"));
        assert_close(
            &format!("add_layer_norm_f32 y {shape:?}"),
            &got,
            &want,
            |i| S::ULP * want[i].abs() + 1e-4,
        );
        let got = engine.download(&x).expect("x");
        assert_close(
            &format!("add_layer_norm_f32 sum {shape:?}"),
            &got,
            &sum,
            |i| 1e-6 * sum[i].abs() + 1e-6,
        );

        // x = LN(x + alpha h) in f32.
        let mut x = engine.upload(&x_host).expect("x");
        engine
            .add_layer_norm_f32_inplace(&mut x, ResidualF32 { h: &h, alpha }, &weights, shape)
            .expect("add_ln_inplace");
        let got = engine.download(&x).expect("x");
        assert_close(
            &format!("add_layer_norm_f32_inplace {shape:?}"),
            &got,
            &want,
            |i| 1e-5 * want[i].abs() + 1e-5,
        );
    }
}

#[test]
fn head_split_and_merge_move_every_element() {
    let Some(engine) = engine("head_split_merge") else {
        return;
    };
    for_each_storage(&engine, head_split_case::<bf16>, head_split_case::<f32>);
}

fn head_split_case<S: TestStorage>(engine: &CudaEngine) {
    let mut rng = Rng::fresh(&format!("head_split_merge {}", S::NAME));
    for shape in [
        HeadShape {
            batch: 1,
            time: 1,
            heads: 1,
            head_dim: 1,
        },
        HeadShape {
            batch: 2,
            time: 7,
            heads: 4,
            head_dim: 16,
        },
        HeadShape {
            batch: 3,
            time: 33,
            heads: 8,
            head_dim: 128,
        },
        // head_dim 12: whole 16-byte packs for f32 storage only; 5: never.
        HeadShape {
            batch: 2,
            time: 5,
            heads: 3,
            head_dim: 12,
        },
        HeadShape {
            batch: 2,
            time: 9,
            heads: 2,
            head_dim: 5,
        },
    ] {
        let HeadShape {
            batch,
            time,
            heads,
            head_dim,
        } = shape;
        let d = shape.d_model();
        let n = shape.elements();
        let qkv_host = S::random(&mut rng, 3 * n, 0.0, 1.0);
        let u_host = rng.f32_vec(d, 0.0, 0.5);
        let v_host = rng.f32_vec(d, 0.0, 0.5);
        let qkv = engine.upload(&qkv_host).expect("qkv");
        let (u, v) = (
            engine.upload(&u_host).expect("u"),
            engine.upload(&v_host).expect("v"),
        );
        let mut outs: Vec<_> = (0..4).map(|_| S::poisoned(engine, n)).collect();
        let [q_u, q_v, k, vv] = outs.as_mut_slice() else {
            unreachable!()
        };
        engine
            .split_qkv_heads(&qkv, &u, &v, shape, QkvHeads { q_u, q_v, k, v: vv })
            .expect("split");
        let got: Vec<Vec<f32>> = outs
            .iter()
            .map(|o| S::to_f32(&engine.download(o).expect("dl")))
            .collect();
        let qkv_wide = S::to_f32(&qkv_host);
        let mut wrong = 0;
        for b in 0..batch {
            for t in 0..time {
                for h in 0..heads {
                    for e in 0..head_dim {
                        let dst = ((h * batch + b) * time + t) * head_dim + e;
                        let col = h * head_dim + e;
                        let row = &qkv_wide[(b * time + t) * 3 * d..];
                        let q = row[col];
                        let want = [
                            S::to_f32(&[S::from_f32(q + u_host[col])])[0],
                            S::to_f32(&[S::from_f32(q + v_host[col])])[0],
                            row[d + col],
                            row[2 * d + col],
                        ];
                        for (g, w) in got.iter().zip(want) {
                            wrong += usize::from(g[dst].to_bits() != w.to_bits());
                        }
                    }
                }
            }
        }

        // merge(split(v)) is the identity on the v block of qkv.
        let mut merged = S::poisoned(engine, n);
        engine
            .merge_heads(&outs[3], shape, &mut merged)
            .expect("merge");
        let got_m = S::to_f32(&engine.download(&merged).expect("dl"));
        for bt in 0..batch * time {
            for col in 0..d {
                let want = qkv_wide[bt * 3 * d + 2 * d + col];
                wrong += usize::from(got_m[bt * d + col].to_bits() != want.to_bits());
            }
        }
        eprintln!("RESULT head split/merge {shape:?}: mismatches={wrong}");
        assert_eq!(wrong, 0, "{shape:?}");
    }
}

#[test]
fn rel_pos_softmax_matches_reference_with_relative_shift_and_masks() {
    let Some(engine) = engine("rel_pos_softmax") else {
        return;
    };
    for_each_storage(&engine, rel_pos_case::<bf16>, rel_pos_case::<f32>);
}

fn rel_pos_case<S: TestStorage>(engine: &CudaEngine) {
    let mut rng = Rng::fresh(&format!("rel_pos_softmax {}", S::NAME));
    let cases = [
        (
            HeadShape {
                batch: 1,
                time: 1,
                heads: 1,
                head_dim: 8,
            },
            vec![1],
        ),
        (
            HeadShape {
                batch: 2,
                time: 17,
                heads: 3,
                head_dim: 8,
            },
            vec![17, 5],
        ),
        (
            HeadShape {
                batch: 3,
                time: 130,
                heads: 2,
                head_dim: 8,
            },
            vec![130, 0, 77],
        ),
        (
            HeadShape {
                batch: 1,
                time: 375,
                heads: 2,
                head_dim: 8,
            },
            vec![301],
        ),
        // Longer than one warp's rows (REL_POS_WARP_KEYS): the block-per-row kernel.
        (
            HeadShape {
                batch: 2,
                time: cuda_engine::internals::REL_POS_WARP_KEYS + 37,
                heads: 1,
                head_dim: 8,
            },
            vec![cuda_engine::internals::REL_POS_WARP_KEYS as i32 + 37, 600],
        ),
    ];
    let scale = 0.25f32;
    for (shape, lengths_host) in cases {
        let HeadShape {
            batch, time, heads, ..
        } = shape;
        let positions = shape.positions();
        let rows = heads * batch * time;
        let ac_host = rng.f32_vec(rows * time, 0.0, 3.0);
        let bd_host = rng.f32_vec(rows * positions, 0.0, 3.0);
        let ac = engine.upload(&ac_host).expect("ac");
        let bd = engine.upload(&bd_host).expect("bd");
        let lengths = engine.upload(&lengths_host).expect("lengths");
        let mut probs = S::poisoned(engine, rows * time);
        engine
            .rel_pos_softmax(
                &ac,
                &bd,
                &lengths,
                scale,
                shape,
                ScoreRows::dense(time, positions),
                &mut probs,
            )
            .expect("softmax");
        let got = S::to_f32(&engine.download(&probs).expect("dl"));
        let mut want = vec![0.0f64; rows * time];
        for row in 0..rows {
            let (i, b) = (row % time, (row / time) % batch);
            let valid = lengths_host[b].max(0) as usize;
            if i >= valid {
                continue;
            }
            let scores: Vec<f64> = (0..valid)
                .map(|j| {
                    // Table row of relative position i - j is time - 1 - (i - j).
                    let c = time - 1 - i + j;
                    f64::from(scale)
                        * (f64::from(ac_host[row * time + j])
                            + f64::from(bd_host[row * positions + c]))
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            for (j, s) in scores.iter().enumerate() {
                want[row * time + j] = (s - max).exp() / sum;
            }
        }
        assert_close(&format!("rel_pos_softmax {shape:?}"), &got, &want, |i| {
            if want[i] == 0.0 {
                0.0
            } else {
                S::ULP * want[i] + 1e-7
            }
        });
    }
}

/// The CPU reference's band placement: bd column for key j of query i, if any.
fn local_bd_column(i: usize, j: usize, left: usize, right: usize) -> Option<usize> {
    let w = left.max(right);
    let c = j + w - i;
    if c < left {
        Some(c)
    } else if c >= 2 * w - right {
        Some(left + c - (2 * w - right))
    } else {
        None
    }
}

#[test]
fn local_rel_pos_softmax_matches_reference_inside_the_band_and_zeroes_outside() {
    let Some(engine) = engine("local_rel_pos_softmax") else {
        return;
    };
    for_each_storage(
        &engine,
        local_rel_pos_case::<bf16>,
        local_rel_pos_case::<f32>,
    );
}

fn local_rel_pos_case<S: TestStorage>(engine: &CudaEngine) {
    let mut rng = Rng::fresh(&format!("local_rel_pos_softmax {}", S::NAME));
    let cases = [
        (
            HeadShape {
                batch: 1,
                time: 1,
                heads: 1,
                head_dim: 8,
            },
            vec![1],
            (1, 1),
        ),
        (
            HeadShape {
                batch: 2,
                time: 17,
                heads: 3,
                head_dim: 8,
            },
            vec![17, 5],
            (2, 2),
        ),
        (
            HeadShape {
                batch: 3,
                time: 130,
                heads: 2,
                head_dim: 8,
            },
            vec![130, 0, 77],
            (16, 16),
        ),
        (
            HeadShape {
                batch: 1,
                time: 75,
                heads: 2,
                head_dim: 8,
            },
            vec![61],
            (8, 3),
        ),
        (
            HeadShape {
                batch: 1,
                time: 75,
                heads: 2,
                head_dim: 8,
            },
            vec![75],
            (2, 9),
        ),
    ];
    let scale = 0.25f32;
    for (shape, lengths_host, (left, right)) in cases {
        let HeadShape {
            batch, time, heads, ..
        } = shape;
        let band = left + right + 1;
        let rows = heads * batch * time;
        let ac_host = rng.f32_vec(rows * time, 0.0, 3.0);
        let bd_host = rng.f32_vec(rows * band, 0.0, 3.0);
        let ac = engine.upload(&ac_host).expect("ac");
        let bd = engine.upload(&bd_host).expect("bd");
        let lengths = engine.upload(&lengths_host).expect("lengths");
        let mut probs = S::poisoned(engine, rows * time);
        engine
            .local_rel_pos_softmax(
                &ac,
                &bd,
                &lengths,
                scale,
                shape,
                (left, right),
                ScoreRows::dense(time, band),
                &mut probs,
            )
            .expect("softmax");
        let got = S::to_f32(&engine.download(&probs).expect("dl"));
        let mut want = vec![0.0f64; rows * time];
        for row in 0..rows {
            let (i, b) = (row % time, (row / time) % batch);
            let valid = lengths_host[b].max(0) as usize;
            if i >= valid {
                continue;
            }
            let (lo, hi) = (i.saturating_sub(left), (i + right + 1).min(valid));
            let scores: Vec<f64> = (lo..hi)
                .map(|j| {
                    let bd_term = local_bd_column(i, j, left, right)
                        .map_or(0.0, |c| f64::from(bd_host[row * band + c]));
                    f64::from(scale) * (f64::from(ac_host[row * time + j]) + bd_term)
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            for (k, s) in scores.iter().enumerate() {
                want[row * time + lo + k] = (s - max).exp() / sum;
            }
        }
        assert_close(
            &format!("local_rel_pos_softmax {shape:?} [{left},{right}]"),
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
