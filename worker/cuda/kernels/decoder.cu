// Label-looping TDT greedy decoding on the GPU (f32) in one persistent cooperative kernel.
//
// `tdt_decode` runs up to `max_steps` uniform steps without returning to the host. A step:
//
//   [rows that emitted a label last step exist]
//     LSTM layer 0 .. layer L-1 (grid barrier after each) -> joint.pred (grid barrier)
//   joint for every active row (grid barrier) -> choice of label and duration, advance
//
// Rows that emitted a label in the previous step first run the prediction network on it (the
// other rows keep their state and projection), so a row's sequence of joint evaluations is
// exactly the CPU loop's (models::tdt): blanks advance the frame and look again with the same
// prediction output, labels are emitted at the frame where they were found.
//
// Every block keeps its own copy of the row state in shared memory and makes the same choices
// from the same joint outputs, so the blocks agree on what runs next without another barrier; block 0
// alone writes tokens and the final row state. Work inside a phase is split over the blocks
// (block b owns outputs b, b + G, b + 2G, ...) and over the block's warps in tiles: a warp
// multiplies TILE weight rows by up to ROW_CHUNK staged batch rows over one CHUNK of the inner
// dimension, so weights are read once per step (up to ROW_CHUNK rows) and each staged value
// read from shared memory feeds TILE multiply-adds. The choice of label and duration reduces
// per-block partial maxima instead of every logit. The launch must be cooperative: the grid
// barrier needs every block resident.
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

// Loop bookkeeping `ds[field]`, kept across launches so a decode may span several.
#define DS_FIELDS 4
#define DS_STEPS 0      // steps run since the reset
#define DS_PARITY 1     // which half of h/c holds the current state
#define DS_BAR_COUNT 2  // grid barrier: arrivals ever (wraps; compared as a difference)
#define DS_BAR_BASE 3   // DS_BAR_COUNT when the last launch ended: where this launch starts

#define DEC_WARPS 16  // warps per block
#define ROW_CHUNK 16  // batch rows staged (and accumulated in registers) per pass
#define TILE 4        // weight rows per work item (an LSTM unit's four gates)
#define CHUNK 128     // inner-dimension values per work item: one float4 per lane
#define PARTIAL 4     // per block and row: best label value, its index, best duration, index

struct TdtParams {
    int* rs;                // [rows, RS_FIELDS]
    int* ds;                // [DS_FIELDS]
    int* tokens;            // [rows, token_capacity, 3]: (id, frame, duration)
    const float* x_table;   // [vocab + 1, 4H]: layer 0's input part W_ih x + b_ih + b_hh per label
    const float* w_hh;      // [layers, 4H, H] (gate order i, f, g, o)
    const float* w_ih;      // [layers - 1, 4H, H]: the layers above the first
    const float* bias;      // [layers - 1, 4H]: b_ih + b_hh of the layers above the first
    float* h;               // [2, layers, rows, H]: two halves, DS_PARITY says which is current
    float* c;               // [2, layers, rows, H]
    const float* pred_w;    // [J, H]
    const float* pred_b;    // [J]
    float* pred_proj;       // [rows, J]
    const float* enc_proj;  // [frames, J]
    const float* out_w;     // [n_out, J]
    const float* out_b;     // [n_out]
    float* partial;         // [2, rows, grid, PARTIAL]: halves alternate by step
    const int* durations;   // [n_durations]
    int rows;
    int layers;
    int hidden;
    int joint_hidden;
    int n_out;
    int n_classes;  // vocab + 1 (blank last)
    int n_durations;
    int max_symbols;
    int token_capacity;
    int max_steps;
};

__device__ __forceinline__ bool row_active(const int* s) {
    return s[RS_TIME] < s[RS_FRAMES];
}

// Rows of the chunk at row0 that run the prediction network this step (bit r: row0 + r).
__device__ unsigned predicting_rows(const int* srs, int row0, int rows) {
    unsigned sel = 0;
    for (int r = 0; r < ROW_CHUNK && row0 + r < rows; ++r) {
        const int* s = srs + (row0 + r) * RS_FIELDS;
        if (s[RS_NEED_PREDICT] && row_active(s)) sel |= 1u << r;
    }
    return sel;
}

__device__ unsigned active_rows(const int* srs, int row0, int rows) {
    unsigned sel = 0;
    for (int r = 0; r < ROW_CHUNK && row0 + r < rows; ++r)
        if (row_active(srs + (row0 + r) * RS_FIELDS)) sel |= 1u << r;
    return sel;
}

// Every block arrives, then all leave; writes before it are visible to every block after it
// (readers of data written inside this kernel use __ldcg, past the non-coherent L1). The count
// only grows, so leaving needs one look at it, not a reset and a second flag; `target` is the
// count once every block has arrived, the same in every block.
__device__ void grid_barrier(int* ds, unsigned& target) {
    target += gridDim.x;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* count = reinterpret_cast<unsigned*>(ds + DS_BAR_COUNT);
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
        unsigned seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                         : "=r"(seen)
                         : "l"(count)
                         : "memory");
        } while ((int)(seen - target) < 0);
    }
    __syncthreads();
}

// Copies the selected rows of src ([rows, k] floats, written in this kernel) to dst
// ([ROW_CHUNK, k]); k % 4 == 0.
__device__ void stage_rows(float* dst, const float* src, int row0, unsigned sel, int k) {
    const int quads = k / 4;
    for (int i = threadIdx.x; i < ROW_CHUNK * quads; i += blockDim.x) {
        const int r = i / quads, q = i % quads;
        if (sel >> r & 1)
            reinterpret_cast<float4*>(dst)[i] =
                __ldcg(reinterpret_cast<const float4*>(src + (long long)(row0 + r) * k) + q);
    }
}

// This lane's float4 at k of each of the TILE weight rows (w[q] null, or k past the row length
// `len`: zeros).
__device__ __forceinline__ void load_tile(float4 (&wv)[TILE], const float* const (&w)[TILE],
                                          int len, int k) {
#pragma unroll
    for (int q = 0; q < TILE; ++q)
        wv[q] = w[q] && k < len ? __ldg(reinterpret_cast<const float4*>(w[q] + k))
                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// acc[r * TILE + q] += wv[q] . xs[r][k..k+4) for the selected rows r < RC (xs: [ROW_CHUNK][len]).
// A warp's accumulators cover the first RC rows of a chunk (1, 4 or ROW_CHUNK: fewer registers
// and instructions when only the first rows are selected, as in small batches).
template <int RC>
__device__ __forceinline__ void fma_tile(float (&acc)[RC * TILE], const float4 (&wv)[TILE],
                                         const float* xs, int len, int k, unsigned sel) {
    if (k >= len) return;
#pragma unroll
    for (int r = 0; r < RC; ++r) {
        if (!(sel >> r & 1)) continue;
        const float4 x = *reinterpret_cast<const float4*>(xs + r * len + k);
#pragma unroll
        for (int q = 0; q < TILE; ++q) {
            float a = acc[r * TILE + q];
            a = fmaf(wv[q].x, x.x, a);
            a = fmaf(wv[q].y, x.y, a);
            a = fmaf(wv[q].z, x.z, a);
            acc[r * TILE + q] = fmaf(wv[q].w, x.w, a);
        }
    }
}

template <int N>
__device__ __forceinline__ void zero_tile(float (&acc)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = 0.0f;
}

// One halving exchange over lanes `offset` apart: sums the values i and i + HALF of the two
// lanes, keeping (in acc[0..HALF)) the half this lane's `offset` bit selects.
template <int HALF, int N>
__device__ __forceinline__ void halve(float (&acc)[N], int offset) {
    const bool upper = threadIdx.x & offset;
#pragma unroll
    for (int i = 0; i < HALF; ++i) {
        const float send = upper ? acc[i] : acc[i + HALF];
        const float keep = upper ? acc[i + HALF] : acc[i];
        acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
    }
}

// Halving exchanges HALF, HALF / 2, ..., 2 over lanes 16, 8, ... apart; `base` becomes the index
// of the first of the two values this lane keeps.
template <int HALF, int N>
__device__ __forceinline__ void halvings(float (&acc)[N], int offset, int& base) {
    halve<HALF>(acc, offset);
    if (threadIdx.x & offset) base += HALF;
    if constexpr (HALF > 2) halvings<HALF / 2>(acc, offset / 2, base);
}

// Sums accumulators 0..V over the warp and stores them at out[0..V): halving exchanges while
// more than two values remain (V = 64: 32 + 16 + 8 + 4 + 2 shuffles instead of 64 * 5), plain
// ones for the lane bits left.
template <int V, int N>
__device__ __forceinline__ void reduce_store(float (&acc)[N], float* out) {
    constexpr int used = V == 64 ? 5 : V == 32 ? 4 : V == 16 ? 3 : V == 8 ? 2 : 1;
    static_assert(V <= N && (1 << (used + 1)) == V, "V is 4, 8, 16, 32 or 64");
    int base = 0;
    halvings<V / 2>(acc, 16, base);
#pragma unroll
    for (int offset = 16 >> used; offset >= 1; offset /= 2) {
        acc[0] += __shfl_xor_sync(0xffffffffu, acc[0], offset);
        acc[1] += __shfl_xor_sync(0xffffffffu, acc[1], offset);
    }
    if (((threadIdx.x & 31) & ((32 >> used) - 1)) == 0) {
        out[base] = acc[0];
        out[base + 1] = acc[1];
    }
}

// Stores the warp sums of the accumulators of the selected rows at out[r * TILE + q] (fewer
// exchanges when only the first rows of the chunk are selected). The sums' tree (lanes 16, 8,
// 4, 2, 1 apart) is the same whichever width is reduced, so a row's result does not depend on
// the other rows of its batch.
template <int RC>
__device__ __forceinline__ void store_warp_sums(float (&acc)[RC * TILE], float* out,
                                                unsigned sel) {
    static_assert(ROW_CHUNK * TILE == 64, "the widest reduction is 64 values");
    if constexpr (RC == 1) {
        reduce_store<TILE>(acc, out);
    } else if constexpr (RC == 4) {
        reduce_store<4 * TILE>(acc, out);
    } else {
        if (sel < (1u << 8))
            reduce_store<8 * TILE>(acc, out);
        else
            reduce_store<16 * TILE>(acc, out);
    }
}

// This warp's work items (item = warp, warp + DEC_WARPS, ...): TILE weight rows (a) times the
// staged rows xa over one chunk, plus, if `two`, TILE more (b) times the staged rows xb, into
// accumulators for the first RC rows; then the warp sums go to parts[item * 64 ...].
// load_item(item, a, b) fills the weights; the first item's are loaded by the caller.
template <int RC, typename LoadItem>
__device__ __forceinline__ void tile_items(int items, int chunks, int len, bool two,
                                           unsigned sel, const float* xa, const float* xb,
                                           float* parts, float4 (&a)[TILE], float4 (&b)[TILE],
                                           LoadItem load_item) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int item = warp; item < items; item += DEC_WARPS) {
        if (item != warp) load_item(item, a, b);
        const int k = (item % chunks) * CHUNK + lane * 4;
        float acc[RC * TILE];
        zero_tile(acc);
        fma_tile<RC>(acc, a, xa, len, k, sel);
        if (two) fma_tile<RC>(acc, b, xb, len, k, sel);
        store_warp_sums<RC>(acc, parts + item * 64, sel);
    }
}

// tile_items with the narrowest accumulator width that covers the selected rows.
template <typename LoadItem>
__device__ __forceinline__ void tile_items_for(int items, int chunks, int len, bool two,
                                               unsigned sel, const float* xa, const float* xb,
                                               float* parts, float4 (&a)[TILE],
                                               float4 (&b)[TILE], LoadItem load_item) {
    if (sel < (1u << 1))
        tile_items<1>(items, chunks, len, two, sel, xa, xb, parts, a, b, load_item);
    else if (sel < (1u << 4))
        tile_items<4>(items, chunks, len, two, sel, xa, xb, parts, a, b, load_item);
    else
        tile_items<ROW_CHUNK>(items, chunks, len, two, sel, xa, xb, parts, a, b, load_item);
}

// Work items of `groups` tiles over an inner dimension of `len`: item = group * chunks + chunk.
__device__ __forceinline__ int chunks_of(int len) { return (len + CHUNK - 1) / CHUNK; }

// Sum over the chunks of tile `group`'s value for row r, weight row q (parts as stored by
// store_warp_sums, one 64-value slot per item).
__device__ __forceinline__ float tile_sum(const float* parts, int group, int chunks, int r,
                                          int q) {
    float sum = 0.0f;
    for (int c = 0; c < chunks; ++c) sum += parts[(group * chunks + c) * 64 + r * TILE + q];
    return sum;
}

// One LSTM layer for the rows that predict: reads the current half of h/c (and layer l - 1's
// new h), writes the other half. Rows that do not predict carry their state over unchanged.
__device__ void lstm_layer(const TdtParams& p, int l, int parity, const int* srs, float* stage,
                           float* parts) {
    const int H = p.hidden;
    const long long layer = (long long)p.rows * H;
    const long long old_at = ((long long)parity * p.layers + l) * layer;
    const long long new_at = ((long long)(1 - parity) * p.layers + l) * layer;
    const float* h_old = p.h + old_at;
    const float* c_old = p.c + old_at;
    float* h_new = p.h + new_at;
    float* c_new = p.c + new_at;
    const float* w_hh = p.w_hh + (long long)l * 4 * H * H;
    const float* w_ih = l > 0 ? p.w_ih + (long long)(l - 1) * 4 * H * H : nullptr;

    float* hs = stage;                  // [ROW_CHUNK][H]: the rows' h of this layer
    float* xs = stage + ROW_CHUNK * H;  // [ROW_CHUNK][H]: their new h of the layer below
    const int units = (H - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
    const int chunks = chunks_of(H);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int row0 = 0; row0 < p.rows; row0 += ROW_CHUNK) {
        const unsigned sel = predicting_rows(srs, row0, p.rows);
        if (sel == 0) continue;  // uniform: every thread reads the same shared row state
        // Item (unit u, chunk c): the unit's four gate rows of W_hh (and W_ih) over one chunk.
        // The first item's weights and the epilogue's inputs do not depend on the stage: their
        // loads are issued first, so their latency overlaps the staging.
        auto gate_rows = [&](const float* w, int item, const float* (&rows)[TILE]) {
            const int unit = blockIdx.x + (item / chunks) * gridDim.x;
#pragma unroll
            for (int g = 0; g < TILE; ++g) rows[g] = w + ((long long)g * H + unit) * H;
        };
        auto load_item = [&](int item, float4 (&hh)[TILE], float4 (&ih)[TILE]) {
            const float* rows[TILE];
            const int k = (item % chunks) * CHUNK + lane * 4;
            gate_rows(w_hh, item, rows);
            load_tile(hh, rows, H, k);
            if (l > 0) {
                gate_rows(w_ih, item, rows);
                load_tile(ih, rows, H, k);
            }
        };
        float4 hh[TILE], ih[TILE];
        if (warp < units * chunks) load_item(warp, hh, ih);
        // The epilogue's first (unit, row): gate additions and old cell state.
        const int u0 = threadIdx.x / ROW_CHUNK, r0 = threadIdx.x % ROW_CHUNK;
        const bool early = u0 < units && (sel >> r0 & 1);
        float add0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c0 = 0.0f;
        auto epilogue_inputs = [&](int u, int r, float (&add)[4], float& c) {
            const int unit = blockIdx.x + u * gridDim.x, row = row0 + r;
            const float* from =
                l == 0 ? p.x_table + (long long)srs[row * RS_FIELDS + RS_LABEL] * 4 * H
                       : p.bias + (long long)(l - 1) * 4 * H;
#pragma unroll
            for (int g = 0; g < 4; ++g) add[g] = __ldg(from + g * H + unit);
            c = __ldcg(c_old + (long long)row * H + unit);
        };
        if (early) epilogue_inputs(u0, r0, add0, c0);

        __syncthreads();  // the previous chunk is done with the stage and the parts
        stage_rows(hs, h_old, row0, sel, H);
        if (l > 0) stage_rows(xs, h_new - layer, row0, sel, H);  // layer l - 1, new half
        __syncthreads();
        tile_items_for(units * chunks, chunks, H, l > 0, sel, hs, xs, parts, hh, ih, load_item);
        __syncthreads();
        for (int i = threadIdx.x; i < units * ROW_CHUNK; i += blockDim.x) {
            const int u = i / ROW_CHUNK, r = i % ROW_CHUNK, row = row0 + r;
            if (!(sel >> r & 1)) continue;
            float add[4], c;
            if (i == (int)threadIdx.x) {
#pragma unroll
                for (int g = 0; g < 4; ++g) add[g] = add0[g];
                c = c0;
            } else {
                epilogue_inputs(u, r, add, c);
            }
            float gate[4];
#pragma unroll
            for (int g = 0; g < 4; ++g) gate[g] = tile_sum(parts, u, chunks, r, g) + add[g];
            const long long at = (long long)row * H + blockIdx.x + u * gridDim.x;
            const float cell = sigmoid_f32(gate[1]) * c + sigmoid_f32(gate[0]) * tanhf(gate[2]);
            c_new[at] = cell;
            h_new[at] = sigmoid_f32(gate[3]) * tanhf(cell);
        }
    }
    // Active rows that do not predict carry their state into the new half (finished rows are
    // never read again). Last, so its latency overlaps the wait at the next barrier.
    const int threads = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < p.rows * H; i += threads) {
        const int* s = srs + (i / H) * RS_FIELDS;
        if (row_active(s) && !s[RS_NEED_PREDICT]) {
            h_new[i] = __ldcg(h_old + i);
            c_new[i] = __ldcg(c_old + i);
        }
    }
}

// Items of w . x for this block's outputs o = blockIdx.x + (group * TILE + q) * gridDim.x < n:
// issues the first item's weight loads, runs `stage` (which fills xs, [ROW_CHUNK][len]) between
// two block barriers, then each warp sums its items into parts. Returns the group count.
template <typename Stage>
__device__ int block_linear_parts(const float* w, const float* xs, int len, int n, unsigned sel,
                                  float* parts, Stage stage) {
    const int mine = (n - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
    const int groups = (mine + TILE - 1) / TILE, chunks = chunks_of(len);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    auto load_item = [&](int item, float4 (&wv)[TILE]) {
        const float* rows_of_w[TILE];
#pragma unroll
        for (int q = 0; q < TILE; ++q) {
            const int o = blockIdx.x + ((item / chunks) * TILE + q) * gridDim.x;
            rows_of_w[q] = o < n ? w + (long long)o * len : nullptr;
        }
        load_tile(wv, rows_of_w, len, (item % chunks) * CHUNK + lane * 4);
    };
    float4 wv[TILE];
    if (warp < groups * chunks) load_item(warp, wv);
    __syncthreads();  // the previous chunk is done with the stage and the parts
    stage();
    __syncthreads();
    float4 unused[TILE];
    tile_items_for(groups * chunks, chunks, len, false, sel, xs, xs, parts, wv, unused,
                   [&](int item, float4 (&w)[TILE], float4 (&)[TILE]) { load_item(item, w); });
    return groups;
}

// pred_proj[row] = joint.pred(new top-layer h[row]) for the rows that predict.
__device__ void pred_phase(const TdtParams& p, int parity, const int* srs, float* stage,
                           float* parts) {
    const long long layer = (long long)p.rows * p.hidden;
    const float* h_top = p.h + ((long long)(1 - parity) * p.layers + p.layers - 1) * layer;
    for (int row0 = 0; row0 < p.rows; row0 += ROW_CHUNK) {
        const unsigned sel = predicting_rows(srs, row0, p.rows);
        if (sel == 0) continue;
        const int groups =
            block_linear_parts(p.pred_w, stage, p.hidden, p.joint_hidden, sel, parts,
                               [&] { stage_rows(stage, h_top, row0, sel, p.hidden); });
        __syncthreads();
        const int chunks = chunks_of(p.hidden);
        for (int i = threadIdx.x; i < groups * TILE * ROW_CHUNK; i += blockDim.x) {
            const int r = i % ROW_CHUNK, q = (i / ROW_CHUNK) % TILE, group = i / (ROW_CHUNK * TILE);
            const int o = blockIdx.x + (group * TILE + q) * gridDim.x;
            if (!(sel >> r & 1) || o >= p.joint_hidden) continue;
            p.pred_proj[(long long)(row0 + r) * p.joint_hidden + o] =
                tile_sum(parts, group, chunks, r, q) + __ldg(p.pred_b + o);
        }
    }
}

// joint.out(relu(enc_proj[frame] + pred_proj[row])) for the active rows; per row, this block's
// best label and best duration output go to partial[row][block].
__device__ void joint_phase(const TdtParams& p, const int* srs, float* stage, float* parts,
                            float* partial) {
    const int J = p.joint_hidden, quads = J / 4;
    for (int row0 = 0; row0 < p.rows; row0 += ROW_CHUNK) {
        const unsigned sel = active_rows(srs, row0, p.rows);
        if (sel == 0) continue;
        auto stage_joint_input = [&] {
            for (int i = threadIdx.x; i < ROW_CHUNK * quads; i += blockDim.x) {
                const int r = i / quads, q = i % quads;
                if (!(sel >> r & 1)) continue;
                const int* s = srs + (row0 + r) * RS_FIELDS;
                const float4 e = __ldg(
                    reinterpret_cast<const float4*>(
                        p.enc_proj + ((long long)s[RS_ENC_ROW] + s[RS_TIME]) * J) +
                    q);
                const float4 v = __ldcg(
                    reinterpret_cast<const float4*>(p.pred_proj + (long long)(row0 + r) * J) + q);
                reinterpret_cast<float4*>(stage)[i] =
                    make_float4(fmaxf(v.x + e.x, 0.0f), fmaxf(v.y + e.y, 0.0f),
                                fmaxf(v.z + e.z, 0.0f), fmaxf(v.w + e.w, 0.0f));
            }
        };
        const int groups =
            block_linear_parts(p.out_w, stage, J, p.n_out, sel, parts, stage_joint_input);
        __syncthreads();
        // Every (output, row) value at once into the free stage, then one thread per row scans
        // its outputs in increasing order with strict '>': the first index of the maximum.
        const int chunks = chunks_of(J);
        float* vals = stage;  // [groups * TILE][ROW_CHUNK]
        for (int i = threadIdx.x; i < groups * TILE * ROW_CHUNK; i += blockDim.x) {
            const int r = i % ROW_CHUNK, q = (i / ROW_CHUNK) % TILE, group = i / (ROW_CHUNK * TILE);
            const int o = blockIdx.x + (group * TILE + q) * gridDim.x;
            if (o < p.n_out && (sel >> r & 1))
                vals[i] = tile_sum(parts, group, chunks, r, q) + __ldg(p.out_b + o);
        }
        __syncthreads();
        const int r = threadIdx.x;
        if (r >= ROW_CHUNK || !(sel >> r & 1)) continue;
        float best_label = 0.0f, best_duration = 0.0f;
        int label = -1, duration = -1;  // -1: none of this block's outputs is of the kind
        for (int j = 0; j < groups * TILE; ++j) {
            const int o = blockIdx.x + j * gridDim.x;
            if (o >= p.n_out) break;
            const float v = vals[j * ROW_CHUNK + r];
            if (o < p.n_classes) {
                if (label < 0 || v > best_label) {
                    best_label = v;
                    label = o;
                }
            } else if (duration < 0 || v > best_duration) {
                best_duration = v;
                duration = o - p.n_classes;
            }
        }
        float* out = partial + ((long long)(row0 + r) * gridDim.x + blockIdx.x) * PARTIAL;
        __stcg(reinterpret_cast<float4*>(out),
               make_float4(best_label, __int_as_float(label), best_duration,
                           __int_as_float(duration)));
    }
}

// The best (value, index) of one kind over every block's partial for a row, in every lane:
// greater value wins, the lower index on ties (index -1: that block had no output of the kind).
__device__ int warp_best(const float* row_partial, int kind) {
    const int lane = threadIdx.x & 31;
    float best = 0.0f;
    int index = -1;
    for (int b = lane; b < (int)gridDim.x; b += 32) {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(row_partial) + b);
        const float value = kind == 0 ? v.x : v.z;
        const int at = __float_as_int(kind == 0 ? v.y : v.w);
        if (at >= 0 && (index < 0 || value > best || (value == best && at < index))) {
            best = value;
            index = at;
        }
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, best, offset);
        const int other_index = __shfl_xor_sync(0xffffffffu, index, offset);
        if (other_index >= 0 &&
            (index < 0 || other > best || (other == best && other_index < index))) {
            best = other;
            index = other_index;
        }
    }
    return index;
}

// Every block: choose each active row's label and duration from the partials and move the row
// on (the CPU loop's rules) in its shared row state; block 0 also writes the tokens. A row that
// would exceed `token_capacity` stops emitting and is marked by RS_TOKENS = token_capacity + 1
// (the host reports it).
__device__ void advance_phase(const TdtParams& p, int* srs, const float* partial) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int row = warp; row < p.rows; row += DEC_WARPS) {
        int* s = srs + row * RS_FIELDS;
        if (!row_active(s)) {
            if (lane == 0) s[RS_NEED_PREDICT] = 0;
            continue;
        }
        const float* v = partial + (long long)row * gridDim.x * PARTIAL;
        const int label = warp_best(v, 0);
        int duration = __ldg(p.durations + warp_best(v, 1));
        if (lane != 0) continue;
        s[RS_NEED_PREDICT] = 0;
        const int blank = p.n_classes - 1;
        if (label == blank && duration == 0) duration = 1;
        const int frame = s[RS_TIME];
        s[RS_TIME] = frame + duration;
        if (label == blank) continue;

        const int n = s[RS_TOKENS];
        if (n >= p.token_capacity) {
            s[RS_TOKENS] = p.token_capacity + 1;
            s[RS_TIME] = s[RS_FRAMES];
            continue;
        }
        if (blockIdx.x == 0) {
            int* t = p.tokens + ((long long)row * p.token_capacity + n) * 3;
            t[0] = label;
            t[1] = frame;
            t[2] = duration;
        }
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
        if (row_active(s) && s[RS_EMITS] >= p.max_symbols && s[RS_LAST_EMIT] == s[RS_TIME])
            s[RS_TIME] += 1;
    }
}

// Dynamic shared memory: stage [2][ROW_CHUNK][max(H, J)] floats, then the warps' tile sums
// [max_tiles(grid) * chunks_of(max(H, J))][64] floats, then the row state [rows][RS_FIELDS].
__device__ __forceinline__ int max_tiles(const TdtParams& p) {
    const int g = gridDim.x;
    const int per_block = max(max((p.hidden + g - 1) / g, (p.joint_hidden + g - 1) / g),
                              (p.n_out + g - 1) / g);
    return max((p.hidden + g - 1) / g, (per_block + TILE - 1) / TILE);
}

extern "C" __global__ __launch_bounds__(DEC_WARPS * 32, 1) void tdt_decode(const TdtParams p) {
    extern __shared__ float4 shared4[];
    float* stage = reinterpret_cast<float*>(shared4);
    const int width = max(p.hidden, p.joint_hidden);
    float* parts = stage + 2 * ROW_CHUNK * width;
    int* srs = reinterpret_cast<int*>(parts + max_tiles(p) * chunks_of(width) * 64);
    __shared__ int any_active, any_predicting;

    for (int i = threadIdx.x; i < p.rows * RS_FIELDS; i += blockDim.x) srs[i] = __ldcg(p.rs + i);
    const int first_step = __ldcg(p.ds + DS_STEPS);
    int parity = __ldcg(p.ds + DS_PARITY);
    unsigned barrier = (unsigned)__ldcg(p.ds + DS_BAR_BASE);
    __syncthreads();
    int step = 0;
    for (; step < p.max_steps; ++step) {
        if (threadIdx.x < 32) {
            bool active = false, predicting = false;
            for (int row = threadIdx.x; row < p.rows; row += 32) {
                const int* s = srs + row * RS_FIELDS;
                active |= row_active(s);
                predicting |= row_active(s) && s[RS_NEED_PREDICT];
            }
            active = __any_sync(0xffffffffu, active);
            predicting = __any_sync(0xffffffffu, predicting);
            if (threadIdx.x == 0) {
                any_active = active;
                any_predicting = predicting;
            }
        }
        __syncthreads();
        if (!any_active) break;  // the same in every block: their row states are equal
        if (any_predicting) {
            for (int l = 0; l < p.layers; ++l) {
                lstm_layer(p, l, parity, srs, stage, parts);
                grid_barrier(p.ds, barrier);
            }
            pred_phase(p, parity, srs, stage, parts);
            parity ^= 1;
            grid_barrier(p.ds, barrier);
        }
        // Alternate halves: a block may still read step s's partials while another writes s + 1's.
        float* partial = p.partial + (long long)((first_step + step) & 1) * p.rows * gridDim.x *
                                         PARTIAL;
        joint_phase(p, srs, stage, parts, partial);
        grid_barrier(p.ds, barrier);
        advance_phase(p, srs, partial);
        __syncthreads();
    }
    if (blockIdx.x == 0) {
        for (int i = threadIdx.x; i < p.rows * RS_FIELDS; i += blockDim.x) p.rs[i] = srs[i];
        if (threadIdx.x == 0) {
            p.ds[DS_STEPS] = first_step + step;
            p.ds[DS_PARITY] = parity;
            // Read by the next launch only: every block read this launch's base before it
            // arrived at its first barrier, and block 0 got here past the last one.
            p.ds[DS_BAR_BASE] = (int)barrier;
        }
    }
}

// Zero state (both halves), every used row feeds the start-of-sequence label first; rows >=
// batch are unused. Leaves the barrier fields of ds alone (the count and its base stay
// consistent across launches).
extern "C" __global__ void tdt_reset(int* rs, int* ds, const int* frames, const int* enc_rows,
                                     int batch, int rows, int blank, float* h, float* c,
                                     long long state_len) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < state_len;
         i += (long long)gridDim.x * blockDim.x) {
        h[i] = 0.0f;
        c[i] = 0.0f;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        ds[DS_STEPS] = 0;
        ds[DS_PARITY] = 0;
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
