//! What one matrix product computes and over which buffers: its dimensions, `b`'s layout, the
//! strides, the element types, and the check that the buffers hold what it addresses.

use cudarc::cublaslt::sys;
use cudarc::driver::DeviceRepr;
use half::bf16;

use crate::error::{CudaEngineError, Result};

/// How the second operand `b` is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BLayout {
    /// `b` is `[n, k]` (an `nn.Linear` weight, or attention keys): `out = a . bᵀ`.
    NByK,
    /// `b` is `[k, n]` (attention values): `out = a . b`.
    KByN,
}

/// `out[batch, m, n] = alpha * a[batch, m, k] . op(b) (+ bias[n])`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatmulSpec {
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub b_layout: BLayout,
    /// One `b` for every batch entry (a weight) instead of one per entry.
    pub b_shared: bool,
    pub alpha: f32,
    /// Row and batch strides where they are not the dense ones.
    pub strides: MatmulStrides,
}

/// Strides in elements; `None` is the dense layout. Padded rows keep cuBLASLt on its fast,
/// 16-byte-aligned kernels (a 375-column f32 row is only 4-byte aligned), and a batch stride
/// smaller than a matrix reads one column block of a wider buffer per batch entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MatmulStrides {
    /// Row stride of `a` (dense: `k`); its batch stride is `m` rows.
    pub a_row: Option<usize>,
    /// Row stride of `b` (dense: `k` for [`BLayout::NByK`], `n` for [`BLayout::KByN`]).
    pub b_row: Option<usize>,
    /// Batch stride of `b` (dense: one whole `b`; 0 when shared).
    pub b_batch: Option<usize>,
    /// Row stride of `out` (dense: `n`); its batch stride is `m` rows.
    pub out_row: Option<usize>,
}

/// What one matmul addresses in one buffer (strides in elements).
#[derive(Debug, Clone, Copy)]
pub(super) struct Extent {
    pub(super) row: usize,
    pub(super) batch: usize,
    rows: usize,
    cols: usize,
}

impl Extent {
    /// Elements from the first addressed to one past the last.
    fn span(&self, batches: usize) -> usize {
        (batches - 1) * self.batch + (self.rows - 1) * self.row + self.cols
    }
}

impl MatmulSpec {
    /// A Linear layer over `rows` input rows: `out[rows, out_features] = x . Wᵀ (+ bias)`.
    pub fn linear(rows: usize, in_features: usize, out_features: usize) -> Self {
        Self {
            batch: 1,
            m: rows,
            n: out_features,
            k: in_features,
            b_layout: BLayout::NByK,
            b_shared: true,
            alpha: 1.0,
            strides: MatmulStrides::default(),
        }
    }

    /// `a`: `[batch, m, k]`, rows `a_row` apart.
    pub(super) fn a_extent(&self) -> Extent {
        let row = self.strides.a_row.unwrap_or(self.k);
        Extent {
            row,
            batch: self.m * row,
            rows: self.m,
            cols: self.k,
        }
    }

    /// `b`: `[n, k]` or `[k, n]`, rows `b_row` apart, one per batch entry unless shared.
    pub(super) fn b_extent(&self) -> Extent {
        let (rows, cols) = match self.b_layout {
            BLayout::NByK => (self.n, self.k),
            BLayout::KByN => (self.k, self.n),
        };
        let row = self.strides.b_row.unwrap_or(cols);
        let dense_batch = if self.b_shared { 0 } else { rows * row };
        Extent {
            row,
            batch: self.strides.b_batch.unwrap_or(dense_batch),
            rows,
            cols,
        }
    }

    /// `out`: `[batch, m, n]`, rows `out_row` apart.
    pub(super) fn out_extent(&self) -> Extent {
        let row = self.strides.out_row.unwrap_or(self.n);
        Extent {
            row,
            batch: self.m * row,
            rows: self.m,
            cols: self.n,
        }
    }

    pub(super) fn describe(&self) -> String {
        format!(
            "batch={} m={} n={} k={} b={:?}{} alpha={} strides={:?}",
            self.batch,
            self.m,
            self.n,
            self.k,
            self.b_layout,
            if self.b_shared { " shared" } else { "" },
            self.alpha,
            self.strides
        )
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::bf16 {}
    impl Sealed for f32 {}
}

/// Element types a matmul can read: bf16 (the encoder), or f32 for products that must stay in
/// full precision (the compute type is fp32 either way; TF32 is never enabled).
pub trait MatmulInput: DeviceRepr + sealed::Sealed {
    #[doc(hidden)]
    const DATA_TYPE: sys::cudaDataType;
}

impl MatmulInput for bf16 {
    const DATA_TYPE: sys::cudaDataType = sys::cudaDataType_t::CUDA_R_16BF;
}

impl MatmulInput for f32 {
    const DATA_TYPE: sys::cudaDataType = sys::cudaDataType_t::CUDA_R_32F;
}

/// Element types a matmul can write. The bias has the output's type: cuBLASLt 13.0 refused an
/// f32 bias with bf16 output (CUBLAS_STATUS_INVALID_VALUE from the heuristic, measured on H200).
pub trait MatmulOutput: DeviceRepr + sealed::Sealed {
    #[doc(hidden)]
    const DATA_TYPE: sys::cudaDataType;
}

impl MatmulOutput for bf16 {
    const DATA_TYPE: sys::cudaDataType = sys::cudaDataType_t::CUDA_R_16BF;
}

impl MatmulOutput for f32 {
    const DATA_TYPE: sys::cudaDataType = sys::cudaDataType_t::CUDA_R_32F;
}

/// Fails unless every dimension is usable and every buffer holds what `spec` addresses in it;
/// nothing is launched on failure.
pub(super) fn validate(
    spec: &MatmulSpec,
    a_len: usize,
    b_len: usize,
    bias_len: Option<usize>,
    out_len: usize,
) -> Result<()> {
    let shape_error = |detail: String| CudaEngineError::Shape {
        op: "matmul",
        detail: format!("{detail} ({})", spec.describe()),
    };
    let dims = [spec.batch, spec.m, spec.n, spec.k];
    if dims.contains(&0) {
        return Err(shape_error("every dimension must be at least 1".into()));
    }
    if dims.iter().any(|&d| d > i32::MAX as usize) {
        return Err(shape_error("dimensions must fit in 32 bits".into()));
    }
    let needs = [
        ("a", a_len, spec.a_extent()),
        ("b", b_len, spec.b_extent()),
        ("out", out_len, spec.out_extent()),
    ];
    for (name, have, extent) in needs {
        if extent.row < extent.cols {
            return Err(shape_error(format!(
                "{name}'s row stride {} is shorter than its {} columns",
                extent.row, extent.cols
            )));
        }
        let need = extent.span(spec.batch);
        if have < need {
            return Err(shape_error(format!(
                "{name} holds {have} elements, needs {need}"
            )));
        }
    }
    if let Some(have) = bias_len {
        if have < spec.n {
            return Err(shape_error(format!(
                "bias holds {have} elements, needs {}",
                spec.n
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_rejects_short_buffers_and_zero_dims() {
        let spec = MatmulSpec::linear(3, 4, 5);
        assert!(validate(&spec, 12, 20, Some(5), 15).is_ok());
        assert!(validate(&spec, 11, 20, None, 15).is_err());
        assert!(validate(&spec, 12, 19, None, 15).is_err());
        assert!(validate(&spec, 12, 20, Some(4), 15).is_err());
        assert!(validate(&spec, 12, 20, None, 14).is_err());
        let zero = MatmulSpec { m: 0, ..spec };
        assert!(validate(&zero, 12, 20, None, 15).is_err());
        let batched = MatmulSpec {
            batch: 2,
            b_shared: false,
            ..spec
        };
        assert!(validate(&batched, 24, 40, None, 30).is_ok());
        assert!(validate(&batched, 24, 20, None, 30).is_err());
    }
}
