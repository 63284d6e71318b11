/* narrowmm: scalar helpers every kernel row shares. Included (not linked) so each row's
 * translation unit compiles them with its own ISA flags: loads of one weight from any byte
 * address, and array codec loops over the branch-free scalar codecs, which the compiler
 * vectorises for the row's ISA. */
#ifndef NM_KERNEL_COMMON_H
#define NM_KERNEL_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../codecs/codec_scalar.h"
#include "nm_kernels.h"

static inline float nm_load1_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, sizeof f); /* B may sit at any byte address */
    return f;
}

static inline uint16_t nm_load_u16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return h;
}

static inline float nm_load1_fp16(const uint8_t *p) { return nm_fp16_to_f32(nm_load_u16(p)); }
static inline float nm_load1_bf16(const uint8_t *p) { return nm_bf16_to_f32(nm_load_u16(p)); }
/* raw() of one FP8 weight (nm_kernels.h): the binary16 the SIMD rows convert (the NaN code
 * as the quiet NaN 0x7E00), through the portable binary16 decode; never a float32
 * subnormal (the smallest e4m3fn code is 2^-9 * 2^-8) */
static inline float nm_load1_e4m3fn_raw(const uint8_t *p) {
    const uint32_t q = *p, mag = (q & 0x7Fu) << 7;
    const uint32_t is_nan = nm_mask(mag == 0x3F80u);
    return nm_fp16_to_f32((uint16_t)(((q & 0x80u) << 8) | (is_nan & 0x7E00u) | (~is_nan & mag)));
}
static inline float nm_load1_e5m2_raw(const uint8_t *p) { return nm_e5m2_to_f32(*p); }
/* raw() of one Q8_0 weight: its int8 code, exactly */
static inline float nm_load1_q8_0_raw(const uint8_t *p) { return nm_q8_0_to_f32(*p); }
/* raw() of one Q5_1 weight: its code, a byte, exactly (then fma with the scale and offset) */
static inline float nm_load1_q5_1_raw(const uint8_t *p) { return nm_q5_1_to_f32(*p); }

/* The binary16 bits of raw() of a finite e4m3fn code, from its byte sign-extended to 16
 * bits, x: x << 7 puts the 7 magnitude bits in a binary16's exponent and mantissa fields
 * (the value / 2^8: bias 15 against 7, subnormal codes on binary16 subnormals, which the
 * hardware conversion makes normal float32s) and the sign in bit 15; the mask clears the
 * copy of the sign that lands in bit 14. The SIMD rows do this lane-wise, then convert
 * (F16C, FCVTL). A NaN code would come out as binary16 -/+ 480: finite weights only. */
#define NM_E4M3FN_FP16_SHIFT 7
#define NM_E4M3FN_FP16_MASK 0xBF80u

/* Scales (nm_kernels.h): every template below takes two operations that apply the scales
 * of the columns at sp (and their offsets at op) to decoded weights, SCV(w, sp, op) on a
 * vector of them and SC1(x, sp, op) on one: NM_UNSCALED for formats without scales (sp
 * and op are never evaluated: they may be NULL), for scaled ones the row's vector
 * multiplication and NM_SCALE1, and for a format with offsets (Q5_1) fma(w, scale, offset),
 * the row's and NM_OFFSET1 (op is unused by the others: it may be NULL + j). */
#define NM_UNSCALED(w, sp, op) (w)
#define NM_SCALE1(x, sp, op) ((x) * *(sp))
#define NM_SCALE1_HALF(x, sp, op) ((x) * nm_fp16_to_f32(*(sp))) /* a binary16 scale, widened */
#define NM_OFFSET1(x, sp, op) fmaf((x), *(sp), *(op))
#define NM_OFFSET1_HALF(x, sp, op) fmaf((x), nm_fp16_to_f32(*(sp)), nm_fp16_to_f32(*(op)))

/* Packing, written once for every row from its vector load (L lanes; L = 1 for portable C):
 * each row of each nr-wide sliver takes whole vectors while they fit, then single weights,
 * then zeros up to nr. The frame calls it for a last sliver narrower than NR, so the part
 * that matters is how fast the few columns of that sliver decode: with the row's own
 * conversion (F16C, FCVTL) rather than the portable bit manipulation.
 *   LOADW(p): L weights at byte address p as float32;  STOREF(p, v): store them (unaligned);
 *   LOAD1(p): one weight;  SCV, SC1: the scales, as above. */
#define NM_DEFINE_PACK(NAME, ITEM, L, LOADW, STOREF, LOAD1, SCV, SC1)                        \
    static void NAME(int64_t kc, int64_t nc, const uint8_t *b, int64_t ldb, int nr,          \
                     float *dst, const float *s, const float *o) {                           \
        (void)s, (void)o;                                                                    \
        for (int64_t j0 = 0; j0 < nc; j0 += nr) {                                            \
            const int64_t w = nc - j0 < nr ? nc - j0 : nr;                                   \
            float *sliver = dst + (j0 / nr) * kc * nr;                                       \
            for (int64_t p = 0; p < kc; ++p) {                                               \
                const uint8_t *src = b + p * ldb + (ITEM) * j0;                              \
                float *out = sliver + p * nr;                                                \
                int64_t j = 0;                                                               \
                for (; j + (L) <= w; j += (L))                                               \
                    STOREF(out + j, SCV(LOADW(src + (ITEM) * j), s + j0 + j, o + j0 + j));   \
                for (; j < w; ++j)                                                           \
                    out[j] = SC1(LOAD1(src + (ITEM) * j), s + j0 + j, o + j0 + j);           \
                for (; j < nr; ++j) out[j] = 0.0f;                                           \
            }                                                                                \
        }                                                                                    \
    }

/* The columns j..n-1 a vector gemv step leaves over: rows b0..b3 (weights a[p..p+3]), one
 * fmaf per row, in order. */
#define NM_GEMV_TAIL4(ITEM, LOAD1, SC1, a, p, b0, b1, b2, b3, c, s, o, j, n)                 \
    for (; (j) < (n); ++(j)) {                                                               \
        const int64_t at_ = (ITEM) * (j);                                                    \
        float c_ = (c)[j];                                                                   \
        c_ = fmaf((a)[p], SC1(LOAD1((b0) + at_), (s) + (j), (o) + (j)), c_);                 \
        c_ = fmaf((a)[(p) + 1], SC1(LOAD1((b1) + at_), (s) + (j), (o) + (j)), c_);           \
        c_ = fmaf((a)[(p) + 2], SC1(LOAD1((b2) + at_), (s) + (j), (o) + (j)), c_);           \
        c_ = fmaf((a)[(p) + 3], SC1(LOAD1((b3) + at_), (s) + (j), (o) + (j)), c_);           \
        (c)[j] = c_;                                                                         \
    }

/* The m == 1 streaming product of a SIMD row, written once from the row's vector operations:
 * groups of four rows of B (p ascending) applied to four vectors of C held in registers,
 * so C is loaded and stored once per four rows while B is read exactly once, in order; the
 * next group's rows are prefetched; single vectors, then scalar fmaf, take the columns left
 * over, and single rows the last k % 4.
 *   VEC, L            the vector type and its float32 lanes
 *   SET1(x)           x in every lane;  LOADC(p), STOREC(p, v): unaligned float32 vectors
 *   LOADW(p)          L weights at byte address p, as float32 (exact)
 *   FMA(acc, x, y)    acc + x * y with one rounding
 *   PREFETCH(p)       a hint for byte address p (may be a no-op; never faults)
 *   SCV, SC1          the scales (see above) */
/* one row of B (at bq, vectors w bytes apart, their scales at sq and offsets at oq, L
 * floats apart) times x, into the four accumulators */
#define NM_GEMV_ROW4_(FMA, LOADW, SCV, bq, w, sq, oq, x)                                     \
    (c0 = FMA(c0, x, SCV(LOADW(bq), sq, oq)),                                                \
     c1 = FMA(c1, x, SCV(LOADW((bq) + (w)), (sq) + L_, (oq) + L_)),                          \
     c2 = FMA(c2, x, SCV(LOADW((bq) + 2 * (w)), (sq) + 2 * L_, (oq) + 2 * L_)),              \
     c3 = FMA(c3, x, SCV(LOADW((bq) + 3 * (w)), (sq) + 3 * L_, (oq) + 3 * L_)))

#define NM_DEFINE_GEMV_SIMD(NAME, ITEM, VEC, L, SET1, LOADC, STOREC, LOADW, FMA, PREFETCH,     \
                            LOAD1, SCV, SC1)                                                 \
    static void NAME(int64_t k, int64_t n, const float *a, const uint8_t *b, int64_t ldb,    \
                     float *c, const float *s, const float *o) {                             \
        enum { L_ = (L) };                                                                   \
        (void)s, (void)o;                                                                    \
        int64_t p = 0;                                                                       \
        for (; p + 4 <= k; p += 4) {                                                         \
            const VEC a0 = SET1(a[p]), a1 = SET1(a[p + 1]);                                  \
            const VEC a2 = SET1(a[p + 2]), a3 = SET1(a[p + 3]);                              \
            const uint8_t *b0 = b + p * ldb, *b1 = b0 + ldb, *b2 = b1 + ldb, *b3 = b2 + ldb; \
            int64_t j = 0;                                                                   \
            for (; j + 4 * (L) <= n; j += 4 * (L)) {                                         \
                VEC c0 = LOADC(c + j), c1 = LOADC(c + j + (L));                              \
                VEC c2 = LOADC(c + j + 2 * (L)), c3 = LOADC(c + j + 3 * (L));                \
                const int64_t at = (ITEM) * j, w = (ITEM) * (L);                             \
                for (int64_t q = 4; q < 8; ++q) /* the next group's rows, same columns */    \
                    for (int64_t l = 0; l < 4 * w; l += 64) PREFETCH(b0 + q * ldb + at + l); \
                NM_GEMV_ROW4_(FMA, LOADW, SCV, b0 + at, w, s + j, o + j, a0);                \
                NM_GEMV_ROW4_(FMA, LOADW, SCV, b1 + at, w, s + j, o + j, a1);                \
                NM_GEMV_ROW4_(FMA, LOADW, SCV, b2 + at, w, s + j, o + j, a2);                \
                NM_GEMV_ROW4_(FMA, LOADW, SCV, b3 + at, w, s + j, o + j, a3);                \
                STOREC(c + j, c0), STOREC(c + j + (L), c1);                                  \
                STOREC(c + j + 2 * (L), c2), STOREC(c + j + 3 * (L), c3);                    \
            }                                                                                \
            for (; j + (L) <= n; j += (L)) {                                                 \
                const int64_t at = (ITEM) * j;                                               \
                VEC c0 = LOADC(c + j);                                                       \
                c0 = FMA(c0, a0, SCV(LOADW(b0 + at), s + j, o + j));                         \
                c0 = FMA(c0, a1, SCV(LOADW(b1 + at), s + j, o + j));                         \
                c0 = FMA(c0, a2, SCV(LOADW(b2 + at), s + j, o + j));                         \
                c0 = FMA(c0, a3, SCV(LOADW(b3 + at), s + j, o + j));                         \
                STOREC(c + j, c0);                                                           \
            }                                                                                \
            NM_GEMV_TAIL4(ITEM, LOAD1, SC1, a, p, b0, b1, b2, b3, c, s, o, j, n)             \
        }                                                                                    \
        for (; p < k; ++p) {                                                                 \
            const VEC a0 = SET1(a[p]);                                                       \
            const uint8_t *b0 = b + p * ldb;                                                 \
            int64_t j = 0;                                                                   \
            for (; j + (L) <= n; j += (L))                                                   \
                STOREC(c + j,                                                                \
                       FMA(LOADC(c + j), a0, SCV(LOADW(b0 + (ITEM) * j), s + j, o + j)));    \
            for (; j < n; ++j)                                                               \
                c[j] = fmaf(a[p], SC1(LOAD1(b0 + (ITEM) * j), s + j, o + j), c[j]);          \
        }                                                                                    \
    }

/* The m == 2 streaming product (nm_gemv2_fn), from the same vector operations as
 * NM_DEFINE_GEMV_SIMD: the gemv's walk for two rows of A (lda apart) and C (ldc apart),
 * three rows of B per step (p ascending) applied to four vectors of each C row held in
 * registers. Each weight vector is loaded once and feeds both rows' FMAs, so B is read once
 * for the two rows; 8 accumulators and 6 broadcasts leave a register for the weights on a
 * 16-register ISA (four rows of B a step would not). Single vectors, then scalar fmaf, take
 * the columns left over, and single rows of B the last k % 3. */
#define NM_GEMV2_ROW_(FMA, LOADW, SCV, bq, w, sq, oq, s, t)                                  \
    (w_ = SCV(LOADW(bq), sq, oq), x0 = FMA(x0, s, w_), y0 = FMA(y0, t, w_),                  \
     w_ = SCV(LOADW((bq) + (w)), (sq) + L_, (oq) + L_), x1 = FMA(x1, s, w_),                 \
     y1 = FMA(y1, t, w_), w_ = SCV(LOADW((bq) + 2 * (w)), (sq) + 2 * L_, (oq) + 2 * L_),     \
     x2 = FMA(x2, s, w_), y2 = FMA(y2, t, w_),                                               \
     w_ = SCV(LOADW((bq) + 3 * (w)), (sq) + 3 * L_, (oq) + 3 * L_), x3 = FMA(x3, s, w_),     \
     y3 = FMA(y3, t, w_))

#define NM_DEFINE_GEMV2_SIMD(NAME, ITEM, VEC, L, SET1, LOADC, STOREC, LOADW, FMA, PREFETCH,    \
                             LOAD1, SCV, SC1)                                                \
    static inline void NAME##_rows_(int64_t rows, int64_t n, const float *a, const float *a1, \
                                    const uint8_t *b, int64_t ldb, float *c, float *c1,     \
                                    const float *sc, const float *oc) {                      \
        /* rows (1 or 3, a constant once inlined) rows of B from b, weights a[0..rows) and   \
         * a1[0..rows) */                                                                    \
        enum { L_ = (L) };                                                                   \
        (void)sc, (void)oc;                                                                  \
        VEC s[3], t[3];                                                                      \
        _Pragma("GCC unroll 3") for (int64_t q = 0; q < rows; ++q) s[q] = SET1(a[q]),        \
                                                                   t[q] = SET1(a1[q]);       \
        int64_t j = 0;                                                                       \
        for (; j + 4 * (L) <= n; j += 4 * (L)) {                                             \
            VEC x0 = LOADC(c + j), x1 = LOADC(c + j + (L));                                  \
            VEC x2 = LOADC(c + j + 2 * (L)), x3 = LOADC(c + j + 3 * (L));                    \
            VEC y0 = LOADC(c1 + j), y1 = LOADC(c1 + j + (L));                                \
            VEC y2 = LOADC(c1 + j + 2 * (L)), y3 = LOADC(c1 + j + 3 * (L));                  \
            VEC w_;                                                                          \
            const int64_t at = (ITEM) * j, w = (ITEM) * (L);                                 \
            _Pragma("GCC unroll 3") for (int64_t q = 0; q < rows; ++q) { /* + next rows' */ \
                for (int64_t l = 0; l < 4 * w; l += 64)                                      \
                    PREFETCH(b + (rows + q) * ldb + at + l);                                 \
                NM_GEMV2_ROW_(FMA, LOADW, SCV, b + q * ldb + at, w, sc + j, oc + j, s[q],    \
                              t[q]);                                                         \
            }                                                                                \
            STOREC(c + j, x0), STOREC(c + j + (L), x1);                                      \
            STOREC(c + j + 2 * (L), x2), STOREC(c + j + 3 * (L), x3);                        \
            STOREC(c1 + j, y0), STOREC(c1 + j + (L), y1);                                    \
            STOREC(c1 + j + 2 * (L), y2), STOREC(c1 + j + 3 * (L), y3);                      \
        }                                                                                    \
        for (; j + (L) <= n; j += (L)) {                                                     \
            VEC x0 = LOADC(c + j), y0 = LOADC(c1 + j);                                       \
            _Pragma("GCC unroll 3") for (int64_t q = 0; q < rows; ++q) {                     \
                const VEC w_ = SCV(LOADW(b + q * ldb + (ITEM) * j), sc + j, oc + j);         \
                x0 = FMA(x0, s[q], w_), y0 = FMA(y0, t[q], w_);                              \
            }                                                                                \
            STOREC(c + j, x0), STOREC(c1 + j, y0);                                           \
        }                                                                                    \
        for (; j < n; ++j) {                                                                 \
            float x_ = c[j], y_ = c1[j];                                                     \
            for (int64_t q = 0; q < rows; ++q) {                                             \
                const float w_ = SC1(LOAD1(b + q * ldb + (ITEM) * j), sc + j, oc + j);       \
                x_ = fmaf(a[q], w_, x_), y_ = fmaf(a1[q], w_, y_);                           \
            }                                                                                \
            c[j] = x_, c1[j] = y_;                                                           \
        }                                                                                    \
    }                                                                                        \
    static void NAME(int64_t k, int64_t n, const float *a, int64_t lda, const uint8_t *b,    \
                     int64_t ldb, float *c, int64_t ldc, const float *s, const float *o) {   \
        int64_t p = 0;                                                                       \
        for (; p + 3 <= k; p += 3)                                                           \
            NAME##_rows_(3, n, a + p, a + lda + p, b + p * ldb, ldb, c, c + ldc, s, o);      \
        for (; p < k; ++p)                                                                   \
            NAME##_rows_(1, n, a + p, a + lda + p, b + p * ldb, ldb, c, c + ldc, s, o);      \
    }

/* Both row-major gemvs for the six formats of a SIMD row, and the finite-weights variants
 * of the scaled ones, named gemv_<fmt>_<ISA>, gemv_<fmt>_finite_<ISA> and gemv2_... .
 * LOADF32, LOADFP16, LOADBF16: the row's LOADW per format; LOADE4M3, LOADE5M2: its raw()
 * of L FP8 weights, exact for every code; LOADE4M3F, LOADE5M2F: the same for finite codes
 * only; LOADQ8: L Q8_0 codes as float32; LOAD1FP16 its single fp16 weight (the others'
 * singles are the portable loads);
 * SCALEV: the row's SCV for the scaled formats. */
#define NM_DEFINE_ROW_MAJOR_GEMVS(ISA, VEC, L, SET1, LOADC, STOREC, LOADF32, LOADFP16,         \
                                  LOADBF16, LOADE4M3, LOADE5M2, LOADE4M3F, LOADE5M2F, LOADQ8, \
                                  FMA, PREFETCH, LOAD1FP16, SCALEV)                          \
    NM_DEFINE_GEMV_SIMD(gemv_q8_0_##ISA, 1, VEC, L, SET1, LOADC, STOREC, LOADQ8, FMA,        \
                        PREFETCH, nm_load1_q8_0_raw, SCALEV, NM_SCALE1)                      \
    NM_DEFINE_GEMV2_SIMD(gemv2_q8_0_##ISA, 1, VEC, L, SET1, LOADC, STOREC, LOADQ8, FMA,      \
                         PREFETCH, nm_load1_q8_0_raw, SCALEV, NM_SCALE1)                     \
    NM_DEFINE_GEMV_SIMD(gemv_e4m3fn_finite_##ISA, 1, VEC, L, SET1, LOADC, STOREC, LOADE4M3F,  \
                        FMA, PREFETCH, nm_load1_e4m3fn_raw, SCALEV, NM_SCALE1)               \
    NM_DEFINE_GEMV_SIMD(gemv_e5m2_finite_##ISA, 1, VEC, L, SET1, LOADC, STOREC, LOADE5M2F,    \
                        FMA, PREFETCH, nm_load1_e5m2_raw, SCALEV, NM_SCALE1)                 \
    NM_DEFINE_GEMV2_SIMD(gemv2_e4m3fn_finite_##ISA, 1, VEC, L, SET1, LOADC, STOREC,          \
                         LOADE4M3F, FMA, PREFETCH, nm_load1_e4m3fn_raw, SCALEV, NM_SCALE1)   \
    NM_DEFINE_GEMV2_SIMD(gemv2_e5m2_finite_##ISA, 1, VEC, L, SET1, LOADC, STOREC, LOADE5M2F, \
                         FMA, PREFETCH, nm_load1_e5m2_raw, SCALEV, NM_SCALE1)                \
    NM_DEFINE_GEMV_SIMD(gemv_f32_##ISA, 4, VEC, L, SET1, LOADC, STOREC, LOADF32, FMA, PREFETCH, \
                        nm_load1_f32, NM_UNSCALED, NM_UNSCALED)                              \
    NM_DEFINE_GEMV_SIMD(gemv_fp16_##ISA, 2, VEC, L, SET1, LOADC, STOREC, LOADFP16, FMA,      \
                        PREFETCH, LOAD1FP16, NM_UNSCALED, NM_UNSCALED)                       \
    NM_DEFINE_GEMV_SIMD(gemv_bf16_##ISA, 2, VEC, L, SET1, LOADC, STOREC, LOADBF16, FMA,      \
                        PREFETCH, nm_load1_bf16, NM_UNSCALED, NM_UNSCALED)                   \
    NM_DEFINE_GEMV_SIMD(gemv_e4m3fn_##ISA, 1, VEC, L, SET1, LOADC, STOREC, LOADE4M3, FMA,    \
                        PREFETCH, nm_load1_e4m3fn_raw, SCALEV, NM_SCALE1)                        \
    NM_DEFINE_GEMV_SIMD(gemv_e5m2_##ISA, 1, VEC, L, SET1, LOADC, STOREC, LOADE5M2, FMA,      \
                        PREFETCH, nm_load1_e5m2_raw, SCALEV, NM_SCALE1)                          \
    NM_DEFINE_GEMV2_SIMD(gemv2_f32_##ISA, 4, VEC, L, SET1, LOADC, STOREC, LOADF32, FMA,      \
                         PREFETCH, nm_load1_f32, NM_UNSCALED, NM_UNSCALED)                   \
    NM_DEFINE_GEMV2_SIMD(gemv2_fp16_##ISA, 2, VEC, L, SET1, LOADC, STOREC, LOADFP16, FMA,    \
                         PREFETCH, LOAD1FP16, NM_UNSCALED, NM_UNSCALED)                      \
    NM_DEFINE_GEMV2_SIMD(gemv2_bf16_##ISA, 2, VEC, L, SET1, LOADC, STOREC, LOADBF16, FMA,    \
                         PREFETCH, nm_load1_bf16, NM_UNSCALED, NM_UNSCALED)                  \
    NM_DEFINE_GEMV2_SIMD(gemv2_e4m3fn_##ISA, 1, VEC, L, SET1, LOADC, STOREC, LOADE4M3, FMA,  \
                         PREFETCH, nm_load1_e4m3fn_raw, SCALEV, NM_SCALE1)                       \
    NM_DEFINE_GEMV2_SIMD(gemv2_e5m2_##ISA, 1, VEC, L, SET1, LOADC, STOREC, LOADE5M2, FMA,    \
                         PREFETCH, nm_load1_e5m2_raw, SCALEV, NM_SCALE1)

/* One past the last row of the block that starts at row r0 (block rows of a block; the last
 * block cut at rows): the walks' loop over a block of scales */
#define NM_BLOCK_END_(r0, block, rows) ((rows) - (r0) < (block) ? (rows) : (r0) + (block))

/* A hint for the stored row PACKED_GEMV_AHEAD bytes down the stream of a packed m <= 2 walk
 * (both lines of a row of up to 128 bytes, which may straddle two). Each row's folder
 * defines PACKED_GEMV_AHEAD: 0 (no hint compiled) on the portable rows, on the x86 rows the
 * distance in force (nm_packed_gemv_ahead: the row's default on this CPU, or the one
 * nm_set_packed_gemv_ahead forces), 0 leaving the stream to the hardware prefetchers. The
 * walks issue few loads per byte for the decode's many operations, so few misses are in
 * flight at once: on an AMD Zen 3 (avx2 row, 2048 bytes ahead) Q8_0 ran 1.13-1.15x at m = 1
 * on one thread, up to 1.21x at two; on an Intel Xeon (avx512 row) the 4-bit and byte
 * formats ran 1.35-2.2x, while on an AMD Zen 4 the same row lost (docs/kernels.md). A hint
 * never faults, so it may point past the weights. A walk reads the distance once, at its
 * start (NM_PACKED_GEMV_AHEAD_): read at every stored row, two loads and two tests, it cost
 * the Xeon's Q4_0 walk for two rows 3-7 %. */
#define NM_PACKED_GEMV_AHEAD_                                                                \
    const int64_t packed_gemv_ahead_ = (PACKED_GEMV_AHEAD);                                  \
    (void)packed_gemv_ahead_
#define NM_PACKED_GEMV_PREFETCH(row, ldb)                                                     \
    do {                                                                                     \
        if (packed_gemv_ahead_) {                                                            \
            const char *ahead_ =                                                             \
                (const char *)((uintptr_t)(row) + (uintptr_t)packed_gemv_ahead_);            \
            __builtin_prefetch(ahead_);                                                      \
            if ((ldb) > 64) __builtin_prefetch(ahead_ + 64);                                 \
        }                                                                                    \
    } while (0)

/* Row p of k of the packed byte walks (its weights at row_, sliver t's slb bytes after sliver
 * t - 1's): RR rows of A (lda apart) times W_ weight vectors (V_ a sliver), each read through
 * LOADW and SCV with the scales of vector w at sp + w * L (offsets op), into acc_ */
#define NM_BYTE_STORED_ROW_(VEC, L, V_, W_, RR, ITEM, SET1, FMA, LOADW, SCV, acc_, a, lda, p,  \
                            row_, slb, sp, op)                                               \
    do {                                                                                     \
        VEC ap_[RR];                                                                         \
        _Pragma("GCC unroll 4") for (int r_ = 0; r_ < (RR); ++r_) ap_[r_] =                  \
            SET1((a)[r_ * (lda) + (p)]);                                                     \
        _Pragma("GCC unroll 32") for (int w_ = 0; w_ < (W_); ++w_) {                         \
            const uint8_t *w_at_ = (row_) + w_ / (V_) * (slb) + (w_ % (V_)) * (L) * (ITEM);  \
            /* unscaled formats read no scales */                                            \
            const VEC wv_ = SCV(LOADW(w_at_), (sp) + w_ * (L), (op) + w_ * (L));             \
            _Pragma("GCC unroll 4") for (int r_ = 0; r_ < (RR); ++r_)                        \
                acc_[r_ * (W_) + w_] = FMA(acc_[r_ * (W_) + w_], ap_[r_], wv_);              \
        }                                                                                    \
    } while (0)

/* The m == 1 and m == 2 products on packed weights (nm_gemv_packed_fn, nm_gemv2_packed_fn),
 * written once from the row's vector operations: G slivers of NRW columns at a time, side by
 * side in one group of the packed layout (stored rows ldb bytes apart), for RR rows of A (lda
 * apart) and C (ldc apart), their RR x G x NRW/L accumulator vectors in registers for all of
 * k (every block of scales: the pointer steps by lds every bk rows, kept in s itself, since a
 * second pointer cost the avx512 loop registers and measured slower), so C is loaded and
 * stored once per sliver and the weights are read once, as one stream of the group's rows,
 * each weight vector feeding the RR rows' FMAs; then single slivers; the last sliver,
 * narrower than NRW, runs on a zero-padded scratch copy of its C (its padding weights are
 * read, their results dropped). Sliver t's scales are NRW elements after sliver t - 1's in
 * either grid (a row-major one, or a group's part of a group-major one). VEC, L, SET1,
 * LOADC, STOREC, LOADW, FMA, SCV: as in NM_DEFINE_GEMV_SIMD; ST, the scales' type: float, or
 * uint16_t for a binary16 grid (nm_scales.s16), which SCV then reads. */
#define NM_GEMV_PACKED_SLIVERS_(NAME, ST, RR, GG, ITEM, VEC, L, NRW, SET1, LOADC, STOREC,    \
                                LOADW, FMA, SCV)                                             \
    static inline void NAME(int64_t k, int64_t ldb, int64_t slb, const float *a,            \
                            int64_t lda, const uint8_t *b, float *c, int64_t ldc,           \
                            const ST *s, const ST *o, int64_t bk, int64_t lds) {             \
        enum { V_ = (NRW) / (L), W_ = (GG) * V_ };                                           \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        const int64_t block_ = bk < k ? bk : k; /* rows under one block of scales */         \
        VEC acc_[(RR) * W_];                                                                 \
        _Pragma("GCC unroll 32") for (int i_ = 0; i_ < (RR) * W_; ++i_)                      \
            acc_[i_] = LOADC(c + (i_ / W_) * ldc + (i_ % W_) / V_ * (NRW) + (i_ % V_) * (L));  \
        /* s (and o) step to the next block's scales as the rows reach it (NULL: unscaled;  \
         * never past the last block, not even as an unread pointer) */                      \
        for (int64_t p0_ = 0; p0_ < k; p0_ += block_, s = s && p0_ < k ? s + lds : s,        \
                     o = o && p0_ < k ? o + lds : o) {                                       \
            for (int64_t p = p0_; p < NM_BLOCK_END_(p0_, block_, k); ++p) {                  \
                const uint8_t *row_ = b + p * ldb;                                           \
                NM_PACKED_GEMV_PREFETCH(row_, ldb);                                          \
                NM_BYTE_STORED_ROW_(VEC, L, V_, W_, RR, ITEM, SET1, FMA, LOADW, SCV, acc_, a, lda, \
                                    p, row_, slb, s, o);                                     \
            }                                                                                \
        }                                                                                    \
        _Pragma("GCC unroll 32") for (int i_ = 0; i_ < (RR) * W_; ++i_)                      \
            STOREC(c + (i_ / W_) * ldc + (i_ % W_) / V_ * (NRW) + (i_ % V_) * (L), acc_[i_]); \
    }

/* The walk over n columns shared by both (stored rows ldb bytes apart, slb bytes from a
 * sliver's first to the next one's; scales side by side): G-sliver groups, single slivers,
 * the padded tail. */
#define NM_GEMV_PACKED_WALK_(NAME, RR, G, NRW, k, ldb, slb, n, a, lda, b, c, ldc, s, o, bk,   \
                             lds)                                                            \
    do {                                                                                     \
        int64_t j = 0;                                                                       \
        for (; j + (G) * (NRW) <= (n); j += (G) * (NRW))                                     \
            NAME##_group_(k, ldb, slb, a, lda, (b) + j / (NRW) * (slb), (c) + j, ldc,        \
                          (s) ? (s) + j : NULL, (o) ? (o) + j : NULL, bk, lds);              \
        for (; j + (NRW) <= (n); j += (NRW))                                                 \
            NAME##_one_(k, ldb, slb, a, lda, (b) + j / (NRW) * (slb), (c) + j, ldc,          \
                        (s) ? (s) + j : NULL, (o) ? (o) + j : NULL, bk, lds);                \
        if (j < (n)) {                                                                       \
            _Alignas(64) float tail[(RR) * (NRW)] = {0};                                     \
            const size_t bytes_ = (size_t)((n) - j) * sizeof(float);                         \
            for (int r = 0; r < (RR); ++r) memcpy(tail + r * (NRW), (c) + r * (ldc) + j, bytes_); \
            NAME##_one_(k, ldb, slb, a, lda, (b) + j / (NRW) * (slb), tail, NRW,             \
                        (s) ? (s) + j : NULL, (o) ? (o) + j : NULL, bk, lds);                \
            for (int r = 0; r < (RR); ++r) memcpy((c) + r * (ldc) + j, tail + r * (NRW), bytes_); \
        }                                                                                    \
    } while (0)

/* GROUP: the walk over G slivers side by side (NM_GEMV_PACKED_SLIVERS_'s parameters: it, or
 * a row's own for a format), the _BY forms' first parameter */
#define NM_DEFINE_GEMV_PACKED(NAME, ST, ITEM, VEC, L, NRW, G, SET1, LOADC, STOREC, LOADW,    \
                              FMA, SCV)                                                      \
    NM_DEFINE_GEMV_PACKED_BY(NM_GEMV_PACKED_SLIVERS_, NAME, ST, ITEM, VEC, L, NRW, G, SET1,  \
                             LOADC, STOREC, LOADW, FMA, SCV)
#define NM_DEFINE_GEMV_PACKED_BY(GROUP, NAME, ST, ITEM, VEC, L, NRW, G, SET1, LOADC, STOREC, \
                                 LOADW, FMA, SCV)                                            \
    GROUP(NAME##_group_, ST, 1, G, ITEM, VEC, L, NRW, SET1, LOADC, STOREC, LOADW, FMA, SCV)  \
    NM_GEMV_PACKED_SLIVERS_(NAME##_one_, ST, 1, 1, ITEM, VEC, L, NRW, SET1, LOADC, STOREC,   \
                            LOADW, FMA, SCV)                                                 \
    static void NAME(int64_t k, int64_t ldb, int64_t slb, int64_t n, const float *a,         \
                     const uint8_t *b, float *c, const ST *s, const ST *o, int64_t bk,       \
                     int64_t lds) {                                                          \
        NM_GEMV_PACKED_WALK_(NAME, 1, G, NRW, k, ldb, slb, n, a, 0, b, c, 0, s, o, bk, lds);  \
    }

/* m == 2: G2 slivers at a time, chosen so that 2 x G2 x NRW/L accumulators fit the row's
 * registers with the two broadcasts and a weight vector. */
#define NM_DEFINE_GEMV2_PACKED(NAME, ST, ITEM, VEC, L, NRW, G2, SET1, LOADC, STOREC, LOADW,  \
                               FMA, SCV)                                                     \
    NM_DEFINE_GEMV2_PACKED_BY(NM_GEMV_PACKED_SLIVERS_, NAME, ST, ITEM, VEC, L, NRW, G2, SET1, \
                              LOADC, STOREC, LOADW, FMA, SCV)
#define NM_DEFINE_GEMV2_PACKED_BY(GROUP, NAME, ST, ITEM, VEC, L, NRW, G2, SET1, LOADC,       \
                                  STOREC, LOADW, FMA, SCV)                                   \
    GROUP(NAME##_group_, ST, 2, G2, ITEM, VEC, L, NRW, SET1, LOADC, STOREC, LOADW, FMA, SCV) \
    NM_GEMV_PACKED_SLIVERS_(NAME##_one_, ST, 2, 1, ITEM, VEC, L, NRW, SET1, LOADC, STOREC,   \
                            LOADW, FMA, SCV)                                                 \
    static void NAME(int64_t k, int64_t ldb, int64_t slb, int64_t n, const float *a,         \
                     int64_t lda, const uint8_t *b, float *c, int64_t ldc, const ST *s,      \
                     const ST *o, int64_t bk, int64_t lds) {                                 \
        NM_GEMV_PACKED_WALK_(NAME, 2, G2, NRW, k, ldb, slb, n, a, lda, b, c, ldc, s, o, bk,   \
                             lds);                                                           \
    }

/* Both packed gemvs for the six formats of a row and the finite variants, named
 * gemv_packed_<fmt>_<ISA> and gemv2_packed_<fmt>_<ISA>: G slivers at a time for one row,
 * G2 for two (G8, G28 for the 8-bit formats). LOADF32 ... LOADQ8: the row's LOADW for
 * each (as in NM_DEFINE_ROW_MAJOR_GEMVS); SCALEV its SCV, and SCALEH the same on binary16
 * scales, for Q8_0's packed gemvs on a binary16 grid (gemv_packed_q8_0_half_<ISA>);
 * BYTE_GROUP, Q8_0's walk over a group (NM_GEMV_PACKED_SLIVERS_, or the row's own). */
#define NM_DEFINE_PACKED_GEMVS(ISA, VEC, L, NRW, G, G2, G8, G28, SET1, LOADC, STOREC, LOADF32, \
                               LOADFP16, LOADBF16, LOADE4M3, LOADE5M2, LOADE4M3F, LOADE5M2F,  \
                               LOADQ8, FMA, SCALEV, SCALEH, BYTE_GROUP)                      \
    NM_DEFINE_GEMV_PACKED_BY(BYTE_GROUP, gemv_packed_q8_0_##ISA, float, 1, VEC, L, NRW, G8,  \
                             SET1, LOADC, STOREC, LOADQ8, FMA, SCALEV)                       \
    NM_DEFINE_GEMV2_PACKED_BY(BYTE_GROUP, gemv2_packed_q8_0_##ISA, float, 1, VEC, L, NRW,    \
                              G28, SET1, LOADC, STOREC, LOADQ8, FMA, SCALEV)                 \
    NM_DEFINE_GEMV_PACKED(gemv_packed_e4m3fn_finite_##ISA, float, 1, VEC, L, NRW, G8,        \
                          SET1, LOADC, STOREC, LOADE4M3F, FMA, SCALEV)                       \
    NM_DEFINE_GEMV_PACKED(gemv_packed_e5m2_finite_##ISA, float, 1, VEC, L, NRW, G8, SET1,    \
                          LOADC, STOREC, LOADE5M2F, FMA, SCALEV)                             \
    NM_DEFINE_GEMV2_PACKED(gemv2_packed_e4m3fn_finite_##ISA, float, 1, VEC, L, NRW, G28,     \
                           SET1, LOADC, STOREC, LOADE4M3F, FMA, SCALEV)                      \
    NM_DEFINE_GEMV2_PACKED(gemv2_packed_e5m2_finite_##ISA, float, 1, VEC, L, NRW, G28,       \
                           SET1, LOADC, STOREC, LOADE5M2F, FMA, SCALEV)                      \
    NM_DEFINE_GEMV_PACKED(gemv_packed_f32_##ISA, float, 4, VEC, L, NRW, G, SET1, LOADC,      \
                          STOREC, LOADF32, FMA, NM_UNSCALED)                                 \
    NM_DEFINE_GEMV_PACKED(gemv_packed_fp16_##ISA, float, 2, VEC, L, NRW, G, SET1, LOADC,     \
                          STOREC, LOADFP16, FMA, NM_UNSCALED)                                \
    NM_DEFINE_GEMV_PACKED(gemv_packed_bf16_##ISA, float, 2, VEC, L, NRW, G, SET1, LOADC,     \
                          STOREC, LOADBF16, FMA, NM_UNSCALED)                                \
    NM_DEFINE_GEMV_PACKED(gemv_packed_e4m3fn_##ISA, float, 1, VEC, L, NRW, G8, SET1,         \
                          LOADC, STOREC, LOADE4M3, FMA, SCALEV)                              \
    NM_DEFINE_GEMV_PACKED(gemv_packed_e5m2_##ISA, float, 1, VEC, L, NRW, G8, SET1, LOADC,    \
                          STOREC, LOADE5M2, FMA, SCALEV)                                     \
    NM_DEFINE_GEMV2_PACKED(gemv2_packed_f32_##ISA, float, 4, VEC, L, NRW, G2, SET1,          \
                           LOADC, STOREC, LOADF32, FMA, NM_UNSCALED)                         \
    NM_DEFINE_GEMV2_PACKED(gemv2_packed_fp16_##ISA, float, 2, VEC, L, NRW, G2, SET1,         \
                           LOADC, STOREC, LOADFP16, FMA, NM_UNSCALED)                        \
    NM_DEFINE_GEMV2_PACKED(gemv2_packed_bf16_##ISA, float, 2, VEC, L, NRW, G2, SET1,         \
                           LOADC, STOREC, LOADBF16, FMA, NM_UNSCALED)                        \
    NM_DEFINE_GEMV2_PACKED(gemv2_packed_e4m3fn_##ISA, float, 1, VEC, L, NRW, G28, SET1,      \
                           LOADC, STOREC, LOADE4M3, FMA, SCALEV)                             \
    NM_DEFINE_GEMV2_PACKED(gemv2_packed_e5m2_##ISA, float, 1, VEC, L, NRW, G28, SET1,        \
                           LOADC, STOREC, LOADE5M2, FMA, SCALEV)                             \
    NM_DEFINE_GEMV_PACKED_BY(BYTE_GROUP, gemv_packed_q8_0_half_##ISA, uint16_t, 1, VEC, L,   \
                             NRW, G8, SET1, LOADC, STOREC, LOADQ8, FMA, SCALEH)              \
    NM_DEFINE_GEMV2_PACKED_BY(BYTE_GROUP, gemv2_packed_q8_0_half_##ISA, uint16_t, 1, VEC, L, \
                              NRW, G28, SET1, LOADC, STOREC, LOADQ8, FMA, SCALEH)

/* Q5_1 (GGUF's Q5_1 and Q5_K, one code a byte; nm_formats.h): every slot but the first
 * tile, from the same templates as the 8-bit formats, each weight fma(q, scale, offset) with
 * one rounding. LOADU8: L unsigned bytes as float32 (exact); OFFSETV its scale and offset
 * (SCV with op), OFFSETH the same on binary16 grids; G8, G28: slivers at a time for one row
 * and two, as for Q8_0; BYTE_GROUP, the packed gemvs' walk over a group, as for Q8_0. */
#define NM_DEFINE_Q5_1_FORMAT(ISA, VEC, L, NRW, G8, G28, SET1, LOADC, STOREC, LOADU8, FMA,   \
                              PREFETCH, OFFSETV, OFFSETH, BYTE_GROUP)                        \
    NM_DEFINE_GEMV_SIMD(gemv_q5_1_##ISA, 1, VEC, L, SET1, LOADC, STOREC, LOADU8, FMA,        \
                        PREFETCH, nm_load1_q5_1_raw, OFFSETV, NM_OFFSET1)                    \
    NM_DEFINE_GEMV2_SIMD(gemv2_q5_1_##ISA, 1, VEC, L, SET1, LOADC, STOREC, LOADU8, FMA,      \
                         PREFETCH, nm_load1_q5_1_raw, OFFSETV, NM_OFFSET1)                   \
    NM_DEFINE_GEMV_PACKED_BY(BYTE_GROUP, gemv_packed_q5_1_##ISA, float, 1, VEC, L, NRW, G8,  \
                             SET1, LOADC, STOREC, LOADU8, FMA, OFFSETV)                      \
    NM_DEFINE_GEMV2_PACKED_BY(BYTE_GROUP, gemv2_packed_q5_1_##ISA, float, 1, VEC, L, NRW,    \
                              G28, SET1, LOADC, STOREC, LOADU8, FMA, OFFSETV)                \
    NM_DEFINE_GEMV_PACKED_BY(BYTE_GROUP, gemv_packed_q5_1_half_##ISA, uint16_t, 1, VEC, L,   \
                             NRW, G8, SET1, LOADC, STOREC, LOADU8, FMA, OFFSETH)             \
    NM_DEFINE_GEMV2_PACKED_BY(BYTE_GROUP, gemv2_packed_q5_1_half_##ISA, uint16_t, 1, VEC, L, \
                              NRW, G28, SET1, LOADC, STOREC, LOADU8, FMA, OFFSETH)           \
    NM_DEFINE_PACK(pack_q5_1_##ISA, 1, L, LOADU8, STOREC, nm_load1_q5_1_raw, OFFSETV,        \
                   NM_OFFSET1)

/* An edge tile (mr < MR or nr < NR, the including row's tile) runs on a full-size scratch
 * copy of its C, so only mr x nr of C is touched; packed A's rows past mr are zero and their
 * results are dropped. CALL computes on `scratch` (leading dimension NR). */
#define WITH_SCRATCH_TILE(mr, nr, c, ldc, CALL) WITH_SCRATCH_ROWS(MR, mr, nr, c, ldc, CALL)
/* the same on a scratch of ROWS rows (ROWS >= mr), for a tile of ROWS rows */
#define WITH_SCRATCH_ROWS(ROWS, mr, nr, c, ldc, CALL)                                        \
    do {                                                                                     \
        _Alignas(64) float scratch[(ROWS) * NR] = {0};                                       \
        for (int64_t i_ = 0; i_ < (mr); ++i_)                                                \
            memcpy(scratch + i_ * NR, (c) + i_ * (ldc), (size_t)(nr) * sizeof(float));      \
        CALL;                                                                                \
        for (int64_t i_ = 0; i_ < (mr); ++i_)                                                \
            memcpy((c) + i_ * (ldc), scratch + i_ * NR, (size_t)(nr) * sizeof(float));      \
    } while (0)

/* The blocks of scales down a fused first tile (nm_ukernel_pack_fn's bk and lds), for a
 * loop over its rows, or stored rows of PER rows each: NM_TILE_SCALES_INIT_ before it, and
 * NM_TILE_SCALES_NEXT_ (an expression) at the top of every step, which moves s and o to the
 * next block's scales when a block has ended. They move only when a row follows, so no
 * pointer is formed past the last block, and never without scales (s NULL: one block). */
#define NM_TILE_SCALES_INIT_(s, kc, bk, per)                                                 \
    int64_t scale_rows_left_ = ((s) && (bk) < (kc) ? (bk) : (kc)) / (per)
#define NM_TILE_SCALES_NEXT_(s, o, bk, lds, per)                                             \
    (scale_rows_left_-- == 0                                                                 \
         ? (scale_rows_left_ = (bk) / (per) - 1, (s) += (lds), (o) = (o) ? (o) + (lds) : (o), 0) \
         : 0)

/* The ukernel_pack slot around a row's fused first tile, TILE(kc, ap, b, ldb, bp, c, ldc,
 * c_next, s, o, bk, lds): a full MR-row tile straight on C, a shorter last one on a scratch
 * copy. */
#define NM_DEFINE_UKERNEL_PACK_FROM_TILE(NAME, TILE)                                         \
    static void NAME(int64_t kc, int64_t mr, const float *ap, const uint8_t *b, int64_t ldb, \
                     float *bp, float *c, int64_t ldc, const float *c_next, const float *s,   \
                     const float *o, int64_t bk, int64_t lds) {                              \
        if (mr == MR) {                                                                      \
            TILE(kc, ap, b, ldb, bp, c, ldc, c_next, s, o, bk, lds);                         \
            return;                                                                          \
        }                                                                                    \
        WITH_SCRATCH_TILE(mr, NR, c, ldc,                                                    \
                          TILE(kc, ap, b, ldb, bp, scratch, NR, c_next, s, o, bk, lds));     \
    }

/* The same for a row that also has a half-height fused tile, TILE_HALF (the first MR / 2
 * rows of the same tile: the same chains, half the FMAs): tiles of at most MR / 2 rows take
 * it, so m = 3 or 4 does not pay for the MR rows of a full tile (its rows past mr are zeros
 * whose results are dropped), where HALF_OK(ldb) says so (see the avx512 row). */
#define NM_DEFINE_UKERNEL_PACK_FROM_TILES(NAME, TILE, TILE_HALF, HALF_OK)                    \
    static void NAME(int64_t kc, int64_t mr, const float *ap, const uint8_t *b, int64_t ldb, \
                     float *bp, float *c, int64_t ldc, const float *c_next, const float *s,   \
                     const float *o, int64_t bk, int64_t lds) {                              \
        if (mr == MR || (mr == MR / 2 && HALF_OK(ldb))) {                                    \
            (mr == MR ? TILE : TILE_HALF)(kc, ap, b, ldb, bp, c, ldc, c_next, s, o, bk, lds); \
        } else if (mr < MR / 2 && HALF_OK(ldb)) {                                            \
            WITH_SCRATCH_ROWS(MR / 2, mr, NR, c, ldc,                                        \
                              TILE_HALF(kc, ap, b, ldb, bp, scratch, NR, c_next, s, o, bk,   \
                                        lds));                                               \
        } else {                                                                             \
            WITH_SCRATCH_TILE(mr, NR, c, ldc,                                                \
                              TILE(kc, ap, b, ldb, bp, scratch, NR, c_next, s, o, bk, lds)); \
        }                                                                                    \
    }

/* A ukernel_pack made of the row's own parts, for rows without a fused one: pack the whole
 * sliver a block of scales at a time (KPACK rows a stored row), then run the microkernel on
 * it. Same bits; the decode just is not overlapped. */
#define NM_DEFINE_UKERNEL_PACK_BY_PARTS(NAME, PACK, UKERNEL, NR, KPACK)                      \
    static void NAME(int64_t kc, int64_t mr, const float *ap, const uint8_t *b, int64_t ldb, \
                     float *bp, float *c, int64_t ldc, const float *c_next, const float *s,   \
                     const float *o, int64_t bk, int64_t lds) {                              \
        const int64_t block_ = s && bk < kc ? bk : kc;                                       \
        for (int64_t p0_ = 0; p0_ < kc; p0_ += block_) {                                     \
            if (p0_) { /* a next block follows: its scales */                                \
                s += lds;                                                                    \
                o = o ? o + lds : o;                                                         \
            }                                                                                \
            PACK(kc - p0_ < block_ ? kc - p0_ : block_, (NR), b + p0_ / (KPACK) * ldb, ldb,  \
                 (NR), bp + p0_ * (NR), s, o);                                               \
        }                                                                                    \
        UKERNEL(kc, mr, (NR), ap, bp, c, ldc, c_next);                                       \
    }

/* An array codec named NAME applying the scalar codec FN element by element. */
/* The nm_widen_factored_fn named NAME: plain loops, vectorised by the row's flags. */
#define NM_DEFINE_WIDEN_FACTORED(NAME)                                                       \
    static void NAME(const int8_t *c, int64_t ldc, const float *f, int64_t rows, int64_t w,  \
                     float *out) {                                                           \
        for (int64_t r = 0; r < rows; ++r)                                                   \
            for (int64_t x = 0; x < w; ++x) out[r * w + x] = f[x] * (float)c[r * ldc + x];   \
    }

/* The same, L codes a step through the row's FACTORED_STORE(dst, cp, fp) (dst unaligned):
 * widened, converted (exact), times the factors, then the last ones one at a time. */
#define NM_DEFINE_WIDEN_FACTORED_SIMD(NAME, L, FACTORED_STORE)                               \
    static void NAME(const int8_t *c, int64_t ldc, const float *f, int64_t rows, int64_t w,  \
                     float *out) {                                                           \
        for (int64_t r = 0; r < rows; ++r, c += ldc, out += w) {                             \
            int64_t x = 0;                                                                   \
            for (; x + (L) <= w; x += (L)) FACTORED_STORE(out + x, c + x, f + x);            \
            for (; x < w; ++x) out[x] = f[x] * (float)c[x];                                  \
        }                                                                                    \
    }

#define NM_DEFINE_CODEC_LOOP(NAME, IN, OUT, FN)                                              \
    static void NAME(const IN *src, OUT *dst, int64_t n) {                                   \
        for (int64_t i = 0; i < n; ++i) dst[i] = FN(src[i]);                                 \
    }

/* An 8-bit encoder named NAME over the scalar codec FN(value, saturate); the two loops let
 * the compiler vectorise each with saturate a constant. */
#define NM_DEFINE_ENCODE8_LOOP(NAME, FN)                                                     \
    static void NAME(const float *src, uint8_t *dst, int64_t n, int saturate) {              \
        if (saturate)                                                                        \
            for (int64_t i = 0; i < n; ++i) dst[i] = FN(src[i], 1);                          \
        else                                                                                 \
            for (int64_t i = 0; i < n; ++i) dst[i] = FN(src[i], 0);                          \
    }

/* ---- the 4-bit formats (Q4_0, Q4_1): two rows of the matrix a byte -------------------
 * Byte (r, j) of the weights holds the codes of rows 2r (low nibble) and 2r + 1 (high
 * nibble) of column j (nm_format_info.kpack = 2), so a column's codes stay byte-addressed
 * and every template below reads L bytes of one stored row for 2 x L weights: the L low
 * nibbles feed row 2r's chains, then the L high ones row 2r + 1's, p ascending as always.
 * k is even; the frame cuts it at the scales' blocks (even too). A row gives:
 *   NIBBLES(p, lo, hi)   the codes of L bytes at p as float32 (exact), into VECs lo, hi: a
 *                        format's own pair, NIBBLES and DEQ, may agree on a shifted code
 *                        (q - 8 for Q4_0, where a lookup table gives it for free)
 *   DEQ(q, sp, op)       the L weights of codes q with the scales at sp and offsets at op
 *                        (op unused by a format without offsets: it may be NULL + j)
 *   DEQ1(q, sp, op)      the same for one code (a float)
 * and VEC, L, SET1, LOADC, STOREC, FMA as in NM_DEFINE_GEMV_SIMD. */
#define NM_NIBBLE_LO(byte) ((float)((byte) & 15u))
#define NM_NIBBLE_HI(byte) ((float)((byte) >> 4))

/* the columns j.. of rows [0, k) one code at a time: the tail of every walk below */
#define NM_NIBBLE_TAIL_(DEQ1, k, n, a, b, ldb, c, s, o, j)                                  \
    for (; (j) < (n); ++(j)) {                                                               \
        float c_ = (c)[j];                                                                   \
        for (int64_t r_ = 0; r_ < (k) / 2; ++r_) {                                           \
            const unsigned q_ = (b)[r_ * (ldb) + (j)];                                       \
            c_ = fmaf((a)[2 * r_], DEQ1(NM_NIBBLE_LO(q_), (s) + (j), (o) + (j)), c_);       \
            c_ = fmaf((a)[2 * r_ + 1], DEQ1(NM_NIBBLE_HI(q_), (s) + (j), (o) + (j)), c_);   \
        }                                                                                    \
        (c)[j] = c_;                                                                         \
    }

/* m == 1 and m == 2, row-major (nm_gemv_fn, nm_gemv2_fn): V vectors of columns at a time
 * (4 for one row: a 64-byte line of a stored row on avx512; 2 for two rows), their C in
 * registers down all k of the call (a block of scales: 32 rows in a GGUF file), then single
 * vectors, then single codes. */
#define NM_NIBBLE_ROWS_(VEC, L, V, RR, SET1, LOADC, STOREC, FMA, NIBBLES, DEQ, k, a, lda, b,  \
                        ldb, c, ldc, s, o, j)                                                \
    do {                                                                                     \
        VEC acc_[(RR) * (V)];                                                                \
        _Pragma("GCC unroll 8") for (int i_ = 0; i_ < (RR) * (V); ++i_)                      \
            acc_[i_] = LOADC((c) + (i_ / (V)) * (ldc) + (j) + (i_ % (V)) * (L));            \
        for (int64_t r_ = 0; r_ < (k) / 2; ++r_) {                                           \
            const uint8_t *q_ = (b) + r_ * (ldb) + (j);                                      \
            _Pragma("GCC unroll 4") for (int v_ = 0; v_ < (V); ++v_) {                       \
                VEC lo_, hi_;                                                                \
                NIBBLES(q_ + v_ * (L), lo_, hi_);                                            \
                const int64_t jj_ = (j) + v_ * (L);                                          \
                const VEC wl_ = DEQ(lo_, (s) + jj_, (o) + jj_);                              \
                const VEC wh_ = DEQ(hi_, (s) + jj_, (o) + jj_);                              \
                _Pragma("GCC unroll 2") for (int i_ = 0; i_ < (RR); ++i_) {                  \
                    acc_[i_ * (V) + v_] = FMA(acc_[i_ * (V) + v_],                           \
                                              SET1((a)[i_ * (lda) + 2 * r_]), wl_);          \
                    acc_[i_ * (V) + v_] = FMA(acc_[i_ * (V) + v_],                           \
                                              SET1((a)[i_ * (lda) + 2 * r_ + 1]), wh_);      \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        _Pragma("GCC unroll 8") for (int i_ = 0; i_ < (RR) * (V); ++i_)                      \
            STOREC((c) + (i_ / (V)) * (ldc) + (j) + (i_ % (V)) * (L), acc_[i_]);            \
    } while (0)

#define NM_DEFINE_NIBBLE_GEMVS(FMT, ISA, VEC, L, SET1, LOADC, STOREC, FMA, NIBBLES, DEQ,      \
                               DEQ1)                                                         \
    static void gemv_##FMT##_##ISA(int64_t k, int64_t n, const float *a, const uint8_t *b,  \
                                   int64_t ldb, float *c, const float *s, const float *o) { \
        (void)o;                                                                             \
        int64_t j = 0;                                                                       \
        for (; j + 4 * (L) <= n; j += 4 * (L))                                               \
            NM_NIBBLE_ROWS_(VEC, L, 4, 1, SET1, LOADC, STOREC, FMA, NIBBLES, DEQ, k, a, 0, b, \
                            ldb, c, 0, s, o, j);                                             \
        for (; j + (L) <= n; j += (L))                                                       \
            NM_NIBBLE_ROWS_(VEC, L, 1, 1, SET1, LOADC, STOREC, FMA, NIBBLES, DEQ, k, a, 0, b, \
                            ldb, c, 0, s, o, j);                                             \
        NM_NIBBLE_TAIL_(DEQ1, k, n, a, b, ldb, c, s, o, j)                                   \
    }                                                                                        \
    static void gemv2_##FMT##_##ISA(int64_t k, int64_t n, const float *a, int64_t lda,      \
                                    const uint8_t *b, int64_t ldb, float *c, int64_t ldc,   \
                                    const float *s, const float *o) {                       \
        (void)o;                                                                             \
        int64_t j = 0;                                                                       \
        for (; j + 2 * (L) <= n; j += 2 * (L))                                               \
            NM_NIBBLE_ROWS_(VEC, L, 2, 2, SET1, LOADC, STOREC, FMA, NIBBLES, DEQ, k, a, lda,  \
                            b, ldb, c, ldc, s, o, j);                                        \
        for (; j + (L) <= n; j += (L))                                                       \
            NM_NIBBLE_ROWS_(VEC, L, 1, 2, SET1, LOADC, STOREC, FMA, NIBBLES, DEQ, k, a, lda,  \
                            b, ldb, c, ldc, s, o, j);                                        \
        const int64_t j0_ = j;                                                               \
        NM_NIBBLE_TAIL_(DEQ1, k, n, a, b, ldb, c, s, o, j)                                   \
        j = j0_;                                                                             \
        NM_NIBBLE_TAIL_(DEQ1, k, n, a + lda, b, ldb, c + ldc, s, o, j)                       \
    }

/* Stored row r of the packed nibble walks (its codes at row_, sliver t's slb bytes after
 * sliver t - 1's): rows 2r (low nibbles) and 2r + 1 (high) of k, for RR rows of A (lda apart)
 * times W_ decoded vectors (V_ a sliver), the scales of vector w at sp + w * L (offsets op),
 * into acc_; the low nibbles' FMAs first, so each chain takes p ascending */
#define NM_NIBBLE_STORED_ROW_(VEC, L, V_, W_, RR, SET1, FMA, NIBBLES, DEQ, acc_, a, lda, r,    \
                              row_, slb, sp, op)                                             \
    do {                                                                                     \
        VEC al_[RR], ah_[RR];                                                                \
        _Pragma("GCC unroll 2") for (int r_ = 0; r_ < (RR); ++r_) al_[r_] =                  \
            SET1((a)[r_ * (lda) + 2 * (r)]), ah_[r_] = SET1((a)[r_ * (lda) + 2 * (r) + 1]);  \
        _Pragma("GCC unroll 32") for (int w_ = 0; w_ < (W_); ++w_) {                         \
            VEC lo_, hi_;                                                                    \
            NIBBLES((row_) + w_ / (V_) * (slb) + (w_ % (V_)) * (L), lo_, hi_);               \
            const VEC wl_ = DEQ(lo_, (sp) + w_ * (L), (op) + w_ * (L));                      \
            const VEC wh_ = DEQ(hi_, (sp) + w_ * (L), (op) + w_ * (L));                      \
            _Pragma("GCC unroll 2") for (int r_ = 0; r_ < (RR); ++r_) {                      \
                acc_[r_ * (W_) + w_] = FMA(acc_[r_ * (W_) + w_], al_[r_], wl_);              \
                acc_[r_ * (W_) + w_] = FMA(acc_[r_ * (W_) + w_], ah_[r_], wh_);              \
            }                                                                                \
        }                                                                                    \
    } while (0)

/* The stored rows of the block from r0_ (block_ of them, the last block cut at k / 2) through
 * NM_NIBBLE_STORED_ROW_, that block's scales at sp and offsets at op; the walks' names
 * (k, b, ldb, slb, r0_, block_) */
#define NM_NIBBLE_BLOCK_ROWS_(VEC, L, V_, W_, RR, SET1, FMA, NIBBLES, DEQ, acc_, a, lda, sp, op) \
    for (int64_t r = r0_; r < NM_BLOCK_END_(r0_, block_, k / 2); ++r) {                      \
        const uint8_t *row_ = b + r * ldb;                                                   \
        NM_PACKED_GEMV_PREFETCH(row_, ldb);                                                  \
        NM_NIBBLE_STORED_ROW_(VEC, L, V_, W_, RR, SET1, FMA, NIBBLES, DEQ, acc_, a, lda, r,  \
                              row_, slb, sp, op);                                            \
    }

/* m == 1 and m == 2 on packed weights (nm_gemv_packed_fn, nm_gemv2_packed_fn): G slivers of
 * NRW columns at a time, side by side in one group of the packed layout (stored row r of
 * column j at b + r * ldb + j), their accumulators in registers down all k of the call,
 * through its blocks of scales (s and o step by lds every bk rows, as in
 * NM_GEMV_PACKED_SLIVERS_); then single slivers; the last, narrower than NRW, on a
 * zero-padded scratch copy of its C (its padding codes are read: zero bytes, with the padded
 * scales and offsets; their results are dropped). */
#define NM_NIBBLE_SLIVERS_(NAME, ST, RR, GG, VEC, L, NRW, SET1, LOADC, STOREC, FMA, NIBBLES,  \
                           DEQ)                                                              \
    static inline void NAME(int64_t k, int64_t ldb, int64_t slb, const float *a,            \
                            int64_t lda, const uint8_t *b, float *c, int64_t ldc,           \
                            const ST *s, const ST *o, int64_t bk, int64_t lds) {             \
        enum { V_ = (NRW) / (L), W_ = (GG) * V_ };                                           \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        const int64_t block_ = (bk < k ? bk : k) / 2; /* stored rows under one block */      \
        VEC acc_[(RR) * W_];                                                                 \
        _Pragma("GCC unroll 32") for (int i_ = 0; i_ < (RR) * W_; ++i_)                      \
            acc_[i_] = LOADC(c + (i_ / W_) * ldc + (i_ % W_) / V_ * (NRW) + (i_ % V_) * (L));  \
        /* s and o step to the next block's scales as the rows reach it (never past the    \
         * last block, not even as an unread pointer) */                                     \
        for (int64_t r0_ = 0; r0_ < k / 2; r0_ += block_, s = r0_ < k / 2 ? s + lds : s,    \
                     o = o && r0_ < k / 2 ? o + lds : o) {                                   \
            NM_NIBBLE_BLOCK_ROWS_(VEC, L, V_, W_, RR, SET1, FMA, NIBBLES, DEQ, acc_, a, lda, \
                                  s, o);                                                     \
        }                                                                                    \
        _Pragma("GCC unroll 32") for (int i_ = 0; i_ < (RR) * W_; ++i_)                      \
            STOREC(c + (i_ / W_) * ldc + (i_ % W_) / V_ * (NRW) + (i_ % V_) * (L), acc_[i_]); \
    }

/* FMT's packed gemvs on scales of type ST (float; uint16_t, binary16, for FMT##_half), each
 * scale read through DEQ; GROUP defines the walks over a group, of G slivers for one row
 * and of G2 for two, with NM_NIBBLE_SLIVERS_'s parameters (NM_NIBBLE_SLIVERS_ itself, or a
 * row's own). */
#define NM_DEFINE_NIBBLE_PACKED_GEMVS(FMT, ISA, ST, VEC, L, NRW, G, G2, SET1, LOADC, STOREC,   \
                                      FMA, NIBBLES, DEQ, GROUP)                              \
    GROUP(gemv_packed_##FMT##_##ISA##_group_, ST, 1, G, VEC, L, NRW, SET1, LOADC, STOREC, FMA, \
          NIBBLES, DEQ)                                                                      \
    NM_NIBBLE_SLIVERS_(gemv_packed_##FMT##_##ISA##_one_, ST, 1, 1, VEC, L, NRW, SET1, LOADC,   \
                       STOREC, FMA, NIBBLES, DEQ)                                            \
    GROUP(gemv2_packed_##FMT##_##ISA##_group_, ST, 2, G2, VEC, L, NRW, SET1, LOADC, STOREC,  \
          FMA, NIBBLES, DEQ)                                                                 \
    NM_NIBBLE_SLIVERS_(gemv2_packed_##FMT##_##ISA##_one_, ST, 2, 1, VEC, L, NRW, SET1, LOADC,  \
                       STOREC, FMA, NIBBLES, DEQ)                                            \
    static void gemv_packed_##FMT##_##ISA(int64_t k, int64_t ldb, int64_t slb, int64_t n,   \
                                          const float *a, const uint8_t *b, float *c,       \
                                          const ST *s, const ST *o, int64_t bk,             \
                                          int64_t lds) {                                     \
        NM_GEMV_PACKED_WALK_(gemv_packed_##FMT##_##ISA, 1, G, NRW, k, ldb, slb, n, a, 0, b, c, \
                             0, s, o, bk, lds);                                              \
    }                                                                                        \
    static void gemv2_packed_##FMT##_##ISA(int64_t k, int64_t ldb, int64_t slb, int64_t n,  \
                                           const float *a, int64_t lda, const uint8_t *b,   \
                                           float *c, int64_t ldc, const ST *s, const ST *o, \
                                           int64_t bk, int64_t lds) {                        \
        NM_GEMV_PACKED_WALK_(gemv2_packed_##FMT##_##ISA, 2, G2, NRW, k, ldb, slb, n, a, lda, \
                             b, c, ldc, s, o, bk, lds);                                      \
    }

/* The bytes between stored rows of packed weights of ITEM-byte elements on the including
 * row (NRW-column slivers, PACK_WIDTH-column groups): nm_pack_width's rule, NM_PACK_WIDTH_OF.
 * A kernel given ldb equal to it knows that it walks packed weights. */
#define NM_PACKED_LDB(ITEM, NRW) (NM_PACK_WIDTH_OF((ITEM), (NRW), PACK_WIDTH) * (ITEM))

/* Packing (nm_pack_fn) a kc x nc block into float32 slivers of width nr: stored row r gives
 * sliver rows 2r and 2r + 1; whole vectors, then single codes (each byte XOR-ed with
 * CODE_XOR first: Q4_0's packed codes), then zeros up to nr. On packed
 * weights (ldb = NM_PACKED_LDB) a prefetch 32 stored rows down, as in the avx512 row's fused
 * tile: the rows of a sliver are a group's row apart. A whole sliver (nc = nr = NRW, every
 * call of ukernel_pack by parts) goes to pack_whole_<format>: a fixed count of vectors a row
 * and restrict pointers, so the block's scales and offsets stay in registers instead of being
 * reloaded after every store (docs/kernels.md, "The block formats' speed"). */
#define NM_DEFINE_NIBBLE_PACK(FMT, ISA, VEC, L, NRW, STOREF, NIBBLES, DEQ, DEQ1, CODE_XOR)   \
    static void pack_whole_##FMT##_##ISA(int64_t kc, const uint8_t *restrict b, int64_t ldb, \
                                         float *restrict dst, const float *restrict s,       \
                                         const float *restrict o) {                          \
        (void)o;                                                                             \
        for (int64_t r = 0; r < kc / 2; ++r) {                                               \
            const uint8_t *src = b + r * ldb;                                                \
            if (ldb == NM_PACKED_LDB(1, NRW)) __builtin_prefetch(src + 32 * ldb);            \
            float *lo = dst + 2 * r * (NRW), *hi = lo + (NRW);                               \
            _Pragma("GCC unroll 8") for (int j = 0; j < (NRW); j += (L)) {                   \
                VEC ql_, qh_;                                                                \
                NIBBLES(src + j, ql_, qh_);                                                  \
                STOREF(lo + j, DEQ(ql_, s + j, o + j));                                      \
                STOREF(hi + j, DEQ(qh_, s + j, o + j));                                      \
            }                                                                                \
        }                                                                                    \
    }                                                                                        \
    static void pack_##FMT##_##ISA(int64_t kc, int64_t nc, const uint8_t *b, int64_t ldb,   \
                                   int nr, float *dst, const float *s, const float *o) {    \
        (void)o;                                                                             \
        if ((NRW) % (L) == 0 && nc == (NRW) && nr == (NRW)) {                                \
            pack_whole_##FMT##_##ISA(kc, b, ldb, dst, s, o);                                 \
            return;                                                                          \
        }                                                                                    \
        for (int64_t j0 = 0; j0 < nc; j0 += nr) {                                            \
            const int64_t w = nc - j0 < nr ? nc - j0 : nr;                                   \
            float *sliver = dst + (j0 / nr) * kc * nr;                                       \
            for (int64_t r = 0; r < kc / 2; ++r) {                                           \
                const uint8_t *src = b + r * ldb + j0;                                       \
                if (ldb == NM_PACKED_LDB(1, NRW)) __builtin_prefetch(src + 32 * ldb);        \
                float *lo = sliver + 2 * r * nr, *hi = lo + nr;                              \
                int64_t j = 0;                                                               \
                for (; j + (L) <= w; j += (L)) {                                             \
                    VEC ql_, qh_;                                                            \
                    NIBBLES(src + j, ql_, qh_);                                              \
                    STOREF(lo + j, DEQ(ql_, s + j0 + j, o + j0 + j));                        \
                    STOREF(hi + j, DEQ(qh_, s + j0 + j, o + j0 + j));                        \
                }                                                                            \
                /* the last columns (fewer than L), one by one; the explicit bound keeps   \
                 * GCC 12 from warning about an iteration past 2^62 that cannot happen */     \
                for (int t_ = 0; t_ < (L) && j < w; ++t_, ++j) {                             \
                    const unsigned q_ = src[j] ^ (CODE_XOR); /* the code as it was */        \
                    lo[j] = DEQ1(NM_NIBBLE_LO(q_), s + j0 + j, o + j0 + j);                  \
                    hi[j] = DEQ1(NM_NIBBLE_HI(q_), s + j0 + j, o + j0 + j);                  \
                }                                                                            \
                if (j < nr) { /* the padding columns */                                      \
                    memset(lo + j, 0, (size_t)(nr - j) * sizeof(float));                     \
                    memset(hi + j, 0, (size_t)(nr - j) * sizeof(float));                     \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    }

/* The single-code dequantizations, shared by every row (the vector ones are the row's); the
 * H ones read binary16 scales (nm_scales.s16), widened exactly: the same weights. */
#define NM_DEQ1_Q4_0(q, sp, op) (((q) - 8.0f) * *(sp))
#define NM_DEQ1_Q4_1(q, sp, op) fmaf((q), *(sp), *(op))
#define NM_DEQ1H_Q4_0(q, sp, op) (((q) - 8.0f) * nm_fp16_to_f32(*(sp)))
#define NM_DEQ1H_Q4_1(q, sp, op) fmaf((q), nm_fp16_to_f32(*(sp)), nm_fp16_to_f32(*(op)))

/* The slots of both 4-bit formats on a row but the first tile (ukernel_pack, which the row
 * defines, fused or NM_DEFINE_NIBBLE_UKERNEL_PACKS_BY_PARTS): the gemvs, the packed gemvs
 * and packing; each format with its NIBBLES and DEQ pair, and DEQH, its DEQ on binary16
 * scales (nm_scales.s16) for the packed gemvs. Q4_0's packed codes (each byte XOR 0x88, its
 * nibbles q - 8 in two's complement: nm_format_info.packed_xor) have their own pair,
 * NIBBLES_Q4_0P and DEQ_Q4_0P / DEQH_Q4_0P, read by its packed gemvs and by the packing
 * slot of its packed weights (pack_q4_0_packed, NM_SLOT_Q4_0_PACKED). GROUP: the packed
 * walks over a group (NM_DEFINE_NIBBLE_PACKED_GEMVS). */
#define NM_DEFINE_NIBBLE_FORMATS(ISA, VEC, L, NRW, G, G2, SET1, LOADC, STOREC, FMA,          \
                                 NIBBLES_Q4_0, DEQ_Q4_0, NIBBLES_Q4_0P, DEQ_Q4_0P, DEQH_Q4_0P, \
                                 NIBBLES_Q4_1, DEQ_Q4_1, DEQH_Q4_1, GROUP)                   \
    NM_DEFINE_NIBBLE_GEMVS(q4_0, ISA, VEC, L, SET1, LOADC, STOREC, FMA, NIBBLES_Q4_0,         \
                           DEQ_Q4_0, NM_DEQ1_Q4_0)                                           \
    NM_DEFINE_NIBBLE_GEMVS(q4_1, ISA, VEC, L, SET1, LOADC, STOREC, FMA, NIBBLES_Q4_1,         \
                           DEQ_Q4_1, NM_DEQ1_Q4_1)                                           \
    NM_DEFINE_NIBBLE_PACKED_GEMVS(q4_0, ISA, float, VEC, L, NRW, G, G2, SET1, LOADC, STOREC,  \
                                  FMA, NIBBLES_Q4_0P, DEQ_Q4_0P, GROUP)                      \
    NM_DEFINE_NIBBLE_PACKED_GEMVS(q4_1, ISA, float, VEC, L, NRW, G, G2, SET1, LOADC, STOREC,  \
                                  FMA, NIBBLES_Q4_1, DEQ_Q4_1, GROUP)                        \
    NM_DEFINE_NIBBLE_PACKED_GEMVS(q4_0_half, ISA, uint16_t, VEC, L, NRW, G, G2, SET1, LOADC,  \
                                  STOREC, FMA, NIBBLES_Q4_0P, DEQH_Q4_0P, GROUP)             \
    NM_DEFINE_NIBBLE_PACKED_GEMVS(q4_1_half, ISA, uint16_t, VEC, L, NRW, G, G2, SET1, LOADC,  \
                                  STOREC, FMA, NIBBLES_Q4_1, DEQH_Q4_1, GROUP)               \
    NM_DEFINE_NIBBLE_PACK(q4_0, ISA, VEC, L, NRW, STOREC, NIBBLES_Q4_0, DEQ_Q4_0,              \
                          NM_DEQ1_Q4_0, 0)                                                   \
    NM_DEFINE_NIBBLE_PACK(q4_0_packed, ISA, VEC, L, NRW, STOREC, NIBBLES_Q4_0P, DEQ_Q4_0P,     \
                          NM_DEQ1_Q4_0, 0x88)                                                \
    NM_DEFINE_NIBBLE_PACK(q4_1, ISA, VEC, L, NRW, STOREC, NIBBLES_Q4_1, DEQ_Q4_1, NM_DEQ1_Q4_1, \
                          0)

/* m == 1 and m == 2 on packed weights under a factored grid (nm_gemv_packed_factored_fn,
 * nm_gemv2_packed_factored_fn: the K types' q4_1 form, Q4_K and Q2_K, and their q8_0 form,
 * Q6_K, Q3_K and IQ4_XS), G slivers at a time for RR rows of A (lda apart) and C (ldc
 * apart), then one: the packed walks above, with each block's scales (and offsets) made just
 * before its rows from the block's int8 codes cs (co) and its super-block's float32 factors
 * fs (fo). FACTORED(dst, cp, fp) stores the L products fp[x] * (float)cp[x] at dst (64-byte
 * aligned): the frame's widen_factored's products, so the same scales and the same bits.
 * They land in a small array on the stack that DEQ (nibbles) or SCV (bytes) reads as it
 * reads a float32 grid, so the frame makes no pass of its own over the grid and the walk goes
 * through all of k in one call. Block q + 1's codes are ld after block q's; a super-block's
 * factors are ld after the one before, every per_super blocks (never stepped past the last,
 * not even as an unread pointer). The last sliver, narrower than NRW, runs on a zero-padded
 * copy of its C (the padding columns' codes and factors are the grid's, read, their results
 * dropped). The parts' signature (NM_FACTORED_SIGNATURE_) is the m == 2 slot's without n. */
#define NM_FACTORED_STAGE_(W_, L, FACTORED, dst, cs, fs)                                     \
    _Pragma("GCC unroll 32") for (int i_ = 0; i_ < (W_); ++i_)                               \
        FACTORED(dst + i_ * (L), cs + i_ * (L), fs + i_ * (L))
#define NM_FACTORED_NEXT_(done, cs, co, fs, fo, ld, left_, per_super)                        \
    if (done) break;                                                                         \
    cs += ld, co = co ? co + ld : co;                                                        \
    if (--left_ == 0) fs += ld, fo = fo ? fo + ld : fo, left_ = per_super
#define NM_FACTORED_SIGNATURE_(NAME)                                                         \
    void NAME(int64_t k, int64_t ldb, int64_t slb, const float *a, int64_t lda,              \
              const uint8_t *b, float *c, int64_t ldc, const int8_t *cs, const int8_t *co,   \
              const float *fs, const float *fo, int64_t bk, int64_t ld, int64_t per_super)
/* C's RR rows of W_ vectors (row-major in acc_) in and out of the accumulators */
#define NM_FACTORED_C_(RR, W_, L, OP)                                                        \
    _Pragma("GCC unroll 32") for (int i_ = 0; i_ < (RR) * (W_); ++i_) OP
/* the q4_1 form: NIBBLES and DEQ as in NM_NIBBLE_SLIVERS_ (DEQ on float32 scales) */
#define NM_FACTORED_NIBBLE_SLIVERS_(NAME, RR, GG, VEC, L, NRW, SET1, LOADC, STOREC, FMA,      \
                                    NIBBLES, DEQ, FACTORED)                                  \
    static inline NM_FACTORED_SIGNATURE_(NAME) {                                             \
        enum { V_ = (NRW) / (L), W_ = (GG) * V_ };                                           \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        const int64_t block_ = (bk < k ? bk : k) / 2; /* stored rows under one block */      \
        VEC acc_[(RR) * W_];                                                                 \
        NM_FACTORED_C_(RR, W_, L, acc_[i_] = LOADC(c + i_ / W_ * ldc + i_ % W_ * (L)));      \
        for (int64_t r0_ = 0, left_ = per_super; r0_ < k / 2; r0_ += block_) {               \
            _Alignas(64) float sc_[W_ * (L)], of_[W_ * (L)];                                 \
            NM_FACTORED_STAGE_(W_, L, FACTORED, sc_, cs, fs);                                \
            NM_FACTORED_STAGE_(W_, L, FACTORED, of_, co, fo); /* q4_1 has offsets */         \
            NM_NIBBLE_BLOCK_ROWS_(VEC, L, V_, W_, RR, SET1, FMA, NIBBLES, DEQ, acc_, a, lda, \
                                  sc_, of_);                                                 \
            NM_FACTORED_NEXT_(r0_ + block_ >= k / 2, cs, co, fs, fo, ld, left_, per_super);  \
        }                                                                                    \
        NM_FACTORED_C_(RR, W_, L, STOREC(c + i_ / W_ * ldc + i_ % W_ * (L), acc_[i_]));      \
    }
/* the q8_0 form: LOADW and SCV as in NM_GEMV_PACKED_SLIVERS_ (no offsets) */
#define NM_FACTORED_BYTE_SLIVERS_(NAME, RR, GG, VEC, L, NRW, SET1, LOADC, STOREC, FMA, LOADW, \
                                  SCV, FACTORED)                                             \
    static inline NM_FACTORED_SIGNATURE_(NAME) {                                             \
        enum { V_ = (NRW) / (L), W_ = (GG) * V_ };                                           \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        const int64_t block_ = bk < k ? bk : k; /* rows under one block */                  \
        VEC acc_[(RR) * W_];                                                                 \
        NM_FACTORED_C_(RR, W_, L, acc_[i_] = LOADC(c + i_ / W_ * ldc + i_ % W_ * (L)));      \
        for (int64_t p0_ = 0, left_ = per_super; p0_ < k; p0_ += block_) {                   \
            _Alignas(64) float sc_[W_ * (L)];                                                \
            NM_FACTORED_STAGE_(W_, L, FACTORED, sc_, cs, fs);                                \
            for (int64_t p = p0_; p < NM_BLOCK_END_(p0_, block_, k); ++p) {                  \
                const uint8_t *row_ = b + p * ldb;                                           \
                NM_PACKED_GEMV_PREFETCH(row_, ldb);                                          \
                NM_BYTE_STORED_ROW_(VEC, L, V_, W_, RR, 1, SET1, FMA, LOADW, SCV, acc_, a, lda, p, \
                                    row_, slb, sc_, sc_); /* no offsets */                   \
            }                                                                                \
            NM_FACTORED_NEXT_(p0_ + block_ >= k, cs, co, fs, fo, ld, left_, per_super);      \
        }                                                                                    \
        NM_FACTORED_C_(RR, W_, L, STOREC(c + i_ / W_ * ldc + i_ % W_ * (L), acc_[i_]));      \
    }
/* The walk over n columns inside one group, from NAME##_group_ (G slivers) and NAME##_one_
 * for RR rows: G slivers at a time, then one, then the padded tail. NAME is the m == 2 slot
 * (nm_gemv2_packed_factored_fn) with NM_DEFINE_FACTORED_WALK2, the m == 1 one with
 * NM_DEFINE_FACTORED_WALK (no lda, ldc). */
#define NM_FACTORED_WALK_(NAME, RR, G, NRW)                                                  \
    do {                                                                                     \
        int64_t j = 0;                                                                       \
        for (; j + (G) * (NRW) <= n; j += (G) * (NRW))                                       \
            NAME##_group_(k, ldb, slb, a, lda, b + j / (NRW) * slb, c + j, ldc, cs + j,      \
                          co ? co + j : NULL, fs + j, fo ? fo + j : NULL, bk, ld, per_super); \
        for (; j + (NRW) <= n; j += (NRW))                                                   \
            NAME##_one_(k, ldb, slb, a, lda, b + j / (NRW) * slb, c + j, ldc, cs + j,        \
                        co ? co + j : NULL, fs + j, fo ? fo + j : NULL, bk, ld, per_super);  \
        if (j < n) {                                                                         \
            _Alignas(64) float tail[(RR) * (NRW)] = {0};                                     \
            const size_t bytes_ = (size_t)(n - j) * sizeof(float);                           \
            for (int r_ = 0; r_ < (RR); ++r_) memcpy(tail + r_ * (NRW), c + r_ * ldc + j, bytes_); \
            NAME##_one_(k, ldb, slb, a, lda, b + j / (NRW) * slb, tail, NRW, cs + j,         \
                        co ? co + j : NULL, fs + j, fo ? fo + j : NULL, bk, ld, per_super);  \
            for (int r_ = 0; r_ < (RR); ++r_) memcpy(c + r_ * ldc + j, tail + r_ * (NRW), bytes_); \
        }                                                                                    \
    } while (0)
#define NM_DEFINE_FACTORED_WALK(NAME, G, NRW)                                                \
    static void NAME(int64_t k, int64_t ldb, int64_t slb, int64_t n, const float *a,         \
                     const uint8_t *b, float *c, const int8_t *cs, const int8_t *co,         \
                     const float *fs, const float *fo, int64_t bk, int64_t ld,               \
                     int64_t per_super) {                                                    \
        const int64_t lda = 0, ldc = 0;                                                      \
        NM_FACTORED_WALK_(NAME, 1, G, NRW);                                                  \
    }
#define NM_DEFINE_FACTORED_WALK2(NAME, G, NRW)                                               \
    static void NAME(int64_t k, int64_t ldb, int64_t slb, int64_t n, const float *a,         \
                     int64_t lda, const uint8_t *b, float *c, int64_t ldc, const int8_t *cs, \
                     const int8_t *co, const float *fs, const float *fo, int64_t bk,         \
                     int64_t ld, int64_t per_super) {                                        \
        NM_FACTORED_WALK_(NAME, 2, G, NRW);                                                  \
    }
/* One form's walks for one row and for two, gemv_packed_<FMT>_factored_<ISA> and
 * gemv2_packed_<FMT>_factored_<ISA>, G and G2 slivers at a time, from SLIVERS
 * (NM_FACTORED_NIBBLE_SLIVERS_ with NIBBLES and DEQ as X and Y, or NM_FACTORED_BYTE_SLIVERS_
 * with LOADW and SCV), the walks over a group (G slivers for one row, G2 for two) from GROUP
 * (SLIVERS's parameters: SLIVERS itself, or a row's own) */
#define NM_DEFINE_FACTORED_FORM_(SLIVERS, GROUP, FMT, ISA, G, G2, VEC, L, NRW, SET1, LOADC,  \
                                 STOREC, FMA, X, Y, FACTORED)                                \
    GROUP(gemv_packed_##FMT##_factored_##ISA##_group_, 1, G, VEC, L, NRW, SET1, LOADC, STOREC, \
          FMA, X, Y, FACTORED)                                                               \
    SLIVERS(gemv_packed_##FMT##_factored_##ISA##_one_, 1, 1, VEC, L, NRW, SET1, LOADC, STOREC, \
            FMA, X, Y, FACTORED)                                                             \
    NM_DEFINE_FACTORED_WALK(gemv_packed_##FMT##_factored_##ISA, G, NRW)                      \
    GROUP(gemv2_packed_##FMT##_factored_##ISA##_group_, 2, G2, VEC, L, NRW, SET1, LOADC,     \
          STOREC, FMA, X, Y, FACTORED)                                                       \
    SLIVERS(gemv2_packed_##FMT##_factored_##ISA##_one_, 2, 1, VEC, L, NRW, SET1, LOADC,       \
            STOREC, FMA, X, Y, FACTORED)                                                     \
    NM_DEFINE_FACTORED_WALK2(gemv2_packed_##FMT##_factored_##ISA, G2, NRW)
/* Both forms' walks for a row: q4_1 G slivers at a time for one row, G2 for two (the groups'
 * walks through NIBBLE_GROUP); q8_0 G8 and G28 (through BYTE_GROUP). */
#define NM_DEFINE_FACTORED_GEMVS(ISA, VEC, L, NRW, G, G8, G2, G28, SET1, LOADC, STOREC, FMA,  \
                                 NIBBLES, DEQ, LOADQ8, SCALEV, FACTORED, NIBBLE_GROUP,       \
                                 BYTE_GROUP)                                                 \
    NM_DEFINE_FACTORED_FORM_(NM_FACTORED_NIBBLE_SLIVERS_, NIBBLE_GROUP, q4_1, ISA, G, G2, VEC, \
                             L, NRW, SET1, LOADC, STOREC, FMA, NIBBLES, DEQ, FACTORED)       \
    NM_DEFINE_FACTORED_FORM_(NM_FACTORED_BYTE_SLIVERS_, BYTE_GROUP, q8_0, ISA, G8, G28, VEC, \
                             L, NRW, SET1, LOADC, STOREC, FMA, LOADQ8, SCALEV, FACTORED)

/* The first tile of both 4-bit formats (and of Q4_0's packed codes) as packing then the
 * row's microkernel (UKERNEL; its NR is the row's), for a row without a fused one. */
#define NM_DEFINE_NIBBLE_UKERNEL_PACKS_BY_PARTS(ISA, UKERNEL, NRW)                           \
    NM_DEFINE_UKERNEL_PACK_BY_PARTS(ukernel_pack_q4_0_##ISA, pack_q4_0_##ISA, UKERNEL, NRW,   \
                                    2)                                                       \
    NM_DEFINE_UKERNEL_PACK_BY_PARTS(ukernel_pack_q4_0_packed_##ISA, pack_q4_0_packed_##ISA,   \
                                    UKERNEL, NRW, 2)                                         \
    NM_DEFINE_UKERNEL_PACK_BY_PARTS(ukernel_pack_q4_1_##ISA, pack_q4_1_##ISA, UKERNEL, NRW, 2)

#endif
