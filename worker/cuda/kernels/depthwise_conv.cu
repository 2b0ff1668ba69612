// Depthwise 1-D convolution over time with BatchNorm already folded into weight and bias.
//
// x, y: [batch, time, channels] bf16 (channels contiguous: consecutive threads read consecutive
// channels, so loads are coalesced). weight: [channels, kernel] f32; bias: [channels] f32.
// Symmetric zero padding of (kernel - 1) / 2 frames (odd kernel sizes). Frames t >= lengths[b]
// read as zero, as NeMo masks padding frames before this convolution, and are written as zero.
// apply_silu != 0 fuses the SiLU that follows BatchNorm in the Conformer convolution module.
//
// Follow-up: stage a time tile in shared memory so each input is read once instead of `kernel`
// times (today the re-reads hit L1/L2).

extern "C" __global__ void depthwise_conv1d_bf16(const bf16_t* x, const float* weight,
                                                 const float* bias, const int* lengths, int batch,
                                                 int time, int channels, int kernel,
                                                 int apply_silu, bf16_t* y) {
    const long long n = (long long)batch * time * channels;
    const int pad = (kernel - 1) / 2;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(i % channels);
        const long long bt = i / channels;
        const int t = (int)(bt % time);
        const int b = (int)(bt / time);
        const int valid = min(max(lengths[b], 0), time);
        if (t >= valid) {
            y[i] = 0;
            continue;
        }
        float acc = bias[c];
        const float* w = weight + (long long)c * kernel;
        const bf16_t* xb = x + (long long)b * time * channels + c;
        for (int k = 0; k < kernel; ++k) {
            const int src = t + k - pad;
            if (src >= 0 && src < valid) acc += w[k] * bf16_to_f32(xb[(long long)src * channels]);
        }
        if (apply_silu) acc *= sigmoid_f32(acc);
        y[i] = f32_to_bf16(acc);
    }
}
