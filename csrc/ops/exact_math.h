/* narrowmm: elementary functions with the same bits on every CPU and compiler.
 *
 * The model ops (attention's softmax, SiLU) need exp. The C library's expf is not the same
 * function everywhere (glibc picks an FMA variant at load time; other libms round
 * differently) and vector libraries differ from their scalar tails. This one uses only IEEE
 * double +, -, *, / and integer operations on the bits, each exact or correctly rounded,
 * with contraction off (CMake's -ffp-contract=off): every build on every CPU computes the
 * same double, and rounding it to float32 gives the same float. Accuracy: relative error below 2e-16 before the final
 * rounding, so nm_expf is correctly rounded except for float results within about 2e-16 of a
 * rounding boundary (none found against a correctly rounded exp on the float32 inputs
 * tested in tests/test_model_ops.py). */
#ifndef NM_EXACT_MATH_H
#define NM_EXACT_MATH_H

#include <math.h>
#include <stdint.h>

/* e^x in double: x = k ln2 + r with k the integer nearest x / ln2 (ties to even) and
 * |r| <= ln2 / 2 + 2^-40, e^r by its Taylor series to r^12 (the first term left out is
 * below 2e-16 relative), then the exact scaling by 2^k as two powers of two in the normal
 * range (so a subnormal result is rounded once). x is first clamped to [-746, 710], beyond
 * which e^x is 0 or inf in double; NaN stays NaN. k comes from the bits of
 * x / ln2 + 1.5 * 2^52. Written once as a macro over a lane type so that the scalar code and
 * the two-lane vector code (GNU C vector extensions, SSE2 or Advanced SIMD: no intrinsics)
 * perform the same IEEE operations on every element. */
#define NM_EXP_C12 (1.0 / 479001600.0) /* 1/12!: the caller starts p there */
#define NM_EXP_POLY(p, r)                                                                    \
    do {                                                                                     \
        p = p * r + 1.0 / 39916800.0;                                                        \
        p = p * r + 1.0 / 3628800.0;                                                         \
        p = p * r + 1.0 / 362880.0;                                                          \
        p = p * r + 1.0 / 40320.0;                                                           \
        p = p * r + 1.0 / 5040.0;                                                            \
        p = p * r + 1.0 / 720.0;                                                             \
        p = p * r + 1.0 / 120.0;                                                             \
        p = p * r + 1.0 / 24.0;                                                              \
        p = p * r + 1.0 / 6.0;                                                               \
        p = p * r + 0.5;                                                                     \
        p = p * r + 1.0;                                                                     \
        p = p * r + 1.0;                                                                     \
    } while (0)

#define NM_EXP_SHIFTER 6755399441055744.0 /* 1.5 * 2^52 */
#define NM_LN2_HI 6.93147180369123816490e-01 /* k * LN2_HI is exact for |k| < 2^11 */
#define NM_LN2_LO 1.90821492927058770002e-10
#define NM_INV_LN2 1.4426950408889634

static inline double nm_bits_to_double(int64_t i) {
    union { int64_t i; double d; } u = {i};
    return u.d;
}

static inline int64_t nm_double_to_bits(double d) {
    union { double d; int64_t i; } u = {d};
    return u.i;
}

static inline double nm_exp_d(double x) {
    if (x != x) return x;
    const double xc = x < -746.0 ? -746.0 : x > 710.0 ? 710.0 : x;
    const double t = xc * NM_INV_LN2 + NM_EXP_SHIFTER; /* two roundings: contraction off */
    const double k = t - NM_EXP_SHIFTER;
    const int64_t kk = nm_double_to_bits(t) - nm_double_to_bits(NM_EXP_SHIFTER) + 2048;
    const int64_t k1 = kk >> 1, k2 = kk - k1; /* 2^k = 2^(k1 - 1024) * 2^(k2 - 1024) */
    const double r = (xc - k * NM_LN2_HI) - k * NM_LN2_LO;
    double p = NM_EXP_C12;
    NM_EXP_POLY(p, r);
    return (p * nm_bits_to_double((k1 - 1) << 52)) * nm_bits_to_double((k2 - 1) << 52);
}

/* e^x for float32 x, rounded once from nm_exp_d. */
static inline float nm_expf(float x) { return (float)nm_exp_d((double)x); }

/* SiLU, x * sigmoid(x) = x / (1 + e^-x), computed in double and rounded once. */
static inline float nm_silu_value(float x) {
    const double xd = (double)x;
    return (float)(xd / (1.0 + nm_exp_d(-xd)));
}

#if defined(__GNUC__)
#define NM_HAVE_VECTOR_EXP 1

/* nm_exp_d on the lanes of a GNU C vector type (VD doubles, VI and VU 64-bit integers of the
 * same width): the same operations, selections done with masks. One body for every width,
 * so the two-lane version below and the ISA rows' wider ones (kernels/<isa>/, compiled with
 * their flags) perform the same IEEE operations on every element. */
#define NM_DEFINE_VECTOR_EXP(NAME, VD, VI, VU)                                               \
    static inline VD NAME(VD x) {                                                            \
        const VD zero = {0}, lo = zero - 746.0, hi = zero + 710.0;                          \
        const VD shifter = zero + NM_EXP_SHIFTER;                                           \
        const VI below = x < lo, above = x > hi, nan = x != x;                              \
        VD xc = (VD)(((VI)x & ~below) | ((VI)lo & below));                                  \
        xc = (VD)(((VI)xc & ~above) | ((VI)hi & above));                                    \
        xc = (VD)((VI)xc & ~nan); /* a NaN lane computes on 0 and is put back below */      \
        const VD t = xc * NM_INV_LN2 + shifter;                                             \
        const VD k = t - shifter;                                                           \
        /* k + 2048 is positive: an unsigned shift (SSE2 has no 64-bit arithmetic one) */   \
        const VU kk = (VU)t - (VU)shifter + 2048;                                           \
        const VU k1 = kk >> 1, k2 = kk - k1;                                                \
        const VD r = (xc - k * NM_LN2_HI) - k * NM_LN2_LO;                                  \
        VD p = zero + NM_EXP_C12;                                                           \
        NM_EXP_POLY(p, r);                                                                  \
        const VD e = (p * (VD)((k1 - 1) << 52)) * (VD)((k2 - 1) << 52);                     \
        return (VD)(((VI)e & ~nan) | ((VI)x & nan));                                        \
    }

/* y[i] = F(x[i]) for i < n, y may be x, F a function of one float computed in double and
 * rounded once: four vectors of LANES a step (VOP on each, the VD version of F), independent
 * chains that hide the polynomial's latency; the rest one at a time (SOP, its scalar one). */
#define NM_DEFINE_DOUBLE_LANES_ARRAY_(NAME, VD, LANES, VOP, SOP)                             \
    static inline void NAME(int64_t n, const float *x, float *y) {                          \
        int64_t i = 0;                                                                       \
        for (; i + 4 * (LANES) <= n; i += 4 * (LANES)) {                                     \
            VD v[4];                                                                         \
            for (int j = 0; j < 4; ++j) {                                                    \
                VD w = {0};                                                                  \
                for (int l = 0; l < (LANES); ++l) w[l] = (double)x[i + j * (LANES) + l];     \
                v[j] = w;                                                                    \
            }                                                                                \
            for (int j = 0; j < 4; ++j) v[j] = VOP(v[j]);                                    \
            for (int j = 0; j < 4; ++j)                                                      \
                for (int l = 0; l < (LANES); ++l) y[i + j * (LANES) + l] = (float)v[j][l];   \
        }                                                                                    \
        for (; i < n; ++i) y[i] = SOP(x[i]);                                                 \
    }

/* y[i] = x[i] / (1 + e^-x[i]) (SiLU, nm_silu_value) for i < n, y may be x. EXP is an
 * NM_DEFINE_VECTOR_EXP function on VD. */
#define NM_DEFINE_SILU_ARRAY(NAME, VD, LANES, EXP)                                           \
    static inline VD NAME##_lanes_(VD v) { return v / (((VD){0} + 1.0) + EXP(-v)); }         \
    NM_DEFINE_DOUBLE_LANES_ARRAY_(NAME, VD, LANES, NAME##_lanes_, nm_silu_value)

/* y[i] = nm_expf(x[i]) for i < n, y may be x: softmax's exps, the same way. */
#define NM_DEFINE_EXPF_ARRAY(NAME, VD, LANES, EXP)                                           \
    NM_DEFINE_DOUBLE_LANES_ARRAY_(NAME, VD, LANES, EXP, nm_expf)

typedef double nm_v2d __attribute__((vector_size(16)));
typedef int64_t nm_v2i __attribute__((vector_size(16)));
typedef uint64_t nm_v2u __attribute__((vector_size(16)));
NM_DEFINE_VECTOR_EXP(nm_exp_v2d, nm_v2d, nm_v2i, nm_v2u)
#endif

/* y[i] = nm_expf(x[i]) for i < n (y may be x), two lanes at a time: the portable rows'
 * softmax exps (the SIMD rows have wider copies of the same operations:
 * nm_isa_kernels.expf). */
#if defined(NM_HAVE_VECTOR_EXP)
NM_DEFINE_EXPF_ARRAY(nm_expf_array, nm_v2d, 2, nm_exp_v2d)
#else
static inline void nm_expf_array(int64_t n, const float *x, float *y) {
    for (int64_t i = 0; i < n; ++i) y[i] = nm_expf(x[i]);
}
#endif

/* y[i] = nm_silu_value(x[i]) for i < n (y may be x), two lanes at a time: the portable
 * rows' SiLU (the SIMD rows have wider copies of the same operations: nm_isa_kernels.silu). */
#if defined(NM_HAVE_VECTOR_EXP)
NM_DEFINE_SILU_ARRAY(nm_silu_array, nm_v2d, 2, nm_exp_v2d)
#else
static inline void nm_silu_array(int64_t n, const float *x, float *y) {
    for (int64_t i = 0; i < n; ++i) y[i] = nm_silu_value(x[i]);
}
#endif

#endif
