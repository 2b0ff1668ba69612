// dw_striding subsampling convolutions (3x3, stride 2, padding 1) in channels-last layout, so the
// pointwise 1x1 convolutions that follow are plain Linear matmuls over [positions, channels].
//
// Input frames t >= lengths[b] read as zero: a batched, padded utterance then gives exactly what
// the unpadded utterance gives on its own (the CPU reference sees only valid frames, with zero
// padding at its end). Output frames past the stage's own length are computed anyway; the next
// stage (and the encoder's masks) never read them.

// Launch shape of both convolutions: blockIdx.x = b * out_time + t (one output frame), and
// blockIdx.y * blockDim.x + threadIdx.x = f * channels + c within the frame, so the index math is
// 32-bit and channel-contiguous (coalesced stores).

// First convolution, one input channel: x [batch, time, freq] f32 (features, time-major);
// weight [channels, 9] f32, bias [channels] f32; y [batch, out_time, out_freq, channels] bf16,
// ReLU applied.
extern "C" __global__ void subsample_conv0_relu(const float* x, const int* lengths,
                                                const float* weight, const float* bias, int batch,
                                                int time, int freq, int channels, int out_time,
                                                int out_freq, bf16_t* y) {
    const int frame = blockIdx.x;
    const int within = blockIdx.y * blockDim.x + threadIdx.x;
    if (within >= out_freq * channels) return;
    const int c = within % channels;
    const int f = within / channels;
    const int t = frame % out_time;
    const int b = frame / out_time;
    const int valid = min(max(lengths[b], 0), time);
    const float* w = weight + c * 9;
    const float* xb = x + (long long)b * time * freq;
    float acc = bias[c];
    for (int ki = 0; ki < 3; ++ki) {
        const int r = 2 * t + ki - 1;
        if (r < 0 || r >= valid) continue;
        for (int kj = 0; kj < 3; ++kj) {
            const int col = 2 * f + kj - 1;
            if (col < 0 || col >= freq) continue;
            acc += w[ki * 3 + kj] * xb[(long long)r * freq + col];
        }
    }
    y[(long long)frame * out_freq * channels + within] = f32_to_bf16(fmaxf(acc, 0.0f));
}

// Depthwise convolution of every channel: x [batch, time, freq, channels] bf16 -> y
// [batch, out_time, out_freq, channels] bf16; weight [channels, 9] f32, bias [channels] f32.
extern "C" __global__ void subsample_depthwise(const bf16_t* x, const int* lengths,
                                               const float* weight, const float* bias, int batch,
                                               int time, int freq, int channels, int out_time,
                                               int out_freq, bf16_t* y) {
    const int frame = blockIdx.x;
    const int within = blockIdx.y * blockDim.x + threadIdx.x;
    if (within >= out_freq * channels) return;
    const int c = within % channels;
    const int f = within / channels;
    const int t = frame % out_time;
    const int b = frame / out_time;
    const int valid = min(max(lengths[b], 0), time);
    const float* w = weight + c * 9;
    const bf16_t* xb = x + (long long)b * time * freq * channels + c;
    float acc = bias[c];
    for (int ki = 0; ki < 3; ++ki) {
        const int r = 2 * t + ki - 1;
        if (r < 0 || r >= valid) continue;
        const bf16_t* row = xb + (long long)r * freq * channels;
        for (int kj = 0; kj < 3; ++kj) {
            const int col = 2 * f + kj - 1;
            if (col < 0 || col >= freq) continue;
            acc += w[ki * 3 + kj] * bf16_to_f32(row[col * channels]);
        }
    }
    y[(long long)frame * out_freq * channels + within] = f32_to_bf16(acc);
}

// In-place ReLU over n elements (after the pointwise convolution's bias epilogue).
extern "C" __global__ void relu_bf16_inplace(bf16_t* x, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        x[i] = f32_to_bf16(fmaxf(bf16_to_f32(x[i]), 0.0f));
    }
}
