// LayerNorm over the last axis, one block per row; bf16 rows, f32 gamma/beta, f32 statistics.
// The fused variant normalizes v = x + alpha * r and also stores v (bf16), which is the next
// residual stream value in a Conformer block.
//
// Simple first version: each pass re-reads the row from global memory (L1/L2 hits for rows of a
// few KB). Follow-up: keep the row in registers and use 16-byte loads.

template <bool kResidual>
__device__ __forceinline__ float row_value(const bf16_t* x, const bf16_t* r, float alpha, int c) {
    float v = bf16_to_f32(x[c]);
    if (kResidual) v += alpha * bf16_to_f32(r[c]);
    return v;
}

template <bool kResidual>
__device__ void layer_norm_row(const bf16_t* x, const bf16_t* r, float alpha, const float* gamma,
                               const float* beta, float eps, int cols, bf16_t* sum_out,
                               bf16_t* y) {
    const long long offset = (long long)blockIdx.x * cols;
    x += offset;
    if (kResidual) {
        r += offset;
        sum_out += offset;
    }
    y += offset;

    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += row_value<kResidual>(x, r, alpha, c);
    const float mean = block_sum(sum) / cols;

    // Two-pass variance: no cancellation when |mean| >> std.
    float sq = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = row_value<kResidual>(x, r, alpha, c) - mean;
        sq += d * d;
    }
    const float inv_std = rsqrtf(block_sum(sq) / cols + eps);

    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = row_value<kResidual>(x, r, alpha, c);
        if (kResidual) sum_out[c] = f32_to_bf16(v);
        y[c] = f32_to_bf16((v - mean) * inv_std * gamma[c] + beta[c]);
    }
}

extern "C" __global__ void layer_norm_bf16(const bf16_t* x, const float* gamma, const float* beta,
                                           float eps, int cols, bf16_t* y) {
    layer_norm_row<false>(x, nullptr, 0.0f, gamma, beta, eps, cols, nullptr, y);
}

extern "C" __global__ void add_layer_norm_bf16(const bf16_t* x, const bf16_t* r, float alpha,
                                               const float* gamma, const float* beta, float eps,
                                               int cols, bf16_t* sum_out, bf16_t* y) {
    layer_norm_row<true>(x, r, alpha, gamma, beta, eps, cols, sum_out, y);
}
