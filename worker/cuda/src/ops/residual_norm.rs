//! LayerNorm on the fp32 residual stream, fused with the residual add that precedes it.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::{check_len, rows_for_grid, to_i32};
use crate::device::CudaEngine;
use crate::driver::launch::per_row_config;
use crate::error::{CudaEngineError, Result};
use crate::kernels::Kernel;
use crate::ops::{LayerNormWeights, RowShape};
use crate::storage::Storage;

/// The branch output `h` (f32) added to the residual stream as `x + alpha * h`.
#[derive(Debug, Clone, Copy)]
pub struct ResidualF32<'a> {
    pub h: &'a CudaSlice<f32>,
    pub alpha: f32,
}

impl CudaEngine {
    /// `y = LayerNorm(x)` per row: `x` f32, `y` bf16.
    pub fn layer_norm_f32<S: Storage>(
        &self,
        x: &CudaSlice<f32>,
        weights: &LayerNormWeights<'_>,
        shape: RowShape,
        y: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "layer_norm_f32";
        let (rows, cols) = check_rows(OP, x.len(), weights, shape)?;
        check_len(OP, "y", y.len(), shape.rows * shape.cols)?;
        let eps = weights.eps;
        // SAFETY: signature (const float* x, const float* gamma, const float* beta, float eps,
        // int cols, bf16_t* y); x and y hold rows*cols elements, gamma and beta cols.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::LayerNormF32,
                per_row_config(rows),
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

    /// `x += alpha * h` (stored) and `y = LayerNorm(x)` (bf16).
    pub fn add_layer_norm_f32<S: Storage>(
        &self,
        x: &mut CudaSlice<f32>,
        residual: ResidualF32<'_>,
        weights: &LayerNormWeights<'_>,
        shape: RowShape,
        y: &mut CudaSlice<S>,
    ) -> Result<()> {
        const OP: &str = "add_layer_norm_f32";
        let (rows, cols) = check_rows(OP, x.len(), weights, shape)?;
        check_len(OP, "h", residual.h.len(), shape.rows * shape.cols)?;
        check_len(OP, "y", y.len(), shape.rows * shape.cols)?;
        let (alpha, eps) = (residual.alpha, weights.eps);
        // SAFETY: signature (float* x, const float* h, float alpha, const float* gamma,
        // const float* beta, float eps, int cols, bf16_t* y); x, h and y hold rows*cols
        // elements, gamma and beta cols.
        unsafe {
            self.launch_as(
                S::KIND,
                Kernel::AddLayerNormF32,
                per_row_config(rows),
                || format!("{shape:?}"),
                |args| {
                    args.arg(x)
                        .arg(residual.h)
                        .arg(&alpha)
                        .arg(weights.gamma)
                        .arg(weights.beta)
                        .arg(&eps)
                        .arg(&cols)
                        .arg(y);
                },
            )
        }
    }

    /// `x = LayerNorm(x + alpha * h)` in place, f32.
    pub fn add_layer_norm_f32_inplace(
        &self,
        x: &mut CudaSlice<f32>,
        residual: ResidualF32<'_>,
        weights: &LayerNormWeights<'_>,
        shape: RowShape,
    ) -> Result<()> {
        const OP: &str = "add_layer_norm_f32_inplace";
        let (rows, cols) = check_rows(OP, x.len(), weights, shape)?;
        check_len(OP, "h", residual.h.len(), shape.rows * shape.cols)?;
        let (alpha, eps) = (residual.alpha, weights.eps);
        // SAFETY: signature (float* x, const float* h, float alpha, const float* gamma,
        // const float* beta, float eps, int cols); x and h hold rows*cols elements, gamma and
        // beta cols.
        unsafe {
            self.launch(
                Kernel::AddLayerNormF32Inplace,
                per_row_config(rows),
                || format!("{shape:?}"),
                |args| {
                    args.arg(x)
                        .arg(residual.h)
                        .arg(&alpha)
                        .arg(weights.gamma)
                        .arg(weights.beta)
                        .arg(&eps)
                        .arg(&cols);
                },
            )
        }
    }
}

fn check_rows(
    op: &'static str,
    x_len: usize,
    weights: &LayerNormWeights<'_>,
    shape: RowShape,
) -> Result<(u32, i32)> {
    if shape.cols == 0 || weights.eps.is_nan() || weights.eps <= 0.0 {
        return Err(CudaEngineError::Shape {
            op,
            detail: format!("{shape:?} eps={}: need cols >= 1 and eps > 0", weights.eps),
        });
    }
    let rows = rows_for_grid(op, shape.rows)?;
    let cols = to_i32(op, "cols", shape.cols)?;
    check_len(op, "x", x_len, shape.rows * shape.cols)?;
    check_len(op, "gamma", weights.gamma.len(), shape.cols)?;
    check_len(op, "beta", weights.beta.len(), shape.cols)?;
    Ok((rows, cols))
}
