// Label-looping TDT greedy decoding on the GPU (f32), one uniform step per launch sequence:
//
//   tdt_lstm_step (per layer) -> tdt_pred_project -> tdt_joint -> tdt_advance
//
// A step evaluates the joint once for every active row. Rows that emitted a label in the
// previous step first run the prediction network on it (the other rows keep their state and
// projection), so a row's sequence of joint evaluations is exactly the CPU loop's
// (models::tdt): blanks advance the frame and look again with the same prediction output,
// labels are emitted at the frame where they were found. Every kernel reads its shapes from
// arguments and its per-row decoding state from `rs`, so one captured sequence serves every
// batch inside the envelope it was sized for.
//
// Row state `rs[row * RS_FIELDS + field]`:
#define RS_FIELDS 8
#define RS_FRAMES 0        // valid encoder frames (0: row unused)
#define RS_TIME 1          // frame the row looks at next
#define RS_NEED_PREDICT 2  // 1: feed RS_LABEL to the prediction network this step
#define RS_LABEL 3         // label to feed (blank = start of sequence)
#define RS_LAST_EMIT 4     // frame of the last emitted label, -1 before the first
#define RS_EMITS 5         // labels emitted in a row at RS_LAST_EMIT
#define RS_TOKENS 6        // tokens written to this row's output
#define RS_ENC_ROW 7       // first row of this utterance in the projected encoder output

// Rows handled by one block of the matrix-vector kernels (their inputs live in shared memory).
#define ROWS_PER_BLOCK 8
#define WARPS_PER_BLOCK 8

__device__ __forceinline__ bool row_active(const int* rs, int row) {
    return rs[row * RS_FIELDS + RS_TIME] < rs[row * RS_FIELDS + RS_FRAMES];
}

__device__ __forceinline__ bool row_predicts(const int* rs, int row) {
    return rs[row * RS_FIELDS + RS_NEED_PREDICT] != 0;
}

// Zero state, every used row feeds the start-of-sequence label first; rows >= batch are unused.
extern "C" __global__ void tdt_reset(int* rs, const int* frames, const int* enc_rows, int batch,
                                     int rows, int blank, float* h, float* c,
                                     long long state_len) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < state_len;
         i += (long long)gridDim.x * blockDim.x) {
        h[i] = 0.0f;
        c[i] = 0.0f;
    }
    for (int row = blockIdx.x * blockDim.x + threadIdx.x; row < rows;
         row += gridDim.x * blockDim.x) {
        int* r = rs + row * RS_FIELDS;
        const int n = row < batch ? frames[row] : 0;
        r[RS_FRAMES] = n;
        r[RS_TIME] = 0;
        r[RS_NEED_PREDICT] = n > 0 ? 1 : 0;
        r[RS_LABEL] = blank;
        r[RS_LAST_EMIT] = -1;
        r[RS_EMITS] = 0;
        r[RS_TOKENS] = 0;
        r[RS_ENC_ROW] = row < batch ? enc_rows[row] : 0;
    }
}

// One LSTM layer for the rows that predict: gates = W_ih x + W_hh h + bias (order i, f, g, o).
// One warp per hidden unit; the block's rows' x and h are staged in shared memory.
// Layer 0 reads x from the embedding table at the row's label, later layers read the new h of
// the layer below. Writes h_new/c_new; tdt_advance commits them.
extern "C" __global__ void tdt_lstm_step(const int* rs, int rows, const float* embedding,
                                         const float* x_below, int from_embedding,
                                         const float* w_ih, const float* w_hh,
                                         const float* bias, const float* h, const float* c,
                                         float* h_new, float* c_new, int hidden) {
    extern __shared__ float4 stage4[];
    float* xs = reinterpret_cast<float*>(stage4);  // [ROWS_PER_BLOCK][hidden]
    float* hs = xs + ROWS_PER_BLOCK * hidden;      // [ROWS_PER_BLOCK][hidden]
    __shared__ const float* x_src[ROWS_PER_BLOCK];
    __shared__ bool selected[ROWS_PER_BLOCK];
    const int row0 = blockIdx.y * ROWS_PER_BLOCK;
    const int n_rows = min(ROWS_PER_BLOCK, rows - row0);
    // Resolve each row's inputs once: the staging loop below then has no dependent loads.
    if (threadIdx.x < ROWS_PER_BLOCK) {
        const int r = threadIdx.x, row = row0 + r;
        selected[r] = r < n_rows && row_predicts(rs, row);
        x_src[r] = !selected[r]       ? nullptr
                   : from_embedding ? embedding +
                                          (long long)rs[row * RS_FIELDS + RS_LABEL] * hidden
                                    : x_below + (long long)row * hidden;
    }
    __syncthreads();
    bool any = false;
#pragma unroll
    for (int r = 0; r < ROWS_PER_BLOCK; ++r) any |= selected[r];
    if (!any) return;

    const int quads = hidden / 4;
    for (int i = threadIdx.x; i < ROWS_PER_BLOCK * quads; i += blockDim.x) {
        const int r = i / quads, q = i % quads;
        if (!selected[r]) continue;
        reinterpret_cast<float4*>(xs)[r * quads + q] =
            reinterpret_cast<const float4*>(x_src[r])[q];
        reinterpret_cast<float4*>(hs)[r * quads + q] =
            reinterpret_cast<const float4*>(h + (long long)(row0 + r) * hidden)[q];
    }
    __syncthreads();

    const int lane = threadIdx.x & 31;
    const int unit = blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    if (unit >= hidden) return;
    float acc[4][ROWS_PER_BLOCK];
#pragma unroll
    for (int g = 0; g < 4; ++g)
#pragma unroll
        for (int r = 0; r < ROWS_PER_BLOCK; ++r) acc[g][r] = 0.0f;
    // float4 loads (hidden % 4 == 0, checked on the host), unrolled so several rows of weights
    // are in flight at once: the step is latency-bound, not bandwidth-bound.
#pragma unroll 2
    for (int k = lane * 4; k < hidden; k += 128) {
        float4 wi[4], wh[4];
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            const long long w_row = (long long)(g * hidden + unit) * hidden;
            wi[g] = *reinterpret_cast<const float4*>(w_ih + w_row + k);
            wh[g] = *reinterpret_cast<const float4*>(w_hh + w_row + k);
        }
#pragma unroll
        for (int r = 0; r < ROWS_PER_BLOCK; ++r) {
            if (selected[r]) {
                const float4 xv = *reinterpret_cast<const float4*>(xs + r * hidden + k);
                const float4 hv = *reinterpret_cast<const float4*>(hs + r * hidden + k);
#pragma unroll
                for (int g = 0; g < 4; ++g)
                    acc[g][r] += wi[g].x * xv.x + wi[g].y * xv.y + wi[g].z * xv.z +
                                 wi[g].w * xv.w + wh[g].x * hv.x + wh[g].y * hv.y +
                                 wh[g].z * hv.z + wh[g].w * hv.w;
            }
        }
    }
#pragma unroll
    for (int g = 0; g < 4; ++g)
#pragma unroll
        for (int r = 0; r < ROWS_PER_BLOCK; ++r) acc[g][r] = warp_sum(acc[g][r]);
    if (lane != 0) return;
    for (int r = 0; r < n_rows; ++r) {
        const int row = row0 + r;
        if (!selected[r]) continue;
        const float i = sigmoid_f32(acc[0][r] + bias[unit]);
        const float f = sigmoid_f32(acc[1][r] + bias[hidden + unit]);
        const float g = tanhf(acc[2][r] + bias[2 * hidden + unit]);
        const float o = sigmoid_f32(acc[3][r] + bias[3 * hidden + unit]);
        const long long at = (long long)row * hidden + unit;
        const float cell = f * c[at] + i * g;
        c_new[at] = cell;
        h_new[at] = o * tanhf(cell);
    }
}

// out[row, o] = x[row] . w[o] + b[o] for the rows selected by `which` (0: rows that predict,
// 1: active rows). One warp per output; rows staged in shared memory. For the joint (`joint`
// = 1) the staged row is relu(enc_proj[enc_row + time] + pred_proj[row]) instead of x[row].
__device__ void rows_times_matrix(const int* rs, int rows, int which, int joint,
                                  const float* x, const float* enc_proj, const float* w,
                                  const float* b, float* out, int in_dim, int out_dim) {
    extern __shared__ float4 stage4[];
    float* xs = reinterpret_cast<float*>(stage4);  // [ROWS_PER_BLOCK][in_dim]
    __shared__ const float* x_src[ROWS_PER_BLOCK];
    __shared__ const float* enc_src[ROWS_PER_BLOCK];
    __shared__ bool selected[ROWS_PER_BLOCK];
    const int row0 = blockIdx.y * ROWS_PER_BLOCK;
    const int n_rows = min(ROWS_PER_BLOCK, rows - row0);
    // Resolve each row's inputs once: the staging loop below then has no dependent loads.
    if (threadIdx.x < ROWS_PER_BLOCK) {
        const int r = threadIdx.x, row = row0 + r;
        selected[r] = r < n_rows &&
                      (which == 0 ? row_predicts(rs, row) : row_active(rs, row));
        x_src[r] = x + (long long)row * in_dim;
        enc_src[r] = nullptr;
        if (joint && selected[r]) {
            const int* st = rs + row * RS_FIELDS;
            enc_src[r] = enc_proj + ((long long)st[RS_ENC_ROW] + st[RS_TIME]) * in_dim;
        }
    }
    __syncthreads();
    bool any = false;
#pragma unroll
    for (int r = 0; r < ROWS_PER_BLOCK; ++r) any |= selected[r];
    if (!any) return;

    const int quads = in_dim / 4;
    for (int i = threadIdx.x; i < ROWS_PER_BLOCK * quads; i += blockDim.x) {
        const int r = i / quads, q = i % quads;
        if (!selected[r]) continue;
        float4 v = reinterpret_cast<const float4*>(x_src[r])[q];
        if (joint) {
            const float4 e = reinterpret_cast<const float4*>(enc_src[r])[q];
            v.x = fmaxf(v.x + e.x, 0.0f);
            v.y = fmaxf(v.y + e.y, 0.0f);
            v.z = fmaxf(v.z + e.z, 0.0f);
            v.w = fmaxf(v.w + e.w, 0.0f);
        }
        reinterpret_cast<float4*>(xs)[r * quads + q] = v;
    }
    __syncthreads();

    const int lane = threadIdx.x & 31;
    const int o = blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    if (o >= out_dim) return;
    float acc[ROWS_PER_BLOCK];
#pragma unroll
    for (int r = 0; r < ROWS_PER_BLOCK; ++r) acc[r] = 0.0f;
    const float* w_row = w + (long long)o * in_dim;
#pragma unroll 4
    for (int k = lane * 4; k < in_dim; k += 128) {
        const float4 wv = *reinterpret_cast<const float4*>(w_row + k);
#pragma unroll
        for (int r = 0; r < ROWS_PER_BLOCK; ++r) {
            if (selected[r]) {
                const float4 xv = *reinterpret_cast<const float4*>(xs + r * in_dim + k);
                acc[r] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS_PER_BLOCK; ++r) acc[r] = warp_sum(acc[r]);
    if (lane != 0) return;
    for (int r = 0; r < n_rows; ++r)
        if (selected[r]) out[(long long)(row0 + r) * out_dim + o] = acc[r] + b[o];
}

// pred_proj[row] = joint.pred(h_top_new[row]) for the rows that predict.
extern "C" __global__ void tdt_pred_project(const int* rs, int rows, const float* h_top_new,
                                            const float* w, const float* b, float* pred_proj,
                                            int hidden, int joint_hidden) {
    rows_times_matrix(rs, rows, 0, 0, h_top_new, nullptr, w, b, pred_proj, hidden, joint_hidden);
}

// logits[row] = joint.out(relu(enc_proj[frame] + pred_proj[row])) for the active rows.
extern "C" __global__ void tdt_joint(const int* rs, int rows, const float* enc_proj,
                                     const float* pred_proj, const float* w, const float* b,
                                     float* logits, int joint_hidden, int n_out) {
    rows_times_matrix(rs, rows, 1, 1, pred_proj, enc_proj, w, b, logits, joint_hidden, n_out);
}

// First index of the maximum of v[0..n) over the block (torch's argmax on ties); every thread
// gets the result. blockDim.x must be a multiple of 32 and at most 1024.
__device__ int block_argmax(const float* v, int n) {
    __shared__ float best_of[32];
    __shared__ int index_of[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float best = 0.0f;
    int index = n;  // n: nothing seen yet
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        if (index == n || v[i] > best) {
            best = v[i];
            index = i;
        }
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, best, offset);
        const int other_index = __shfl_xor_sync(0xffffffffu, index, offset);
        if (other_index < n &&
            (index == n || other > best || (other == best && other_index < index))) {
            best = other;
            index = other_index;
        }
    }
    __syncthreads();
    if (lane == 0) {
        best_of[warp] = best;
        index_of[warp] = index;
    }
    __syncthreads();
    best = best_of[0];
    index = index_of[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); ++w) {
        const float other = best_of[w];
        const int other_index = index_of[w];
        if (other_index < n &&
            (index == n || other > best || (other == best && other_index < index))) {
            best = other;
            index = other_index;
        }
    }
    return index;
}

// One block per row: commit the prediction state computed this step, then choose label and
// duration from the joint's logits, emit, and move the row's frame (the CPU loop's rules).
// tokens[row][i] = (id, frame, duration); a row that would exceed `token_capacity` stops
// emitting and is marked by RS_TOKENS = token_capacity + 1 (the host reports it).
extern "C" __global__ void tdt_advance(int* rs, int rows, const float* logits, int n_out,
                                       int n_classes, const int* durations, int n_durations,
                                       int max_symbols, int* tokens, int token_capacity,
                                       float* h, float* c, const float* h_new,
                                       const float* c_new, int layers, int hidden) {
    const int row = blockIdx.x;
    if (row >= rows) return;
    int* s = rs + row * RS_FIELDS;
    if (s[RS_NEED_PREDICT]) {
        for (int i = threadIdx.x; i < layers * hidden; i += blockDim.x) {
            const int l = i / hidden, k = i % hidden;
            const long long at = ((long long)l * rows + row) * hidden + k;
            h[at] = h_new[at];
            c[at] = c_new[at];
        }
    }
    const bool active = s[RS_TIME] < s[RS_FRAMES];
    if (!active) {
        __syncthreads();
        if (threadIdx.x == 0) s[RS_NEED_PREDICT] = 0;
        return;
    }
    const float* v = logits + (long long)row * n_out;
    const int label = block_argmax(v, n_classes);
    int duration = durations[block_argmax(v + n_classes, n_durations)];
    // Everyone has read RS_NEED_PREDICT and the logits before thread 0 updates the row.
    __syncthreads();
    if (threadIdx.x != 0) return;
    s[RS_NEED_PREDICT] = 0;
    const int blank = n_classes - 1;
    if (label == blank && duration == 0) duration = 1;
    const int frame = s[RS_TIME];
    s[RS_TIME] = frame + duration;
    if (label == blank) return;

    const int n = s[RS_TOKENS];
    if (n >= token_capacity) {
        s[RS_TOKENS] = token_capacity + 1;
        s[RS_TIME] = s[RS_FRAMES];
        return;
    }
    int* t = tokens + ((long long)row * token_capacity + n) * 3;
    t[0] = label;
    t[1] = frame;
    t[2] = duration;
    s[RS_TOKENS] = n + 1;
    if (s[RS_LAST_EMIT] == frame) {
        s[RS_EMITS] += 1;
    } else {
        s[RS_LAST_EMIT] = frame;
        s[RS_EMITS] = 1;
    }
    s[RS_LABEL] = label;
    s[RS_NEED_PREDICT] = 1;
    // After max_symbols labels at one frame, move on by one frame.
    if (s[RS_TIME] < s[RS_FRAMES] && s[RS_EMITS] >= max_symbols && s[RS_LAST_EMIT] == s[RS_TIME])
        s[RS_TIME] += 1;
}
