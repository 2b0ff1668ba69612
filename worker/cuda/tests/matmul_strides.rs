//! Matmuls with non-dense strides (`MatmulStrides`) against an f64 reference that addresses the
//! buffers through the same strides: padded rows of `a` and `out` (the attention scores) and a
//! per-batch column block of a wider `b` (the position table read per head by
//! `HeadShape::bd_matmul`). Outputs start poisoned: every addressed element must be written, and
//! the padding columns of `out` must stay poisoned (never written).
//!
//! Without CUDA these tests print SKIPPED and pass, unless `REQUIRE_CUDA=1`.

mod common;

use common::{assert_close, engine, poisoned_f32, Rng};
use cuda_engine::bf16;
use cuda_engine::internals::{BLayout, HeadShape, MatmulSpec, MatmulStrides};

/// A host buffer addressed like the device one: `data[batch_index · batch + row · row + col]`.
struct Strided<'a> {
    data: &'a [f64],
    row: usize,
    batch: usize,
}

impl Strided<'_> {
    fn at(&self, bi: usize, r: usize, c: usize) -> f64 {
        self.data[bi * self.batch + r * self.row + c]
    }
}

/// `alpha · a · op(b)` in f64, laid out in `out_row`-padded rows; padding columns are NaN.
fn reference(spec: &MatmulSpec, a: Strided<'_>, b: Strided<'_>, out_row: usize) -> Vec<f64> {
    let mut out = vec![f64::NAN; spec.batch * spec.m * out_row];
    for bi in 0..spec.batch {
        for i in 0..spec.m {
            for j in 0..spec.n {
                let mut acc = 0.0;
                for kk in 0..spec.k {
                    let bv = match spec.b_layout {
                        BLayout::NByK => b.at(bi, j, kk),
                        BLayout::KByN => b.at(bi, kk, j),
                    };
                    acc += a.at(bi, i, kk) * bv;
                }
                out[(bi * spec.m + i) * out_row + j] = f64::from(spec.alpha) * acc;
            }
        }
    }
    out
}

fn random_bf16(rng: &mut Rng, n: usize, std: f64) -> (Vec<bf16>, Vec<f64>) {
    let values = rng.bf16_vec(n, 0.0, std);
    let wide = values.iter().map(|v| f64::from(v.to_f32())).collect();
    (values, wide)
}

/// Runs `spec` on random bf16 operands of `a_len`/`b_len` elements and checks every element of
/// the padded output: computed ones against the reference, padding still NaN.
fn check(label: &str, spec: MatmulSpec, a_len: usize, b_len: usize) {
    let Some(engine) = engine(label) else {
        return;
    };
    let mut rng = Rng::fresh(label);
    let (a_host, a_wide) = random_bf16(&mut rng, a_len, 1.0);
    let (b_host, b_wide) = random_bf16(&mut rng, b_len, 1.0 / (spec.k as f64).sqrt());
    let a_row = spec.strides.a_row.unwrap_or(spec.k);
    let (b_rows, b_cols) = match spec.b_layout {
        BLayout::NByK => (spec.n, spec.k),
        BLayout::KByN => (spec.k, spec.n),
    };
    let b_row = spec.strides.b_row.unwrap_or(b_cols);
    let b_batch = spec.strides.b_batch.unwrap_or(b_rows * b_row);
    let out_row = spec.strides.out_row.unwrap_or(spec.n);
    let want = reference(
        &spec,
        Strided {
            data: &a_wide,
            row: a_row,
            batch: spec.m * a_row,
        },
        Strided {
            data: &b_wide,
            row: b_row,
            batch: b_batch,
        },
        out_row,
    );
    let a = engine.upload(&a_host).expect("upload a");
    let b = engine.upload(&b_host).expect("upload b");
    let mut out = poisoned_f32(&engine, want.len());
    let no_bias: Option<&cudarc::driver::CudaSlice<f32>> = None;
    engine
        .matmul(&spec, &a, &b, no_bias, &mut out)
        .expect("matmul");
    let got = engine.download(&out).expect("download");

    let padding_written = got
        .iter()
        .zip(&want)
        .filter(|(g, w)| w.is_nan() && !g.is_nan())
        .count();
    assert_eq!(padding_written, 0, "{label}: padding columns were written");
    let (got_valid, want_valid): (Vec<f32>, Vec<f64>) = got
        .iter()
        .zip(&want)
        .filter(|(_, w)| !w.is_nan())
        .map(|(&g, &w)| (g, w))
        .unzip();
    assert_eq!(got_valid.len(), spec.batch * spec.m * spec.n);
    // fp32 accumulation of bf16 products of unit scale: well under 1e-4 of sqrt(k).
    let bound = 1e-4 * (spec.k as f64).sqrt();
    assert_close(label, &got_valid, &want_valid, |_| bound);
}

#[test]
fn padded_score_rows_match_the_reference_and_leave_padding_alone() {
    // (q+u)·kᵀ as the encoder runs it: 2 heads × 3 utterances of 37 frames, rows of 40.
    let shape = HeadShape {
        batch: 3,
        time: 37,
        heads: 2,
        head_dim: 16,
    };
    let spec = shape.scores_matmul();
    assert_eq!(spec.strides.out_row, Some(40));
    let qk = shape.elements();
    check("matmul_strides_scores", spec, qk, qk);
}

#[test]
fn values_read_through_padded_probability_rows() {
    // probs · v with probs rows of 40 for 37 keys (a_row), v dense.
    let spec = MatmulSpec {
        batch: 6,
        m: 37,
        n: 16,
        k: 37,
        b_layout: BLayout::KByN,
        b_shared: false,
        alpha: 1.0,
        strides: MatmulStrides {
            a_row: Some(40),
            ..MatmulStrides::default()
        },
    };
    check("matmul_strides_values", spec, 6 * 37 * 40, 6 * 37 * 16);
}

#[test]
fn position_scores_read_each_heads_columns_of_one_shared_table() {
    // (q+v)·pᵀ per head: p is [2T-1, d] read in place (row stride d, batch stride head_dim),
    // out rows padded from 2T-1 = 73 to 80.
    let shape = HeadShape {
        batch: 3,
        time: 37,
        heads: 4,
        head_dim: 8,
    };
    let positions = shape.positions();
    let spec = shape.bd_matmul(positions);
    assert_eq!(spec.strides.out_row, Some(80));
    check(
        "matmul_strides_positions",
        spec,
        shape.elements(),
        positions * shape.d_model(),
    );
}

#[test]
fn strides_shorter_than_a_row_are_rejected() {
    let Some(engine) = engine("matmul_strides_rejected") else {
        return;
    };
    let spec = MatmulSpec {
        strides: MatmulStrides {
            out_row: Some(4),
            ..MatmulStrides::default()
        },
        ..MatmulSpec::linear(2, 3, 5)
    };
    let a = engine.zeros::<bf16>(6).expect("alloc");
    let b = engine.zeros::<bf16>(15).expect("alloc");
    let mut out = engine.zeros::<f32>(100).expect("alloc");
    let no_bias: Option<&cudarc::driver::CudaSlice<f32>> = None;
    assert!(engine.matmul(&spec, &a, &b, no_bias, &mut out).is_err());
}
