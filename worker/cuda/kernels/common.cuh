// Shared helpers prepended to every kernel module before NVRTC compiles it.
//
// bf16 values travel as raw 16-bit patterns (the host side is `half::bf16`, a transparent u16),
// so the kernels need no cuda_bf16.h and compile under any NVRTC without include paths.

// NVRTC has no math.h, so no INFINITY macro.
#define F32_INFINITY __int_as_float(0x7f800000)

#ifdef CUDA_ENGINE_F32_STORAGE
// The f32-storage build of the same kernels (the exact path): "bf16" buffers hold f32 and the
// conversions are identities.
typedef float bf16_t;

__device__ __forceinline__ float bf16_to_f32(bf16_t v) { return v; }

__device__ __forceinline__ bf16_t f32_to_bf16(float f) { return f; }
#else
typedef unsigned short bf16_t;

__device__ __forceinline__ float bf16_to_f32(bf16_t v) {
    return __uint_as_float(((unsigned int)v) << 16);
}

// Round to nearest even, NaN stays NaN (quieted): the same rule as `half::bf16::from_f32`.
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (bf16_t)((u >> 16) | 0x0040u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}
#endif

// 16-byte packs: kPack storage elements (8 bf16 or 4 f32) move as one load or store. Kernels
// take the packed path only where aligned16 holds for their pointers (and the layout allows).
constexpr int kPack = 16 / (int)sizeof(bf16_t);

union Pack {
    uint4 raw;
    bf16_t v[kPack];
};

__device__ __forceinline__ bool aligned16(const void* p) {
    return ((unsigned long long)p & 15ull) == 0;
}

// Starts an asynchronous 16-byte copy global -> shared (cp.async: no registers in between); with
// `valid` false nothing is read and dst gets zeros. Before sm_80 it is an ordinary copy.
__device__ __forceinline__ void copy16_async(void* dst, const void* src, bool valid) {
#if __CUDA_ARCH__ >= 800
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(addr), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
#else
    *reinterpret_cast<uint4*>(dst) =
        valid ? *reinterpret_cast<const uint4*>(src) : make_uint4(0u, 0u, 0u, 0u);
#endif
}

// Closes the copies started so far into one group.
__device__ __forceinline__ void commit_copies() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most `pending` of this thread's groups are still in flight.
template <int pending>
__device__ __forceinline__ void wait_copies() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(pending) : "memory");
#endif
}

__device__ __forceinline__ float sigmoid_f32(float v) {
    return 1.0f / (1.0f + expf(-v));
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;
}

// Block-wide reductions; every thread receives the result. blockDim.x must be a multiple of 32.
// The leading barrier keeps a second call from overwriting `partial` before the first call's
// readers are done with it.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    const int warps = blockDim.x >> 5;
    return warp_sum(lane < warps ? partial[lane] : 0.0f);
}

__device__ float block_max(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    const int warps = blockDim.x >> 5;
    return warp_max(lane < warps ? partial[lane] : -F32_INFINITY);
}
