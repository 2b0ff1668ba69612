// Relative-position multi-head attention, unfused baseline around cuBLASLt batched matmuls.
// Head-major layout [heads, batch, time, head_dim] ("hb" = h * batch + b indexes a batch entry),
// so QK^T, (q+v)P^T and PV are each one batched matmul.

// split_qkv_heads and merge_heads give each thread one unit of kPack consecutive columns of d
// (8 bf16 or 4 f32: one 16-byte pack) of one row: when head_dim is a multiple of kPack and every
// pointer is 16-byte aligned, a unit lies in one head and moves with 16-byte loads and stores;
// otherwise element by element. Launch: blockIdx.x * blockDim.x + threadIdx.x = unit; rows
// (b * time + t) blockIdx.y * blockDim.y + threadIdx.y, striding by gridDim.y * blockDim.y.

union F32Pack {
    float4 raw[kPack / 4];
    float v[kPack];
};

// q + bias (kPack f32 at a 16-byte aligned address), added in f32 and rounded once, as a pack.
__device__ __forceinline__ uint4 add_bias(const Pack& q, const float* bias) {
    F32Pack b;
#pragma unroll
    for (int j = 0; j < kPack / 4; ++j) b.raw[j] = reinterpret_cast<const float4*>(bias)[j];
    Pack sum;
#pragma unroll
    for (int j = 0; j < kPack; ++j) sum.v[j] = f32_to_bf16(bf16_to_f32(q.v[j]) + b.v[j]);
    return sum.raw;
}

// qkv [batch, time, 3 * d] bf16 (q | k | v, d = heads * head_dim); pos_bias_u/v [d] f32.
// q_u = q + u, q_v = q + v (added in f32, rounded once), k, v: [heads, batch, time, head_dim].
// batch * time must fit an int (checked by the wrapper).
extern "C" __global__ void split_qkv_heads(const bf16_t* qkv, const float* pos_bias_u,
                                           const float* pos_bias_v, int batch, int time,
                                           int heads, int head_dim, bf16_t* q_u, bf16_t* q_v,
                                           bf16_t* k, bf16_t* v) {
    const int d = heads * head_dim;
    const int col0 = (blockIdx.x * blockDim.x + threadIdx.x) * kPack;
    if (col0 >= d) return;
    const bool packed = head_dim % kPack == 0 && aligned16(qkv) && aligned16(pos_bias_u) &&
                        aligned16(pos_bias_v) && aligned16(q_u) && aligned16(q_v) &&
                        aligned16(k) && aligned16(v);
    const int rows = batch * time;
    for (int bt = blockIdx.y * blockDim.y + threadIdx.y; bt < rows; bt += gridDim.y * blockDim.y) {
        const int t = bt % time;
        const int b = bt / time;
        const bf16_t* row = qkv + (long long)bt * 3 * d;
        if (packed) {
            const int h = col0 / head_dim;
            const int e = col0 - h * head_dim;
            const long long dst = (((long long)h * batch + b) * time + t) * head_dim + e;
            Pack q;
            q.raw = *reinterpret_cast<const uint4*>(row + col0);
            // __stwb: an ordinary store that stays one 128-bit access (NVVM split a plain
            // assignment of this value into four).
            __stwb(reinterpret_cast<uint4*>(q_u + dst), add_bias(q, pos_bias_u + col0));
            __stwb(reinterpret_cast<uint4*>(q_v + dst), add_bias(q, pos_bias_v + col0));
            *reinterpret_cast<uint4*>(k + dst) = *reinterpret_cast<const uint4*>(row + d + col0);
            *reinterpret_cast<uint4*>(v + dst) =
                *reinterpret_cast<const uint4*>(row + 2 * d + col0);
        } else {
            const int end = min(col0 + kPack, d);
            for (int col = col0; col < end; ++col) {
                const int h = col / head_dim;
                const int e = col - h * head_dim;
                const long long dst = (((long long)h * batch + b) * time + t) * head_dim + e;
                const float q = bf16_to_f32(row[col]);
                q_u[dst] = f32_to_bf16(q + pos_bias_u[col]);
                q_v[dst] = f32_to_bf16(q + pos_bias_v[col]);
                k[dst] = row[d + col];
                v[dst] = row[2 * d + col];
            }
        }
    }
}

// One block per score row (hb, i). ac [hb, time, score_row] = (q+u)K^T, bd [hb, time, bd_row] =
// (q+v)P^T with table row c holding relative position time-1-c, so key j of query i uses column
// time-1-i+j (the relative shift). probs [hb, time, score_row] = softmax(scale * (ac + bd)) over
// keys j < lengths[b]; masked keys, and every key of query rows i >= lengths[b], get exactly 0.
// Row strides are padded (>= time, >= 2*time-1) so every row starts 16-byte aligned for the
// matmuls; columns past `time` are never read or written.
extern "C" __global__ void rel_pos_softmax(const float* ac, const float* bd, const int* lengths,
                                           float scale, int batch, int time, int score_row,
                                           int bd_row, bf16_t* probs) {
    const long long row = blockIdx.x;
    const int i = (int)(row % time);
    const int b = (int)((row / time) % batch);
    const int valid = min(max(lengths[b], 0), time);
    bf16_t* out = probs + row * score_row;
    if (i >= valid) {
        for (int j = threadIdx.x; j < time; j += blockDim.x) out[j] = 0;
        return;
    }
    const float* a = ac + row * score_row;
    const float* s = bd + row * bd_row + (time - 1 - i);
    float m = -F32_INFINITY;
    for (int j = threadIdx.x; j < valid; j += blockDim.x) m = fmaxf(m, (a[j] + s[j]) * scale);
    m = block_max(m);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < valid; j += blockDim.x) sum += expf((a[j] + s[j]) * scale - m);
    const float inv = 1.0f / block_sum(sum);
    for (int j = threadIdx.x; j < time; j += blockDim.x) {
        out[j] = j < valid ? f32_to_bf16(expf((a[j] + s[j]) * scale - m) * inv) : (bf16_t)0;
    }
}

// ctx [heads, batch, time, head_dim] -> out [batch, time, heads * head_dim]; launch and units as
// for split_qkv_heads.
extern "C" __global__ void merge_heads(const bf16_t* ctx, int batch, int time, int heads,
                                       int head_dim, bf16_t* out) {
    const int d = heads * head_dim;
    const int col0 = (blockIdx.x * blockDim.x + threadIdx.x) * kPack;
    if (col0 >= d) return;
    const bool packed = head_dim % kPack == 0 && aligned16(ctx) && aligned16(out);
    const int rows = batch * time;
    for (int bt = blockIdx.y * blockDim.y + threadIdx.y; bt < rows; bt += gridDim.y * blockDim.y) {
        const int t = bt % time;
        const int b = bt / time;
        bf16_t* dst = out + (long long)bt * d;
        if (packed) {
            const int h = col0 / head_dim;
            const int e = col0 - h * head_dim;
            const long long src = (((long long)h * batch + b) * time + t) * head_dim + e;
            *reinterpret_cast<uint4*>(dst + col0) = *reinterpret_cast<const uint4*>(ctx + src);
        } else {
            const int end = min(col0 + kPack, d);
            for (int col = col0; col < end; ++col) {
                const int h = col / head_dim;
                const int e = col - h * head_dim;
                dst[col] = ctx[(((long long)h * batch + b) * time + t) * head_dim + e];
            }
        }
    }
}

// Local (banded) variant, NeMo rel_pos_local_attn without global tokens. Query i sees keys
// i-left ..= i+right inside the utterance; bd [hb, time, bd_row] is (q+v)P_band^T with the
// band table of positions left, ..., -right. Band column c = j - i + w (w = max(left, right))
// takes bd column c when c < left, column left + c - (2w - right) when c >= 2w - right, and no bd
// term otherwise (NeMo's placement, mirrored from the CPU reference). Keys outside the window get
// exactly 0, as do all keys of query rows i >= lengths[b].
__device__ __forceinline__ float local_score(const float* a, const float* s, int i, int j,
                                             int left, int right, int w, float scale) {
    const int c = j - i + w;
    float b = 0.0f;
    if (c < left) {
        b = s[c];
    } else if (c >= 2 * w - right) {
        b = s[left + c - (2 * w - right)];
    }
    return (a[j] + b) * scale;
}

extern "C" __global__ void local_rel_pos_softmax(const float* ac, const float* bd,
                                                 const int* lengths, float scale, int batch,
                                                 int time, int left, int right, int score_row,
                                                 int bd_row, bf16_t* probs) {
    const long long row = blockIdx.x;
    const int i = (int)(row % time);
    const int b = (int)((row / time) % batch);
    const int valid = min(max(lengths[b], 0), time);
    bf16_t* out = probs + row * score_row;
    if (i >= valid) {
        for (int j = threadIdx.x; j < time; j += blockDim.x) out[j] = 0;
        return;
    }
    const int w = max(left, right);
    const int lo = max(i - left, 0);
    const int hi = min(i + right + 1, valid);
    const float* a = ac + row * score_row;
    const float* s = bd + row * bd_row;
    float m = -F32_INFINITY;
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        m = fmaxf(m, local_score(a, s, i, j, left, right, w, scale));
    }
    m = block_max(m);
    float sum = 0.0f;
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        sum += expf(local_score(a, s, i, j, left, right, w, scale) - m);
    }
    const float inv = 1.0f / block_sum(sum);
    for (int j = threadIdx.x; j < time; j += blockDim.x) {
        out[j] = (j >= lo && j < hi)
                     ? f32_to_bf16(expf(local_score(a, s, i, j, left, right, w, scale) - m) * inv)
                     : (bf16_t)0;
    }
}

// rel_pos_softmax for rows of at most 32 * REL_POS_WARP_VALUES keys: one warp per score row,
// each lane keeping its scores in registers, so ac and bd are read once and no block-wide
// barrier is needed (the block-per-row kernel above re-reads them and synchronises 256 threads
// for a few hundred keys). Same arguments plus the total row count; same results up to the
// summation order of the softmax denominator.
#define REL_POS_WARP_VALUES 32

extern "C" __global__ void rel_pos_softmax_warp(const float* ac, const float* bd,
                                                const int* lengths, float scale, int batch,
                                                int time, int score_row, int bd_row,
                                                long long rows, bf16_t* probs) {
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int i = (int)(row % time);
    const int b = (int)((row / time) % batch);
    const int valid = min(max(lengths[b], 0), time);
    bf16_t* out = probs + row * score_row;
    if (i >= valid) {
        for (int j = lane; j < time; j += 32) out[j] = 0;
        return;
    }
    const float* a = ac + row * score_row;
    const float* s = bd + row * bd_row + (time - 1 - i);
    float v[REL_POS_WARP_VALUES];
    float m = -F32_INFINITY;
#pragma unroll
    for (int r = 0; r < REL_POS_WARP_VALUES; ++r) {
        const int j = lane + 32 * r;
        v[r] = j < valid ? (a[j] + s[j]) * scale : -F32_INFINITY;
        m = fmaxf(m, v[r]);
    }
    m = warp_max(m);
    float sum = 0.0f;
#pragma unroll
    for (int r = 0; r < REL_POS_WARP_VALUES; ++r) {
        const int j = lane + 32 * r;
        v[r] = j < valid ? expf(v[r] - m) : 0.0f;
        sum += v[r];
    }
    const float inv = 1.0f / warp_sum(sum);
#pragma unroll
    for (int r = 0; r < REL_POS_WARP_VALUES; ++r) {
        const int j = lane + 32 * r;
        if (j < time) out[j] = j < valid ? f32_to_bf16(v[r] * inv) : (bf16_t)0;
    }
}
