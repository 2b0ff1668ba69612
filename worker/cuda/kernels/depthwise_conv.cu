// Depthwise 1-D convolution over time with BatchNorm already folded into weight and bias.
//
// x, y: [batch, time, channels] bf16 (channels contiguous). weight: [channels, kernel] f32; bias:
// [channels] f32. Symmetric zero padding of (kernel - 1) / 2 frames (odd kernel sizes). Frames
// t >= lengths[b] read as zero, as NeMo masks padding frames before this convolution, and are
// written as zero. apply_silu != 0 fuses the SiLU that follows BatchNorm in the Conformer
// convolution module.
//
// Each thread computes one unit of kPack consecutive channels (8 bf16 or 4 f32: one 16-byte pack)
// of one (b, t): each tap is one 16-byte load when channels is a multiple of kPack and x, y are
// 16-byte aligned, element-wise loads otherwise (tails, odd channel counts). Per output the taps
// accumulate in fp32 in order k = 0, 1, ..., as in the element-wise formulation.
//
// Launch: blockIdx.x * blockDim.x + threadIdx.x = channel unit; the block's blockDim.x * kPack
// channels have their weights staged in dynamic shared memory, transposed to [kernel][block
// channels] (kernel * blockDim.x * kPack floats), so a thread's kPack weights of one tap are
// contiguous. Time: blockIdx.y * blockDim.y + threadIdx.y, striding by gridDim.y * blockDim.y;
// batch: blockIdx.z, striding by gridDim.z.
//
// Follow-up: stage a time tile of x in shared memory so each input is read once instead of
// `kernel` times (today the re-reads hit L1/L2).


extern "C" __global__ void depthwise_conv1d_bf16(const bf16_t* x, const float* weight,
                                                 const float* bias, const int* lengths, int batch,
                                                 int time, int channels, int kernel,
                                                 int apply_silu, bf16_t* y) {
    extern __shared__ __align__(16) float block_weight[];
    const int block_channels = blockDim.x * kPack;
    const int first_channel = blockIdx.x * block_channels;
    const int threads = blockDim.x * blockDim.y;
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    // weight rows of this block's channels are one contiguous range: coalesced reads.
    for (int j = tid; j < block_channels * kernel; j += threads) {
        const int local = j / kernel;
        const int k = j - local * kernel;
        const int c = first_channel + local;
        block_weight[k * block_channels + local] =
            c < channels ? weight[(long long)first_channel * kernel + j] : 0.0f;
    }
    __syncthreads();

    const int local = threadIdx.x * kPack;
    const int c0 = first_channel + local;
    if (c0 >= channels) return;
    const int count = min(kPack, channels - c0);
    const bool packed = channels % kPack == 0 && aligned16(x) && aligned16(y);
    float b0[kPack];
#pragma unroll
    for (int j = 0; j < kPack; ++j) b0[j] = j < count ? bias[c0 + j] : 0.0f;
    const int pad = (kernel - 1) / 2;
    const int time_stride = gridDim.y * blockDim.y;

    for (int b = blockIdx.z; b < batch; b += gridDim.z) {
        const int valid = min(max(lengths[b], 0), time);
        const bf16_t* xb = x + (long long)b * time * channels + c0;
        for (int t = blockIdx.y * blockDim.y + threadIdx.y; t < time; t += time_stride) {
            bf16_t* out = y + ((long long)b * time + t) * channels + c0;
            Pack result;
            if (t >= valid) {
#pragma unroll
                for (int j = 0; j < kPack; ++j) result.v[j] = 0;
            } else {
                float acc[kPack];
#pragma unroll
                for (int j = 0; j < kPack; ++j) acc[j] = b0[j];
                const int k_begin = max(0, pad - t);
                const int k_end = min(kernel, valid - t + pad);
                for (int k = k_begin; k < k_end; ++k) {
                    const bf16_t* src = xb + (long long)(t + k - pad) * channels;
                    Pack in;
                    if (packed) {
                        in.raw = *reinterpret_cast<const uint4*>(src);
                    } else {
#pragma unroll
                        for (int j = 0; j < kPack; ++j) in.v[j] = j < count ? src[j] : (bf16_t)0;
                    }
                    const float4* w4 =
                        reinterpret_cast<const float4*>(block_weight + k * block_channels + local);
#pragma unroll
                    for (int q = 0; q < kPack / 4; ++q) {
                        const float4 w = w4[q];
                        acc[4 * q + 0] += w.x * bf16_to_f32(in.v[4 * q + 0]);
                        acc[4 * q + 1] += w.y * bf16_to_f32(in.v[4 * q + 1]);
                        acc[4 * q + 2] += w.z * bf16_to_f32(in.v[4 * q + 2]);
                        acc[4 * q + 3] += w.w * bf16_to_f32(in.v[4 * q + 3]);
                    }
                }
#pragma unroll
                for (int j = 0; j < kPack; ++j) {
                    float v = acc[j];
                    if (apply_silu) v *= sigmoid_f32(v);
                    result.v[j] = f32_to_bf16(v);
                }
            }
            if (packed) {
                *reinterpret_cast<uint4*>(out) = result.raw;
            } else {
#pragma unroll
                for (int j = 0; j < kPack; ++j) {
                    if (j < count) out[j] = result.v[j];
                }
            }
        }
    }
}
