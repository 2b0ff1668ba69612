//! Prediction-network state as ONNX exports carry it: a few f32 tensors `[lead, batch, trail]`
//! (LSTM h and c: `[layers, batch, hidden]`), gathered and scattered by batch row.

use std::ops::Range;

/// Shape of one state tensor without its batch axis (axis 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StateShape {
    pub(crate) lead: usize,
    pub(crate) trail: usize,
}

/// The state of every row of a batch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LstmState {
    pub(crate) batch: usize,
    pub(crate) shapes: Vec<StateShape>,
    /// One `[lead, batch, trail]` buffer per state tensor.
    pub(crate) tensors: Vec<Vec<f32>>,
}

impl LstmState {
    pub(crate) fn zeros(shapes: &[StateShape], batch: usize) -> Self {
        Self {
            batch,
            shapes: shapes.to_vec(),
            tensors: shapes
                .iter()
                .map(|s| vec![0.0; s.lead * batch * s.trail])
                .collect(),
        }
    }

    /// Rows `rows` of tensor `i`, as `[lead, rows.len(), trail]`.
    pub(crate) fn gather(&self, i: usize, rows: Range<usize>) -> Vec<f32> {
        let StateShape { lead, trail } = self.shapes[i];
        let src = &self.tensors[i];
        let mut out = Vec::with_capacity(lead * rows.len() * trail);
        for l in 0..lead {
            let start = (l * self.batch + rows.start) * trail;
            out.extend_from_slice(&src[start..start + rows.len() * trail]);
        }
        out
    }

    /// Writes `[lead, rows.len(), trail]` data into rows `rows` of tensor `i`.
    pub(crate) fn scatter(&mut self, i: usize, rows: Range<usize>, data: &[f32]) {
        let StateShape { lead, trail } = self.shapes[i];
        let n = rows.len() * trail;
        for l in 0..lead {
            let start = (l * self.batch + rows.start) * trail;
            self.tensors[i][start..start + n].copy_from_slice(&data[l * n..(l + 1) * n]);
        }
    }

    /// Every tensor of one row, concatenated (for packing a row's state into a vector).
    pub(crate) fn row(&self, b: usize) -> Vec<f32> {
        (0..self.tensors.len())
            .flat_map(|i| self.gather(i, b..b + 1))
            .collect()
    }

    /// The inverse of [`Self::row`] for row `b`.
    pub(crate) fn set_row(&mut self, b: usize, packed: &[f32]) {
        let mut offset = 0;
        for i in 0..self.tensors.len() {
            let n = self.shapes[i].lead * self.shapes[i].trail;
            self.scatter(i, b..b + 1, &packed[offset..offset + n]);
            offset += n;
        }
    }

    /// Values per row across all tensors.
    pub(crate) fn row_len(shapes: &[StateShape]) -> usize {
        shapes.iter().map(|s| s.lead * s.trail).sum()
    }

    /// Row `b` from `next` where `keep_next[b]`, else from `self`.
    pub(crate) fn select(mut self, keep_next: &[bool], next: &LstmState) -> Self {
        for (b, keep) in keep_next.iter().enumerate() {
            if *keep {
                self.set_row(b, &next.row(b));
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_through_gather_and_scatter() {
        let shapes = [
            StateShape { lead: 2, trail: 3 },
            StateShape { lead: 1, trail: 2 },
        ];
        let mut s = LstmState::zeros(&shapes, 3);
        for (i, t) in s.tensors.iter_mut().enumerate() {
            for (k, v) in t.iter_mut().enumerate() {
                *v = (i * 100 + k) as f32;
            }
        }
        // Tensor 0 is [2, 3, 3]: row 1 is elements 3..6 of layer 0 and 12..15 of layer 1.
        assert_eq!(s.gather(0, 1..2), [3.0, 4.0, 5.0, 12.0, 13.0, 14.0]);
        assert_eq!(s.row(2), [6.0, 7.0, 8.0, 15.0, 16.0, 17.0, 104.0, 105.0]);

        let next = LstmState::zeros(&shapes, 3);
        let mixed = s.clone().select(&[false, true, false], &next);
        assert_eq!(mixed.row(0), s.row(0));
        assert!(mixed.row(1).iter().all(|v| *v == 0.0));
        assert_eq!(mixed.row(2), s.row(2));

        let mut t = LstmState::zeros(&shapes, 3);
        for b in 0..3 {
            t.set_row(b, &s.row(b));
        }
        assert_eq!(t, s);
    }
}
