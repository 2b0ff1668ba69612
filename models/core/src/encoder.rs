//! The encoder arithmetic every engine shares: the relative-position tables (NeMo's
//! `RelPositionalEncoding` and `LocalAttRelPositionalEncoding`, computed in f32 the way torch
//! does, so that `linear_pos` sees the same inputs) and the subsampling lengths.

use crate::config::AttentionModel;

/// The table an attention model needs for `time` frames, `[position_rows, d_model]`: positions
/// `time-1, …, -(time-1)` for full attention, `left, …, -right` for local attention.
pub fn position_table(attention: AttentionModel, time: usize, d_model: usize) -> Vec<f32> {
    let time = time as i64;
    match attention {
        AttentionModel::RelPos => sinusoid_table((-(time - 1)..=(time - 1)).rev(), d_model),
        AttentionModel::RelPosLocal { left, right } => {
            sinusoid_table((-(right as i64)..=left as i64).rev(), d_model)
        }
    }
}

/// Rows in [`position_table`]'s table.
pub fn position_rows(attention: AttentionModel, time: usize) -> usize {
    match attention {
        AttentionModel::RelPos => (2 * time).saturating_sub(1),
        AttentionModel::RelPosLocal { left, right } => left + right + 1,
    }
}

/// One row per position (`d_model` columns): `pe[:, 2i] = sin(p·θ_i)`, `pe[:, 2i+1] =
/// cos(p·θ_i)`, `θ_i = exp(2i · -ln(10000)/d_model)`.
fn sinusoid_table(positions: impl Iterator<Item = i64>, d_model: usize) -> Vec<f32> {
    let scale = -(10000.0f64.ln() / d_model as f64) as f32;
    let theta: Vec<f32> = (0..d_model)
        .step_by(2)
        .map(|i| (i as f32 * scale).exp())
        .collect();
    let mut table = Vec::new();
    for p in positions {
        let p = p as f32;
        for col in 0..d_model {
            let angle = p * theta[col / 2];
            table.push(if col % 2 == 0 {
                angle.sin()
            } else {
                angle.cos()
            });
        }
    }
    table
}

/// Output length of one `kernel 3, stride 2, padding 1` convolution (a subsampling stage).
pub fn stride2_out_len(n: usize) -> usize {
    if n == 0 {
        0
    } else {
        (n - 1) / 2 + 1
    }
}

/// Encoder frames after `stages` stride-2 subsampling stages of `frames` feature frames.
pub fn subsampled_len(frames: usize, stages: usize) -> usize {
    (0..stages).fold(frames, |t, _| stride2_out_len(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn centre_row_is_position_zero_and_rows_mirror() {
        let d = 8;
        let table = position_table(AttentionModel::RelPos, 3, d);
        assert_eq!(table.len(), 5 * d);
        assert_eq!(position_rows(AttentionModel::RelPos, 3), 5);
        let centre = &table[2 * d..3 * d];
        assert!(centre.iter().step_by(2).all(|v| *v == 0.0));
        assert!(centre.iter().skip(1).step_by(2).all(|v| *v == 1.0));
        // Row 0 is position +2, row 4 position -2: sines flip sign, cosines agree.
        assert_eq!(table[2], -table[4 * d + 2]);
        assert_eq!(table[3], table[4 * d + 3]);
        // The local band table with context [2, 2] is the same 5 positions, whatever the time.
        let local = AttentionModel::RelPosLocal { left: 2, right: 2 };
        assert_eq!(position_table(local, 100, d), table);
        assert_eq!(position_rows(local, 100), 5);
    }

    #[test]
    fn three_stages_give_ceil_of_an_eighth() {
        for n in 0..200 {
            assert_eq!(subsampled_len(n, 3), n.div_ceil(8), "n = {n}");
        }
        assert_eq!(stride2_out_len(0), 0);
    }
}
