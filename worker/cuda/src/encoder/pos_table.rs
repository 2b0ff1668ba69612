//! Sinusoidal relative-position tables (NeMo's `RelPositionalEncoding` and
//! `LocalAttRelPositionalEncoding`), computed in f32 the way torch does (as the CPU reference does).

use models::config::AttentionModel;

/// The table an attention model needs for `time` frames: positions `time-1, …, -(time-1)` for
/// full attention, `left, …, -right` for local attention.
pub(crate) fn table_for(attention: AttentionModel, time: usize, d_model: usize) -> Vec<f32> {
    let time = time as i64;
    match attention {
        AttentionModel::RelPos => sinusoid_table((-(time - 1)..=(time - 1)).rev(), d_model),
        AttentionModel::RelPosLocal { left, right } => {
            sinusoid_table((-(right as i64)..=left as i64).rev(), d_model)
        }
    }
}

/// Rows in [`table_for`]'s table.
pub(crate) fn positions_for(attention: AttentionModel, time: usize) -> usize {
    match attention {
        AttentionModel::RelPos => (2 * time).saturating_sub(1),
        AttentionModel::RelPosLocal { left, right } => left + right + 1,
    }
}

/// Full attention's table, `2·time-1` rows.
#[cfg(test)]
fn relative_table(time: usize, d_model: usize) -> Vec<f32> {
    table_for(AttentionModel::RelPos, time, d_model)
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

#[cfg(test)]
mod tests {
    use super::{relative_table, table_for, AttentionModel};

    #[test]
    fn centre_row_is_position_zero_and_rows_mirror() {
        let d = 8;
        let table = relative_table(3, d);
        assert_eq!(table.len(), 5 * d);
        let centre = &table[2 * d..3 * d];
        assert!(centre.iter().step_by(2).all(|v| *v == 0.0));
        assert!(centre.iter().skip(1).step_by(2).all(|v| *v == 1.0));
        // Row 0 is position +2, row 4 position -2: sines flip sign, cosines agree.
        assert_eq!(table[2], -table[4 * d + 2]);
        assert_eq!(table[3], table[4 * d + 3]);
        // The local band table with context [2, 2] is the same 5 positions.
        let local = table_for(AttentionModel::RelPosLocal { left: 2, right: 2 }, 100, d);
        assert_eq!(local, table);
    }
}
