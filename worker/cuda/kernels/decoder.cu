// Label-looping TDT greedy decoding on the GPU (f32) in one persistent cooperative kernel.
//
// `tdt_decode` runs up to `max_steps` uniform steps without returning to the host. A step:
//
//   [rows that emitted a label last step exist]
//     layer 0's cells -> h_0 -> LSTM layers 1 .. L-1 -> h_l -> joint.pred
//   the joint's input of every active row -> joint -> partial maxima -> choice of label and
//   duration, advance
// where each "->" with a value hands it from every block to every block (see below).
//
// Rows that emitted a label in the previous step first run the prediction network on it (the
// other rows keep their state and projection), so a row's sequence of joint evaluations is
// exactly the CPU loop's (models::tdt): blanks advance the frame and look again with the same
// prediction output, labels are emitted at the frame where they were found.
//
// Each layer's recurrent product W_hh h is computed as soon as its h changes, in the phase that
// already stages that h (layer l's new h also feeds W_ih of layer l + 1, or joint.pred), and is
// kept in `rec` until the row predicts again. Layer 0's input product is a per-label table, so
// layer 0 is a cell update with no product, and every product phase stages one input.
//
// Every block keeps its own copy of the row state in shared memory and makes the same choices
// from the same joint outputs, so the blocks agree on what runs next without exchanging more;
// block 0 alone writes tokens and the final row state. Block b owns a contiguous range of LSTM
// units (their four gate rows in every matrix, their cell state and recurrent products), of
// joint.pred's outputs and of the joint's. Its weight rows stay in shared memory for the
// whole launch where they fit (`piece_rows` 0: one block per SM of a whole GPU), else they
// stream through two buffers of `piece_rows` rows (cp.async, the next piece in flight while
// this one is used). A product is computed in micro-tiles of TILE weight rows x up to MR_MAX
// batch rows; the SLICES lanes of a micro-tile split the inner dimension (lane s takes float4s
// s, s + SLICES, ...), each summing its share in order, and add their sums by a butterfly. So
// every value's sum tree depends on the inner dimension alone: not on the grid, on where the
// weights are, or on the other rows of the batch. The choice of label and duration reduces
// per-block partial maxima instead of every logit.
//
// There is no grid barrier: every value one block hands to the others carries a tag saying
// which step wrote it, so a reader's load is also its wait (it loads again until the tags
// match). Three kinds of values cross blocks, each in a buffer of two halves that alternate, so
// a half holds either this use's values or those of two uses ago, whose tag differs:
//   h of each layer, by predicting step ("epoch"): |h| <= 1, so the top bit of the exponent
//     (0x4000 in bf16, bit 30 in f32) is free and holds bit 1 of the epoch;
//   the joint's input relu(enc_proj + pred_proj), by step: never negative, so the sign bit
//     holds bit 1 of the step;
//   the choice's partial maxima, by step: one 64-bit key per row, block and kind (ordered
//     value, 16 bits of the step, index), written and read as one access; duration keys only
//     by the few blocks that own duration outputs, and only theirs are read.
// A writer writes every row's slot of its outputs at every use (a tagged zero where the row
// has nothing), so a slot is never older than two uses. Each block writes a half only after it
// has read every block's values of the step before, which were written after their writers
// read this half's previous values (layer 0's h of a row that predicts is written as soon as
// the row's keys from every block are read: each block wrote them after its own stagings).
// The launch must be cooperative: a reader spins until the writer, another block, has run.
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
#define DS_FIELDS 3
#define DS_STEPS 0   // steps run since the reset
#define DS_CLOCK 1   // steps run ever in this workspace (the tags of the joint input, choice)
#define DS_EPOCHS 2  // predicting steps run ever in this workspace (the tags of h)

#define DEC_WARPS 12  // warps per block (12: 168 registers each; the f32 build spills 12 bytes)
#define ROW_CHUNK 16  // batch rows staged per pass
#define TILE 4        // weight rows per micro-tile
#define MR_MAX 4      // batch rows per micro-tile
#define SLICES 8      // lanes per micro-tile, splitting the inner dimension

// Two builds (`bf16_t`, common.cuh). f32 storage is the exact path: f32 weights and h, products
// on the FMA units in micro-tiles. bf16 storage is the fast path of the bf16 engine: the weight
// rows and every product input (h, the joint's relu) in bf16, products on the tensor cores
// (mma m16n8k16, f32 accumulation); cell state, recurrent products, biases and the epilogues
// stay f32. In shared memory a bf16 row is padded by 16 bytes so that the 8 rows an ldmatrix
// reads fall in distinct banks.
#ifdef CUDA_ENGINE_F32_STORAGE
#define ROW_PAD 0
#else
#define ROW_PAD 8
#define MMA_TILES 8  // 8-row tiles of weight rows per pass of mma_products
#endif

// Elements from one staged or weight row to the next in shared memory.
__device__ __forceinline__ int row_stride(int k) {
    return k + ROW_PAD;
}

// Tag bits of the exchanged values (see the top): per element and per 32-bit word.
#ifdef CUDA_ENGINE_F32_STORAGE
#define H_TAG 0x40000000u
#define JOINT_TAG 0x80000000u
#define H_WORD_TAG H_TAG
#define JOINT_WORD_TAG JOINT_TAG
__device__ __forceinline__ unsigned element_bits(float v) {
    return __float_as_uint(v);
}
__device__ __forceinline__ bf16_t element_of_bits(unsigned bits) {
    return __uint_as_float(bits);
}
#else
#define H_TAG 0x4000u
#define JOINT_TAG 0x8000u
#define H_WORD_TAG 0x40004000u
#define JOINT_WORD_TAG 0x80008000u
__device__ __forceinline__ unsigned element_bits(float v) {
    return f32_to_bf16(v);
}
__device__ __forceinline__ bf16_t element_of_bits(unsigned bits) {
    return (bf16_t)bits;
}
#endif
// A reader that has reloaded a value this many times has lost its writer: trap (a sticky error
// the worker reports) instead of hanging. Readers reload without pausing: reloading less
// (sleeping between reloads, or one piece at a time) measured slower.
#define SPIN_LIMIT (1 << 24)

// Stores for other blocks to read (relaxed, gpu scope: they reach L2, where readers load).
__device__ __forceinline__ void store_shared_value(bf16_t* at, bf16_t v) {
#ifdef CUDA_ENGINE_F32_STORAGE
    asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(at), "r"(__float_as_uint(v))
                 : "memory");
#else
    asm volatile("st.relaxed.gpu.global.b16 [%0], %1;" ::"l"(at), "h"(v) : "memory");
#endif
}

__device__ __forceinline__ uint4 load_relaxed16(const void* at) {
    uint4 v;
    asm volatile("ld.relaxed.gpu.global.v4.b32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(at)
                 : "memory");
    return v;
}

// h tagged with bit 1 of its epoch. A NaN (only from NaN weights or input) travels as
// 1.9921875, a value no h takes, so that its tag bit stays free.
__device__ __forceinline__ bf16_t tagged_h(float h, bool tag) {
    const unsigned bits = element_bits(h != h ? 1.9921875f : h);
    return element_of_bits(tag ? bits | H_TAG : bits);
}

// The joint's input relu(v) (never -0.0; NaN gives 0, as fmaxf did) tagged with bit 1 of
// its step.
__device__ __forceinline__ bf16_t tagged_joint_input(float v, bool tag) {
    const unsigned bits = element_bits(v > 0.0f ? v : 0.0f);
    return element_of_bits(tag ? bits | JOINT_TAG : bits);
}

// Per-phase timing (compile with DEC_PROFILE defined): block 0's thread 0 stamps %globaltimer
// after every phase (a phase's wait for its input is in its time), and inside each product
// phase after its input is staged (waited for) and after its products, and prints the means
// per step at the end.
#ifdef DEC_PROFILE
#define PROFILE_SLOTS 6
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define PROFILE_MARK(slot)                                             \
    if (blockIdx.x == 0 && threadIdx.x == 0) {                         \
        const unsigned long long now = global_ns();                    \
        profile[slot] += now - profile_last;                           \
        profile_last = now;                                            \
    }
// Per product phase kind: [0] entry to input staged, [1] staged to products done; [2] entry.
__shared__ unsigned long long sub_profile[3][3];
#define SUB_MARK(kind, slot)                                                      \
    if (blockIdx.x == 0 && threadIdx.x == 0) {                                   \
        const unsigned long long now = global_ns();                               \
        if (slot > 0) sub_profile[kind][slot - 1] += now - sub_profile[kind][2];  \
        sub_profile[kind][2] = now;                                               \
    }
#else
#define PROFILE_MARK(slot)
#define SUB_MARK(kind, slot)
#endif

// Product phases, in the order their rows sit in shared memory when resident.
#define PH_LSTM 0   // layer l >= 1: W_ih_l of the owned units, then W_hh_{l-1} of the owned units
#define PH_PRED 1   // joint.pred's owned outputs, then W_hh_{L-1} of the owned units
#define PH_JOINT 2  // the joint's owned outputs

struct TdtParams {
    int* rs;                // [rows, RS_FIELDS]
    int* ds;                // [DS_FIELDS]
    int* tokens;            // [token_capacity, rows, 3]: (id, frame, duration), n-th tokens together
    const bf16_t* x_table;  // [vocab + 1, H, 4]: layer 0's input part W_ih x + b_ih + b_hh
                            // per label, unit and gate, in the storage type
    const bf16_t* w_hh;     // [layers, 4H, H] (gate order i, f, g, o)
    const bf16_t* w_ih;     // [layers - 1, 4H, H]: the layers above the first
    const float* bias;      // [layers - 1, 4H]: b_ih + b_hh of the layers above the first
    bf16_t* h;              // [2][layers, rows, H]: tagged, in the products' input type
    float* c;               // [layers, rows, H]: kept between launches (see `Cells`)
    float* rec;             // [layers, rows, H, 4]: W_hh h of the current h, by unit and gate
    const bf16_t* pred_w;   // [J, H]
    const float* pred_b;    // [J]
    float* pred_proj;       // [rows, J]
    bf16_t* joint_in;       // [2][rows, J]: tagged relu(enc_proj + pred_proj), products' type
    const float* enc_proj;  // [frames, J]
    const bf16_t* out_w;    // [n_out, J]
    const float* out_b;     // [n_out]
    unsigned long long* keys;  // [2][2][rows, grid]: the blocks' best label, best duration
    const int* durations;   // [n_durations]
    float* pred_hist;       // [hist_capacity, rows, J]: pred_proj after a row's first k tokens
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
    int piece_rows;  // 0: the block's weight rows are resident; else rows per streaming buffer
    // Dynamic shared memory, in bytes from its start: the staged rows [stage_rows][row_stride]
    // at 0, then the weight rows (row_stride each), the products [max phase rows][ROW_CHUNK],
    // the row state, the block's biases (`Biases`), the warps' partial products (tensor-core
    // build only), then where they fit the x_table slice and the cells.
    int shared_weights;
    int shared_products;
    int shared_row_state;
    int shared_biases;
    int shared_warp_sums;
    // Where the layout has room (-1: none), the block's slice of x_table [vocab + 1][units][4]
    // and its units' c [layers][rows][units] and rec [layers][rows][units][4] (`Cells`).
    int shared_x_table;
    int shared_cells;
    int hist_capacity;  // states pred_hist keeps per row (later ones are not kept)
};

// What this block owns: LSTM units per layer, joint.pred outputs, joint outputs, each a
// contiguous range (`*0` its first index), so that the few bytes a block writes of a row sit
// together and every 16-byte piece of an exchanged row has at most a few writers. Blocks below
// n % G own one more than the others.
struct Owned {
    int units, unit0;
    int pred, pred0;
    int joint, joint0;
};

__device__ __forceinline__ int owned_of(int n) {
    return n / (int)gridDim.x + ((int)blockIdx.x < n % (int)gridDim.x ? 1 : 0);
}

__device__ __forceinline__ int owned_start(int n) {
    const int b = blockIdx.x, G = gridDim.x;
    return b * (n / G) + min(b, n % G);
}

// The block that owns index i of n.
__device__ __forceinline__ int owner_of(int n, int i) {
    const int G = gridDim.x, q = n / G, cut = (n % G) * (q + 1);
    return i < cut ? i / (q + 1) : n % G + (i - cut) / q;
}

__device__ __forceinline__ Owned owned(const TdtParams& p) {
    return {owned_of(p.hidden),       owned_start(p.hidden),
            owned_of(p.joint_hidden), owned_start(p.joint_hidden),
            owned_of(p.n_out),        owned_start(p.n_out)};
}

__device__ __forceinline__ int phase_rows(const Owned& own, int kind) {
    return kind == PH_LSTM ? 8 * own.units : kind == PH_PRED ? own.pred + 4 * own.units : own.joint;
}

__device__ __forceinline__ int phase_inner(const TdtParams& p, int kind) {
    return kind == PH_JOINT ? p.joint_hidden : p.hidden;
}

// The biases of what this block owns, copied to shared memory at the start of a launch (read
// every step; the L1 is small beside the shared memory and streamed data would evict them):
// the LSTM layers above the first [layer - 1][gate][unit], then joint.pred's and the joint's.
struct Biases {
    float* lstm;
    float* pred;
    float* joint;
};

__device__ __forceinline__ Biases biases_at(float* base, const TdtParams& p, const Owned& own) {
    float* pred = base + (p.layers - 1) * 4 * own.units;
    return {base, pred, pred + own.pred};
}

__device__ void load_biases(const Biases& s, const TdtParams& p, const Owned& own) {
    const int H = p.hidden;
    for (int i = threadIdx.x; i < (p.layers - 1) * 4 * own.units; i += blockDim.x) {
        const int u = i % own.units, gate = i / own.units % 4, l = i / (4 * own.units);
        s.lstm[i] = p.bias[((long long)l * 4 + gate) * H + own.unit0 + u];
    }
    for (int j = threadIdx.x; j < own.pred; j += blockDim.x) s.pred[j] = p.pred_b[own.pred0 + j];
    for (int j = threadIdx.x; j < own.joint; j += blockDim.x) s.joint[j] = p.out_b[own.joint0 + j];
}

// The cell state and recurrent products of the block's units (only the owning block reads or
// writes them): in shared memory for the launch where the layout has room (copied in at the
// start and back at the end), else in the workspace. Layer 0's cells then need no load from
// global memory, only its table row, and that too comes from shared memory where it fits.
struct Cells {
    float* c;
    float4* rec;
    long long layer_stride;
    int row_stride, unit_base, unit_stride;

    // Element of (layer, row, owned unit u).
    __device__ __forceinline__ long long at(int layer, int row, int u) const {
        return layer * layer_stride + (long long)row * row_stride + unit_base + u * unit_stride;
    }
};

// The cells where they are kept between launches (the workspace).
__device__ __forceinline__ Cells workspace_cells(const TdtParams& p, const Owned& own) {
    return {p.c, reinterpret_cast<float4*>(p.rec), (long long)p.rows * p.hidden, p.hidden,
            own.unit0, 1};
}

__device__ __forceinline__ Cells cells_at(char* shared, const TdtParams& p, const Owned& own) {
    if (p.shared_cells < 0) return workspace_cells(p, own);
    float4* rec = reinterpret_cast<float4*>(shared + p.shared_cells);
    const int n = p.layers * p.rows * own.units;
    return {reinterpret_cast<float*>(rec + n), rec, (long long)p.rows * own.units, own.units, 0, 1};
}

// Copies the block's cells between the workspace and shared memory (`to_shared`: at the start
// of a launch; else back at its end). No-op where the cells stay in the workspace.
__device__ void move_cells(const TdtParams& p, const Owned& own, const Cells& cells,
                           bool to_shared) {
    if (p.shared_cells < 0) return;
    const Cells kept = workspace_cells(p, own);
    for (int i = threadIdx.x; i < p.layers * p.rows * own.units; i += blockDim.x) {
        const int u = i % own.units, row = i / own.units % p.rows, l = i / own.units / p.rows;
        const long long at = kept.at(l, row, u);
        if (to_shared) {
            cells.rec[i] = __ldcg(kept.rec + at);
            cells.c[i] = __ldcg(kept.c + at);
        } else {
            kept.rec[at] = cells.rec[i];
            kept.c[at] = cells.c[i];
        }
    }
}

// x_table's row for a label at owned unit u in global memory (its four gates).
__device__ __forceinline__ const bf16_t* x_table_global(const TdtParams& p, const Owned& own,
                                                       int label, int u) {
    return p.x_table + ((long long)label * p.hidden + own.unit0 + u) * 4;
}

// Copies the block's slice of x_table into shared memory where the layout has room.
__device__ void load_x_table_slice(char* shared, const TdtParams& p, const Owned& own) {
    if (p.shared_x_table < 0) return;
    bf16_t* dst = reinterpret_cast<bf16_t*>(shared + p.shared_x_table);
    for (int i = threadIdx.x; i < p.n_classes * own.units; i += blockDim.x) {
        const int u = i % own.units, label = i / own.units;
        const bf16_t* src = x_table_global(p, own, label, u);
#pragma unroll
        for (int g = 0; g < 4; ++g) dst[i * 4 + g] = src[g];
    }
}

// Layer 0's input part for a label at owned unit u (gates i, f, g, o).
__device__ __forceinline__ float4 x_table_row(const char* shared, const TdtParams& p,
                                              const Owned& own, int label, int u) {
    const bf16_t* x =
        p.shared_x_table >= 0
            ? reinterpret_cast<const bf16_t*>(shared + p.shared_x_table) +
                  ((long long)label * own.units + u) * 4
            : x_table_global(p, own, label, u);
#ifdef CUDA_ENGINE_F32_STORAGE
    return *reinterpret_cast<const float4*>(x);
#else
    const uint2 v = *reinterpret_cast<const uint2*>(x);
    return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                       __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
#endif
}

// Where this block's rows of phase (kind, layer) start among its resident weights (elements).
__device__ __forceinline__ long long resident_offset(const TdtParams& p, const Owned& own,
                                                     int kind, int layer) {
    const long long lstm = 8LL * own.units * row_stride(p.hidden);
    if (kind == PH_LSTM) return (layer - 1) * lstm;
    const long long pred = (p.layers - 1) * lstm;
    return kind == PH_PRED ? pred
                           : pred + (long long)phase_rows(own, PH_PRED) * row_stride(p.hidden);
}

// Weight row o of this block's rows of phase (kind, layer).
__device__ const bf16_t* weight_row(const TdtParams& p, const Owned& own, int kind, int layer,
                                   int o) {
    const int H = p.hidden;
    // Row i of the owned units' gate rows: unit i / 4, gate i % 4.
    auto gate_row = [&](const bf16_t* w, int i) {
        return w + ((long long)(i % 4) * H + own.unit0 + i / 4) * H;
    };
    const long long matrix = 4LL * H * H;
    if (kind == PH_LSTM) {
        const int n = 4 * own.units;
        return o < n ? gate_row(p.w_ih + (layer - 1) * matrix, o)
                     : gate_row(p.w_hh + (layer - 1) * matrix, o - n);
    }
    if (kind == PH_PRED) {
        return o < own.pred ? p.pred_w + (long long)(own.pred0 + o) * H
                            : gate_row(p.w_hh + (p.layers - 1) * matrix, o - own.pred);
    }
    return p.out_w + (long long)(own.joint0 + o) * p.joint_hidden;
}

// Starts copying rows first .. first + n of phase (kind, layer) to dst [n][row_stride(k)]
// (cp.async): a warp per row, so a row's address is worked out once.
__device__ void copy_weight_rows(bf16_t* dst, const TdtParams& p, const Owned& own, int kind,
                                 int layer, int first, int n) {
    const int k = phase_inner(p, kind), packs = k / kPack;
    const int lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int o = threadIdx.x >> 5; o < n; o += warps) {
        const bf16_t* src = weight_row(p, own, kind, layer, first + o);
        bf16_t* row = dst + (long long)o * row_stride(k);
        for (int q = lane; q < packs; q += 32)
            copy16_async(row + kPack * q, src + kPack * q, true);
    }
}

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

// The step's masks of predicting and active rows per chunk, worked out once at the start of a
// step (the row state changes only in the choice): the phases read one word instead of
// scanning 16 rows' state each. Chunks past MASK_CHUNKS scan.
#define MASK_CHUNKS 16
struct RowMasks {
    unsigned predicting[MASK_CHUNKS];
    unsigned active[MASK_CHUNKS];
};
__shared__ RowMasks step_masks;

__device__ __forceinline__ unsigned step_predicting(const int* srs, int row0, int rows) {
    const int chunk = row0 / ROW_CHUNK;
    return chunk < MASK_CHUNKS ? step_masks.predicting[chunk] : predicting_rows(srs, row0, rows);
}

__device__ __forceinline__ unsigned step_active(const int* srs, int row0, int rows) {
    const int chunk = row0 / ROW_CHUNK;
    return chunk < MASK_CHUNKS ? step_masks.active[chunk] : active_rows(srs, row0, rows);
}

// Copies the selected rows of a tagged buffer src ([rows, k], written by other blocks) to dst
// ([ROW_CHUNK, row_stride(k)]) with the tags cleared, waiting for each 16-byte piece until
// every word's tag bits (`word_tag`) read `want`. All of a thread's loads are in flight at once,
// and so are its reloads: one round trip once the writers are done, however many rows.
__device__ void stage_tagged(bf16_t* dst, const bf16_t* src, int row0, unsigned sel, int k,
                             unsigned word_tag, unsigned want) {
    // Pieces per thread in flight (8 in the f32 build measured slower: more registers).
    constexpr int BATCH = 4;
    const int packs = k / kPack, total = ROW_CHUNK * packs;
    auto ready = [&](const uint4& v) {
        return ((v.x & word_tag) == want) & ((v.y & word_tag) == want) &
               ((v.z & word_tag) == want) & ((v.w & word_tag) == want);
    };
    for (int base = threadIdx.x; base < total; base += BATCH * blockDim.x) {
        uint4 v[BATCH];
        unsigned pending = 0;
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            const int i = base + j * blockDim.x, r = i / packs;
            if (i < total && (sel >> r & 1)) {
                pending |= 1u << j;
                v[j] = load_relaxed16(src + (long long)(row0 + r) * k + kPack * (i % packs));
            }
        }
        for (int spins = 0; pending != 0;) {
#pragma unroll
            for (int j = 0; j < BATCH; ++j) {
                if ((pending >> j & 1) && ready(v[j])) {
                    pending &= ~(1u << j);
                    const int i = base + j * blockDim.x, r = i / packs;
                    *reinterpret_cast<uint4*>(dst + r * row_stride(k) + kPack * (i % packs)) =
                        make_uint4(v[j].x & ~word_tag, v[j].y & ~word_tag, v[j].z & ~word_tag,
                                   v[j].w & ~word_tag);
                }
            }
            if (spins++ == SPIN_LIMIT) __trap();
#pragma unroll
            for (int j = 0; j < BATCH; ++j) {
                if (pending >> j & 1) {
                    const int i = base + j * blockDim.x, r = i / packs;
                    v[j] = load_relaxed16(src + (long long)(row0 + r) * k + kPack * (i % packs));
                }
            }
        }
    }
}

// The index of the n-th set bit of `mask` (n counts from 0; the bit exists).
__device__ __forceinline__ int nth_set_bit(unsigned mask, int n) {
    for (; n > 0; --n) mask &= mask - 1;
    return __ffs(mask) - 1;
}

#ifdef CUDA_ENGINE_F32_STORAGE
// y[o * ROW_CHUNK + r] = sum_k w[o][k] x[r][k] for o < n and the row groups of the first RC
// rows that hold a selected row (w: [n][k], x: [RC][k], both in shared memory). A micro-tile
// (TILE rows of w, MR rows of x) belongs to SLICES consecutive lanes: lane s sums float4s s,
// s + SLICES, ... in order, then a butterfly adds the lanes' sums.
template <int RC>
__device__ void tile_products(const float* w, int n, const float* x, int k, unsigned sel,
                              float* y) {
    constexpr int MR = RC < MR_MAX ? RC : MR_MAX;
    constexpr int GROUPS = RC / MR;
    unsigned groups = 0;  // bit g: row group g holds a selected row
#pragma unroll
    for (int g = 0; g < GROUPS; ++g)
        if (sel >> (g * MR) & ((1u << MR) - 1)) groups |= 1u << g;
    const int tiles = (n + TILE - 1) / TILE, units = tiles * __popc(groups);
    const int slice = threadIdx.x % SLICES, quads = k / 4;
    const unsigned lanes = 0xffu << ((threadIdx.x & 31) & ~(SLICES - 1));
    for (int unit = threadIdx.x / SLICES; unit < units; unit += blockDim.x / SLICES) {
        const int tile = unit % tiles, group = nth_set_bit(groups, unit / tiles);
        const float* wr[TILE];
#pragma unroll
        for (int q = 0; q < TILE; ++q) wr[q] = w + (long long)min(tile * TILE + q, n - 1) * k;
        const float* xr = x + (long long)group * MR * k;
        float acc[MR * TILE];
#pragma unroll
        for (int i = 0; i < MR * TILE; ++i) acc[i] = 0.0f;
        for (int at = slice; at < quads; at += SLICES) {
            float4 wv[TILE], xv[MR];
#pragma unroll
            for (int q = 0; q < TILE; ++q) wv[q] = reinterpret_cast<const float4*>(wr[q])[at];
#pragma unroll
            for (int r = 0; r < MR; ++r) xv[r] = reinterpret_cast<const float4*>(xr + r * k)[at];
#pragma unroll
            for (int r = 0; r < MR; ++r) {
#pragma unroll
                for (int q = 0; q < TILE; ++q) {
                    float a = acc[r * TILE + q];
                    a = fmaf(wv[q].x, xv[r].x, a);
                    a = fmaf(wv[q].y, xv[r].y, a);
                    a = fmaf(wv[q].z, xv[r].z, a);
                    acc[r * TILE + q] = fmaf(wv[q].w, xv[r].w, a);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < MR * TILE; ++i) {
#pragma unroll
            for (int offset = SLICES / 2; offset > 0; offset /= 2)
                acc[i] += __shfl_xor_sync(lanes, acc[i], offset);
        }
        // Every lane holds every sum; lane s stores sums s, s + SLICES, ...
#pragma unroll
        for (int i = 0; i < MR * TILE; ++i) {
            const int o = tile * TILE + i % TILE, r = group * MR + i / TILE;
            if (i % SLICES == slice && o < n) y[o * ROW_CHUNK + r] = acc[i];
        }
    }
}

// tile_products with the narrowest micro-tile height that covers the selected rows.
__device__ __forceinline__ void tile_products_for(const float* w, int n, const float* x, int k,
                                                  unsigned sel, float* y) {
    if (sel < (1u << 1))
        tile_products<1>(w, n, x, k, sel, y);
    else if (sel < (1u << 4))
        tile_products<4>(w, n, x, k, sel, y);
    else
        tile_products<ROW_CHUNK>(w, n, x, k, sel, y);
}

// The products of the block's weight rows w [n][k] with the staged rows x: y[o * ROW_CHUNK + r]
// for o < n and (at least) the selected rows r.
__device__ __forceinline__ void block_products(const TdtParams&, const float* w, int n,
                                               const float* x, int k, unsigned sel, float* y) {
    tile_products_for(w, n, x, k, sel, y);
}
#else
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const bf16_t* at) {
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(at));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// d += a b on the tensor cores: a 16 x 16 (rows x k), b 16 x 8 (k x weight rows), f32 d. Not
// volatile: registers only, so the compiler may interleave independent ones.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One warp's share of a pass of mma_products over COUNT 8-row tiles of w: the 16-wide k-steps
// warp, warp + DEC_WARPS, ... in order, accumulated in acc. COUNT is a template argument so
// that every fragment of a k-step is loaded before its products, with no branch between them:
// with a branch per tile the loads wait for the previous tile's products, one round trip each.
template <int COUNT>
__device__ __forceinline__ void mma_pass(float (&acc)[MMA_TILES][4],
                                         const bf16_t* const (&w_at)[MMA_TILES / 2],
                                         const bf16_t* x_at, int warp, int ksteps) {
    for (int step = warp; step < ksteps; step += DEC_WARPS) {
        unsigned a[4], b[(COUNT + 1) / 2][4];
        ldmatrix_x4(a, x_at + step * 16);
#pragma unroll
        for (int t = 0; t < COUNT; t += 2) ldmatrix_x4(b[t / 2], w_at[t / 2] + step * 16);
#pragma unroll
        for (int t = 0; t < COUNT; t += 2) {
            mma_bf16(acc[t], a, b[t / 2][0], b[t / 2][1]);
            if (t + 1 < COUNT) mma_bf16(acc[t + 1], a, b[t / 2][2], b[t / 2][3]);
        }
    }
}

// y[o * ROW_CHUNK + r] = sum_k w[o][k] x[r][k] for o < n and every r < ROW_CHUNK (w: [n][k], x:
// [ROW_CHUNK][k], bf16 rows row_stride(k) apart in shared memory; k % 16 == 0). Warp v takes
// the 16-wide k-steps v, v + DEC_WARPS, ... in order, accumulating in f32 on the tensor cores
// for up to MMA_TILES 8-row tiles at once; then the warps' sums are added in warp order through
// `sums`. So a value's sum tree depends on k alone, and a row's value on that row alone (an mma
// output row reads only its own input row): not on the other rows, the grid or the weights'
// placement. Rows of a tile past n read row n - 1 and are not stored.
__device__ void mma_products(const bf16_t* w, int n, const bf16_t* x, int k, float* y,
                             float* sums) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int stride = row_stride(k), ksteps = k / 16, tiles = (n + 7) / 8;
    constexpr int WARP_SUMS = MMA_TILES * 8 * ROW_CHUNK;
    // ldmatrix.x4 addresses: of x, rows 0-15 at k + 0 (lanes 0-15) and + 8 (lanes 16-31), the
    // four a registers; of w, two tiles' 8 rows at k + 0 and + 8, two b registers per tile.
    const bf16_t* x_at = x + (lane & 15) * stride + (lane >> 4) * 8;
    const int w_row = lane & 7, w_tile = lane >> 4, w_k = (lane >> 3 & 1) * 8;
    for (int tile0 = 0; tile0 < tiles; tile0 += MMA_TILES) {
        const int count = min(MMA_TILES, tiles - tile0);
        float acc[MMA_TILES][4];
#pragma unroll
        for (int t = 0; t < MMA_TILES; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
        const bf16_t* w_at[MMA_TILES / 2];
#pragma unroll
        for (int t = 0; t < MMA_TILES; t += 2)
            w_at[t / 2] = w + min((tile0 + t + w_tile) * 8 + w_row, n - 1) * stride + w_k;
        switch (count) {
            case 1: mma_pass<1>(acc, w_at, x_at, warp, ksteps); break;
            case 2: mma_pass<2>(acc, w_at, x_at, warp, ksteps); break;
            case 3: mma_pass<3>(acc, w_at, x_at, warp, ksteps); break;
            case 4: mma_pass<4>(acc, w_at, x_at, warp, ksteps); break;
            case 5: mma_pass<5>(acc, w_at, x_at, warp, ksteps); break;
            case 6: mma_pass<6>(acc, w_at, x_at, warp, ksteps); break;
            case 7: mma_pass<7>(acc, w_at, x_at, warp, ksteps); break;
            default: mma_pass<MMA_TILES>(acc, w_at, x_at, warp, ksteps); break;
        }
        // acc[t]: rows g and g + 8, weight rows 2c and 2c + 1 of tile t (g = lane / 4, c = lane % 4).
        float* mine = sums + warp * WARP_SUMS;
        const int g = lane >> 2, c = lane & 3;
#pragma unroll
        for (int t = 0; t < MMA_TILES; ++t) {
            if (t < count) {
                const int o = t * 8 + 2 * c;
                mine[o * ROW_CHUNK + g] = acc[t][0];
                mine[(o + 1) * ROW_CHUNK + g] = acc[t][1];
                mine[o * ROW_CHUNK + g + 8] = acc[t][2];
                mine[(o + 1) * ROW_CHUNK + g + 8] = acc[t][3];
            }
        }
        __syncthreads();
        const int outputs = min(count * 8, n - tile0 * 8) * ROW_CHUNK;
        for (int i = threadIdx.x; i < outputs; i += blockDim.x) {
            float sum = sums[i];
#pragma unroll
            for (int v = 1; v < DEC_WARPS; ++v) sum += sums[v * WARP_SUMS + i];
            y[tile0 * 8 * ROW_CHUNK + i] = sum;
        }
        __syncthreads();  // the sums are rewritten by the next pass
    }
}

__device__ __forceinline__ void block_products(const TdtParams& p, const bf16_t* w, int n,
                                               const bf16_t* x, int k, unsigned, float* y) {
    extern __shared__ float4 shared4[];
    float* sums = reinterpret_cast<float*>(reinterpret_cast<char*>(shared4) + p.shared_warp_sums);
    mma_products(w, n, x, k, y, sums);
}
#endif

// The products of this block's rows of phase (kind, layer) with the staged rows `sel`:
// y[o * ROW_CHUNK + r]. `stage_input` fills xs [ROW_CHUNK][k] (directly, or by copies it
// commits as one group after the first streamed piece of weights, which is in flight by then).
// Ends with a block barrier.
template <typename Stage>
__device__ void phase_products(const TdtParams& p, const Owned& own, int kind, int layer,
                               bf16_t* weights, const bf16_t* xs, unsigned sel, float* y,
                               Stage stage_input) {
    const int n = phase_rows(own, kind), k = phase_inner(p, kind);
    const int piece = p.piece_rows;
    // Streaming: the previous chunk is done with the stage, the buffers and y. Resident, the
    // barriers of the previous products and of this one's staging suffice.
    if (piece > 0) __syncthreads();
    SUB_MARK(kind, 0);
    if (piece > 0) {
        copy_weight_rows(weights, p, own, kind, layer, 0, min(piece, n));
        commit_copies();
    }
    stage_input();
    if (piece == 0) {
        wait_copies<0>();
        __syncthreads();
        SUB_MARK(kind, 1);
        block_products(p, weights + resident_offset(p, own, kind, layer), n, xs, k, sel, y);
        __syncthreads();
        SUB_MARK(kind, 2);
        return;
    }
    const int width = row_stride(max(p.hidden, p.joint_hidden));
    for (int first = 0, i = 0; first < n; first += piece, ++i) {
        if (first + piece < n) {
            copy_weight_rows(weights + (long long)((i + 1) & 1) * piece * width, p, own, kind,
                             layer, first + piece, min(piece, n - first - piece));
            commit_copies();
            wait_copies<1>();
        } else {
            wait_copies<0>();
        }
        __syncthreads();
        block_products(p, weights + (long long)(i & 1) * piece * width, min(piece, n - first), xs,
                       k, sel, y + first * ROW_CHUNK);
        __syncthreads();  // this buffer is refilled two pieces on
    }
}

// Copies every weight row this block owns into shared memory (resident launches), waiting.
__device__ void load_resident_weights(const TdtParams& p, const Owned& own, bf16_t* weights) {
    for (int l = 1; l < p.layers; ++l)
        copy_weight_rows(weights + resident_offset(p, own, PH_LSTM, l), p, own, PH_LSTM, l, 0,
                         phase_rows(own, PH_LSTM));
    for (int kind = PH_PRED; kind <= PH_JOINT; ++kind)
        copy_weight_rows(weights + resident_offset(p, own, kind, 0), p, own, kind, 0, 0,
                         phase_rows(own, kind));
    commit_copies();
    wait_copies<0>();
    __syncthreads();
}

// The choice's key of a block's best output of one kind for a row: greater keys are greater
// values, then lower indices (as the CPU loop's first maximum), so the best over blocks is the
// greatest key. Bits 63-32: the value's bits, ordered as unsigned (NaN lowest, -0 as +0);
// 31-16: the step's tag; 15-0: 0xffff - index. No output of the kind (index -1): 0 there.
__device__ __forceinline__ unsigned long long choice_key(float value, int index, unsigned tag) {
    unsigned long long key = (unsigned long long)(tag & 0xffffu) << 16;
    if (index < 0) return key;
    const unsigned bits = __float_as_uint(value == 0.0f ? 0.0f : value);
    const unsigned ordered = value != value ? 0u : bits >> 31 ? ~bits : bits | 0x80000000u;
    return key | (unsigned long long)ordered << 32 | (0xffffu - (unsigned)index);
}

__device__ __forceinline__ int key_index(unsigned long long key) {
    return 0xffff - (int)(key & 0xffffu);
}

__device__ __forceinline__ void store_key(unsigned long long* at, unsigned long long key) {
    asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(at), "l"(key) : "memory");
}

// Where the tagged values of a use sit: the half of a buffer and the tag bit.
struct Use {
    int half;
    bool tag;
};

__device__ __forceinline__ Use use_of(unsigned count) {
    return {(int)(count & 1u), (count >> 1 & 1u) != 0};
}

// h of `layer` in the half of epoch `e`.
__device__ __forceinline__ bf16_t* h_at(const TdtParams& p, Use e, int layer) {
    return p.h + ((long long)e.half * p.layers + layer) * p.rows * p.hidden;
}

__device__ __forceinline__ bf16_t* joint_in_at(const TdtParams& p, Use s) {
    return p.joint_in + (long long)s.half * p.rows * p.joint_hidden;
}

// The cell's activations. The exact build keeps the library's expf and tanhf; the bf16 build,
// whose h is rounded to bf16 (relative error 2^-9) anyway, uses the hardware tanh (relative
// error about 2^-11) for both, sigmoid(x) = (1 + tanh(x / 2)) / 2: one instruction each
// instead of dozens on every predicting step's path.
#ifdef CUDA_ENGINE_F32_STORAGE
__device__ __forceinline__ float cell_sigmoid(float v) {
    return sigmoid_f32(v);
}
__device__ __forceinline__ float cell_tanh(float v) {
    return tanhf(v);
}
#else
__device__ __forceinline__ float cell_tanh(float v) {
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(v));
    return t;
}
__device__ __forceinline__ float cell_sigmoid(float v) {
    return fmaf(0.5f, cell_tanh(0.5f * v), 0.5f);
}
#endif

// One LSTM cell: gate pre-activations (i, f, g, o) and the old cell state of state element `at`
// of a layer's c; returns the new h.
__device__ __forceinline__ float lstm_cell(float gi, float gf, float gg, float go, float c_old,
                                           float* c, long long at) {
    const float cell = cell_sigmoid(gf) * c_old + cell_sigmoid(gi) * cell_tanh(gg);
    c[at] = cell;
    return cell_sigmoid(go) * cell_tanh(cell);
}

// Layer 0's cell of owned unit u for a row that feeds `label`: table row of the label +
// recurrent product; stores the new h, tagged for epoch e.
__device__ __forceinline__ void layer0_cell(const TdtParams& p, const Owned& own,
                                            const char* shared, const Cells& cells, Use e,
                                            int row, int u, int label) {
    const long long at = cells.at(0, row, u);
    const float4 x = x_table_row(shared, p, own, label, u);
    const float4 r = cells.rec[at];
    const float h =
        lstm_cell(x.x + r.x, x.y + r.y, x.z + r.z, x.w + r.w, cells.c[at], cells.c, at);
    store_shared_value(h_at(p, e, 0) + (long long)row * p.hidden + own.unit0 + u,
                       tagged_h(h, e.tag));
}

// Layer 0 for the owned units of every row: rows that predict get the cell, the others a
// tagged zero. `predicted`: the predicting rows' cells were computed by the step before, as
// soon as it chose their labels (`advance_phase`); only the others are written.
__device__ void layer0_cells(const TdtParams& p, const Owned& own, const int* srs,
                             const char* shared, const Cells& cells, Use e, bool predicted) {
    bf16_t* h = h_at(p, e, 0);
    for (int i = threadIdx.x; i < own.units * p.rows; i += blockDim.x) {
        const int u = i / p.rows, row = i % p.rows;
        const int* s = srs + row * RS_FIELDS;
        if (s[RS_NEED_PREDICT] && row_active(s)) {
            if (!predicted) layer0_cell(p, own, shared, cells, e, row, u, s[RS_LABEL]);
        } else {
            store_shared_value(h + (long long)row * p.hidden + own.unit0 + u,
                               tagged_h(0.0f, e.tag));
        }
    }
}

// Stores the recurrent products y[first + 4i + g] (unit i, gate g) of a layer for the
// selected rows of the chunk at row0. The block's last threads take the first items: the
// first threads are computing what other blocks wait for (cells, the joint's input).
__device__ void store_recurrent(const Owned& own, const Cells& cells, int layer, const float* y,
                                int first, int row0, unsigned sel) {
    for (int i = blockDim.x - 1 - threadIdx.x; i < own.units * ROW_CHUNK; i += blockDim.x) {
        const int u = i / ROW_CHUNK, r = i % ROW_CHUNK;
        if (!(sel >> r & 1)) continue;
        const float* v = y + (first + 4 * u) * ROW_CHUNK + r;
        cells.rec[cells.at(layer, row0 + r, u)] =
            make_float4(v[0], v[ROW_CHUNK], v[2 * ROW_CHUNK], v[3 * ROW_CHUNK]);
    }
}

// LSTM layer l >= 1 for the rows that predict: W_ih_l (new h of layer l - 1) + bias + the kept
// recurrent product, then the cells of the owned units (rows that do not predict get a tagged
// zero); also layer l - 1's new recurrent products from the same staged h.
__device__ void lstm_phase(const TdtParams& p, const Owned& own, int l, const int* srs,
                           bf16_t* stage, bf16_t* weights, float* y, const Biases& biases,
                           const Cells& cells, Use e) {
    const int H = p.hidden, n = own.units * ROW_CHUNK;
    const bf16_t* h_below = h_at(p, e, l - 1);
    bf16_t* h_out = h_at(p, e, l);
    const float* bias = biases.lstm + (l - 1) * 4 * own.units;
    const unsigned want = e.tag ? H_WORD_TAG : 0u;
    for (int row0 = 0; row0 < p.rows; row0 += ROW_CHUNK) {
        const unsigned sel = step_predicting(srs, row0, p.rows);
        // Cell i of the epilogue: unit i / ROW_CHUNK, row i % ROW_CHUNK. This block wrote its
        // cells' state and recurrent products itself, in earlier phases: the thread's first
        // cell loads them now, so where they are in global memory the round trip overlaps the
        // products.
        auto h_index = [&](int i) {
            return (long long)(row0 + i % ROW_CHUNK) * H + own.unit0 + i / ROW_CHUNK;
        };
        auto cell_at = [&](int i) { return cells.at(l, row0 + i % ROW_CHUNK, i / ROW_CHUNK); };
        if (sel != 0) {  // uniform: every thread reads the same shared row state
            const bool early = threadIdx.x < n && (sel >> (threadIdx.x % ROW_CHUNK) & 1);
            float4 early_rec = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float early_c = 0.0f;
            if (early) {
                early_rec = cells.rec[cell_at(threadIdx.x)];
                early_c = cells.c[cell_at(threadIdx.x)];
            }
            phase_products(p, own, PH_LSTM, l, weights, stage, sel, y, [&] {
                stage_tagged(stage, h_below, row0, sel, H, H_WORD_TAG, want);
            });
            for (int i = threadIdx.x; i < n; i += blockDim.x) {
                const int u = i / ROW_CHUNK, r = i % ROW_CHUNK;
                if (!(sel >> r & 1)) continue;
                const float* v = y + 4 * u * ROW_CHUNK + r;
                const long long at = cell_at(i);
                const bool first = i == (int)threadIdx.x;
                const float4 rec = first ? early_rec : cells.rec[at];
                const float c_old = first ? early_c : cells.c[at];
                const float* b = bias + u;
                const float h = lstm_cell(v[0] + b[0] + rec.x, v[ROW_CHUNK] + b[own.units] + rec.y,
                                          v[2 * ROW_CHUNK] + b[2 * own.units] + rec.z,
                                          v[3 * ROW_CHUNK] + b[3 * own.units] + rec.w, c_old,
                                          cells.c, at);
                store_shared_value(h_out + h_index(i), tagged_h(h, e.tag));
            }
            store_recurrent(own, cells, l - 1, y, 4 * own.units, row0, sel);
        }
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            const int r = i % ROW_CHUNK;
            if (row0 + r < p.rows && !(sel >> r & 1))
                store_shared_value(h_out + h_index(i), tagged_h(0.0f, e.tag));
        }
    }
}

// What the joint's input of item i (owned joint.pred output i / ROW_CHUNK, row row0 +
// i % ROW_CHUNK) adds to pred_proj: the row's projected encoder frame there (0 for rows that
// are inactive or past the workspace), and the address of its pred_proj.
struct JointItem {
    bool active;
    float enc;
    float* pred;
};

__device__ __forceinline__ JointItem joint_item(const TdtParams& p, const Owned& own,
                                                const int* srs, int row0, int i) {
    const int J = p.joint_hidden, row = row0 + i % ROW_CHUNK;
    const int o = own.pred0 + i / ROW_CHUNK;
    if (row >= p.rows) return {false, 0.0f, nullptr};
    const int* st = srs + row * RS_FIELDS;
    float* pred = p.pred_proj + (long long)row * J + o;
    if (!row_active(st)) return {false, 0.0f, pred};
    return {true, __ldg(p.enc_proj + ((long long)st[RS_ENC_ROW] + st[RS_TIME]) * J + o), pred};
}

// The joint's input relu(enc_proj[row's frame] + pred_proj[row]) at the owned outputs of
// joint.pred for every row of the chunk at row0, tagged for step `s`: rows in `fresh` take
// pred_proj from this phase's products y (and store it), the other active rows load the one
// this block stored when they last predicted, inactive rows get a tagged zero. `early`: the
// thread's first item, loaded before the products (with the pred_proj it had then).
__device__ void joint_input_chunk(const TdtParams& p, const Owned& own, const int* srs, int row0,
                                  unsigned fresh, const float* y, const Biases& biases, Use s,
                                  const JointItem* early, float early_pred) {
    const int J = p.joint_hidden;
    bf16_t* out = joint_in_at(p, s);
    for (int i = threadIdx.x; i < own.pred * ROW_CHUNK; i += blockDim.x) {
        const int j = i / ROW_CHUNK, r = i % ROW_CHUNK, row = row0 + r;
        if (row >= p.rows) continue;
        const bool first = early != nullptr && i == (int)threadIdx.x;
        const JointItem item = first ? *early : joint_item(p, own, srs, row0, i);
        float value = 0.0f;
        if (item.active) {
            float v;
            if (fresh >> r & 1) {
                v = y[i] + biases.pred[j];
                *item.pred = v;
                // The row predicts after its k-th token: kept for scoring (`tdt_score`).
                const int k = srs[row * RS_FIELDS + RS_TOKENS];
                if (k < p.hist_capacity)
                    p.pred_hist[((long long)k * p.rows + row) * J + own.pred0 + j] = v;
            } else {
                v = first ? early_pred : __ldcg(item.pred);
            }
            value = v + item.enc;
        }
        const int o = own.pred0 + j;
        store_shared_value(out + (long long)row * J + o, tagged_joint_input(value, s.tag));
    }
}

// joint.pred(new top-layer h) for the rows that predict, the joint's input of every row (step
// `s`), and the top layer's new recurrent products from the same staged h.
__device__ void pred_phase(const TdtParams& p, const Owned& own, const int* srs, bf16_t* stage,
                           bf16_t* weights, float* y, const Biases& biases, const Cells& cells,
                           Use e, Use s) {
    const bf16_t* h_top = h_at(p, e, p.layers - 1);
    const unsigned want = e.tag ? H_WORD_TAG : 0u;
    for (int row0 = 0; row0 < p.rows; row0 += ROW_CHUNK) {
        const unsigned sel = step_predicting(srs, row0, p.rows);
        // The thread's first joint input item: its frame's projection and old pred_proj load
        // now, so their round trip overlaps the products.
        const bool has_early = (int)threadIdx.x < own.pred * ROW_CHUNK;
        JointItem early = {false, 0.0f, nullptr};
        float early_pred = 0.0f;
        if (has_early) {
            early = joint_item(p, own, srs, row0, threadIdx.x);
            if (early.active && !(sel >> (threadIdx.x % ROW_CHUNK) & 1))
                early_pred = __ldcg(early.pred);
        }
        if (sel != 0) {
            phase_products(p, own, PH_PRED, 0, weights, stage, sel, y, [&] {
                stage_tagged(stage, h_top, row0, sel, p.hidden, H_WORD_TAG, want);
            });
            store_recurrent(own, cells, p.layers - 1, y, own.pred, row0, sel);
        }
        joint_input_chunk(p, own, srs, row0, sel, y, biases, s, has_early ? &early : nullptr,
                          early_pred);
    }
}

// joint.out(joint input) for the active rows; per row, this block's best label and best
// duration output go to keys[row][block] (inactive rows: keys of no output), tagged for step s.
__device__ void joint_phase(const TdtParams& p, const Owned& own, const int* srs, bf16_t* stage,
                            bf16_t* weights, float* y, const Biases& biases, Use s,
                            unsigned long long* keys, unsigned step_tag) {
    const int J = p.joint_hidden;
    const bf16_t* in = joint_in_at(p, s);
    const unsigned want = s.tag ? JOINT_WORD_TAG : 0u;
    for (int row0 = 0; row0 < p.rows; row0 += ROW_CHUNK) {
        const unsigned sel = step_active(srs, row0, p.rows);
        if (sel != 0)
            phase_products(p, own, PH_JOINT, 0, weights, stage, sel, y, [&] {
                stage_tagged(stage, in, row0, sel, J, JOINT_WORD_TAG, want);
            });
        // KEY_LANES lanes per row (threads 0 .. ROW_CHUNK * KEY_LANES): lane q takes outputs q,
        // q + KEY_LANES, ...; the greatest key (greater value, then lower index) is the first
        // maximum.
        constexpr int KEY_LANES = 8;
        const int r = threadIdx.x / KEY_LANES, q = threadIdx.x % KEY_LANES, row = row0 + r;
        if (threadIdx.x >= ROW_CHUNK * KEY_LANES) continue;  // whole warps
        const unsigned lanes = 0xffu << (threadIdx.x & 31 & ~(KEY_LANES - 1));
        unsigned long long best_label = choice_key(0.0f, -1, step_tag), best_duration = best_label;
        if (row < p.rows && (sel >> r & 1)) {
            for (int j = q; j < own.joint; j += KEY_LANES) {
                const int o = own.joint0 + j;
                const float v = y[j * ROW_CHUNK + r] + biases.joint[j];
                if (o < p.n_classes)
                    best_label = max(best_label, choice_key(v, o, step_tag));
                else
                    best_duration = max(best_duration, choice_key(v, o - p.n_classes, step_tag));
            }
        }
#pragma unroll
        for (int offset = KEY_LANES / 2; offset > 0; offset >>= 1) {
            best_label = max(best_label, __shfl_xor_sync(lanes, best_label, offset));
            best_duration = max(best_duration, __shfl_xor_sync(lanes, best_duration, offset));
        }
        if (q != 0 || row >= p.rows) continue;
        unsigned long long* out = keys + (long long)row * gridDim.x + blockIdx.x;
        store_key(out, best_label);
        // Only the blocks that own duration outputs write (and are read for) the durations.
        if (own.joint > 0 && own.joint0 + own.joint - 1 >= p.n_classes)
            store_key(out + (long long)p.rows * gridDim.x, best_duration);
    }
}

// The greatest label key over every block's and duration key over the duration owners' for a
// row (`label_keys`: the row's keys of block 0 onwards; its duration keys `kind_stride` on), in
// every lane of a group of GROUP_LANES lanes (`lanes`: the group's mask). Each lane loads its
// keys all at once (one round trip for up to GROUP_LANES * LOAD_BATCH blocks) and loads again
// those whose tag is not yet the step's. The duration outputs (the last n_durations) are owned
// by the blocks from owner_of(n_out, n_classes) to owner_of(n_out, n_out - 1).
#define GROUP_LANES 16
__device__ int2 group_best(const TdtParams& p, const unsigned long long* label_keys,
                           long long kind_stride, unsigned lanes, unsigned tag) {
    constexpr int LOAD_BATCH = 10;  // 9 x 16 label keys (a whole H100 or H200) + a duration key
    const int lane = threadIdx.x % GROUP_LANES, blocks = gridDim.x;
    // Load j of this lane: label keys of blocks lane + 16 j while they last, then the duration
    // keys of outputs lane + 16 i.
    const int label_loads = (blocks - lane + GROUP_LANES - 1) / GROUP_LANES;
    const int first_owner = owner_of(p.n_out, p.n_classes);
    const int owners = owner_of(p.n_out, p.n_out - 1) + 1 - first_owner;
    const int duration_loads = (owners - lane + GROUP_LANES - 1) / GROUP_LANES;
    auto key_at = [&](int j) {
        if (j < label_loads) return label_keys + lane + j * GROUP_LANES;
        return label_keys + kind_stride + first_owner + lane + (j - label_loads) * GROUP_LANES;
    };
    unsigned long long best[2] = {0ull, 0ull};
    auto load = [&](const unsigned long long* at) {
        unsigned long long v;
        asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(at) : "memory");
        return v;
    };
    const int loads = label_loads + duration_loads;
    for (int base = 0; base < loads; base += LOAD_BATCH) {
        unsigned long long v[LOAD_BATCH];
        unsigned pending = 0;
#pragma unroll
        for (int j = 0; j < LOAD_BATCH; ++j) {
            if (base + j < loads) {
                pending |= 1u << j;
                v[j] = load(key_at(base + j));
            }
        }
        for (int spins = 0; pending != 0;) {
#pragma unroll
            for (int j = 0; j < LOAD_BATCH; ++j) {
                if ((pending >> j & 1) && (unsigned)(v[j] >> 16 & 0xffffu) == (tag & 0xffffu)) {
                    pending &= ~(1u << j);
                    const int kind = base + j < label_loads ? 0 : 1;
                    best[kind] = max(best[kind], v[j]);
                }
            }
            if (spins++ == SPIN_LIMIT) __trap();
#pragma unroll
            for (int j = 0; j < LOAD_BATCH; ++j)
                if (pending >> j & 1) v[j] = load(key_at(base + j));
        }
    }
#pragma unroll
    for (int kind = 0; kind < 2; ++kind)
        for (int offset = GROUP_LANES / 2; offset > 0; offset >>= 1)
            best[kind] = max(best[kind], __shfl_xor_sync(lanes, best[kind], offset));
    return make_int2(key_index(best[0]), key_index(best[1]));
}

// Every block: choose each active row's label and duration from the blocks' keys and move the row
// on (the CPU loop's rules) in its shared row state; block 0 also writes the tokens. A row that
// would exceed `token_capacity` stops emitting and is marked by RS_TOKENS = token_capacity + 1
// (the host reports it). Where a next step follows in this launch (`next`: its epoch), a row
// that will predict runs layer 0's cells of the owned units right away, from the lanes that
// chose its label: the first thing of the next step other blocks wait for.
__device__ void advance_phase(const TdtParams& p, const Owned& own, int* srs,
                              const unsigned long long* keys, unsigned step_tag,
                              const char* shared, const Cells& cells, const Use* next) {
    // A group of lanes per row: 24 rows in one pass.
    const int group = threadIdx.x / GROUP_LANES, lane = threadIdx.x % GROUP_LANES;
    const unsigned lanes = 0xffffu << (threadIdx.x & 31 & ~(GROUP_LANES - 1));
    for (int row = group; row < p.rows; row += blockDim.x / GROUP_LANES) {
        int* s = srs + row * RS_FIELDS;
        if (!row_active(s)) {
            if (lane == 0) s[RS_NEED_PREDICT] = 0;
            continue;
        }
        const int2 best = group_best(p, keys + (long long)row * gridDim.x,
                                     (long long)p.rows * gridDim.x, lanes, step_tag);
        // Every lane of the group works out the row's new state; lane 0 stores it.
        const int label = best.x, frames = s[RS_FRAMES], frame = s[RS_TIME];
        int duration = __ldg(p.durations + best.y);
        int tokens = s[RS_TOKENS], last_emit = s[RS_LAST_EMIT], emits = s[RS_EMITS];
        bool predict = false;
        const int blank = p.n_classes - 1;
        if (label == blank && duration == 0) duration = 1;
        int time = frame + duration;
        if (label != blank) {
            if (tokens >= p.token_capacity) {
                tokens = p.token_capacity + 1;
                time = frames;
            } else {
                if (blockIdx.x == 0 && lane == 0) {
                    int* t = p.tokens + ((long long)tokens * p.rows + row) * 3;
                    t[0] = label;
                    t[1] = frame;
                    t[2] = duration;
                }
                tokens += 1;
                if (last_emit == frame) {
                    emits += 1;
                } else {
                    last_emit = frame;
                    emits = 1;
                }
                predict = true;
                // After max_symbols labels at one frame, move on by one frame.
                if (time < frames && emits >= p.max_symbols && last_emit == time) time += 1;
            }
        }
        __syncwarp(lanes);  // every lane has read the old state
        if (lane == 0) {
            s[RS_TIME] = time;
            s[RS_TOKENS] = tokens;
            s[RS_LAST_EMIT] = last_emit;
            s[RS_EMITS] = emits;
            s[RS_NEED_PREDICT] = predict;
            if (predict) s[RS_LABEL] = label;
        }
        if (next != nullptr && predict && time < frames)
            for (int u = lane; u < own.units; u += GROUP_LANES)
                layer0_cell(p, own, shared, cells, *next, row, u, label);
    }
}

extern "C" __global__ __launch_bounds__(DEC_WARPS * 32, 1) void tdt_decode(const TdtParams p) {
    extern __shared__ float4 shared4[];
    char* shared = reinterpret_cast<char*>(shared4);
    bf16_t* stage = reinterpret_cast<bf16_t*>(shared);
    bf16_t* weights = reinterpret_cast<bf16_t*>(shared + p.shared_weights);
    float* y = reinterpret_cast<float*>(shared + p.shared_products);
    int* srs = reinterpret_cast<int*>(shared + p.shared_row_state);
    __shared__ int any_active, any_predicting;
    const Owned own = owned(p);
    const Biases biases = biases_at(reinterpret_cast<float*>(shared + p.shared_biases), p, own);
    const Cells cells = cells_at(shared, p, own);
#ifdef DEC_PROFILE
    unsigned long long profile[PROFILE_SLOTS] = {}, profile_last = global_ns();
    if (threadIdx.x == 0)
        for (auto& kind : sub_profile)
            for (auto& slot : kind) slot = 0;
#endif

    for (int i = threadIdx.x; i < p.rows * RS_FIELDS; i += blockDim.x) srs[i] = __ldcg(p.rs + i);
    const int first_step = __ldcg(p.ds + DS_STEPS);
    const unsigned clock = (unsigned)__ldcg(p.ds + DS_CLOCK);
    unsigned epoch = (unsigned)__ldcg(p.ds + DS_EPOCHS);
    load_biases(biases, p, own);
    move_cells(p, own, cells, true);
    load_x_table_slice(shared, p, own);
    if (p.piece_rows == 0) load_resident_weights(p, own, weights);  // ends with a block barrier
    __syncthreads();
    int step = 0;
    for (; step < p.max_steps; ++step) {
        if (threadIdx.x < 32) {
            unsigned active = 0, predicting = 0;
            for (int base = 0; base < p.rows; base += 32) {
                const int row = base + (int)threadIdx.x;
                const int* s = srs + row * RS_FIELDS;
                const bool a = row < p.rows && row_active(s);
                const unsigned am = __ballot_sync(0xffffffffu, a);
                const unsigned pm = __ballot_sync(0xffffffffu, a && s[RS_NEED_PREDICT]);
                active |= am;
                predicting |= pm;
                const int chunk = base / ROW_CHUNK + (int)threadIdx.x;
                if (threadIdx.x < 2 && chunk < MASK_CHUNKS) {
                    step_masks.active[chunk] = threadIdx.x ? am >> 16 : am & 0xffffu;
                    step_masks.predicting[chunk] = threadIdx.x ? pm >> 16 : pm & 0xffffu;
                }
            }
            if (threadIdx.x == 0) {
                any_active = active != 0;
                any_predicting = predicting != 0;
            }
        }
        __syncthreads();
        if (!any_active) break;  // the same in every block: their row states are equal
        const unsigned now = clock + (unsigned)step;
        const Use s = use_of(now);
        if (any_predicting) {
            const Use e = use_of(epoch++);
            layer0_cells(p, own, srs, shared, cells, e, step > 0);
            PROFILE_MARK(0);
            for (int l = 1; l < p.layers; ++l) {
                lstm_phase(p, own, l, srs, stage, weights, y, biases, cells, e);
                PROFILE_MARK(1);
            }
            pred_phase(p, own, srs, stage, weights, y, biases, cells, e, s);
            PROFILE_MARK(2);
        } else {
            for (int row0 = 0; row0 < p.rows; row0 += ROW_CHUNK)
                joint_input_chunk(p, own, srs, row0, 0u, y, biases, s, nullptr, 0.0f);
            PROFILE_MARK(3);
        }
        unsigned long long* keys = p.keys + (long long)s.half * 2 * p.rows * gridDim.x;
        joint_phase(p, own, srs, stage, weights, y, biases, s, keys, now >> 1);
        PROFILE_MARK(4);
        // The next step's epoch, if one follows in this launch (it predicts if any row does).
        const Use next = use_of(epoch);
        advance_phase(p, own, srs, keys, now >> 1, shared, cells,
                      step + 1 < p.max_steps ? &next : nullptr);
        __syncthreads();
        PROFILE_MARK(5);
    }
#ifdef DEC_PROFILE
    if (blockIdx.x == 0 && threadIdx.x == 0 && step > 0)
        printf("PROFILE steps=%d ns/step: layer0 %llu lstm %llu pred %llu joint-input %llu "
               "joint %llu advance %llu\n",
               step, profile[0] / step, profile[1] / step, profile[2] / step, profile[3] / step,
               profile[4] / step, profile[5] / step);
    if (blockIdx.x == 0 && threadIdx.x == 0 && step > 0)
        printf("PROFILE_SUB steps=%d ns/step staged/products: lstm %llu %llu pred %llu %llu "
               "joint %llu %llu\n",
               step, sub_profile[0][0] / step, sub_profile[0][1] / step, sub_profile[1][0] / step,
               sub_profile[1][1] / step, sub_profile[2][0] / step, sub_profile[2][1] / step);
#endif
    __syncthreads();  // every thread's cells are written
    move_cells(p, own, cells, false);
    if (blockIdx.x == 0) {
        for (int i = threadIdx.x; i < p.rows * RS_FIELDS; i += blockDim.x) p.rs[i] = srs[i];
        if (threadIdx.x == 0) {
            // Read by the next launch only: every block read them before its first exchange,
            // and block 0 got here past its last.
            p.ds[DS_STEPS] = first_step + step;
            p.ds[DS_CLOCK] = (int)(clock + (unsigned)step);
            p.ds[DS_EPOCHS] = (int)epoch;
        }
    }
}

// Zero state (c and the recurrent products of every layer; h = 0 is implied: the first step
// predicts every row, and W_hh 0 is the zero recurrent product), every used row feeds the
// start-of-sequence label first; rows >= batch are unused. Leaves the tagged buffers and the
// counters of ds that tag them alone: they stay consistent across decodes.
extern "C" __global__ void tdt_reset(int* rs, int* ds, const int* frames, const int* enc_rows,
                                     int batch, int rows, int blank, float* c, float* rec,
                                     long long state_len) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < state_len;
         i += (long long)gridDim.x * blockDim.x) {
        c[i] = 0.0f;
        reinterpret_cast<float4*>(rec)[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) ds[DS_STEPS] = 0;
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

// Scoring after decoding (model_core::scores): evaluation i is the joint at encoder row
// items[i].x of enc_proj with the prediction output at row items[i].y of pred_hist, and its
// value the log-softmax over the label outputs (vocabulary and blank) at label items[i].z.
// One block per SCORE_ITEMS evaluations: the joint inputs relu(pred + enc) in shared memory,
// warps take the label outputs in turn and lanes the hidden units, each lane of the first
// SCORE_ITEMS keeps one evaluation's running maximum and sum of exponentials over its warp's
// outputs, and the warps' are merged in warp order. Every sum runs in a fixed order, so an
// evaluation's value does not depend on the others in its block or launch.
#define SCORE_ITEMS 8
#define SCORE_THREADS 256
extern "C" __global__ __launch_bounds__(SCORE_THREADS) void tdt_score(
    const int4* items, int n_items, const float* enc_proj, const float* pred_hist,
    const bf16_t* out_w, const float* out_b, int joint_hidden, int n_classes, float* logprobs) {
    extern __shared__ float joint_input[];  // [SCORE_ITEMS][joint_hidden]
    __shared__ float warp_max_of[SCORE_THREADS / 32][SCORE_ITEMS];
    __shared__ float warp_sum_of[SCORE_THREADS / 32][SCORE_ITEMS];
    __shared__ float target_logit[SCORE_ITEMS];
    const int J = joint_hidden, first = blockIdx.x * SCORE_ITEMS;
    const int count = min(SCORE_ITEMS, n_items - first);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (int i = threadIdx.x; i < SCORE_ITEMS * J; i += blockDim.x) {
        const int item = i / J, k = i % J;
        float v = 0.0f;
        if (item < count) {
            const int4 it = items[first + item];
            v = pred_hist[(long long)it.y * J + k] + enc_proj[(long long)it.x * J + k];
            v = v > 0.0f ? v : 0.0f;
        }
        joint_input[i] = v;
    }
    if (threadIdx.x < SCORE_ITEMS) target_logit[threadIdx.x] = __int_as_float(0x7fc00000);
    const int target = lane < count ? items[first + lane].z : -1;
    __syncthreads();
    float running_max = -F32_INFINITY, running_sum = 0.0f;
    for (int o = warp; o < n_classes; o += warps) {
        float acc[SCORE_ITEMS];
#pragma unroll
        for (int i = 0; i < SCORE_ITEMS; ++i) acc[i] = 0.0f;
        const bf16_t* w = out_w + (long long)o * J;
        for (int k = lane; k < J; k += 32) {
            const float wk = bf16_to_f32(w[k]);
#pragma unroll
            for (int i = 0; i < SCORE_ITEMS; ++i) acc[i] = fmaf(joint_input[i * J + k], wk, acc[i]);
        }
        float logit = 0.0f;
#pragma unroll
        for (int i = 0; i < SCORE_ITEMS; ++i) {
            const float total = warp_sum(acc[i]) + out_b[o];
            if (lane == i) logit = total;
        }
        if (lane < SCORE_ITEMS) {
            if (logit > running_max) {
                running_sum = running_sum * expf(running_max - logit) + 1.0f;
                running_max = logit;
            } else {
                running_sum += expf(logit - running_max);
            }
            if (o == target) target_logit[lane] = logit;
        }
    }
    if (lane < SCORE_ITEMS) {
        warp_max_of[warp][lane] = running_max;
        warp_sum_of[warp][lane] = running_sum;
    }
    __syncthreads();
    if ((int)threadIdx.x < count) {
        const int i = threadIdx.x;
        float m = -F32_INFINITY;
        for (int w = 0; w < warps; ++w) m = fmaxf(m, warp_max_of[w][i]);
        float sum = 0.0f;
        for (int w = 0; w < warps; ++w)
            if (warp_sum_of[w][i] > 0.0f) sum += warp_sum_of[w][i] * expf(warp_max_of[w][i] - m);
        logprobs[first + i] = target_logit[i] - m - logf(sum);
    }
}
