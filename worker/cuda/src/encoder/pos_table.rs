//! The sinusoidal relative-position table of full `rel_pos` attention (NeMo's
//! `RelPositionalEncoding`), computed in f32 the way torch does (as the CPU reference does).

/// Rows for positions `time-1, …, -(time-1)` (`2·time-1` rows, `d_model` columns):
/// `pe[:, 2i] = sin(p·θ_i)`, `pe[:, 2i+1] = cos(p·θ_i)`, `θ_i = exp(2i · -ln(10000)/d_model)`.
pub(crate) fn relative_table(time: usize, d_model: usize) -> Vec<f32> {
    let scale = -(10000.0f64.ln() / d_model as f64) as f32;
    let theta: Vec<f32> = (0..d_model)
        .step_by(2)
        .map(|i| (i as f32 * scale).exp())
        .collect();
    let time = time as i64;
    let mut table = Vec::with_capacity((2 * time as usize).saturating_sub(1) * d_model);
    for p in (-(time - 1)..=(time - 1)).rev() {
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
    use super::relative_table;

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
    }
}
