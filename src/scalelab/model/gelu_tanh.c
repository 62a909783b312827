/* The tanh-approximate GELU (GPT-2's, scalelab's mlp: gelu) and its gradient, one pass each,
 * for fp32 and bf16 tensors on a CPU. Built and loaded by fast_gelu.py.
 *
 * Why: torch's CPU kernel for approximate="tanh" runs its tanh through a slow vector path; on
 * the bench's hosts it took 2.5-4x the time of the exact (erf) GELU, ~15 % of a shakespeare_char
 * step in forward + backward. The same function written as x * sigmoid(2u), with
 * u = sqrt(2/pi) (x + 0.044715 x^3), needs one exp, which glibc's vector math library (libmvec)
 * provides per SIMD lane.
 *
 * Values: 0.5 x (1 + tanh u) = x / (1 + exp(-2u)) exactly; in floats the two agree to a few
 * ulp (and this form keeps the small negative tail without the cancellation of 1 + tanh u).
 * exp's argument is clamped to [-80, 80]: libmvec takes a scalar path for every lane whose exp
 * over- or underflows (|2u| > ~87, i.e. |x| > ~10), which made the kernel 10x slower on inputs
 * drawn from N(0, 10); at the clamp the result is x to within 2e-35 relative, or below
 * 2e-35 |x|, where the exact one is smaller still. NaN propagates; x = -inf gives -inf
 * (torch's form gives NaN). bf16 is computed in fp32 and rounded to nearest even once, as
 * torch's bf16 kernels do.
 *
 * Threads: OpenMP, linked at load time against the libgomp that torch already loaded (same
 * soname), so these loops run on torch's own thread pool. The caller passes the count
 * (torch.get_num_threads()): torch keeps its own and does not set OpenMP's default, which is
 * every core, too many for a sweep's one-thread processes.
 */
#include <stdint.h>
#include <string.h>

/* libmvec's SIMD variants of expf, declared as glibc does under -ffast-math, without the rest of
 * fast-math's assumptions (no NaN or inf), which would break the special values above. */
#pragma omp declare simd notinbranch
float expf(float);

#define TWO_C 1.5957691216057308f          /* 2 sqrt(2/pi) */
#define TWO_C_K 0.0713548162726008f        /* 2 sqrt(2/pi) 0.044715 */
#define PARALLEL_FROM 32768                /* below this, one thread: a fork costs more */
/* "parallel:" — a bare if() would also turn off the simd part of the construct below it */
#define LOOP _Pragma("omp parallel for simd schedule(static) num_threads(threads) if (parallel: n >= PARALLEL_FROM)")

static inline float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* quiet NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(bits >> 16);
}

/* exp(80) = 5.5e34: no lane over- or underflows. A variable, not a constant: with a constant
 * bound GCC rewrites exp(clamp(z)) as a blend of exp(z) with exp(+-bound), which hands the
 * vector exp the unclamped arguments again (and took a sweep point's step from 1.00x to 0.97x
 * the reference's). */
float gelu_tanh_exp_limit = 80.0f;

/* 1 + exp(-z), z = 2u, with z clamped to +-lim (a NaN passes through: both tests are false) */
static inline float one_plus_exp_minus(float z, float lim) {
    z = z < -lim ? -lim : z;
    z = z > lim ? lim : z;
    return 1.0f + expf(-z);
}

static inline float gelu(float x, float lim) {
    return x / one_plus_exp_minus(x * (TWO_C + TWO_C_K * x * x), lim);
}

/* d/dx x s(z) = s + x s (1 - s) z'(x), s = sigmoid(z), z = 2u */
static inline float gelu_grad(float g, float x, float lim) {
    float x2 = x * x;
    float s = 1.0f / one_plus_exp_minus(x * (TWO_C + TWO_C_K * x2), lim);
    return g * (s + x * s * (1.0f - s) * (TWO_C + 3.0f * TWO_C_K * x2));
}

void gelu_tanh_f32(const float *x, float *y, int64_t n, int threads) {
    const float lim = gelu_tanh_exp_limit;
LOOP
    for (int64_t i = 0; i < n; i++) y[i] = gelu(x[i], lim);
}

void gelu_tanh_backward_f32(const float *g, const float *x, float *dx, int64_t n, int threads) {
    const float lim = gelu_tanh_exp_limit;
LOOP
    for (int64_t i = 0; i < n; i++) dx[i] = gelu_grad(g[i], x[i], lim);
}

void gelu_tanh_bf16(const uint16_t *x, uint16_t *y, int64_t n, int threads) {
    const float lim = gelu_tanh_exp_limit;
LOOP
    for (int64_t i = 0; i < n; i++) y[i] = f32_to_bf16(gelu(bf16_to_f32(x[i]), lim));
}

void gelu_tanh_backward_bf16(const uint16_t *g, const uint16_t *x, uint16_t *dx, int64_t n, int threads) {
    const float lim = gelu_tanh_exp_limit;
LOOP
    for (int64_t i = 0; i < n; i++) dx[i] = f32_to_bf16(gelu_grad(bf16_to_f32(g[i]), bf16_to_f32(x[i]), lim));
}
