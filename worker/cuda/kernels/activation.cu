// Pointwise activations in bf16 storage, fp32 arithmetic.

// y = x * sigmoid(x)
extern "C" __global__ void silu_bf16(const bf16_t* x, bf16_t* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float v = bf16_to_f32(x[i]);
        y[i] = f32_to_bf16(v * sigmoid_f32(v));
    }
}

// GLU over the last (channel) axis: x is [rows, 2 * half], y is [rows, half],
// y = x[:, :half] * sigmoid(x[:, half:]) (the torch.nn.functional.glu convention).
extern "C" __global__ void glu_bf16(const bf16_t* x, bf16_t* y, long long rows, int half) {
    const long long n = rows * half;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long row = i / half;
        const int col = (int)(i - row * half);
        const bf16_t* in = x + row * 2 * half;
        y[i] = f32_to_bf16(bf16_to_f32(in[col]) * sigmoid_f32(bf16_to_f32(in[half + col])));
    }
}
