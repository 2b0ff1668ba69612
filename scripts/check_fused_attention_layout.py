"""Lane-level emulation of worker/cuda/kernels/fused_attention.cu for one (batch, head), run on
the CPU: every lane's fragment loads, mma through the PTX m16n8k16 fragment layouts, the band
shift, masks, online softmax and output stores, compared with a direct reference. It checks the
kernel's indexing, not its rounding (f64 throughout), and must be kept in step with the kernel
by hand. `python3 scripts/check_fused_attention_layout.py`: every line must show max |err|
~1e-15 and NaN 0."""
import numpy as np

HD, BQ, BK, WARPS, PROWS, BAND = 128, 64, 64, 4, 128, 80
KSTEPS, NT_S, NT_O = HD // 16, BK // 8, HD // 8


def lane_gc(lane):
    return lane >> 2, (lane & 3) * 2


def mma(a_frags, b_frags, d_frags):
    """a_frags[lane] = 4 pairs, b_frags[lane] = 2 pairs, d_frags[lane] = 4 floats (in place)."""
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for lane in range(32):
        g, c = lane_gc(lane)
        a = a_frags[lane]
        A[g, c:c + 2] = a[0]; A[g + 8, c:c + 2] = a[1]
        A[g, c + 8:c + 10] = a[2]; A[g + 8, c + 8:c + 10] = a[3]
        b = b_frags[lane]
        B[c:c + 2, g] = b[0]; B[c + 8:c + 10, g] = b[1]
    D = A @ B
    for lane in range(32):
        g, c = lane_gc(lane)
        d = d_frags[lane]
        d[0] += D[g, c]; d[1] += D[g, c + 1]; d[2] += D[g + 8, c]; d[3] += D[g + 8, c + 1]


def ldmatrix_x4_trans(smem, address):
    """ldmatrix.m8n8.x4.trans.b16: lanes 8m..8m+7 give the rows (row, col) of matrix m; lane t
    receives, from each matrix, (M[c][g], M[c + 1][g]) with g = t / 4, c = 2 (t % 4)."""
    mats = []
    for m in range(4):
        rows = [address(8 * m + r) for r in range(8)]
        mats.append(np.array([smem[row, col:col + 8] for row, col in rows]))
    out = []
    for lane in range(32):
        g, c = lane_gc(lane)
        out.append([np.array([M[c, g], M[c + 1, g]]) for M in mats])
    return out


def load_q(q, row0, time):
    frags = []
    for lane in range(32):
        g, c = lane_gc(lane)
        f = []
        for kk in range(KSTEPS):
            col = kk * 16 + c
            row = lambda r, cc: q[r, cc:cc + 2] if r < time else np.zeros(2)
            f.append([row(row0 + g, col), row(row0 + g + 8, col), row(row0 + g, col + 8),
                      row(row0 + g + 8, col + 8)])
        frags.append(f)
    return frags


def scores_tile(acc, qfr, rows):  # rows: staged [8+, HD] starting at the tile's first row
    for kk in range(KSTEPS):
        a = [qfr[lane][kk] for lane in range(32)]
        b = []
        for lane in range(32):
            g, c = lane_gc(lane)
            b.append([rows[g, kk * 16 + c:kk * 16 + c + 2], rows[g, kk * 16 + c + 8:kk * 16 + c + 10]])
        mma(a, b, acc)


def kernel(q_u, q_v, k, v, pos, time, valid, scale):
    out = np.full((time, HD), np.nan)
    for i0 in range(0, time, BQ):
        key_end = valid if i0 < valid else 0
        for warp in range(WARPS):
            iw = i0 + 16 * warp
            qu, qv = load_q(q_u, iw, time), load_q(q_v, iw, time)
            o = [[[0.0] * 4 for _ in range(NT_O)] for _ in range(32)]
            m_lo = [-np.inf] * 32; m_hi = [-np.inf] * 32; l_lo = [0.0] * 32; l_hi = [0.0] * 32
            for j0 in range(0, key_end, BK):
                ks = np.array([k[j0 + r] if j0 + r < valid else np.zeros(HD) for r in range(BK)])
                vs = np.array([v[j0 + r] if j0 + r < valid else np.zeros(HD) for r in range(BK)])
                first = time - BQ - i0 + j0
                ps = np.array([pos[first + x] if 0 <= first + x < 2 * time - 1 else np.zeros(HD)
                               for x in range(PROWS)])
                warp_rows = ps[48 - 16 * warp:]
                band = np.full((16, BAND), np.nan)
                for n in range(BAND // 8):
                    acc = [[0.0] * 4 for _ in range(32)]
                    scores_tile(acc, qv, warp_rows[n * 8:])
                    for lane in range(32):
                        g, c = lane_gc(lane)
                        band[g, n * 8 + c] = acc[lane][0]; band[g, n * 8 + c + 1] = acc[lane][1]
                        band[g + 8, n * 8 + c] = acc[lane][2]; band[g + 8, n * 8 + c + 1] = acc[lane][3]
                s = [[[0.0] * 4 for _ in range(NT_S)] for _ in range(32)]
                for n in range(NT_S):
                    acc = [s[lane][n] for lane in range(32)]
                    scores_tile(acc, qu, ks[n * 8:])
                    for lane in range(32):
                        g, c = lane_gc(lane)
                        for e in range(4):
                            r = g + (e >> 1) * 8; jj = n * 8 + c + (e & 1)
                            score = (s[lane][n][e] + band[r, jj - r + 15]) * scale
                            s[lane][n][e] = score if j0 + jj < valid else -np.inf
                # quad max
                tl = [max(max(s[l][n][0], s[l][n][1]) for n in range(NT_S)) for l in range(32)]
                th = [max(max(s[l][n][2], s[l][n][3]) for n in range(NT_S)) for l in range(32)]
                tl = [max(tl[(l & ~3) + q] for q in range(4)) for l in range(32)]
                th = [max(th[(l & ~3) + q] for q in range(4)) for l in range(32)]
                for l in range(32):
                    nl, nh = max(m_lo[l], tl[l]), max(m_hi[l], th[l])
                    kl, kh = np.exp(m_lo[l] - nl), np.exp(m_hi[l] - nh)
                    m_lo[l], m_hi[l] = nl, nh
                    sl = sh = 0.0
                    for n in range(NT_S):
                        s[l][n][0] = np.exp(s[l][n][0] - nl); s[l][n][1] = np.exp(s[l][n][1] - nl)
                        s[l][n][2] = np.exp(s[l][n][2] - nh); s[l][n][3] = np.exp(s[l][n][3] - nh)
                        sl += s[l][n][0] + s[l][n][1]; sh += s[l][n][2] + s[l][n][3]
                    l_lo[l] = l_lo[l] * kl + sl; l_hi[l] = l_hi[l] * kh + sh
                    for n in range(NT_O):
                        o[l][n][0] *= kl; o[l][n][1] *= kl; o[l][n][2] *= kh; o[l][n][3] *= kh
                for t in range(BK // 16):
                    a = [[np.array(s[l][2 * t][0:2]), np.array(s[l][2 * t][2:4]),
                          np.array(s[l][2 * t + 1][0:2]), np.array(s[l][2 * t + 1][2:4])]
                         for l in range(32)]
                    for n in range(0, NT_O, 2):
                        frags = ldmatrix_x4_trans(vs, lambda l: (t * 16 + (l & 15), n * 8 + 8 * (l >> 4)))
                        mma(a, [[f[0], f[1]] for f in frags], [o[l][n] for l in range(32)])
                        mma(a, [[f[2], f[3]] for f in frags], [o[l][n + 1] for l in range(32)])
            ll = [sum(l_lo[(l & ~3) + q] for q in range(4)) for l in range(32)]
            lh = [sum(l_hi[(l & ~3) + q] for q in range(4)) for l in range(32)]
            for l in range(32):
                g, c = lane_gc(l)
                rl, rh = iw + g, iw + g + 8
                il = 1.0 / ll[l] if rl < valid else 0.0
                ih = 1.0 / lh[l] if rh < valid else 0.0
                for n in range(NT_O):
                    col = n * 8 + c
                    if rl < time:
                        out[rl, col] = o[l][n][0] * il; out[rl, col + 1] = o[l][n][1] * il
                    if rh < time:
                        out[rh, col] = o[l][n][2] * ih; out[rh, col + 1] = o[l][n][3] * ih
    return out


def reference(q_u, q_v, k, v, pos, time, valid, scale):
    out = np.zeros((time, HD))
    for i in range(valid):
        sc = np.array([scale * (q_u[i] @ k[j] + q_v[i] @ pos[time - 1 - i + j]) for j in range(valid)])
        w = np.exp(sc - sc.max()); w /= w.sum()
        out[i] = w @ v[:valid]
    return out


rng = np.random.default_rng(1)
for time, valid in [(1, 1), (17, 5), (70, 70), (130, 77), (65, 64), (130, 0), (200, 190), (64, 1), (129, 129)]:
    q_u, q_v, k, v = (rng.standard_normal((time, HD)) for _ in range(4))
    pos = rng.standard_normal((2 * time - 1, HD))
    scale = HD ** -0.5
    got = kernel(q_u, q_v, k, v, pos, time, valid, scale)
    want = reference(q_u, q_v, k, v, pos, time, valid, scale)
    err = np.nanmax(np.abs(got - want)) if time else 0
    print(f"time {time} valid {valid}: max |err| {err:.2e}, NaN {np.isnan(got).sum()}")
