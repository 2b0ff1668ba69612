// Elementwise f32 <-> bf16 conversion (grid-stride loops).

extern "C" __global__ void f32_to_bf16_kernel(const float* x, bf16_t* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        y[i] = f32_to_bf16(x[i]);
    }
}

extern "C" __global__ void bf16_to_f32_kernel(const bf16_t* x, float* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        y[i] = bf16_to_f32(x[i]);
    }
}

// Fault injection (worker `--fault-injection` only): one store to an address no allocation
// covers, so the context takes the sticky CUDA_ERROR_ILLEGAL_ADDRESS a real kernel bug would.
extern "C" __global__ void inject_illegal_address(unsigned long long address) {
    *(volatile int*)address = 1;
}
