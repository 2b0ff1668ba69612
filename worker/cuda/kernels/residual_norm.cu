// LayerNorm on the fp32 residual stream, one block per row, f32 statistics (two-pass variance).
//
// - layer_norm_f32_bf16:       y = LN(x) (bf16, the next matmul's input)
// - add_layer_norm_f32_bf16:   x += alpha * h (stored, f32); y = LN(x) (bf16)
// - add_layer_norm_f32_inplace: x = LN(x + alpha * h) (f32; the Conformer layer's norm_out)
//
// Each thread re-reads only the elements it wrote itself, so the update of x needs no barrier
// beyond the ones inside block_sum.

template <int kMode>
__device__ void residual_norm_row(float* x, const float* h, float alpha, const float* gamma,
                                  const float* beta, float eps, int cols, bf16_t* y) {
    const long long offset = (long long)blockIdx.x * cols;
    x += offset;
    if (kMode != 0) h += offset;
    if (kMode != 2) y += offset;

    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = x[c];
        if (kMode != 0) {
            v += alpha * h[c];
            x[c] = v;
        }
        sum += v;
    }
    const float mean = block_sum(sum) / cols;
    float sq = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = x[c] - mean;
        sq += d * d;
    }
    const float inv_std = rsqrtf(block_sum(sq) / cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float out = (x[c] - mean) * inv_std * gamma[c] + beta[c];
        if (kMode == 2) {
            x[c] = out;
        } else {
            y[c] = f32_to_bf16(out);
        }
    }
}

extern "C" __global__ void layer_norm_f32_bf16(const float* x, const float* gamma,
                                               const float* beta, float eps, int cols,
                                               bf16_t* y) {
    // Mode 0 never writes x.
    residual_norm_row<0>(const_cast<float*>(x), nullptr, 0.0f, gamma, beta, eps, cols, y);
}

extern "C" __global__ void add_layer_norm_f32_bf16(float* x, const float* h, float alpha,
                                                   const float* gamma, const float* beta,
                                                   float eps, int cols, bf16_t* y) {
    residual_norm_row<1>(x, h, alpha, gamma, beta, eps, cols, y);
}

extern "C" __global__ void add_layer_norm_f32_inplace(float* x, const float* h, float alpha,
                                                      const float* gamma, const float* beta,
                                                      float eps, int cols) {
    residual_norm_row<2>(x, h, alpha, gamma, beta, eps, cols, nullptr);
}
