// Pointwise activations in bf16 storage, fp32 arithmetic.
//
// Each thread moves one 16-byte pack (kPack storage elements: 8 bf16 or 4 f32) per access where
// the pointers are 16-byte aligned and the layout allows; tails and unaligned pointers take the
// element-wise path. The arithmetic per element is the same on both paths.

__device__ __forceinline__ bf16_t silu_one(bf16_t x) {
    const float v = bf16_to_f32(x);
    return f32_to_bf16(v * sigmoid_f32(v));
}

__device__ __forceinline__ bf16_t glu_one(bf16_t a, bf16_t gate) {
    return f32_to_bf16(bf16_to_f32(a) * sigmoid_f32(bf16_to_f32(gate)));
}

// y = x * sigmoid(x). Launch: a 1-D grid-stride over packs (any grid covers every element).
extern "C" __global__ void silu_bf16(const bf16_t* x, bf16_t* y, long long n) {
    const long long first = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long done = 0;
    if (aligned16(x) && aligned16(y)) {
        const long long packs = n / kPack;
        const uint4* xp = reinterpret_cast<const uint4*>(x);
        uint4* yp = reinterpret_cast<uint4*>(y);
        for (long long p = first; p < packs; p += stride) {
            Pack in, out;
            in.raw = xp[p];
#pragma unroll
            for (int j = 0; j < kPack; ++j) out.v[j] = silu_one(in.v[j]);
            yp[p] = out.raw;
        }
        done = packs * kPack;
    }
    for (long long i = done + first; i < n; i += stride) y[i] = silu_one(x[i]);
}

// GLU over the last (channel) axis: x is [rows, 2 * half], y is [rows, half],
// y = x[:, :half] * sigmoid(x[:, half:]) (the torch.nn.functional.glu convention).
//
// Launch: blockIdx.x * blockDim.x + threadIdx.x = u, the unit of columns [u * kPack, u * kPack +
// kPack) of a row (units beyond ceil(half / kPack) return); rows blockIdx.y * blockDim.y +
// threadIdx.y, striding by gridDim.y * blockDim.y. One 16-byte pack per access when half is a
// multiple of kPack and both pointers are aligned (then every row start is aligned too).
extern "C" __global__ void glu_bf16(const bf16_t* x, bf16_t* y, long long rows, int half) {
    const int units = (half + kPack - 1) / kPack;
    const int unit = blockIdx.x * blockDim.x + threadIdx.x;
    if (unit >= units) return;
    const int col = unit * kPack;
    const bool packed = half % kPack == 0 && aligned16(x) && aligned16(y);
    const long long row_stride = (long long)gridDim.y * blockDim.y;
    for (long long row = blockIdx.y * (long long)blockDim.y + threadIdx.y; row < rows;
         row += row_stride) {
        const bf16_t* in = x + row * 2 * half + col;
        bf16_t* out = y + row * half + col;
        if (packed) {
            Pack a, gate, result;
            a.raw = *reinterpret_cast<const uint4*>(in);
            gate.raw = *reinterpret_cast<const uint4*>(in + half);
#pragma unroll
            for (int j = 0; j < kPack; ++j) result.v[j] = glu_one(a.v[j], gate.v[j]);
            *reinterpret_cast<uint4*>(out) = result.raw;
        } else {
            const int count = min(kPack, half - col);
            for (int j = 0; j < count; ++j) out[j] = glu_one(in[j], in[half + j]);
        }
    }
}
