// Log-mel features on the device, the same arithmetic as models::FeatureExtractor::compute:
// preemphasis, centred STFT framing (zero or reflect padding), power spectrum, then (after the
// mel matmul) log(mel + guard) and per-feature normalisation over each clip's valid frames.
// The DFT and the mel filterbank are fp32 cuBLASLt matmuls between these kernels.
//
// Clips arrive packed one after another (no padding) and are described by `clips`, a
// long long [3 * batch] table: start offsets, sample counts, then valid frame counts.
// Products that the CPU rounds on their own use __fmul_rn so NVRTC's FMA contraction (fmad is on)
// cannot fuse them into a differently rounded fma.

// Sample `index` (relative to the clip start) of the preemphasised, centre-padded clip.
__device__ __forceinline__ float padded_sample(const float* clip, long long len, long long index,
                                               float preemph, int has_preemph, int reflect) {
    if (index < 0 || index >= len) {
        if (!reflect) return 0.0f;
        if (len == 1) {
            index = 0;
        } else {
            // Reflection without repeating the edge sample, folded until it lands inside.
            const long long period = 2 * (len - 1);
            index %= period;
            if (index < 0) index += period;
            if (index >= len) index = period - index;
        }
    }
    if (!has_preemph || index == 0) return clip[index];
    return clip[index] - __fmul_rn(preemph, clip[index - 1]);
}

// frames [batch * time, win]: row b * time + t holds the `win` samples of frame t of clip b that
// the (zero-padded) window covers, unwindowed (the window is folded into the DFT basis). Rows of
// frames past a clip's valid count are zero. `first` is the sample index of column 0 of frame 0
// (window offset inside n_fft minus n_fft / 2).
extern "C" __global__ void feature_frames(const float* pcm, const long long* clips, int batch,
                                          int time, int win, int hop, int first, float preemph,
                                          int has_preemph, int reflect, float* frames) {
    const long long n = (long long)batch * time * win;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n;
         e += (long long)gridDim.x * blockDim.x) {
        const int i = (int)(e % win);
        const long long row = e / win;
        const int t = (int)(row % time);
        const int b = (int)(row / time);
        float value = 0.0f;
        if (t < clips[2 * batch + b]) {
            const long long index = (long long)t * hop + first + i;
            value = padded_sample(pcm + clips[b], clips[batch + b], index, preemph, has_preemph,
                                  reflect);
        }
        frames[e] = value;
    }
}

// spectrum [rows, 2 * n_freq] (cosine parts, then sine parts) -> power [rows, n_freq]:
// |X| = sqrt(re^2 + im^2), then |X|^mag_power, exactly as the CPU reference rounds it.
extern "C" __global__ void power_spectrum(const float* spectrum, long long rows, int n_freq,
                                          float mag_power, float* power) {
    const long long n = rows * n_freq;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n;
         e += (long long)gridDim.x * blockDim.x) {
        const int k = (int)(e % n_freq);
        const long long row = e / n_freq;
        const float re = spectrum[row * 2 * n_freq + k];
        const float im = spectrum[row * 2 * n_freq + n_freq + k];
        const float magnitude = sqrtf(__fadd_rn(__fmul_rn(re, re), __fmul_rn(im, im)));
        float p;
        if (mag_power == 2.0f) {
            p = __fmul_rn(magnitude, magnitude);
        } else if (mag_power == 1.0f) {
            p = magnitude;
        } else {
            p = powf(magnitude, mag_power);
        }
        power[e] = p;
    }
}

__device__ __forceinline__ double warp_sum_f64(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

// block_sum in f64 (the CPU reference sums in f64); every thread receives the result.
__device__ double block_sum_f64(double v) {
    __shared__ double partial[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = warp_sum_f64(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    const int warps = blockDim.x >> 5;
    return warp_sum_f64(lane < warps ? partial[lane] : 0.0);
}

// mel [batch * time, n_mels] -> out [batch, time, n_mels]: log(mel + guard), then (when
// `normalize`) per clip and mel bin: (v - mean) / (std + 1e-5) with the N-1 standard deviation
// over the clip's valid frames (one valid frame: std 0, so every value becomes 0). Frames past a
// clip's valid count are written as zero. Grid: (n_mels, batch); blockDim.x a multiple of 32.
extern "C" __global__ void log_mel_normalize(const float* mel, const long long* clips, int batch,
                                             int time, int n_mels, float guard, int normalize,
                                             float* out) {
    const int m = blockIdx.x;
    const int b = blockIdx.y;
    const long long valid_ll = clips[2 * batch + b];
    const int valid = valid_ll < 0 ? 0 : (valid_ll > time ? time : (int)valid_ll);
    const long long base = (long long)b * time * n_mels + m;

    double sum = 0.0;
    for (int t = threadIdx.x; t < time; t += blockDim.x) {
        const long long at = base + (long long)t * n_mels;
        float v = 0.0f;
        if (t < valid) {
            v = logf(mel[at] + guard);
            sum += (double)v;
        }
        out[at] = v;
    }
    if (!normalize || valid == 0) return;
    const double mean = block_sum_f64(sum) / (double)valid;

    // Two passes, as the reference: squared deviations from the f64 mean.
    double sq = 0.0;
    for (int t = threadIdx.x; t < valid; t += blockDim.x) {
        const double d = (double)out[base + (long long)t * n_mels] - mean;
        sq += d * d;
    }
    const double sq_total = block_sum_f64(sq);
    const float std_dev = valid > 1 ? (float)sqrt(sq_total / (double)(valid - 1)) : 0.0f;
    const float denom = std_dev + 1e-5f;
    const float mean_f = (float)mean;
    for (int t = threadIdx.x; t < valid; t += blockDim.x) {
        const long long at = base + (long long)t * n_mels;
        out[at] = (out[at] - mean_f) / denom;
    }
}
