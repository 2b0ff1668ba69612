//! LayerNorm over the channel axis, optionally fused with the residual add that precedes it.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::{check_len, rows_for_grid, to_i32};
use crate::device::CudaEngine;
use crate::driver::launch::per_row_config;
use crate::error::{CudaEngineError, Result};
use crate::kernels::Kernel;
use crate::storage::Storage;

/// `rows` independent rows of `cols` contiguous channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowShape {
    pub rows: usize,
    pub cols: usize,
}

/// LayerNorm's affine parameters (f32, length `cols`) and epsilon.
#[derive(Debug, Clone, Copy)]
pub struct LayerNormWeights<'a> {
    pub gamma: &'a CudaSlice<f32>,
    pub beta: &'a CudaSlice<f32>,
    pub eps: f32,
}

/// The branch added to the residual stream before normalizing: `x + alpha * r`
/// (alpha = 0.5 for the Conformer's half-step feed-forward modules).
#[derive(Debug, Clone, Copy)]
pub struct Residual<'a, S> {
    pub r: &'a CudaSlice<S>,
    pub alpha: f32,
}

impl CudaEngine {
    /// `y = LayerNorm(x) * gamma + beta` per row, statistics in f32.
    pub fn layer_norm<S: Storage>(
        &self,
        x: &CudaSlice<S>,
        weights: &LayerNormWeights<'_>,
        shape: RowShape,
        y: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "layer_norm";
        let (grid_rows, cols) = check_shape(OP, x, weights, shape, y)?;
        let eps = weights.eps;
        // SAFETY: signature (const bf16_t*, const float*, const float*, float, int, bf16_t*);
        // x and y hold rows*cols elements, gamma and beta cols; one block per row.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::LayerNorm,
                per_row_config(grid_rows),
                || format!("{shape:?}"),
                |args| {
                    args.arg(x)
                        .arg(weights.gamma)
                        .arg(weights.beta)
                        .arg(&eps)
                        .arg(&cols)
                        .arg(y);
                },
            )
        }
    }

    /// `sum = x + alpha * r` (written to `sum_out`, the next residual stream value) and
    /// `y = LayerNorm(sum) * gamma + beta`, in one pass over the rows.
    pub fn add_layer_norm<S: Storage>(
        &self,
        x: &CudaSlice<S>,
        residual: Residual<'_, S>,
        weights: &LayerNormWeights<'_>,
        shape: RowShape,
        sum_out: &mut CudaSlice<S>,
        y: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "add_layer_norm";
        let (grid_rows, cols) = check_shape(OP, x, weights, shape, y)?;
        let elements = shape.rows * shape.cols;
        check_len(OP, "r", residual.r.len(), elements)?;
        check_len(OP, "sum_out", sum_out.len(), elements)?;
        let (alpha, eps) = (residual.alpha, weights.eps);
        // SAFETY: signature (const bf16_t* x, const bf16_t* r, float, const float*,
        // const float*, float, int, bf16_t* sum_out, bf16_t* y); x, r, sum_out and y hold
        // rows*cols elements, gamma and beta cols; one block per row.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::AddLayerNorm,
                per_row_config(grid_rows),
                || format!("{shape:?}"),
                |args| {
                    args.arg(x)
                        .arg(residual.r)
                        .arg(&alpha)
                        .arg(weights.gamma)
                        .arg(weights.beta)
                        .arg(&eps)
                        .arg(&cols)
                        .arg(sum_out)
                        .arg(y);
                },
            )
        }
    }
}

fn check_shape<S: Storage>(
    op: &'static str,
    x: &CudaSlice<S>,
    weights: &LayerNormWeights<'_>,
    shape: RowShape,
    y: &CudaSlice<S>,
) -> Result<(u32, i32)> {
    if shape.cols == 0 {
        return Err(CudaEngineError::Shape {
            op,
            detail: "cols must be at least 1".into(),
        });
    }
    if weights.eps.is_nan() || weights.eps <= 0.0 {
        return Err(CudaEngineError::Shape {
            op,
            detail: format!("eps must be positive, got {}", weights.eps),
        });
    }
    let grid_rows = rows_for_grid(op, shape.rows)?;
    let cols = to_i32(op, "cols", shape.cols)?;
    let elements = shape.rows * shape.cols;
    check_len(op, "x", x.len(), elements)?;
    check_len(op, "y", y.len(), elements)?;
    check_len(op, "gamma", weights.gamma.len(), shape.cols)?;
    check_len(op, "beta", weights.beta.len(), shape.cols)?;
    Ok((grid_rows, cols))
}
