//! Sinusoidal relative-position tables (NeMo `RelPositionalEncoding`,
//! `LocalAttRelPositionalEncoding`), computed in f32 the way torch does so that `linear_pos`
//! sees the same inputs.

/// Rows for `positions`, `[positions.len(), d_model]`: `pe[:, 2i] = sin(p·θ_i)`,
/// `pe[:, 2i+1] = cos(p·θ_i)`, `θ_i = exp(2i · −ln(10000)/d_model)`.
pub(crate) fn sinusoid_table(positions: impl Iterator<Item = i64>, d_model: usize) -> Vec<f32> {
    let scale = -(10000.0f64.ln() / d_model as f64) as f32;
    let div_term: Vec<f32> = (0..d_model)
        .step_by(2)
        .map(|i| (i as f32 * scale).exp())
        .collect();
    let mut table = Vec::new();
    for p in positions {
        let p = p as f32;
        let start = table.len();
        table.resize(start + d_model, 0.0);
        let row = &mut table[start..];
        for (i, theta) in div_term.iter().enumerate() {
            let angle = p * theta;
            row[2 * i] = angle.sin();
            if 2 * i + 1 < d_model {
                row[2 * i + 1] = angle.cos();
            }
        }
    }
    table
}

/// Full relative attention over `t` frames: positions `t−1, …, −(t−1)` (`2t−1` rows).
pub(crate) fn relative_table(t: usize, d_model: usize) -> Vec<f32> {
    let t = t as i64;
    sinusoid_table((-(t - 1)..=(t - 1)).rev(), d_model)
}

/// Local attention with context `[left, right]`: positions `left, …, −right`.
pub(crate) fn local_table(left: usize, right: usize, d_model: usize) -> Vec<f32> {
    sinusoid_table((-(right as i64)..=left as i64).rev(), d_model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_table_is_centred_on_zero() {
        let d = 8;
        let table = relative_table(3, d);
        assert_eq!(table.len(), 5 * d);
        // Row 2 is position 0: sin 0 = 0, cos 0 = 1.
        let centre = &table[2 * d..3 * d];
        assert!(centre.iter().step_by(2).all(|v| *v == 0.0));
        assert!(centre.iter().skip(1).step_by(2).all(|v| *v == 1.0));
        // Row 0 is position +2, row 4 position −2: sines flip sign.
        assert_eq!(table[0], -table[4 * d]);
        assert_eq!(local_table(2, 2, d), table);
    }
}
