/* Attention for small heads on a CPU: softmax(q k^T * scale + mask) v and its backward, fp32,
 * for head_dim <= MAX_HD and at most MAX_T keys. Built and loaded by small_head_kernel.py.
 *
 * Why: a CPU sweep point (head_dim 4 or 8, 64 positions) spends a quarter of its step in torch's
 * CPU flash-attention kernel, whose blocking is made for wide heads: ~475 us forward + backward
 * a layer at the bench's sweep point (7 x 3 heads x 64 x 4) on a 2-core AMX Xeon, for ~1 MFLOP.
 * With heads this narrow every product is a handful of multiply-adds per query-key pair, so the
 * loops here put L queries (16 with AVX-512, else 8) on the vector lanes instead: a score, a
 * probability or a gradient for one key is then one vector op for L queries, with no horizontal
 * sums in the forward.
 *
 * Forward, per (batch, head) and block of L queries: scores against every key the block sees
 * (four keys at a time, for independent dependency chains), the running max, then exp, the
 * sums and p v in a second pass. It saves the log-sum-exp per query (as flash attention does),
 * not the probabilities. Backward, per (batch, K/V head): for each block of queries, p is
 * recomputed from the log-sum-exp, ds = p (dp - rowsum(dy * y)); dq accumulates in registers,
 * dk and dv per key as L-lane vectors that are summed over the lanes once at the end.
 *
 * Masks: causal (query i sees keys 0..i, top-left aligned as SDPA's is_causal) and/or an
 * additive float mask read through its strides (0 strides broadcast). A query that sees no key
 * (every score -inf) gets y = 0 and no gradient. exp is inlined (a call to the vector math
 * library spills every vector register around it) and exact to ~1 ulp; below -87 it is 0.
 *
 * Threads: OpenMP over (batch, K/V head), on the libgomp that torch already loaded; the caller
 * passes torch.get_num_threads(). Returns 0, or 1 when a size is beyond MAX_HD / MAX_T or
 * scratch memory could not be had (nothing is written then that the caller keeps).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HD 16
#define MAX_T 256
/* queries per block: one vector of floats, 512-bit where the CPU has AVX-512, else 256-bit. With
 * 16 lanes in two of AVX2's 16 registers (AVX-512 has 32), the x86-64-v3 build's forward +
 * backward took 215-866 us at three sweep-point shapes, with 8 lanes 190-703 us (1.1-1.2x;
 * a 2-core Xeon, raw calls, 1 thread). */
#if defined(__AVX512F__)
#define L 16
#else
#define L 8
#endif
#define INLINE static inline __attribute__((always_inline))
#define LANES _Pragma("omp simd") for (int l = 0; l < L; l++)

/* dims: B, H, Hkv, Tq, Tk, hd, then 4 strides (in elements, [B, H, T, hd] order) per tensor */
enum { B_, H_, HKV_, TQ_, TK_, HD_, STRIDES_ };

typedef struct {
    int64_t b, h, g; /* batch, query head, its K/V head */
    int64_t tq, tk, heads, hd;
    int causal;
    float scale;
} unit_t;

INLINE const float *at(const float *x, const int64_t *s, int64_t b, int64_t h, int64_t t) {
    return x + b * s[0] + h * s[1] + t * s[2];
}

/* exp(z) for z <= 0: 2^n p(r), z = n ln2 + r, |r| <= ln2 / 2, p Cephes' expf polynomial; 0 below
 * -87 (and for -inf), where the true value is a denormal or less. n is rounded by adding and
 * taking away 1.5 * 2^23 (roundf itself is a library call unless math may be reassociated,
 * which the two-part ln2 below must not be). */
INLINE float exp_nonpos(float z) {
    const float zc = z < -87.0f ? -87.0f : z;
    const float n = (zc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = (zc - n * 0.693359375f) + n * 2.12194440e-4f;
    float p = 1.9875691500E-4f;
    p = p * r + 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return z < -87.0f ? 0.0f : p * two_n;
}

/* the keys a block of queries from i0 sees, and that count rounded up to a multiple of 4 (the
 * key loops' step; the rows past Tk are zero) */
INLINE int64_t keys_seen(const unit_t *u, int64_t i0) {
    return u->causal && i0 + L < u->tk ? i0 + L : u->tk;
}
INLINE int64_t in_fours(int64_t n) { return (n + 3) & ~(int64_t)3; }

/* K or V of one (batch, K/V head) as rows of hd, zero-padded to a multiple of 4 keys */
static void load_rows(const float *x, const int64_t *s, const unit_t *u, float *rows) {
    const float *base = at(x, s, u->b, u->g, 0);
    for (int64_t j = 0; j < u->tk; j++)
        for (int64_t d = 0; d < u->hd; d++) rows[j * u->hd + d] = base[j * s[2] + d * s[3]];
    memset(rows + u->tk * u->hd, 0, sizeof(float) * (in_fours(u->tk) - u->tk) * u->hd);
}

/* a [hd][L] block of a [B, H, T, hd] tensor: rows i0.. of head h, 0 past Tq, times mul */
INLINE void load_block(const float *x, const int64_t *s, const unit_t *u, int64_t i0, int64_t nl,
                       float mul, float (*out)[L]) {
    const float *base = at(x, s, u->b, u->h, i0);
    for (int64_t d = 0; d < u->hd; d++)
        for (int l = 0; l < L; l++) out[d][l] = l < nl ? base[l * s[2] + d * s[3]] * mul : 0.0f;
}

/* acc[k][l] += the dot product of lane l of xt [hd][L] with row j + k of rows, k < 4 (four
 * rows at a time: independent dependency chains) */
INLINE void add_dots4(const float (*xt)[L], const float *rows, int64_t j, float (*acc)[L],
                      const int64_t hd) {
    for (int64_t d = 0; d < hd; d++) {
        const float *rd = rows + j * hd + d;
        const float r0 = rd[0], r1 = rd[hd], r2 = rd[2 * hd], r3 = rd[3 * hd];
        LANES {
            acc[0][l] += xt[d][l] * r0;
            acc[1][l] += xt[d][l] * r1;
            acc[2][l] += xt[d][l] * r2;
            acc[3][l] += xt[d][l] * r3;
        }
    }
}

/* scores of the block's queries against keys j..j+3 (+ the mask), into sc[4][L] */
INLINE void scores4(const float (*qt)[L], const float *kr, const float *mask, const int64_t *ms,
                    const unit_t *u, int64_t i0, int64_t nl, int64_t j, int64_t jmax,
                    float (*sc)[L], const int64_t hd) {
    for (int k = 0; k < 4; k++) {
        if (mask && j + k < jmax) {
            const float *mj = at(mask, ms, u->b, u->h, i0) + (j + k) * ms[3];
            for (int l = 0; l < L; l++) sc[k][l] = l < nl ? mj[l * ms[2]] : 0.0f;
        } else {
            LANES sc[k][l] = 0.0f;
        }
    }
    add_dots4(qt, kr, j, sc, hd);
}

/* whether key j is hidden from lane l of the block at i0 (past the keys, or in its future) */
INLINE int hidden(const unit_t *u, int64_t i0, int l, int64_t j, int64_t jmax) {
    return j >= jmax || (u->causal && i0 + l < j);
}

INLINE void forward_block(const float *q, const float *mask, float *y, float *lse,
                          const int64_t *dims, const unit_t *u, int64_t i0, const float *kr,
                          const float *vr, const int64_t hd) {
    const int64_t *qs = dims + STRIDES_, *ms = dims + STRIDES_ + 12, *ys = dims + STRIDES_ + 16;
    const int64_t nl = u->tq - i0 < L ? u->tq - i0 : L, jmax = keys_seen(u, i0);
    float qt[MAX_HD][L], acc[MAX_HD][L], s[MAX_T][L], m[L], sum[L];
    load_block(q, qs, u, i0, nl, u->scale, qt);
    LANES m[l] = -INFINITY;
    for (int64_t j = 0; j < in_fours(jmax); j += 4) {
        float sc[4][L];
        scores4(qt, kr, mask, ms, u, i0, nl, j, jmax, sc, hd);
        for (int k = 0; k < 4; k++) {
            LANES {
                const float v = hidden(u, i0, l, j + k, jmax) ? -INFINITY : sc[k][l];
                s[j + k][l] = v;
                m[l] = v > m[l] ? v : m[l];
            }
        }
    }
    LANES {
        m[l] = m[l] == -INFINITY ? 0.0f : m[l]; /* no key seen: every exp below is 0 */
        sum[l] = 0.0f;
    }
    for (int64_t d = 0; d < hd; d++) {
        LANES acc[d][l] = 0.0f;
    }
    for (int64_t j = 0; j < in_fours(jmax); j += 2) {
        float e0[L], e1[L];
        LANES {
            e0[l] = exp_nonpos(s[j][l] - m[l]);
            e1[l] = exp_nonpos(s[j + 1][l] - m[l]);
            sum[l] += e0[l] + e1[l];
        }
        for (int64_t d = 0; d < hd; d++) {
            const float v0 = vr[j * hd + d], v1 = vr[(j + 1) * hd + d];
            LANES acc[d][l] += e0[l] * v0 + e1[l] * v1;
        }
    }
    float *yb = y + u->b * ys[0] + u->h * ys[1] + i0 * ys[2];
    float *lb = lse + (u->b * u->heads + u->h) * u->tq + i0;
    for (int l = 0; l < nl; l++) {
        const float inv = sum[l] > 0.0f ? 1.0f / sum[l] : 0.0f;
        for (int64_t d = 0; d < hd; d++) yb[l * ys[2] + d * ys[3]] = acc[d][l] * inv;
        lb[l] = sum[l] > 0.0f ? m[l] + logf(sum[l]) : INFINITY; /* +inf: p = 0 in backward */
    }
}

static unit_t unit_of(const int64_t *dims, int64_t index, int causal, float scale) {
    const unit_t u = {.b = index / dims[HKV_], .g = index % dims[HKV_], .tq = dims[TQ_],
                      .tk = dims[TK_], .heads = dims[H_], .hd = dims[HD_], .causal = causal,
                      .scale = scale};
    return u;
}

static int supported(const int64_t *dims) {
    return dims[HD_] >= 1 && dims[HD_] <= MAX_HD && dims[TK_] >= 1 && dims[TK_] <= MAX_T
           && dims[HKV_] >= 1 && dims[H_] % dims[HKV_] == 0;
}

/* the block loops with hd a constant where it is 4 or 8, the head sizes the model sends here
 * (unrolled, in registers; each constant adds about a second to the build) */
#define BY_HEAD_DIM(CALL)              \
    switch (u.hd) {                    \
    case 4: CALL(4); break;            \
    case 8: CALL(8); break;            \
    default: CALL(u.hd);               \
    }

/* q [B, H, Tq, hd], k and v [B, Hkv, Tk, hd], mask NULL or [B, H, Tq, Tk] (any strides);
 * writes y [B, H, Tq, hd] and lse [B, H, Tq] (contiguous). dims: B, H, Hkv, Tq, Tk, hd and
 * the strides of q, k, v, mask, y. */
int sha_forward(const float *q, const float *k, const float *v, const float *mask, float *y,
                float *lse, const int64_t *dims, int causal, float scale, int threads) {
    if (!supported(dims)) return 1;
    const int64_t units = dims[B_] * dims[HKV_], rep = dims[H_] / dims[HKV_];
#pragma omp parallel for schedule(static) num_threads(threads) if (units > 1 && threads > 1)
    for (int64_t index = 0; index < units; index++) {
        unit_t u = unit_of(dims, index, causal, scale);
        float kr[(MAX_T + 3) * MAX_HD], vr[(MAX_T + 3) * MAX_HD];
        load_rows(k, dims + STRIDES_ + 4, &u, kr);
        load_rows(v, dims + STRIDES_ + 8, &u, vr);
        for (u.h = u.g * rep; u.h < (u.g + 1) * rep; u.h++)
            for (int64_t i0 = 0; i0 < u.tq; i0 += L) {
#define FORWARD(HD) forward_block(q, mask, y, lse, dims, &u, i0, kr, vr, HD)
                BY_HEAD_DIM(FORWARD)
            }
    }
    return 0;
}

/* out[r] = the sum over the lanes of x[r], for rows a multiple of L: L rows at a time in
 * log2(L) rounds of pairwise shuffles and adds (a sum per row would take L - 1 dependent adds).
 * Round w sums lanes in groups of 2w: lane i of PAIRS(a, b, lo, w) holds a group of a or of b. */
typedef float vf __attribute__((vector_size(4 * L)));
typedef int32_t vi __attribute__((vector_size(4 * L)));
#define PAIRS(a, b, lo, w) (__builtin_shuffle(a, b, lo) + __builtin_shuffle(a, b, lo + w))

static void sum_lanes(const float (*x)[L], int64_t rows, float *out) {
#if L == 16
    const vi lo1 = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
    const vi lo2 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
    const vi lo4 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
    const vi lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
#else
    const vi lo1 = {0, 8, 2, 10, 4, 12, 6, 14};
    const vi lo2 = {0, 1, 8, 9, 4, 5, 12, 13};
    const vi lo4 = {0, 1, 2, 3, 8, 9, 10, 11};
#endif
    for (int64_t r = 0; r < rows; r += L) {
        vf v[L], w2[L / 2], w4[L / 4];
        memcpy(v, x + r, sizeof v);
        for (int i = 0; i < L / 2; i++) w2[i] = PAIRS(v[2 * i], v[2 * i + 1], lo1, 1);
        for (int i = 0; i < L / 4; i++) w4[i] = PAIRS(w2[2 * i], w2[2 * i + 1], lo2, 2);
#if L == 16
        vf w8[L / 8];
        for (int i = 0; i < L / 8; i++) w8[i] = PAIRS(w4[2 * i], w4[2 * i + 1], lo4, 4);
        const vf sums = PAIRS(w8[0], w8[1], lo8, 8);
#else
        const vf sums = PAIRS(w4[0], w4[1], lo4, 4);
#endif
        memcpy(out + r, &sums, sizeof sums);
    }
}

typedef struct {
    const float *dy, *q, *y, *lse, *mask;
    float *dq;
} grads_in_t;

/* acc[2 (j hd + d) + {0, 1}][L]: lane partial sums of dk and dv (side by side) */
INLINE void backward_block(const grads_in_t *t, const int64_t *dims, const unit_t *u, int64_t i0,
                           const float *kr, const float *vr, float (*acc)[L], float (*ps)[L],
                           float (*dss)[L], const int64_t hd) {
    const int64_t *gs = dims + STRIDES_, *qs = gs + 4, *yst = gs + 16, *ms = gs + 20, *dqs = gs + 24;
    const int64_t nl = u->tq - i0 < L ? u->tq - i0 : L, jmax = keys_seen(u, i0);
    float qt[MAX_HD][L], gt[MAX_HD][L], yt[MAX_HD][L], dqt[MAX_HD][L], c[L], li[L];
    load_block(t->q, qs, u, i0, nl, u->scale, qt);
    load_block(t->dy, gs, u, i0, nl, 1.0f, gt);
    load_block(t->y, yst, u, i0, nl, 1.0f, yt);
    const float *lb = t->lse + (u->b * u->heads + u->h) * u->tq + i0;
    for (int l = 0; l < L; l++) li[l] = l < nl ? lb[l] : INFINITY;
    LANES c[l] = 0.0f;
    for (int64_t d = 0; d < hd; d++) {
        LANES {
            c[l] += gt[d][l] * yt[d][l]; /* rowsum(dy * y) = sum_j p_j dp_j */
            dqt[d][l] = 0.0f;
        }
    }
    /* pass 1: p and ds for every key the block sees, four keys at a time */
    for (int64_t j = 0; j < in_fours(jmax); j += 4) {
        float sc[4][L], dp[4][L];
        scores4(qt, kr, t->mask, ms, u, i0, nl, j, jmax, sc, hd);
        for (int k = 0; k < 4; k++) {
            LANES dp[k][l] = 0.0f;
        }
        add_dots4(gt, vr, j, dp, hd); /* dp = dy . v */
        for (int k = 0; k < 4; k++) {
            LANES {
                const float e = exp_nonpos(sc[k][l] - li[l]);
                const float p = hidden(u, i0, l, j + k, jmax) ? 0.0f : e;
                ps[j + k][l] = p;
                dss[j + k][l] = p * (dp[k][l] - c[l]);
            }
        }
    }
    /* pass 2: dq (in registers), dk and dv (lane vectors a key) */
    for (int64_t j = 0; j < jmax; j++) {
        for (int64_t d = 0; d < hd; d++) {
            const float kd = kr[j * hd + d];
            float *dk = acc[2 * (j * hd + d)], *dv = acc[2 * (j * hd + d) + 1];
            LANES {
                dqt[d][l] += dss[j][l] * kd;
                dk[l] += dss[j][l] * qt[d][l];
                dv[l] += ps[j][l] * gt[d][l];
            }
        }
    }
    float *dqb = t->dq + u->b * dqs[0] + u->h * dqs[1] + i0 * dqs[2];
    for (int64_t d = 0; d < hd; d++)
        for (int l = 0; l < nl; l++) dqb[l * dqs[2] + d * dqs[3]] = dqt[d][l] * u->scale;
}

/* scratch for one thread in backward, 64-byte aligned: acc (zeroed per unit), ps, dss, sums */
typedef struct {
    float *mem;
    float (*acc)[L], (*ps)[L], (*dss)[L], *sums;
} scratch_t;

INLINE int64_t acc_rows(int64_t tk, int64_t hd) { return (2 * tk * hd + L - 1) / L * L; }

static scratch_t backward_scratch(int64_t tk, int64_t hd) {
    const size_t rows = (size_t)acc_rows(tk, hd), tiles = (size_t)MAX_T * L;
    const size_t bytes = (rows * L + 2 * tiles + rows) * sizeof(float);
    scratch_t s = {.mem = aligned_alloc(64, (bytes + 63) / 64 * 64)};
    if (s.mem) {
        s.acc = (float (*)[L])s.mem;
        s.ps = s.acc + rows;
        s.dss = s.ps + MAX_T;
        s.sums = (float *)(s.dss + MAX_T);
    }
    return s;
}

/* dy, y [B, H, Tq, hd] and lse from the forward; writes dq [B, H, Tq, hd] and dk, dv
 * [B, Hkv, Tk, hd]. dims: B, H, Hkv, Tq, Tk, hd and the strides of dy, q, k, v, y, mask, dq,
 * dk, dv. */
int sha_backward(const float *dy, const float *q, const float *k, const float *v, const float *y,
                 const float *lse, const float *mask, float *dq, float *dk, float *dv,
                 const int64_t *dims, int causal, float scale, int threads) {
    if (!supported(dims)) return 1;
    const int64_t units = dims[B_] * dims[HKV_], rep = dims[H_] / dims[HKV_];
    const int64_t rows = acc_rows(dims[TK_], dims[HD_]);
    const int64_t *ks = dims + STRIDES_ + 8, *vs = ks + 4, *dks = ks + 20, *dvs = ks + 24;
    const grads_in_t t = {dy, q, y, lse, mask, dq};
    int failed = 0;
#pragma omp parallel num_threads(threads) if (units > 1 && threads > 1) reduction(| : failed)
    {
        scratch_t s = backward_scratch(dims[TK_], dims[HD_]);
        failed = s.mem == NULL;
#pragma omp for schedule(static)
        for (int64_t index = 0; index < units; index++) {
            if (!s.mem) continue;
            unit_t u = unit_of(dims, index, causal, scale);
            float kr[(MAX_T + 3) * MAX_HD], vr[(MAX_T + 3) * MAX_HD];
            load_rows(k, ks, &u, kr);
            load_rows(v, vs, &u, vr);
            memset(s.acc, 0, sizeof(float) * rows * L);
            for (u.h = u.g * rep; u.h < (u.g + 1) * rep; u.h++)
                for (int64_t i0 = 0; i0 < u.tq; i0 += L) {
#define BACKWARD(HD) backward_block(&t, dims, &u, i0, kr, vr, s.acc, s.ps, s.dss, HD)
                    BY_HEAD_DIM(BACKWARD)
                }
            sum_lanes((const float (*)[L])s.acc, rows, s.sums);
            float *dkb = dk + u.b * dks[0] + u.g * dks[1], *dvb = dv + u.b * dvs[0] + u.g * dvs[1];
            for (int64_t j = 0; j < u.tk; j++)
                for (int64_t d = 0; d < u.hd; d++) {
                    dkb[j * dks[2] + d * dks[3]] = s.sums[2 * (j * u.hd + d)];
                    dvb[j * dvs[2] + d * dvs[3]] = s.sums[2 * (j * u.hd + d) + 1];
                }
        }
        free(s.mem);
    }
    return failed;
}
