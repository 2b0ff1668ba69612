// Relative-position multi-head attention, unfused baseline around cuBLASLt batched matmuls.
// Head-major layout [heads, batch, time, head_dim] ("hb" = h * batch + b indexes a batch entry),
// so QK^T, (q+v)P^T and PV are each one batched matmul.

// qkv [batch, time, 3 * d] bf16 (q | k | v, d = heads * head_dim); pos_bias_u/v [d] f32.
// q_u = q + u, q_v = q + v (added in f32, rounded once), k, v: [heads, batch, time, head_dim].
extern "C" __global__ void split_qkv_heads(const bf16_t* qkv, const float* pos_bias_u,
                                           const float* pos_bias_v, int batch, int time,
                                           int heads, int head_dim, bf16_t* q_u, bf16_t* q_v,
                                           bf16_t* k, bf16_t* v) {
    const int d = heads * head_dim;
    const long long n = (long long)batch * time * d;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int col = (int)(i % d);
        const long long bt = i / d;
        const int t = (int)(bt % time);
        const int b = (int)(bt / time);
        const int h = col / head_dim;
        const int e = col % head_dim;
        const long long dst = (((long long)h * batch + b) * time + t) * head_dim + e;
        const bf16_t* row = qkv + bt * 3 * d;
        const float q = bf16_to_f32(row[col]);
        q_u[dst] = f32_to_bf16(q + pos_bias_u[col]);
        q_v[dst] = f32_to_bf16(q + pos_bias_v[col]);
        k[dst] = row[d + col];
        v[dst] = row[2 * d + col];
    }
}

// p [positions, d] bf16 -> p_heads [heads, batch, positions, head_dim]: the projected position
// table, repeated per batch entry so the bd product is one batched matmul like QK^T.
extern "C" __global__ void split_pos_heads(const bf16_t* p, int batch, int positions, int heads,
                                           int head_dim, bf16_t* p_heads) {
    const int d = heads * head_dim;
    const long long n = (long long)heads * batch * positions * head_dim;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int e = (int)(i % head_dim);
        long long rest = i / head_dim;
        const int pos = (int)(rest % positions);
        rest /= positions;  // h * batch + b
        const int h = (int)(rest / batch);
        p_heads[i] = p[(long long)pos * d + h * head_dim + e];
    }
}

// One block per score row (hb, i). ac [hb, time, time] = (q+u)K^T, bd [hb, time, 2*time-1] =
// (q+v)P^T with table row c holding relative position time-1-c, so key j of query i uses column
// time-1-i+j (the relative shift). probs = softmax(scale * (ac + bd)) over keys j < lengths[b];
// masked keys, and every key of query rows i >= lengths[b], get exactly 0.
extern "C" __global__ void rel_pos_softmax(const float* ac, const float* bd, const int* lengths,
                                           float scale, int batch, int time, bf16_t* probs) {
    const long long row = blockIdx.x;
    const int i = (int)(row % time);
    const int b = (int)((row / time) % batch);
    const int valid = min(max(lengths[b], 0), time);
    bf16_t* out = probs + row * time;
    if (i >= valid) {
        for (int j = threadIdx.x; j < time; j += blockDim.x) out[j] = 0;
        return;
    }
    const float* a = ac + row * time;
    const float* s = bd + row * (2LL * time - 1) + (time - 1 - i);
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

// ctx [heads, batch, time, head_dim] -> out [batch, time, heads * head_dim].
extern "C" __global__ void merge_heads(const bf16_t* ctx, int batch, int time, int heads,
                                       int head_dim, bf16_t* out) {
    const int d = heads * head_dim;
    const long long n = (long long)batch * time * d;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int col = (int)(i % d);
        const long long bt = i / d;
        const int t = (int)(bt % time);
        const int b = (int)(bt / time);
        const int h = col / head_dim;
        const int e = col % head_dim;
        out[i] = ctx[(((long long)h * batch + b) * time + t) * head_dim + e];
    }
}

// Local (banded) variant, NeMo rel_pos_local_attn without global tokens. Query i sees keys
// i-left ..= i+right inside the utterance; bd [hb, time, left+right+1] is (q+v)P_band^T with the
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
                                                 int time, int left, int right, bf16_t* probs) {
    const long long row = blockIdx.x;
    const int i = (int)(row % time);
    const int b = (int)((row / time) % batch);
    const int valid = min(max(lengths[b], 0), time);
    bf16_t* out = probs + row * time;
    if (i >= valid) {
        for (int j = threadIdx.x; j < time; j += blockDim.x) out[j] = 0;
        return;
    }
    const int w = max(left, right);
    const int lo = max(i - left, 0);
    const int hi = min(i + right + 1, valid);
    const float* a = ac + row * time;
    const float* s = bd + row * (long long)(left + right + 1);
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
