// dw_striding subsampling convolutions (3x3, stride 2, padding 1) in channels-last layout, so the
// pointwise 1x1 convolutions that follow are plain Linear matmuls over [positions, channels].
//
// Input frames t >= lengths[b] read as zero: a batched, padded utterance then gives exactly what
// the unpadded utterance gives on its own (the CPU reference sees only valid frames, with zero
// padding at its end). Output frames past the stage's own length are computed anyway; the next
// stage (and the encoder's masks) never read them.

// Stores the first `count` channels of a unit: one 16-byte store when `packed`.
__device__ __forceinline__ void store_unit(bf16_t* out, const Pack& result, bool packed,
                                           int count) {
    if (packed) {
        *reinterpret_cast<uint4*>(out) = result.raw;
    } else {
#pragma unroll
        for (int j = 0; j < kPack; ++j) {
            if (j < count) out[j] = result.v[j];
        }
    }
}

// Stages the depthwise weights [channels, 9] of the block's channels in shared memory as
// [9][block_channels] (a thread's kPack weights of one tap contiguous, read as float4); the
// block's weight rows are one contiguous range, so the reads coalesce. Ends with a barrier.
__device__ __forceinline__ void stage_tap_weights(float* block_weight, const float* weight,
                                                  int first_channel, int block_channels,
                                                  int channels) {
    const int threads = blockDim.x * blockDim.y;
    for (int j = threadIdx.y * blockDim.x + threadIdx.x; j < block_channels * 9; j += threads) {
        const int local = j / 9;
        const int tap = j - local * 9;
        block_weight[tap * block_channels + local] =
            first_channel + local < channels ? weight[first_channel * 9 + j] : 0.0f;
    }
    __syncthreads();
}

// conv0 + ReLU of one channel unit at conv0 output (r1, col1), rounded to storage: the pack
// `subsample_conv0_relu` stores and the fused kernel reuses (bias first, taps in order,
// `acc += w * v` contracted to FMA, ReLU, rounding), one definition for both. `valid` is the
// conv0 input's valid length, already clamped to [0, time].
__device__ __forceinline__ Pack conv0_relu_unit(const float* xb, int valid, int freq,
                                                const float (&w)[9][kPack],
                                                const float (&b0)[kPack], int r1, int col1) {
    float acc[kPack];
#pragma unroll
    for (int j = 0; j < kPack; ++j) acc[j] = b0[j];
#pragma unroll
    for (int ki = 0; ki < 3; ++ki) {
        const int r = 2 * r1 + ki - 1;
        if (r < 0 || r >= valid) continue;
#pragma unroll
        for (int kj = 0; kj < 3; ++kj) {
            const int col = 2 * col1 + kj - 1;
            if (col < 0 || col >= freq) continue;
            const float v = xb[(long long)r * freq + col];
#pragma unroll
            for (int j = 0; j < kPack; ++j) acc[j] += w[ki * 3 + kj][j] * v;
        }
    }
    Pack result;
#pragma unroll
    for (int j = 0; j < kPack; ++j) result.v[j] = f32_to_bf16(fmaxf(acc[j], 0.0f));
    return result;
}

// Launch shape of both convolutions: blockIdx.x = b * out_time + t (one output frame);
// (blockIdx.y * blockDim.x + threadIdx.x) * kPack = c0, the first of the thread's kPack
// consecutive channels (one 16-byte pack of the output when channels is a multiple of kPack and
// the pointers are aligned; element-wise stores otherwise); output columns f = threadIdx.y,
// striding by blockDim.y, so a thread's weights serve out_freq / blockDim.y positions. Per output
// the taps accumulate in fp32 in the order (ki, kj) = (0, 0), (0, 1), ..., skipping taps outside
// the input, as in the element-wise formulation.

// First convolution, one input channel: x [batch, time, freq] f32 (features, time-major);
// weight [channels, 9] f32, bias [channels] f32; y [batch, out_time, out_freq, channels] bf16,
// ReLU applied. The thread's 9 * kPack weights live in registers.
extern "C" __global__ void subsample_conv0_relu(const float* x, const int* lengths,
                                                const float* weight, const float* bias, int batch,
                                                int time, int freq, int channels, int out_time,
                                                int out_freq, bf16_t* y) {
    const int frame = blockIdx.x;
    const int c0 = (blockIdx.y * blockDim.x + threadIdx.x) * kPack;
    if (c0 >= channels) return;
    const int count = min(kPack, channels - c0);
    const bool packed = channels % kPack == 0 && aligned16(y);
    const int t = frame % out_time;
    const int b = frame / out_time;
    const int valid = min(max(lengths[b], 0), time);
    float w[9][kPack];
    float b0[kPack];
#pragma unroll
    for (int j = 0; j < kPack; ++j) {
        b0[j] = j < count ? bias[c0 + j] : 0.0f;
#pragma unroll
        for (int tap = 0; tap < 9; ++tap) w[tap][j] = j < count ? weight[(c0 + j) * 9 + tap] : 0.0f;
    }
    const float* xb = x + (long long)b * time * freq;
    bf16_t* yf = y + (long long)frame * out_freq * channels + c0;
    for (int f = threadIdx.y; f < out_freq; f += blockDim.y)
        store_unit(yf + (long long)f * channels, conv0_relu_unit(xb, valid, freq, w, b0, t, f),
                   packed, count);
}

// Depthwise convolution of every channel: x [batch, time, freq, channels] bf16 -> y
// [batch, out_time, out_freq, channels] bf16; weight [channels, 9] f32, bias [channels] f32.
// Each tap is one 16-byte load where packed. The block's weights are staged in dynamic shared
// memory as [9][blockDim.x * kPack] floats (a thread's kPack weights of one tap contiguous).
extern "C" __global__ void subsample_depthwise(const bf16_t* x, const int* lengths,
                                               const float* weight, const float* bias, int batch,
                                               int time, int freq, int channels, int out_time,
                                               int out_freq, bf16_t* y) {
    extern __shared__ __align__(16) float block_weight[];
    const int block_channels = blockDim.x * kPack;
    const int first_channel = blockIdx.y * block_channels;
    stage_tap_weights(block_weight, weight, first_channel, block_channels, channels);

    const int frame = blockIdx.x;
    const int local = threadIdx.x * kPack;
    const int c0 = first_channel + local;
    if (c0 >= channels) return;
    const int count = min(kPack, channels - c0);
    const bool packed = channels % kPack == 0 && aligned16(x) && aligned16(y);
    const int t = frame % out_time;
    const int b = frame / out_time;
    const int valid = min(max(lengths[b], 0), time);
    float b0[kPack];
#pragma unroll
    for (int j = 0; j < kPack; ++j) b0[j] = j < count ? bias[c0 + j] : 0.0f;
    const bf16_t* xb = x + (long long)b * time * freq * channels + c0;
    bf16_t* yf = y + (long long)frame * out_freq * channels + c0;
    for (int f = threadIdx.y; f < out_freq; f += blockDim.y) {
        float acc[kPack];
#pragma unroll
        for (int j = 0; j < kPack; ++j) acc[j] = b0[j];
#pragma unroll
        for (int ki = 0; ki < 3; ++ki) {
            const int r = 2 * t + ki - 1;
            if (r < 0 || r >= valid) continue;
            const bf16_t* row = xb + (long long)r * freq * channels;
#pragma unroll
            for (int kj = 0; kj < 3; ++kj) {
                const int col = 2 * f + kj - 1;
                if (col < 0 || col >= freq) continue;
                const bf16_t* src = row + (long long)col * channels;
                Pack in;
                if (packed) {
                    in.raw = *reinterpret_cast<const uint4*>(src);
                } else {
#pragma unroll
                    for (int j = 0; j < kPack; ++j) in.v[j] = j < count ? src[j] : (bf16_t)0;
                }
                const float4* w4 = reinterpret_cast<const float4*>(
                    block_weight + (ki * 3 + kj) * block_channels + local);
#pragma unroll
                for (int q = 0; q < kPack / 4; ++q) {
                    const float4 wq = w4[q];
                    acc[4 * q + 0] += wq.x * bf16_to_f32(in.v[4 * q + 0]);
                    acc[4 * q + 1] += wq.y * bf16_to_f32(in.v[4 * q + 1]);
                    acc[4 * q + 2] += wq.z * bf16_to_f32(in.v[4 * q + 2]);
                    acc[4 * q + 3] += wq.w * bf16_to_f32(in.v[4 * q + 3]);
                }
            }
        }
        Pack result;
#pragma unroll
        for (int j = 0; j < kPack; ++j) result.v[j] = f32_to_bf16(acc[j]);
        store_unit(yf + (long long)f * channels, result, packed, count);
    }
}

// One depthwise tap over a unit, in `subsample_depthwise`'s expression form (float4 weights
// from shared memory, `acc += w * widened input`).
__device__ __forceinline__ void depthwise_tap(float (&acc)[kPack], const float* tap_weight,
                                              const Pack& in) {
    const float4* w4 = reinterpret_cast<const float4*>(tap_weight);
#pragma unroll
    for (int q = 0; q < kPack / 4; ++q) {
        const float4 wq = w4[q];
        acc[4 * q + 0] += wq.x * bf16_to_f32(in.v[4 * q + 0]);
        acc[4 * q + 1] += wq.y * bf16_to_f32(in.v[4 * q + 1]);
        acc[4 * q + 2] += wq.z * bf16_to_f32(in.v[4 * q + 2]);
        acc[4 * q + 3] += wq.w * bf16_to_f32(in.v[4 * q + 3]);
    }
}

// conv0 + ReLU fused with stage 1's depthwise convolution: bitwise what `subsample_conv0_relu`
// followed by `subsample_depthwise` give, without writing conv0's output (the largest
// activation) to memory. x [batch, time, freq] f32; lengths0 the feature frames, lengths1 the
// conv0 output frames (stride2_out_len of lengths0); y [batch, out_time, out_freq, channels]
// with mid_time/mid_freq conv0's output size and out_* = stride2_out_len(mid_*).
//
// Launch: blockIdx.y and threadIdx.x pick the thread's kPack channels as in the other kernels
// (packed 16-byte stores along channels). Work item blockIdx.x * blockDim.y + threadIdx.y is one
// output frame and a run of `cols_per_thread` output columns, which the thread walks left to
// right: output column f needs conv0 columns 2f-1, 2f, 2f+1 of rows 2t-1..2t+1, and column 2f-1
// is the previous column's 2f+1, kept in registers (6 conv0 values computed per output instead
// of 9). conv0 weights live in registers (the hot loop); depthwise weights are staged in dynamic
// shared memory as [9][blockDim.x * kPack] floats, as in `subsample_depthwise`. conv0 rows
// r1 >= lengths1[b] are skipped (they read as zero in the unfused path), and so are conv0's own
// input frames >= lengths0[b].
extern "C" __global__ void subsample_conv0_depthwise(
    const float* x, const int* lengths0, const int* lengths1, const float* conv_weight,
    const float* conv_bias, const float* dw_weight, const float* dw_bias, int batch, int time,
    int freq, int channels, int mid_time, int mid_freq, int out_time, int out_freq,
    int cols_per_thread, bf16_t* y) {
    extern __shared__ __align__(16) float block_weight[];
    const int block_channels = blockDim.x * kPack;
    const int first_channel = blockIdx.y * block_channels;
    stage_tap_weights(block_weight, dw_weight, first_channel, block_channels, channels);

    const int runs = (out_freq + cols_per_thread - 1) / cols_per_thread;
    const long long item = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    const int local = threadIdx.x * kPack;
    const int c0 = first_channel + local;
    if (item >= (long long)batch * out_time * runs || c0 >= channels) return;
    const int frame = (int)(item / runs);
    const int f_begin = (int)(item - (long long)frame * runs) * cols_per_thread;
    const int f_end = min(f_begin + cols_per_thread, out_freq);
    const int count = min(kPack, channels - c0);
    const bool packed = channels % kPack == 0 && aligned16(y);
    const int t = frame % out_time;
    const int b = frame / out_time;
    const int valid0 = min(max(lengths0[b], 0), time);
    const int valid1 = min(max(lengths1[b], 0), mid_time);
    float w[9][kPack];
    float b0[kPack];
    float db[kPack];
#pragma unroll
    for (int j = 0; j < kPack; ++j) {
        b0[j] = j < count ? conv_bias[c0 + j] : 0.0f;
        db[j] = j < count ? dw_bias[c0 + j] : 0.0f;
#pragma unroll
        for (int tap = 0; tap < 9; ++tap)
            w[tap][j] = j < count ? conv_weight[(c0 + j) * 9 + tap] : 0.0f;
    }
    const float* xb = x + (long long)b * time * freq;
    const float* wl = block_weight + local;
    bf16_t* yf = y + (long long)frame * out_freq * channels + c0;

    // left[ki]: conv0 row 2t+ki-1 at column 2f-1 (for f > 0), carried from column to column.
    Pack left[3];
#pragma unroll
    for (int ki = 0; ki < 3; ++ki) {
        const int r1 = 2 * t + ki - 1;
        if (f_begin > 0 && r1 >= 0 && r1 < valid1)
            left[ki] = conv0_relu_unit(xb, valid0, freq, w, b0, r1, 2 * f_begin - 1);
    }
    for (int f = f_begin; f < f_end; ++f) {
        float acc[kPack];
#pragma unroll
        for (int j = 0; j < kPack; ++j) acc[j] = db[j];
        const bool has_right = 2 * f + 1 < mid_freq;
#pragma unroll
        for (int ki = 0; ki < 3; ++ki) {
            const int r1 = 2 * t + ki - 1;
            if (r1 < 0 || r1 >= valid1) continue;
            const Pack mid = conv0_relu_unit(xb, valid0, freq, w, b0, r1, 2 * f);
            // Taps (ki, 0), (ki, 1), (ki, 2) in order; column 2f-1 exists for f > 0, 2f
            // always (f < out_freq), 2f+1 unless it is past conv0's last column.
            if (f > 0) depthwise_tap(acc, wl + (ki * 3 + 0) * block_channels, left[ki]);
            depthwise_tap(acc, wl + (ki * 3 + 1) * block_channels, mid);
            if (has_right) {
                left[ki] = conv0_relu_unit(xb, valid0, freq, w, b0, r1, 2 * f + 1);
                depthwise_tap(acc, wl + (ki * 3 + 2) * block_channels, left[ki]);
            }
        }
        Pack result;
#pragma unroll
        for (int j = 0; j < kPack; ++j) result.v[j] = f32_to_bf16(acc[j]);
        store_unit(yf + (long long)f * channels, result, packed, count);
    }
}

__device__ __forceinline__ bf16_t relu_one(bf16_t v) {
    return f32_to_bf16(fmaxf(bf16_to_f32(v), 0.0f));
}

// In-place ReLU over n elements (after the pointwise convolution's bias epilogue). Launch: a 1-D
// grid-stride over 16-byte packs when x is aligned, then element-wise over the tail.
extern "C" __global__ void relu_bf16_inplace(bf16_t* x, long long n) {
    const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long done = 0;
    if (aligned16(x)) {
        const long long packs = n / kPack;
        uint4* xp = reinterpret_cast<uint4*>(x);
        for (long long p = first; p < packs; p += stride) {
            Pack v;
            v.raw = xp[p];
#pragma unroll
            for (int j = 0; j < kPack; ++j) v.v[j] = relu_one(v.v[j]);
            xp[p] = v.raw;
        }
        done = packs * kPack;
    }
    for (long long i = done + first; i < n; i += stride) x[i] = relu_one(x[i]);
}
