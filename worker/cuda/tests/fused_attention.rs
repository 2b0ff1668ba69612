//! The fused relative-position attention kernel (`rel_pos_attention`, bf16, head_dim 128)
//! against a CPU reference in f64 over the exact device inputs, on fresh random inputs of
//! several shapes (one frame, odd lengths, an empty utterance, tiles cut mid-utterance, 8 heads
//! at 30 s), output poisoned (NaN) before each launch. Padded query rows must come out as
//! exact zeros.
//!
//! Without CUDA (or on a GPU older than compute capability 8.0) these tests print SKIPPED and
//! pass, unless `REQUIRE_CUDA=1`.

mod common;

use common::{assert_close, engine, poisoned_bf16, widen, Rng, BF16_ULP};
use cuda_engine::bf16;
use cuda_engine::internals::{HeadShape, FUSED_ATTENTION_HEAD_DIM};

/// `out[b, i, h*D + e]` of the reference, and a bound per element: the kernel rounds the
/// unnormalized probabilities to bf16 before `P·V` (one ulp of each term) and the output once.
fn reference(
    shape: HeadShape,
    lengths: &[i32],
    scale: f64,
    [q_u, q_v, k, v, pos]: [&[f64]; 5],
) -> (Vec<f64>, Vec<f64>) {
    let HeadShape {
        batch,
        time,
        heads,
        head_dim: hd,
    } = shape;
    let d = heads * hd;
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let mut out = vec![0.0; batch * time * d];
    let mut bound = vec![0.0; batch * time * d];
    for h in 0..heads {
        for (b, &length) in lengths.iter().enumerate().take(batch) {
            let valid = (length.max(0) as usize).min(time);
            let at = |t: usize| ((h * batch + b) * time + t) * hd;
            for i in 0..valid {
                let scores: Vec<f64> = (0..valid)
                    .map(|j| {
                        let c = time - 1 - i + j;
                        let p = &pos[c * d + h * hd..c * d + (h + 1) * hd];
                        scale
                            * (dot(&q_u[at(i)..at(i) + hd], &k[at(j)..at(j) + hd])
                                + dot(&q_v[at(i)..at(i) + hd], p))
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let sum: f64 = weights.iter().sum();
                for e in 0..hd {
                    let terms = (0..valid).map(|j| weights[j] / sum * v[at(j) + e]);
                    let abs: f64 = (0..valid)
                        .map(|j| (weights[j] / sum * v[at(j) + e]).abs())
                        .sum();
                    let o = (b * time + i) * d + h * hd + e;
                    out[o] = terms.sum();
                    bound[o] = 2.0 * BF16_ULP * abs + BF16_ULP * out[o].abs() + 1e-6;
                }
            }
        }
    }
    (out, bound)
}

#[test]
fn fused_attention_matches_reference_with_relative_shift_and_masks() {
    let Some(engine) = engine("fused_attention") else {
        return;
    };
    if engine.compute_capability().0 < 8 {
        eprintln!("SKIPPED: the fused attention needs compute capability 8.0 or newer");
        return;
    }
    let mut rng = Rng::fresh("fused_attention");
    let hd = FUSED_ATTENTION_HEAD_DIM;
    let shape = |batch, time, heads| HeadShape {
        batch,
        time,
        heads,
        head_dim: hd,
    };
    let cases = [
        (shape(1, 1, 1), vec![1]),
        (shape(2, 17, 2), vec![17, 5]),
        (shape(3, 130, 2), vec![130, 0, 77]),
        (shape(1, 64, 1), vec![64]),
        (shape(2, 65, 1), vec![65, 64]),
        (shape(2, 375, 8), vec![375, 301]),
    ];
    let scale = 1.0 / (hd as f64).sqrt();
    for (shape, lengths_host) in cases {
        let n = shape.elements();
        let table = shape.positions() * shape.d_model();
        let inputs: Vec<Vec<bf16>> = [n, n, n, n, table]
            .iter()
            .map(|&len| rng.bf16_vec(len, 0.0, 1.0))
            .collect();
        let up = |host: &[bf16]| engine.upload(host).expect("upload");
        let (q_u, q_v, k, v, pos) = (
            up(&inputs[0]),
            up(&inputs[1]),
            up(&inputs[2]),
            up(&inputs[3]),
            up(&inputs[4]),
        );
        let lengths = engine.upload(&lengths_host).expect("lengths");
        let mut out = poisoned_bf16(&engine, n);
        engine
            .rel_pos_attention(
                &q_u,
                &q_v,
                &k,
                &v,
                &pos,
                &lengths,
                scale as f32,
                shape,
                &mut out,
            )
            .expect("rel_pos_attention");
        let got: Vec<f32> = engine
            .download(&out)
            .expect("download")
            .iter()
            .map(|x| x.to_f32())
            .collect();
        let wide: Vec<Vec<f64>> = inputs.iter().map(|x| widen(x)).collect();
        let (want, bound) = reference(
            shape,
            &lengths_host,
            scale,
            [&wide[0], &wide[1], &wide[2], &wide[3], &wide[4]],
        );
        assert_close(
            &format!("rel_pos_attention {shape:?} lengths {lengths_host:?}"),
            &got,
            &want,
            |i| bound[i],
        );
    }
}

/// A clip's output must not depend on its batch: one utterance alone, then padded in a batch
/// with a longer one (its padding filled with noise), gives bit-identical rows. The table is
/// the same function of the relative position in both runs, as the encoder builds it.
#[test]
fn fused_attention_rows_do_not_depend_on_the_batch() {
    let Some(engine) = engine("fused_attention batch invariance") else {
        return;
    };
    if engine.compute_capability().0 < 8 {
        eprintln!("SKIPPED: the fused attention needs compute capability 8.0 or newer");
        return;
    }
    let mut rng = Rng::fresh("fused_attention batch invariance");
    let (hd, heads, short, long) = (FUSED_ATTENTION_HEAD_DIM, 2, 70usize, 130usize);
    let d = heads * hd;
    // Per relative position p (index p + long - 1), the table row of every head.
    let table_by_rel = rng.bf16_vec((2 * long - 1) * d, 0.0, 1.0);
    let clip: Vec<Vec<bf16>> = (0..4)
        .map(|_| rng.bf16_vec(heads * short * hd, 0.0, 1.0))
        .collect();
    let run = |batch: usize, time: usize, rng: &mut Rng| -> Vec<bf16> {
        let shape = HeadShape {
            batch,
            time,
            heads,
            head_dim: hd,
        };
        // Utterance 0 is the clip (then noise in its padding), the others noise.
        let inputs: Vec<Vec<bf16>> = clip
            .iter()
            .map(|values| {
                let mut all = rng.bf16_vec(shape.elements(), 0.0, 1.0);
                for h in 0..heads {
                    for t in 0..short {
                        let from = (h * short + t) * hd;
                        let to = ((h * batch) * time + t) * hd;
                        all[to..to + hd].copy_from_slice(&values[from..from + hd]);
                    }
                }
                all
            })
            .collect();
        let mut table = vec![bf16::ZERO; shape.positions() * d];
        for c in 0..shape.positions() {
            let p = time as i64 - 1 - c as i64;
            let from = (p + long as i64 - 1) as usize * d;
            table[c * d..(c + 1) * d].copy_from_slice(&table_by_rel[from..from + d]);
        }
        let up = |host: &[bf16]| engine.upload(host).expect("upload");
        let mut lengths_host = vec![time as i32; batch];
        lengths_host[0] = short as i32;
        let lengths = engine.upload(&lengths_host).expect("lengths");
        let mut out = poisoned_bf16(&engine, shape.elements());
        engine
            .rel_pos_attention(
                &up(&inputs[0]),
                &up(&inputs[1]),
                &up(&inputs[2]),
                &up(&inputs[3]),
                &up(&table),
                &lengths,
                (hd as f32).sqrt().recip(),
                shape,
                &mut out,
            )
            .expect("rel_pos_attention");
        let out = engine.download(&out).expect("download");
        out[..short * d].to_vec() // utterance 0's valid rows (batch-major output)
    };
    let alone = run(1, short, &mut rng);
    let batched = run(3, long, &mut rng);
    let differing = alone
        .iter()
        .zip(&batched)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(differing, 0, "{differing} of {} values differ", alone.len());
}
