// Relative-position multi-head attention in one kernel (bf16 storage, sm_80+ tensor cores):
// softmax(scale * ((q+u)K^T + rel_shift((q+v)P^T))) V per (batch, head), flash-style: key tiles
// stream through shared memory with an online softmax, so no score matrix is ever written.
//
// Inputs as the unfused path has them: q_u, q_v, k, v [heads, batch, time, HD] (q_u = q + u,
// q_v = q + v, rounded once); pos [positions, pos_row] the projected table, row c holding
// relative position time - 1 - c (head h at columns h * HD ...), so key j of query i uses row
// time - 1 - i + j. Output: out [batch, time, heads * HD] (heads merged). Query rows i >=
// lengths[b] get zeros; keys j >= lengths[b] are masked.
//
// A block covers BQ = 64 queries of one (head, batch) with 4 warps of 16 rows. Per key tile of
// BK = 64: K, V and the 127 table rows the tile's (i, j) pairs reach are staged by cp.async (all
// of a thread's copies in flight at once; the next tile's K and table load during this tile's
// P V, its V during its scores); each warp computes its 16 x 64 scores (q+u)K^T and its 16 x 80
// band of (q+v)P^T with mma.sync m16n8k16, shifts the band per row through shared memory, and
// folds the tile into its running max, sum and output. Every row's arithmetic depends only on
// its own utterance (key tiles start at 0 whatever the padding), so results do not depend on the
// batch.
//
// The bf16 encoder uses it for head_dim 128 on sm_80+ (tests/fused_attention.rs checks it against
// an f64 reference and for batch invariance). Before sm_80 (no bf16 mma) the kernel traps; its
// wrapper refuses such devices first.


#define FA_HD 128              // head dim (Parakeet TDT 0.6B: 1024 / 8 heads)
#define FA_BQ 64               // queries per block
#define FA_BK 64               // keys per tile
#define FA_WARPS 4             // 16 query rows each
#define FA_SD (FA_HD + 8)      // staged row stride in bf16 (16 bytes of padding: fewer bank conflicts)
#define FA_PROWS 128           // staged table rows: BQ + BK - 1, rounded up
#define FA_BAND 80             // a warp's band columns: 16 + BK - 1 = 79, rounded to n-tiles of 8
#define FA_KSTEPS (FA_HD / 16) // k-steps of the score products
#define FA_NT_S (FA_BK / 8)    // n-tiles of a warp's scores
#define FA_NT_O (FA_HD / 8)    // n-tiles of a warp's output
#ifndef FA_LDMATRIX
#define FA_LDMATRIX 1  // fragments by ldmatrix (0: element by element, the plain path)
#endif

// Dynamic shared memory: K, V [BK][SD], table rows [PROWS][SD] (bf16), then per warp the band
// [16][BAND] (f32). Two blocks fit on an SM; double-buffering the key tiles (one block per SM)
// measured slower.
#define FA_SHARED_BYTES \
    ((2 * FA_BK + FA_PROWS) * FA_SD * 2 + FA_WARPS * 16 * FA_BAND * 4)

#if __CUDA_ARCH__ >= 800

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    return (unsigned)f32_to_bf16(lo) | ((unsigned)f32_to_bf16(hi) << 16);
}

// Two consecutive bf16 at p (4-byte aligned) as one register.
__device__ __forceinline__ unsigned load_pair(const bf16_t* p) {
    return *reinterpret_cast<const unsigned*>(p);
}

// d += a * b for one 16x8x16 tile: a row-major 16x16 bf16, b column-major 16x8 bf16, d f32.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The B fragments of two output n-tiles of P V: V's staged rows key0 .. key0 + 15, columns
// dim0 .. dim0 + 15, transposed on the way (four 8x8 matrices: keys 0-7 and 8-15 of n-tile 0,
// then of n-tile 1). Lane l gives the address of row key0 + (l & 15), column dim0 + 8 (l >> 4).
__device__ __forceinline__ void load_v_fragments(unsigned (&b)[4], const bf16_t* vs, int key0,
                                                 int dim0) {
    const int lane = threadIdx.x & 31;
    const bf16_t* row = vs + (key0 + (lane & 15)) * FA_SD + dim0 + 8 * (lane >> 4);
    const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(addr)
                 : "memory");
}

// Starts copying `rows` rows of HD bf16 (global rows first_row + r of a [*, row_stride] matrix,
// valid for 0 <= first_row + r < limit, zeros otherwise; limit >= 1) to dst [rows][SD]. All of a
// thread's copies are in flight at once: one memory round trip per stage, not one per row.
__device__ __forceinline__ void stage_rows_bf16(bf16_t* dst, const bf16_t* src,
                                                long long row_stride, int first_row, int limit,
                                                int rows) {
    constexpr int packs = FA_HD / 8;
    for (int i = threadIdx.x; i < rows * packs; i += blockDim.x) {
        const int r = i / packs, p = i % packs, row = first_row + r;
        const bool valid = row >= 0 && row < limit;
        copy16_async(dst + r * FA_SD + p * 8, src + (valid ? row : 0) * row_stride + p * 8,
                     valid);
    }
}

// Starts staging K rows j0 .. of key tile j0 and the table rows its (i, j) pairs reach: from
// time - BQ - i0 + j0 (row x of the stage is relative position time - 1 - (time - BQ - i0 + j0 +
// x)).
__device__ __forceinline__ void stage_scores_operands(bf16_t* ks, bf16_t* ps, const bf16_t* k,
                                                      const bf16_t* pos_head, int pos_row,
                                                      int i0, int j0, int valid, int time) {
    stage_rows_bf16(ks, k, FA_HD, j0, valid, FA_BK);
    stage_rows_bf16(ps, pos_head, pos_row, time - FA_BQ - i0 + j0, 2 * time - 1, FA_PROWS);
}

// A fragments (16 rows x HD) of rows row0.. of q [time, HD]; rows >= time are zeros.
__device__ __forceinline__ void load_q(unsigned (&frag)[FA_KSTEPS][4], const bf16_t* q,
                                       int row0, int time) {
    const int lane = threadIdx.x & 31, g = lane >> 2, c = (lane & 3) * 2;
    const int r_lo = row0 + g, r_hi = row0 + g + 8;
#pragma unroll
    for (int kk = 0; kk < FA_KSTEPS; ++kk) {
        const int col = kk * 16 + c;
        frag[kk][0] = r_lo < time ? load_pair(q + (long long)r_lo * FA_HD + col) : 0u;
        frag[kk][1] = r_hi < time ? load_pair(q + (long long)r_hi * FA_HD + col) : 0u;
        frag[kk][2] = r_lo < time ? load_pair(q + (long long)r_lo * FA_HD + col + 8) : 0u;
        frag[kk][3] = r_hi < time ? load_pair(q + (long long)r_hi * FA_HD + col + 8) : 0u;
    }
}

// acc [16 x 8] += q-fragments x (8 staged rows starting at `rows`)^T over HD.
__device__ __forceinline__ void scores_tile(float (&acc)[4],
                                            const unsigned (&q)[FA_KSTEPS][4],
                                            const bf16_t* rows) {
    const int lane = threadIdx.x & 31;
#if FA_LDMATRIX
    // Per pair of k-steps one ldmatrix.x4: matrix m holds the 8 rows' dims 8m .. 8m + 7 of the
    // pair, lane l addresses row l & 7 of matrix l >> 3 (row stride 272 bytes: no bank
    // conflicts), and hands out exactly the B fragments of the two mma.
    const bf16_t* row = rows + (lane & 7) * FA_SD + 8 * (lane >> 3);
#pragma unroll
    for (int kk = 0; kk < FA_KSTEPS; kk += 2) {
        unsigned b[4];
        const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row + kk * 16));
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                     : "r"(addr)
                     : "memory");
        mma_bf16(acc, q[kk], b[0], b[1]);
        mma_bf16(acc, q[kk + 1], b[2], b[3]);
    }
#else
    const int g = lane >> 2, c = (lane & 3) * 2;
    const bf16_t* row = rows + g * FA_SD + c;
#pragma unroll
    for (int kk = 0; kk < FA_KSTEPS; ++kk)
        mma_bf16(acc, q[kk], load_pair(row + kk * 16), load_pair(row + kk * 16 + 8));
#endif
}

#endif  // __CUDA_ARCH__ >= 800

extern "C" __global__ __launch_bounds__(FA_WARPS * 32) void rel_pos_attention(
    const bf16_t* q_u, const bf16_t* q_v, const bf16_t* k, const bf16_t* v, const bf16_t* pos,
    int pos_row, const int* lengths, float scale, int batch, int time, int heads,
    bf16_t* out) {
#if __CUDA_ARCH__ < 800
    __trap();
#else
    extern __shared__ float4 fa_shared4[];
    bf16_t* ks = reinterpret_cast<bf16_t*>(fa_shared4);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = (lane & 3) * 2;
    float* band =
        reinterpret_cast<float*>(ks + (2 * FA_BK + FA_PROWS) * FA_SD) + warp * 16 * FA_BAND;

    const int hb = blockIdx.y, h = hb / batch, b = hb % batch;
    const int i0 = blockIdx.x * FA_BQ, iw = i0 + warp * 16;
    const int valid = min(max(lengths[b], 0), time);
    const long long head_off = (long long)hb * time * FA_HD;
    const int d_model = heads * FA_HD;

    unsigned qu[FA_KSTEPS][4], qv[FA_KSTEPS][4];
    load_q(qu, q_u + head_off, iw, time);
    load_q(qv, q_v + head_off, iw, time);

    float o[FA_NT_O][4];
#pragma unroll
    for (int n = 0; n < FA_NT_O; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    // Running max and sum of rows g and g + 8 (the quad's four lanes hold the same values).
    float m_lo = -F32_INFINITY, m_hi = -F32_INFINITY, l_lo = 0.0f, l_hi = 0.0f;

    // The block's queries past the utterance need no keys.
    const int key_end = i0 < valid ? valid : 0;
    const bf16_t* k_head = k + head_off;
    const bf16_t* v_head = v + head_off;
    const bf16_t* pos_head = pos + (long long)h * FA_HD;
    bf16_t* vs = ks + FA_BK * FA_SD;
    bf16_t* ps = vs + FA_BK * FA_SD;
    // Copy groups in flight, oldest first: K and table of tile t, V of tile t. K and table of
    // tile t + 1 load while tile t's P V runs, V of tile t + 1 while its scores run.
    if (key_end > 0) {
        stage_scores_operands(ks, ps, k_head, pos_head, pos_row, i0, 0, valid, time);
        commit_copies();
        stage_rows_bf16(vs, v_head, FA_HD, 0, valid, FA_BK);
        commit_copies();
    }
    for (int j0 = 0; j0 < key_end; j0 += FA_BK) {
        const bool next = j0 + FA_BK < key_end;
        wait_copies<1>();  // K and table of this tile have landed (V may still be in flight)
        __syncthreads();

        // (q+v)P^T over the warp's band: stage rows 48 - 16 * warp + x, x < BAND; row r,
        // key jj of the tile reads band column jj - r + 15.
        const bf16_t* warp_rows = ps + (48 - 16 * warp) * FA_SD;
#pragma unroll
        for (int n = 0; n < FA_BAND / 8; ++n) {
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            scores_tile(acc, qv, warp_rows + n * 8 * FA_SD);
            band[g * FA_BAND + n * 8 + c] = acc[0];
            band[g * FA_BAND + n * 8 + c + 1] = acc[1];
            band[(g + 8) * FA_BAND + n * 8 + c] = acc[2];
            band[(g + 8) * FA_BAND + n * 8 + c + 1] = acc[3];
        }
        __syncwarp();

        float s[FA_NT_S][4];
        float tile_lo = -F32_INFINITY, tile_hi = -F32_INFINITY;
#pragma unroll
        for (int n = 0; n < FA_NT_S; ++n) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
            scores_tile(s[n], qu, ks + n * 8 * FA_SD);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = g + (e >> 1) * 8, jj = n * 8 + c + (e & 1);
                const float score = (s[n][e] + band[r * FA_BAND + jj - r + 15]) * scale;
                s[n][e] = j0 + jj < valid ? score : -F32_INFINITY;
            }
            tile_lo = fmaxf(tile_lo, fmaxf(s[n][0], s[n][1]));
            tile_hi = fmaxf(tile_hi, fmaxf(s[n][2], s[n][3]));
        }
        // K, the table and the band are no longer read: the next tile's copies may start.
        __syncthreads();
        if (next)
            stage_scores_operands(ks, ps, k_head, pos_head, pos_row, i0, j0 + FA_BK, valid, time);
        commit_copies();
#pragma unroll
        for (int offset = 1; offset <= 2; offset <<= 1) {
            tile_lo = fmaxf(tile_lo, __shfl_xor_sync(0xffffffffu, tile_lo, offset));
            tile_hi = fmaxf(tile_hi, __shfl_xor_sync(0xffffffffu, tile_hi, offset));
        }
        // Key 0 of the first tile is valid, so the running max is finite from the first tile.
        const float new_lo = fmaxf(m_lo, tile_lo), new_hi = fmaxf(m_hi, tile_hi);
        const float keep_lo = expf(m_lo - new_lo), keep_hi = expf(m_hi - new_hi);
        m_lo = new_lo;
        m_hi = new_hi;
        float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
        for (int n = 0; n < FA_NT_S; ++n) {
            s[n][0] = expf(s[n][0] - m_lo);
            s[n][1] = expf(s[n][1] - m_lo);
            s[n][2] = expf(s[n][2] - m_hi);
            s[n][3] = expf(s[n][3] - m_hi);
            sum_lo += s[n][0] + s[n][1];
            sum_hi += s[n][2] + s[n][3];
        }
        l_lo = l_lo * keep_lo + sum_lo;  // this lane's part; the quad is summed at the end
        l_hi = l_hi * keep_hi + sum_hi;
#pragma unroll
        for (int n = 0; n < FA_NT_O; ++n) {
            o[n][0] *= keep_lo;
            o[n][1] *= keep_lo;
            o[n][2] *= keep_hi;
            o[n][3] *= keep_hi;
        }
        wait_copies<1>();  // V of this tile has landed
        __syncthreads();
        // O += P V: P's fragments are the score tiles 2t, 2t + 1 (keys 16t ..), rounded to bf16.
#pragma unroll
        for (int t = 0; t < FA_BK / 16; ++t) {
            const unsigned a[4] = {pack_bf16(s[2 * t][0], s[2 * t][1]),
                                   pack_bf16(s[2 * t][2], s[2 * t][3]),
                                   pack_bf16(s[2 * t + 1][0], s[2 * t + 1][1]),
                                   pack_bf16(s[2 * t + 1][2], s[2 * t + 1][3])};
#if FA_LDMATRIX
#pragma unroll
            for (int n = 0; n < FA_NT_O; n += 2) {
                unsigned b[4];
                load_v_fragments(b, vs, t * 16, n * 8);
                mma_bf16(o[n], a, b[0], b[1]);
                mma_bf16(o[n + 1], a, b[2], b[3]);
            }
#else
            const bf16_t* key_row = vs + (t * 16 + c) * FA_SD;
#pragma unroll
            for (int n = 0; n < FA_NT_O; ++n) {
                const int dim = n * 8 + g;
                const unsigned b0 = (unsigned)key_row[dim] | ((unsigned)key_row[FA_SD + dim] << 16);
                const unsigned b1 = (unsigned)key_row[8 * FA_SD + dim] |
                                    ((unsigned)key_row[9 * FA_SD + dim] << 16);
                mma_bf16(o[n], a, b0, b1);
            }
#endif
        }
        __syncthreads();  // V is no longer read
        if (next) stage_rows_bf16(vs, v_head, FA_HD, j0 + FA_BK, valid, FA_BK);
        commit_copies();
    }

#pragma unroll
    for (int offset = 1; offset <= 2; offset <<= 1) {
        l_lo += __shfl_xor_sync(0xffffffffu, l_lo, offset);
        l_hi += __shfl_xor_sync(0xffffffffu, l_hi, offset);
    }
    const int r_lo = iw + g, r_hi = iw + g + 8;
    const float inv_lo = r_lo < valid ? 1.0f / l_lo : 0.0f;
    const float inv_hi = r_hi < valid ? 1.0f / l_hi : 0.0f;
#pragma unroll
    for (int n = 0; n < FA_NT_O; ++n) {
        const int col = h * FA_HD + n * 8 + c;
        if (r_lo < time)
            *reinterpret_cast<unsigned*>(out + ((long long)b * time + r_lo) * d_model + col) =
                pack_bf16(o[n][0] * inv_lo, o[n][1] * inv_lo);
        if (r_hi < time)
            *reinterpret_cast<unsigned*>(out + ((long long)b * time + r_hi) * d_model + col) =
                pack_bf16(o[n][2] * inv_hi, o[n][3] * inv_hi);
    }
#endif
}
