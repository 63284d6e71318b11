/* narrowmm: the avx2 row (AVX2 + FMA + F16C). Compiled with exactly those flags; chosen at
 * run time only on CPUs that have them (dispatch/isa_table.c).
 *
 * Same contract as the scalar row: one fma per p, p ascending, per C element. Vector lanes
 * are distinct output columns, never partial sums of one element, so no bit changes. Tails
 * use fmaf, which this file's flags turn into the scalar vfmadd instruction. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../kernel_common.h"
#include "../nm_kernels.h"
#include "../../ops/exact_math.h" /* SiLU, exp: one body, as wide as the row's vectors */
#include "../x86_common.h"

#define MR 4
#define NR 24
/* packed weights of the byte formats: groups of four slivers side by side, so the m <= 2
 * walks read one stream of weights for four slivers (nm_pack_width; docs/kernels.md,
 * "Groups of slivers") */
#define PACK_WIDTH (4 * NR)
/* the packed m <= 2 walks ask for the stored row this many bytes down their stream
 * (NM_PACKED_GEMV_PREFETCH) by default, on every CPU: on a Zen 3, 2048 ran 1.04-1.21x faster
 * than none, and as fast as 4096 or faster (docs/results/gemv-prefetch-zen3-2026-12-05.txt).
 * Read when a walk runs, so that nm_set_packed_gemv_ahead can force another. */
#define PACKED_GEMV_AHEAD_DEFAULT 2048
#define PACKED_GEMV_AHEAD nm_packed_gemv_ahead(PACKED_GEMV_AHEAD_DEFAULT)

/* ---- loading 8 weights as float32 (B may sit at any byte address) ------------------- */

static inline __m256 load8_f32(const uint8_t *p) { return _mm256_loadu_ps((const float *)p); }

static inline __m256 load8_fp16(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); /* exact */
}

static inline __m256 load8_bf16(const uint8_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)); /* exact (NaNs feed an fma) */
}

/* raw() of 8 FP8 weights (nm_kernels.h), exact for every code: the binary16 bits
 * (x86_common.h) through F16C. Finite e4m3fn codes need no NaN patch (4 instructions in
 * all); e5m2 needs none for any code, so its finite slot is the same function. */
static inline __m256 load8_e4m3fn(const uint8_t *p) {
    return _mm256_cvtph_ps(fp16_bits_of_e4m3fn(_mm_loadl_epi64((const __m128i *)p)));
}

static inline __m256 load8_e5m2(const uint8_t *p) {
    return _mm256_cvtph_ps(fp16_bits_of_e5m2(_mm_loadl_epi64((const __m128i *)p)));
}

static inline __m256 load8_e4m3fn_finite(const uint8_t *p) {
    return _mm256_cvtph_ps(fp16_bits_of_e4m3fn_finite(_mm_loadl_epi64((const __m128i *)p)));
}

#define load8_e5m2_finite load8_e5m2

/* raw() of 8 Q8_0 weights: their int8 codes, widened and converted (exact) */
static inline __m256 load8_q8_0(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* raw() of 8 Q5_1 weights: their codes, bytes widened and converted (exact) */
static inline __m256 load8_q5_1(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* the scales of 8 columns (nm_kernels.h): one rounding per weight */
#define SCALE8(w, sp, op) _mm256_mul_ps(w, _mm256_loadu_ps(sp))
/* the same on binary16 scales (nm_scales.s16), widened exactly by F16C */
#define SCALE8_HALF(w, sp, op)                                                               \
    _mm256_mul_ps(w, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sp))))
/* scales and offsets (Q5_1): fma(q, scale, offset), one rounding */
#define OFFSET8(w, sp, op) _mm256_fmadd_ps(w, _mm256_loadu_ps(sp), _mm256_loadu_ps(op))
#define OFFSET8_HALF(w, sp, op)                                                              \
    _mm256_fmadd_ps(w, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sp))),             \
                    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(op))))

/* ---- m == 1: stream B four rows at a time, 32 columns per step ----------------------- */

#define FMADD8(acc, x, y) _mm256_fmadd_ps(x, y, acc)

/* m == 2 (gemv2): both rows from one read of B. In a C harness (q_proj 8B fp16, one
 * thread) 16.3 GB/s of weights, against 9.0 for two gemvs and 7.5 for the 4-row tile half
 * empty; two rows of B a step 14.9, one 10.6. */
NM_DEFINE_ROW_MAJOR_GEMVS(avx2, __m256, 8, _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps,
                          load8_f32, load8_fp16, load8_bf16, load8_e4m3fn, load8_e5m2,
                          load8_e4m3fn_finite, load8_e5m2_finite, load8_q8_0, FMADD8,
                          PREFETCH_T0, load1_fp16_f16c, SCALE8)

/* ---- packed weights -------------------------------------------------------------------
 * m == 1: four 24-column slivers at a time, 12 accumulators. Four contiguous streams per
 * thread read 1.1-1.4x faster than the row-major gemv's short runs on one thread
 * (tools/perf/gemv_layouts.c).
 * m == 2: two slivers at a time for both rows, 12 accumulators. The 4 x 24 tile would do
 * the same FMAs with half its rows empty and read one stream; this reads two and wastes
 * none: 21.5 GB/s of fp16 weights against 13 for the tile (one thread, q_proj 8B, C
 * harness). */

/* slivers the packed gemvs walk at a time (NM_DEFINE_PACKED_GEMVS): 16-bit and f32 weights
 * at m = 1 and m = 2, then the FP8 formats at m = 1 and m = 2 */
#define PACKED_SLIVERS_M1 4
#define PACKED_SLIVERS_M2 2
#define PACKED_SLIVERS_FP8_M1 4
#define PACKED_SLIVERS_FP8_M2 2
NM_DEFINE_PACKED_GEMVS(avx2, __m256, 8, NR,
                       PACKED_SLIVERS_M1, PACKED_SLIVERS_M2, PACKED_SLIVERS_FP8_M1,
                       PACKED_SLIVERS_FP8_M2, _mm256_set1_ps, _mm256_loadu_ps,
                       _mm256_storeu_ps, load8_f32, load8_fp16, load8_bf16, load8_e4m3fn,
                       load8_e5m2, load8_e4m3fn_finite, load8_e5m2_finite, load8_q8_0,
                       FMADD8, SCALE8, SCALE8_HALF, NM_GEMV_PACKED_SLIVERS_)
NM_DEFINE_Q5_1_FORMAT(avx2, __m256, 8, NR, PACKED_SLIVERS_FP8_M1, PACKED_SLIVERS_FP8_M2,
                      _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps, load8_q5_1, FMADD8,
                      PREFETCH_T0, OFFSET8, OFFSET8_HALF, NM_GEMV_PACKED_SLIVERS_)

/* ---- packing a narrow sliver (the last of a column range) --------------------------- */

NM_DEFINE_PACK(pack_f32_avx2, 4, 8, load8_f32, _mm256_storeu_ps, nm_load1_f32, NM_UNSCALED,
               NM_UNSCALED)
NM_DEFINE_PACK(pack_fp16_avx2, 2, 8, load8_fp16, _mm256_storeu_ps, load1_fp16_f16c,
               NM_UNSCALED, NM_UNSCALED)
NM_DEFINE_PACK(pack_bf16_avx2, 2, 8, load8_bf16, _mm256_storeu_ps, nm_load1_bf16, NM_UNSCALED,
               NM_UNSCALED)
NM_DEFINE_PACK(pack_e4m3fn_avx2, 1, 8, load8_e4m3fn, _mm256_storeu_ps, nm_load1_e4m3fn_raw,
               SCALE8, NM_SCALE1)
NM_DEFINE_PACK(pack_e5m2_avx2, 1, 8, load8_e5m2, _mm256_storeu_ps, nm_load1_e5m2_raw, SCALE8,
               NM_SCALE1)
NM_DEFINE_PACK(pack_e4m3fn_finite_avx2, 1, 8, load8_e4m3fn_finite, _mm256_storeu_ps,
               nm_load1_e4m3fn_raw, SCALE8, NM_SCALE1)
NM_DEFINE_PACK(pack_e5m2_finite_avx2, 1, 8, load8_e5m2_finite, _mm256_storeu_ps,
               nm_load1_e5m2_raw, SCALE8, NM_SCALE1)
NM_DEFINE_PACK(pack_q8_0_avx2, 1, 8, load8_q8_0, _mm256_storeu_ps, nm_load1_q8_0_raw, SCALE8,
               NM_SCALE1)

/* ---- the 4 x 24 microkernel: 12 accumulators, 3 B vectors, 1 broadcast ---------------
 * Named registers rather than an array: compilers keep these in ymm registers, where an
 * array of __m256 gets spilled to the stack on every step. Four rows divide the batch sizes
 * that matter (16, 128) exactly, and need fewer broadcasts per FMA than six. */

#define TILE_LOAD_C(c, ldc)                                                                  \
    float *c0p = (c), *c1p = c0p + (ldc), *c2p = c1p + (ldc), *c3p = c2p + (ldc);           \
    __m256 c00 = _mm256_loadu_ps(c0p), c01 = _mm256_loadu_ps(c0p + 8);                       \
    __m256 c02 = _mm256_loadu_ps(c0p + 16), c10 = _mm256_loadu_ps(c1p);                      \
    __m256 c11 = _mm256_loadu_ps(c1p + 8), c12 = _mm256_loadu_ps(c1p + 16);                  \
    __m256 c20 = _mm256_loadu_ps(c2p), c21 = _mm256_loadu_ps(c2p + 8);                       \
    __m256 c22 = _mm256_loadu_ps(c2p + 16), c30 = _mm256_loadu_ps(c3p);                      \
    __m256 c31 = _mm256_loadu_ps(c3p + 8), c32 = _mm256_loadu_ps(c3p + 16);

/* step p of every chain of the tile: row i of the tile times the three B vectors */
#define TILE_FMA_STEP(ap, p, b0, b1, b2)                                                     \
    do {                                                                                     \
        __m256 ai = _mm256_broadcast_ss((ap) + (p) * MR);                                    \
        c00 = _mm256_fmadd_ps(ai, b0, c00);                                                  \
        c01 = _mm256_fmadd_ps(ai, b1, c01);                                                  \
        c02 = _mm256_fmadd_ps(ai, b2, c02);                                                  \
        ai = _mm256_broadcast_ss((ap) + (p) * MR + 1);                                       \
        c10 = _mm256_fmadd_ps(ai, b0, c10);                                                  \
        c11 = _mm256_fmadd_ps(ai, b1, c11);                                                  \
        c12 = _mm256_fmadd_ps(ai, b2, c12);                                                  \
        ai = _mm256_broadcast_ss((ap) + (p) * MR + 2);                                       \
        c20 = _mm256_fmadd_ps(ai, b0, c20);                                                  \
        c21 = _mm256_fmadd_ps(ai, b1, c21);                                                  \
        c22 = _mm256_fmadd_ps(ai, b2, c22);                                                  \
        ai = _mm256_broadcast_ss((ap) + (p) * MR + 3);                                       \
        c30 = _mm256_fmadd_ps(ai, b0, c30);                                                  \
        c31 = _mm256_fmadd_ps(ai, b1, c31);                                                  \
        c32 = _mm256_fmadd_ps(ai, b2, c32);                                                  \
    } while (0)

#define TILE_STORE_C()                                                                       \
    _mm256_storeu_ps(c0p, c00), _mm256_storeu_ps(c0p + 8, c01);                              \
    _mm256_storeu_ps(c0p + 16, c02), _mm256_storeu_ps(c1p, c10);                             \
    _mm256_storeu_ps(c1p + 8, c11), _mm256_storeu_ps(c1p + 16, c12);                         \
    _mm256_storeu_ps(c2p, c20), _mm256_storeu_ps(c2p + 8, c21);                              \
    _mm256_storeu_ps(c2p + 16, c22), _mm256_storeu_ps(c3p, c30);                             \
    _mm256_storeu_ps(c3p + 8, c31), _mm256_storeu_ps(c3p + 16, c32);

static void tile_4x24(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc,
                      const float *c_next) {
    PREFETCH_C_TILE(c_next, ldc);
    TILE_LOAD_C(c, ldc)
    for (int64_t p = 0; p < kc; ++p) {
        const float *bq = bp + p * NR;
        const __m256 b0 = _mm256_load_ps(bq), b1 = _mm256_load_ps(bq + 8),
                     b2 = _mm256_load_ps(bq + 16);
        TILE_FMA_STEP(ap, p, b0, b1, b2);
    }
    TILE_STORE_C()
}

static void ukernel_4x24_avx2(int64_t kc, int64_t mr, int64_t nr, const float *ap,
                              const float *bp, float *c, int64_t ldc, const float *c_next) {
    if (mr == MR && nr == NR) {
        tile_4x24(kc, ap, bp, c, ldc, c_next);
        return;
    }
    WITH_SCRATCH_TILE(mr, nr, c, ldc, tile_4x24(kc, ap, bp, scratch, NR, c_next));
}

/* ---- the first tile of a sliver, decoding B on the way ------------------------------
 * Each step converts one row of the sliver (3 x 8 weights), stores it for the tiles below
 * and feeds the same registers to the 12 FMAs, so the decode rides along with the
 * arithmetic instead of costing a pass of its own. B is read 48 or 96 bytes per row across
 * kc rows, a pattern the hardware prefetchers do not follow, so each step asks for every
 * line of the same row B_AHEAD weights further on, two to three slivers ahead. Further is
 * worse when m is large: with 32 tiles per sliver at m = 128, lines fetched five slivers
 * early were evicted again before use (C microbenchmark, warm L3: 128 weights 77-84
 * GFLOP/s, 64 weights 94, 32 weights 86, none 67; m = 16: 84-87, 84-85, 60-63, 31-45). */
#define B_AHEAD 64
/* a group of byte-format slivers: 64 rows down (128, the avx512 row's, ran 0.97x at m = 8
 * on a Zen 4's avx2 row, Q8_0 896 x 4864) */
#define BYTE_GROUP_AHEAD_ROWS 64

#define NM_DEFINE_UKERNEL_PACK(NAME, TILE, ITEM, LOAD8, SCV)                                 \
    static void TILE(int64_t kc, const float *ap, const uint8_t *b, int64_t ldb, float *bp,  \
                     float *c, int64_t ldc, const float *c_next, const float *s,             \
                     const float *o, int64_t bk, int64_t lds) {                              \
        PREFETCH_C_TILE(c_next, ldc);                                                        \
        TILE_LOAD_C(c, ldc)                                                                  \
        const int64_t ahead = SLIVER_AHEAD_BYTES(ldb, ITEM);                                 \
        NM_TILE_SCALES_INIT_(s, kc, bk, 1);                                                  \
        for (int64_t p = 0; p < kc; ++p) {                                                   \
            NM_TILE_SCALES_NEXT_(s, o, bk, lds, 1);                                          \
            const uint8_t *src = b + p * ldb;                                                \
            PREFETCH_SLIVER_ROW_AHEAD(src, ITEM, ahead);                                     \
            const __m256 b0 = SCV(LOAD8(src), s, o);                                         \
            const __m256 b1 = SCV(LOAD8(src + 8 * (ITEM)), s + 8, o + 8);                    \
            const __m256 b2 = SCV(LOAD8(src + 16 * (ITEM)), s + 16, o + 16);                 \
            float *bq = bp + p * NR;                                                         \
            _mm256_store_ps(bq, b0);                                                         \
            _mm256_store_ps(bq + 8, b1);                                                     \
            _mm256_store_ps(bq + 16, b2);                                                    \
            TILE_FMA_STEP(ap, p, b0, b1, b2);                                                \
        }                                                                                    \
        TILE_STORE_C()                                                                       \
    }                                                                                        \
    NM_DEFINE_UKERNEL_PACK_FROM_TILE(NAME, TILE)

NM_DEFINE_UKERNEL_PACK(ukernel_pack_f32_avx2, tile_pack_f32, 4, load8_f32, NM_UNSCALED)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_fp16_avx2, tile_pack_fp16, 2, load8_fp16, NM_UNSCALED)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_bf16_avx2, tile_pack_bf16, 2, load8_bf16, NM_UNSCALED)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_e4m3fn_avx2, tile_pack_e4m3fn, 1, load8_e4m3fn, SCALE8)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_e5m2_avx2, tile_pack_e5m2, 1, load8_e5m2, SCALE8)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_e4m3fn_finite_avx2, tile_pack_e4m3fn_finite, 1,
                       load8_e4m3fn_finite, SCALE8)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_e5m2_finite_avx2, tile_pack_e5m2_finite, 1,
                       load8_e5m2_finite, SCALE8)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_q8_0_avx2, tile_pack_q8_0, 1, load8_q8_0, SCALE8)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_q5_1_avx2, tile_pack_q5_1, 1, load8_q5_1, OFFSET8)

/* ---- the 4-bit formats (kernel_common.h): 8 bytes, 16 codes, two rows --------------- */

static inline void nibbles8(const uint8_t *p, __m256 *lo, __m256 *hi) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    *lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15))); /* exact */
    *hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4));
}
#define NIBBLES8(p, lo, hi) nibbles8((p), &(lo), &(hi))
/* (q - 8) * d and fma(q, d, m): q - 8 is exact, and so is each product */
#define DEQ8_Q4_0(q, sp, op) _mm256_mul_ps(_mm256_sub_ps(q, _mm256_set1_ps(8.0f)), _mm256_loadu_ps(sp))
#define DEQ8_Q4_1(q, sp, op) _mm256_fmadd_ps(q, _mm256_loadu_ps(sp), _mm256_loadu_ps(op))
/* the same on binary16 scales and offsets (nm_scales.s16), widened exactly by F16C */
#define LOAD8_HALF(sp) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sp)))
#define DEQH8_Q4_1(q, sp, op) _mm256_fmadd_ps(q, LOAD8_HALF(sp), LOAD8_HALF(op))
/* Q4_0's packed codes (each byte XOR 0x88: nibbles q - 8 in two's complement) sign-extended:
 * the low nibble by a shift up and an arithmetic shift down, the high one by an arithmetic
 * shift, so the codes are q - 8 already and a weight is one multiplication, (q - 8) * d */
static inline void nibbles8_q4_0p(const uint8_t *p, __m256 *lo, __m256 *hi) {
    const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
    *lo = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 28), 28));
    *hi = _mm256_cvtepi32_ps(_mm256_srai_epi32(v, 4));
}
#define NIBBLES8_Q4_0P(p, lo, hi) nibbles8_q4_0p((p), &(lo), &(hi))
#define DEQ8_Q4_0P(q8, sp, op) _mm256_mul_ps(q8, _mm256_loadu_ps(sp))
#define DEQH8_Q4_0P(q8, sp, op) _mm256_mul_ps(q8, LOAD8_HALF(sp))
/* packed: two 24-column slivers at a time for one row (6 accumulators), one for two */
NM_DEFINE_NIBBLE_FORMATS(avx2, __m256, 8, NR, 2, 1, _mm256_set1_ps, _mm256_loadu_ps,
                         _mm256_storeu_ps, FMADD8, NIBBLES8, DEQ8_Q4_0, NIBBLES8_Q4_0P,
                         DEQ8_Q4_0P, DEQH8_Q4_0P, NIBBLES8, DEQ8_Q4_1, DEQH8_Q4_1,
                         NM_NIBBLE_SLIVERS_)
NM_DEFINE_NIBBLE_UKERNEL_PACKS_BY_PARTS(avx2, ukernel_4x24_avx2, NR)

/* The rows of one block of scales (from stored row r0_) of Q4_1's staged walks: scales_ in
 * registers, the offsets staged at offsets_ and read through a pointer the compiler cannot
 * follow, so that each decode FMA takes them as a memory operand (see below). */
#define Q4_1_STAGED_BLOCK_ROWS(W_)                                                           \
    const float *op_ = offsets_;                                                             \
    const int64_t end_ = NM_BLOCK_END_(r0_, block_, k / 2);                                  \
    for (int64_t r = r0_; r < end_; ++r) {                                                   \
        __asm__("" : "+r"(op_)); /* a memory operand at every use */                         \
        const uint8_t *row_ = b + r * ldb;                                                   \
        NM_PACKED_GEMV_PREFETCH(row_, ldb);                                                  \
        const __m256 al_ = _mm256_set1_ps(a[2 * r]), ah_ = _mm256_set1_ps(a[2 * r + 1]);     \
        _Pragma("GCC unroll 6") for (int w_ = 0; w_ < W_; ++w_) {                            \
            __m256 lo_, hi_;                                                                 \
            nibbles8(row_ + w_ / 3 * slb + (w_ % 3) * 8, &lo_, &hi_);                        \
            const __m256 off_ = _mm256_load_ps(op_ + 8 * w_);                                \
            const __m256 wl_ = _mm256_fmadd_ps(lo_, scales_[w_], off_);                      \
            const __m256 wh_ = _mm256_fmadd_ps(hi_, scales_[w_], off_);                      \
            acc_[w_] = _mm256_fmadd_ps(al_, wl_, acc_[w_]);                                  \
            acc_[w_] = _mm256_fmadd_ps(ah_, wh_, acc_[w_]);                                  \
        }                                                                                    \
    }

/* Q4_1's packed gemv (one row, two slivers, 6 accumulators) with each block's offsets
 * widened once into a stack array and read from it at every use, through a pointer the
 * compiler cannot follow, so that the decode's FMA takes them as a memory operand. The
 * template hoists the block's scales and offsets into registers, 12 vectors beside the 6
 * accumulators, two broadcasts and the mask: more than 16, so the compiler reloaded them
 * from the stack as separate loads, each row. The same operations, so the same bits; 3.34 ->
 * 3.11 cycles per 16 weights on an L2-resident group (Zen 3,
 * docs/results/ab-avx2-q4-zen3-2026-12-05.txt). WIDEN8 reads 8 scales or offsets of the
 * grid's type (float32, or binary16 widened exactly). */
#define NM_DEFINE_Q4_1_STAGED_GEMV(NAME, ST, WIDEN8)                                          \
    static void NAME##_group_(int64_t k, int64_t ldb, int64_t slb, const float *a,          \
                              int64_t lda, const uint8_t *b, float *c, int64_t ldc,         \
                              const ST *s, const ST *o, int64_t bk, int64_t lds) {           \
        (void)lda, (void)ldc;                                                                \
        enum { W_ = 2 * NR / 8 };                                                            \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        const int64_t block_ = (bk < k ? bk : k) / 2; /* stored rows under one block */      \
        __m256 acc_[W_];                                                                     \
        _Pragma("GCC unroll 6") for (int i_ = 0; i_ < W_; ++i_)                              \
            acc_[i_] = _mm256_loadu_ps(c + i_ / 3 * NR + (i_ % 3) * 8);                       \
        for (int64_t r0_ = 0; r0_ < k / 2; r0_ += block_, s = r0_ < k / 2 ? s + lds : s,      \
                     o = r0_ < k / 2 ? o + lds : o) {                                        \
            _Alignas(32) float offsets_[W_ * 8];                                             \
            __m256 scales_[W_];                                                              \
            _Pragma("GCC unroll 6") for (int i_ = 0; i_ < W_; ++i_) {                        \
                scales_[i_] = WIDEN8(s + 8 * i_);                                            \
                _mm256_store_ps(offsets_ + 8 * i_, WIDEN8(o + 8 * i_));                      \
            }                                                                                \
            Q4_1_STAGED_BLOCK_ROWS(W_);                                                      \
        }                                                                                    \
        _Pragma("GCC unroll 6") for (int i_ = 0; i_ < W_; ++i_)                              \
            _mm256_storeu_ps(c + i_ / 3 * NR + (i_ % 3) * 8, acc_[i_]);                       \
    }                                                                                        \
    static void NAME(int64_t k, int64_t ldb, int64_t slb, int64_t n, const float *a,         \
                     const uint8_t *b, float *c, const ST *s, const ST *o, int64_t bk,       \
                     int64_t lds) {                                                          \
        NM_GEMV_PACKED_WALK_(NAME, 1, 2, NR, k, ldb, slb, n, a, 0, b, c, 0, s, o, bk, lds);   \
    }

/* a single sliver, and the last, narrower one: the template's (NM_GEMV_PACKED_WALK_) */
#define gemv_packed_q4_1_staged_avx2_one_ gemv_packed_q4_1_avx2_one_
#define gemv_packed_q4_1_half_staged_avx2_one_ gemv_packed_q4_1_half_avx2_one_
NM_DEFINE_Q4_1_STAGED_GEMV(gemv_packed_q4_1_staged_avx2, float, _mm256_loadu_ps)
NM_DEFINE_Q4_1_STAGED_GEMV(gemv_packed_q4_1_half_staged_avx2, uint16_t, LOAD8_HALF)

/* Q4_0's packed gemvs on binary16 scales (m = 1 and 2). Its packed codes are signed
 * nibbles (each byte XOR 0x88: q - 8 in two's complement), so a byte sign-extended and
 * shifted left by 28 is (q_lo - 8) * 2^28, and masked (& ~15) (q_hi - 8) * 16, both exact in
 * int32 and in float32. Multiplied by the block's d * 2^-28 and d * 2^-4 (exact: a binary16 d
 * is at least 2^-24 in magnitude, so both are normal float32 numbers; staged on the stack and
 * read as memory operands, as Q4_1's offsets above), each weight is (q - 8) * d rounded once,
 * as the other rows': the same bits, a zero's sign, Inf and NaN included. 9 vector
 * operations per 16 weights where the template on the file's codes took 11 (vpmovzxbd, and,
 * srl, two conversions, two subtractions, two multiplications, two FMAs); on an L2-resident
 * group of a Zen 3, 3.15-3.22 against 3.65-3.72 cycles
 * (docs/results/q4_0-signed-nibbles-zen3-2026-12-05.txt). Not for float32 grids: there
 * d * 2^-28 can fall below the normal range and round. */
#define NM_DEFINE_Q4_0_SIGNED_SLIVERS(NAME, RR, SL)                                         \
    static void NAME(int64_t k, int64_t ldb, int64_t slb, const float *a, int64_t lda,       \
                     const uint8_t *b, float *c, int64_t ldc, const uint16_t *s,             \
                     const uint16_t *o, int64_t bk, int64_t lds) {                           \
        (void)o; /* Q4_0 has no offsets */                                                   \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        enum { W_ = (SL) * NR / 8 };                                                         \
        const int64_t block_ = (bk < k ? bk : k) / 2; /* stored rows under one block */      \
        __m256 acc_[(RR) * W_];                                                              \
        _Pragma("GCC unroll 6") for (int i_ = 0; i_ < (RR) * W_; ++i_)                       \
            acc_[i_] = _mm256_loadu_ps(c + i_ / W_ * ldc + (i_ % W_) / 3 * NR + (i_ % 3) * 8); \
        for (int64_t r0_ = 0; r0_ < k / 2; r0_ += block_, s = r0_ < k / 2 ? s + lds : s) {   \
            _Alignas(32) float low_[W_ * 8], high_[W_ * 8];                                  \
            _Pragma("GCC unroll 6") for (int i_ = 0; i_ < W_; ++i_) {                        \
                const __m256 d_ = LOAD8_HALF(s + 8 * i_);                                    \
                _mm256_store_ps(low_ + 8 * i_, _mm256_mul_ps(d_, _mm256_set1_ps(0x1p-28f)));   \
                _mm256_store_ps(high_ + 8 * i_, _mm256_mul_ps(d_, _mm256_set1_ps(0x1p-4f)));   \
            }                                                                                \
            const float *lp_ = low_, *hp_ = high_;                                           \
            const int64_t end_ = NM_BLOCK_END_(r0_, block_, k / 2);                          \
            for (int64_t r = r0_; r < end_; ++r) {                                           \
                __asm__("" : "+r"(lp_)); /* memory operands at every use */                  \
                __asm__("" : "+r"(hp_));                                                     \
                const uint8_t *row_ = b + r * ldb;                                           \
                NM_PACKED_GEMV_PREFETCH(row_, ldb);                                          \
                __m256 al_[RR], ah_[RR];                                                     \
                _Pragma("GCC unroll 2") for (int i_ = 0; i_ < (RR); ++i_) {                  \
                    al_[i_] = _mm256_set1_ps(a[i_ * lda + 2 * r]);                           \
                    ah_[i_] = _mm256_set1_ps(a[i_ * lda + 2 * r + 1]);                       \
                }                                                                            \
                _Pragma("GCC unroll 6") for (int w_ = 0; w_ < W_; ++w_) {                    \
                    const __m256i v_ = _mm256_cvtepi8_epi32(_mm_loadl_epi64(                 \
                        (const __m128i *)(row_ + w_ / 3 * slb + (w_ % 3) * 8)));             \
                    const __m256 lo_ = _mm256_cvtepi32_ps(_mm256_slli_epi32(v_, 28));        \
                    const __m256 hi_ =                                                       \
                        _mm256_cvtepi32_ps(_mm256_and_si256(v_, _mm256_set1_epi32(~15)));    \
                    const __m256 wl_ = _mm256_mul_ps(lo_, _mm256_load_ps(lp_ + 8 * w_));     \
                    const __m256 wh_ = _mm256_mul_ps(hi_, _mm256_load_ps(hp_ + 8 * w_));     \
                    _Pragma("GCC unroll 2") for (int i_ = 0; i_ < (RR); ++i_) {              \
                        acc_[i_ * W_ + w_] = _mm256_fmadd_ps(al_[i_], wl_, acc_[i_ * W_ + w_]); \
                        acc_[i_ * W_ + w_] = _mm256_fmadd_ps(ah_[i_], wh_, acc_[i_ * W_ + w_]); \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        _Pragma("GCC unroll 6") for (int i_ = 0; i_ < (RR) * W_; ++i_)                       \
            _mm256_storeu_ps(c + i_ / W_ * ldc + (i_ % W_) / 3 * NR + (i_ % 3) * 8, acc_[i_]); \
    }
/* one row: two slivers at a time (6 accumulators), then one; two rows: one (6) */
NM_DEFINE_Q4_0_SIGNED_SLIVERS(gemv_packed_q4_0_half_signed_avx2_group_, 1, 2)
NM_DEFINE_Q4_0_SIGNED_SLIVERS(gemv_packed_q4_0_half_signed_avx2_one_, 1, 1)
NM_DEFINE_Q4_0_SIGNED_SLIVERS(gemv2_packed_q4_0_half_signed_avx2_one_, 2, 1)
#define gemv2_packed_q4_0_half_signed_avx2_group_ gemv2_packed_q4_0_half_signed_avx2_one_
static void gemv_packed_q4_0_half_signed_avx2(int64_t k, int64_t ldb, int64_t slb, int64_t n,
                                              const float *a, const uint8_t *b, float *c,
                                              const uint16_t *s, const uint16_t *o,
                                              int64_t bk, int64_t lds) {
    NM_GEMV_PACKED_WALK_(gemv_packed_q4_0_half_signed_avx2, 1, 2, NR, k, ldb, slb, n, a, 0, b,
                         c, 0, s, o, bk, lds);
}
static void gemv2_packed_q4_0_half_signed_avx2(int64_t k, int64_t ldb, int64_t slb, int64_t n,
                                               const float *a, int64_t lda, const uint8_t *b,
                                               float *c, int64_t ldc, const uint16_t *s,
                                               const uint16_t *o, int64_t bk, int64_t lds) {
    NM_GEMV_PACKED_WALK_(gemv2_packed_q4_0_half_signed_avx2, 2, 1, NR, k, ldb, slb, n, a, lda,
                         b, c, ldc, s, o, bk, lds);
}

/* The m == 4 walks on binary16 scales (nm_gemv4_packed_half_fn) of Q4_0 (the signed
 * nibbles as above) and Q4_1: each decoded vector feeds four rows' FMAs, V vectors of 8
 * columns at a time through all of k: 4V accumulators, the four rows' broadcasts of one
 * step (a row) and the V decoded vectors, 16 registers at V = 2. The low nibbles' FMAs come
 * before the high ones', so every chain takes p ascending. A block's two staged vectors
 * (Q4_0: d * 2^-28 and d * 2^-4; Q4_1: d and m) and the nibble mask are read from memory at
 * each use: no register is left for them. A form a sliver (24 columns) wide, with a
 * broadcast loaded for each FMA instead of one for two, measured 1.14x slower on a Zen 3.
 * The vectors' bytes are at b + off[w] (8 columns never straddle a sliver: NR = 24). */
static const __m256i q4_0_high_nibble_mask = {~0xf0000000fLL, ~0xf0000000fLL, ~0xf0000000fLL,
                                              ~0xf0000000fLL};
static const __m256i low_nibble_mask = {0xf0000000fLL, 0xf0000000fLL, 0xf0000000fLL,
                                        0xf0000000fLL};
/* Q4_0: the signed codes; (q - 8) * 2^28 and (q - 8) * 16 times the staged d * 2^-28 and
 * d * 2^-4 (exact products, as in the m == 1 walk above) */
#define QUAD_WIDEN_Q4_0(p) _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define QUAD_STAGE_Q4_0(st0, st1, s, o)                                                      \
    do {                                                                                     \
        const __m256 d_ = LOAD8_HALF(s);                                                     \
        _mm256_store_ps(st0, _mm256_mul_ps(d_, _mm256_set1_ps(0x1p-28f)));                     \
        _mm256_store_ps(st1, _mm256_mul_ps(d_, _mm256_set1_ps(0x1p-4f)));                      \
    } while (0)
#define QUAD_LOW_Q4_0(v, p0, p1, mask)                                                       \
    _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_slli_epi32(v, 28)), _mm256_load_ps(p0))
#define QUAD_HIGH_Q4_0(v, p0, p1, mask)                                                      \
    _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_load_si256(mask))),          \
                  _mm256_load_ps(p1))
/* Q4_1: fma(q, d, m) on the codes zero-extended; its scales and offsets binary16
 * (widened exactly) or float32 (Q4_1F: a factored grid multiplied out by the frame) */
#define QUAD_WIDEN_Q4_1(p) _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#define QUAD_STAGE_SCALES_OFFSETS(st0, st1, s, o, WIDEN8)                                    \
    do {                                                                                     \
        _mm256_store_ps(st0, WIDEN8(s));                                                     \
        _mm256_store_ps(st1, WIDEN8(o));                                                     \
    } while (0)
#define QUAD_STAGE_Q4_1(st0, st1, s, o) QUAD_STAGE_SCALES_OFFSETS(st0, st1, s, o, LOAD8_HALF)
#define QUAD_WIDEN_Q4_1F QUAD_WIDEN_Q4_1
#define QUAD_STAGE_Q4_1F(st0, st1, s, o)                                                     \
    QUAD_STAGE_SCALES_OFFSETS(st0, st1, s, o, _mm256_loadu_ps)
#define QUAD_LOW_Q4_1F QUAD_LOW_Q4_1
#define QUAD_HIGH_Q4_1F QUAD_HIGH_Q4_1
#define QUAD_LOW_Q4_1(v, p0, p1, mask)                                                       \
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_load_si256(mask))),        \
                    _mm256_load_ps(p0), _mm256_load_ps(p1))
#define QUAD_HIGH_Q4_1(v, p0, p1, mask)                                                      \
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 4)), _mm256_load_ps(p0),          \
                    _mm256_load_ps(p1))
/* The pieces of the m == 4 walks: C's four rows of V vectors in and out of the
 * accumulators, and one step p of k, the four rows' broadcasts of A times the V decoded
 * vectors wv */
#define QUAD_LOAD_C(acc, V, c, ldc)                                                          \
    _Pragma("GCC unroll 8") for (int x_ = 0; x_ < 4 * (V); ++x_)                             \
        acc[x_] = _mm256_loadu_ps((c) + x_ / (V) * (ldc) + (x_ % (V)) * 8)
#define QUAD_STORE_C(acc, V, c, ldc)                                                         \
    _Pragma("GCC unroll 8") for (int x_ = 0; x_ < 4 * (V); ++x_)                             \
        _mm256_storeu_ps((c) + x_ / (V) * (ldc) + (x_ % (V)) * 8, acc[x_])
#define QUAD_FMAS(acc, wv, V, a, lda, p)                                                     \
    do {                                                                                     \
        __m256 av_[4];                                                                       \
        _Pragma("GCC unroll 4") for (int i_ = 0; i_ < 4; ++i_)                               \
            av_[i_] = _mm256_broadcast_ss((a) + i_ * (lda) + (p));                           \
        _Pragma("GCC unroll 8") for (int x_ = 0; x_ < 4 * (V); ++x_)                         \
            acc[x_] = _mm256_fmadd_ps(av_[x_ / (V)], wv[x_ % (V)], acc[x_]);                 \
    } while (0)
#define NM_DEFINE_NIBBLE_QUAD(NAME, FMT, ST, V, MASK)                                        \
    static void NAME(int64_t k, int64_t ldb, const int64_t *off, const float *a,             \
                     int64_t lda, const uint8_t *b, float *c, int64_t ldc, const ST *s,       \
                     const ST *o, int64_t bk, int64_t lds) {                                 \
        const int64_t block = (bk < k ? bk : k) / 2; /* stored rows under one block */       \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        __m256 acc[4 * (V)];                                                                 \
        QUAD_LOAD_C(acc, V, c, ldc);                                                         \
        /* s (and o) step to the next block's scales (never past the last) */                \
        for (int64_t r0 = 0; r0 < k / 2; r0 += block, s = r0 < k / 2 ? s + lds : s,          \
                     o = o && r0 < k / 2 ? o + lds : o) {                                    \
            _Alignas(32) float st0[8 * (V)], st1[8 * (V)];                                   \
            _Pragma("GCC unroll 2") for (int w = 0; w < (V); ++w)                            \
                QUAD_STAGE_##FMT(st0 + 8 * w, st1 + 8 * w, s + 8 * w, o + 8 * w);            \
            const float *p0 = st0, *p1 = st1;                                                \
            const __m256i *mask = &(MASK);                                                   \
            const int64_t end = k / 2 - r0 < block ? k / 2 : r0 + block;                     \
            for (int64_t r = r0; r < end; ++r) {                                             \
                __asm__("" : "+r"(p0)); /* memory operands at every use */                   \
                __asm__("" : "+r"(p1));                                                      \
                __asm__("" : "+r"(mask));                                                    \
                const uint8_t *row = b + r * ldb;                                            \
                NM_PACKED_GEMV_PREFETCH(row, ldb);                                           \
                __m256i v[V];                                                                \
                __m256 wv[V];                                                                \
                _Pragma("GCC unroll 2") for (int w = 0; w < (V); ++w) {                      \
                    v[w] = QUAD_WIDEN_##FMT(row + off[w]);                                   \
                    wv[w] = QUAD_LOW_##FMT(v[w], p0 + 8 * w, p1 + 8 * w, mask);              \
                }                                                                            \
                QUAD_FMAS(acc, wv, V, a, lda, 2 * r);                                        \
                /* the high half's loads after the low half's FMAs: decoded early, both  \
                 * halves would need more registers than there are */                       \
                __asm__("" : "+r"(p0), "+r"(p1) : "x"(acc[4 * (V) - 1]));                    \
                _Pragma("GCC unroll 2") for (int w = 0; w < (V); ++w)                        \
                    wv[w] = QUAD_HIGH_##FMT(v[w], p0 + 8 * w, p1 + 8 * w, mask);             \
                QUAD_FMAS(acc, wv, V, a, lda, 2 * r + 1);                                    \
            }                                                                                \
        }                                                                                    \
        QUAD_STORE_C(acc, V, c, ldc);                                                        \
    }
/* The m == 4 walks of the byte formats, Q8_0 (q * d) and Q5_1 (fma(q, d, m)), on binary16
 * (WIDEN8 LOAD8_HALF) or float32 scales: one row of k a stored row, the block's d (and m)
 * staged and read as memory operands; the same registers as the nibble walks' */
#define BYTE_QUAD_STAGE_Q8_0(st0, st1, s, o, WIDEN8) _mm256_store_ps(st0, WIDEN8(s))
#define BYTE_QUAD_DECODE_Q8_0(p, sp0, sp1) _mm256_mul_ps(load8_q8_0(p), _mm256_load_ps(sp0))
#define BYTE_QUAD_STAGE_Q5_1 QUAD_STAGE_SCALES_OFFSETS
#define BYTE_QUAD_DECODE_Q5_1(p, sp0, sp1)                                                   \
    _mm256_fmadd_ps(load8_q5_1(p), _mm256_load_ps(sp0), _mm256_load_ps(sp1))
#define NM_DEFINE_BYTE_QUAD(NAME, FMT, ST, WIDEN8, V)                                        \
    static void NAME(int64_t k, int64_t ldb, const int64_t *off, const float *a,             \
                     int64_t lda, const uint8_t *b, float *c, int64_t ldc, const ST *s,       \
                     const ST *o, int64_t bk, int64_t lds) {                                 \
        const int64_t block = bk < k ? bk : k;                                               \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        __m256 acc[4 * (V)];                                                                 \
        QUAD_LOAD_C(acc, V, c, ldc);                                                         \
        /* s (and o) step to the next block's scales (never past the last) */                \
        for (int64_t p0 = 0; p0 < k; p0 += block, s = p0 < k ? s + lds : s,                 \
                     o = o && p0 < k ? o + lds : o) {                                        \
            _Alignas(32) float st0[8 * (V)], st1[8 * (V)];                                   \
            _Pragma("GCC unroll 2") for (int w = 0; w < (V); ++w)                            \
                BYTE_QUAD_STAGE_##FMT(st0 + 8 * w, st1 + 8 * w, s + 8 * w, o + 8 * w, WIDEN8); \
            const float *sp0 = st0, *sp1 = st1;                                              \
            const int64_t end = k - p0 < block ? k : p0 + block;                             \
            for (int64_t p = p0; p < end; ++p) {                                             \
                __asm__("" : "+r"(sp0), "+r"(sp1)); /* memory operands at every use */       \
                const uint8_t *row = b + p * ldb;                                            \
                NM_PACKED_GEMV_PREFETCH(row, ldb);                                           \
                __m256 wv[V];                                                                \
                _Pragma("GCC unroll 2") for (int w = 0; w < (V); ++w)                        \
                    wv[w] = BYTE_QUAD_DECODE_##FMT(row + off[w], sp0 + 8 * w, sp1 + 8 * w);  \
                QUAD_FMAS(acc, wv, V, a, lda, p);                                            \
            }                                                                                \
        }                                                                                    \
        QUAD_STORE_C(acc, V, c, ldc);                                                        \
    }

/* 16 columns at a time, then 8; the last, narrower than 8, on a zero-padded copy of its C
 * (its padding columns' codes and scales, the sliver's padding, read, their results
 * dropped) */
#define NM_DEFINE_QUAD_WALK(NAME, ST)                                                        \
    static void NAME(int64_t k, int64_t ldb, int64_t slb, int64_t n, const float *a,         \
                     int64_t lda, const uint8_t *b, float *c, int64_t ldc, const ST *s,       \
                     const ST *o, int64_t bk, int64_t lds) {                                 \
        int64_t j = 0;                                                                       \
        for (; j + 16 <= n; j += 16) {                                                       \
            const int64_t off[2] = {j / NR * slb + j % NR, (j + 8) / NR * slb + (j + 8) % NR}; \
            NAME##_two_(k, ldb, off, a, lda, b, c + j, ldc, s + j, o ? o + j : NULL, bk, lds); \
        }                                                                                    \
        for (; j < n; j += 8) {                                                              \
            const int64_t off[1] = {j / NR * slb + j % NR};                                  \
            if (j + 8 <= n) {                                                                \
                NAME##_one_(k, ldb, off, a, lda, b, c + j, ldc, s + j, o ? o + j : NULL, bk, \
                            lds);                                                            \
                continue;                                                                    \
            }                                                                                \
            _Alignas(32) float tail[4 * 8] = {0};                                            \
            const size_t bytes = (size_t)(n - j) * sizeof(float);                            \
            for (int r = 0; r < 4; ++r) memcpy(tail + 8 * r, c + r * ldc + j, bytes);        \
            NAME##_one_(k, ldb, off, a, lda, b, tail, 8, s + j, o ? o + j : NULL, bk, lds);  \
            for (int r = 0; r < 4; ++r) memcpy(c + r * ldc + j, tail + 8 * r, bytes);        \
        }                                                                                    \
    }
#define NM_DEFINE_NIBBLE_QUADS(NAME, FMT, ST, MASK)                                          \
    NM_DEFINE_NIBBLE_QUAD(NAME##_two_, FMT, ST, 2, MASK)                                      \
    NM_DEFINE_NIBBLE_QUAD(NAME##_one_, FMT, ST, 1, MASK)                                      \
    NM_DEFINE_QUAD_WALK(NAME, ST)
#define NM_DEFINE_BYTE_QUADS(NAME, FMT, ST, WIDEN8)                                          \
    NM_DEFINE_BYTE_QUAD(NAME##_two_, FMT, ST, WIDEN8, 2)                                      \
    NM_DEFINE_BYTE_QUAD(NAME##_one_, FMT, ST, WIDEN8, 1)                                      \
    NM_DEFINE_QUAD_WALK(NAME, ST)
/* binary16 grids (a GGUF file's Q4_0, Q4_1, Q8_0 and Q5_1), then float32 ones (the
 * factored grids of the K types, multiplied out by the frame: Q4_K, Q2_K as q4_1; Q6_K,
 * Q3_K, IQ4_XS as q8_0; Q5_K as q5_1) */
NM_DEFINE_NIBBLE_QUADS(gemv4_packed_q4_0_half_signed_avx2, Q4_0, uint16_t, q4_0_high_nibble_mask)
NM_DEFINE_NIBBLE_QUADS(gemv4_packed_q4_1_half_avx2, Q4_1, uint16_t, low_nibble_mask)
NM_DEFINE_BYTE_QUADS(gemv4_packed_q8_0_half_avx2, Q8_0, uint16_t, LOAD8_HALF)
NM_DEFINE_BYTE_QUADS(gemv4_packed_q5_1_half_avx2, Q5_1, uint16_t, LOAD8_HALF)
NM_DEFINE_NIBBLE_QUADS(gemv4_packed_q4_1_avx2, Q4_1F, float, low_nibble_mask)
NM_DEFINE_BYTE_QUADS(gemv4_packed_q8_0_avx2, Q8_0, float, _mm256_loadu_ps)
NM_DEFINE_BYTE_QUADS(gemv4_packed_q5_1_avx2, Q5_1, float, _mm256_loadu_ps)

/* Q4_1's packed gemv on a factored grid (nm_gemv_packed_factored_fn: the K types' Q4_K and
 * Q2_K), SL slivers at a time: the staged walk above with each block's scales and offsets
 * made from its int8 codes and its super-block's factors (vpmovsxbd, vcvtdq2ps, vmulps: the
 * frame's widen_factored, three operations where a float32 grid's scale is one load), so
 * the frame needs no pass of its own over the grid and the walk no chunks of k. The same
 * products, the same fma(q, scale, offset): the same bits. */
#define FACTORED8(cp, fp)                                                                    \
    _mm256_mul_ps(_mm256_loadu_ps(fp),                                                       \
                  _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(cp)))))
#define NM_DEFINE_Q4_1_FACTORED_SLIVERS(NAME, SL)                                            \
    static NM_FACTORED_SIGNATURE_(NAME) {                                                    \
        (void)lda, (void)ldc; /* one row */                                                  \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        enum { W_ = (SL) * NR / 8 };                                                         \
        const int64_t block_ = (bk < k ? bk : k) / 2; /* stored rows under one block */      \
        __m256 acc_[W_];                                                                     \
        _Pragma("GCC unroll 6") for (int i_ = 0; i_ < W_; ++i_)                              \
            acc_[i_] = _mm256_loadu_ps(c + i_ / 3 * NR + (i_ % 3) * 8);                       \
        for (int64_t r0_ = 0, left_ = per_super; r0_ < k / 2; r0_ += block_) {               \
            _Alignas(32) float offsets_[W_ * 8];                                             \
            __m256 scales_[W_];                                                              \
            _Pragma("GCC unroll 6") for (int i_ = 0; i_ < W_; ++i_) {                        \
                scales_[i_] = FACTORED8(cs + 8 * i_, fs + 8 * i_);                           \
                _mm256_store_ps(offsets_ + 8 * i_, FACTORED8(co + 8 * i_, fo + 8 * i_));     \
            }                                                                                \
            Q4_1_STAGED_BLOCK_ROWS(W_);                                                      \
            /* the next block's codes, the next super-block's factors after per_super (never \
             * past the last, not even as an unread pointer) */                              \
            if (r0_ + block_ >= k / 2) break;                                                \
            cs += ld, co += ld;                                                              \
            if (--left_ == 0) fs += ld, fo += ld, left_ = per_super;                         \
        }                                                                                    \
        _Pragma("GCC unroll 6") for (int i_ = 0; i_ < W_; ++i_)                              \
            _mm256_storeu_ps(c + i_ / 3 * NR + (i_ % 3) * 8, acc_[i_]);                       \
    }
NM_DEFINE_Q4_1_FACTORED_SLIVERS(gemv_packed_q4_1_factored_avx2_group_, 2)
NM_DEFINE_Q4_1_FACTORED_SLIVERS(gemv_packed_q4_1_factored_avx2_one_, 1)

/* the walk over a group's columns: kernel_common.h's */
NM_DEFINE_FACTORED_WALK(gemv_packed_q4_1_factored_avx2, 2, NR)

/* Q8_0's packed gemv on a factored grid (the K types' Q6_K, Q3_K and IQ4_XS), SL slivers at
 * a time: each block's scales made as above into a stack array, read by each weight
 * vector's multiplication as a memory operand (12 accumulators leave no registers for
 * them), w = q * scale, then the chain's fma: the template's operations, the same bits. */
#define NM_DEFINE_Q8_0_FACTORED_SLIVERS(NAME, SL)                                            \
    static NM_FACTORED_SIGNATURE_(NAME) {                                                    \
        (void)lda, (void)ldc; /* one row */                                                  \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        (void)co, (void)fo; /* no offsets */                                                 \
        enum { W_ = (SL) * NR / 8 };                                                         \
        const int64_t block_ = bk < k ? bk : k; /* rows under one block */                  \
        __m256 acc_[W_];                                                                     \
        _Pragma("GCC unroll 12") for (int i_ = 0; i_ < W_; ++i_)                             \
            acc_[i_] = _mm256_loadu_ps(c + i_ / 3 * NR + (i_ % 3) * 8);                       \
        for (int64_t p0_ = 0, left_ = per_super; p0_ < k; p0_ += block_) {                   \
            _Alignas(32) float scales_[W_ * 8];                                              \
            _Pragma("GCC unroll 12") for (int i_ = 0; i_ < W_; ++i_)                         \
                _mm256_store_ps(scales_ + 8 * i_, FACTORED8(cs + 8 * i_, fs + 8 * i_));      \
            const float *sp_ = scales_;                                                      \
            const int64_t end_ = NM_BLOCK_END_(p0_, block_, k);                              \
            for (int64_t p = p0_; p < end_; ++p) {                                           \
                __asm__("" : "+r"(sp_)); /* a memory operand at every use */                \
                const uint8_t *row_ = b + p * ldb;                                           \
                NM_PACKED_GEMV_PREFETCH(row_, ldb);                                          \
                const __m256 ap_ = _mm256_set1_ps(a[p]);                                     \
                _Pragma("GCC unroll 12") for (int w_ = 0; w_ < W_; ++w_) {                   \
                    const __m256 wv_ = _mm256_mul_ps(                                        \
                        load8_q8_0(row_ + w_ / 3 * slb + (w_ % 3) * 8),                      \
                        _mm256_load_ps(sp_ + 8 * w_));                                       \
                    acc_[w_] = _mm256_fmadd_ps(ap_, wv_, acc_[w_]);                          \
                }                                                                            \
            }                                                                                \
            if (p0_ + block_ >= k) break; /* never past the last block */                    \
            cs += ld;                                                                        \
            if (--left_ == 0) fs += ld, left_ = per_super;                                   \
        }                                                                                    \
        _Pragma("GCC unroll 12") for (int i_ = 0; i_ < W_; ++i_)                             \
            _mm256_storeu_ps(c + i_ / 3 * NR + (i_ % 3) * 8, acc_[i_]);                       \
    }
NM_DEFINE_Q8_0_FACTORED_SLIVERS(gemv_packed_q8_0_factored_avx2_group_, 4)
NM_DEFINE_Q8_0_FACTORED_SLIVERS(gemv_packed_q8_0_factored_avx2_one_, 1)

NM_DEFINE_FACTORED_WALK(gemv_packed_q8_0_factored_avx2, 4, NR)

/* ---- codecs ------------------------------------------------------------------------- */

static void decode_fp16_avx2(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8_fp16((const uint8_t *)(src + i)));
    for (; i < n; ++i) dst[i] = nm_fp16_to_f32(src[i]);
}

static void encode_fp16_avx2(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    for (; i < n; ++i) dst[i] = nm_f32_to_fp16(src[i]);
}

/* bf16 has no conversion instruction in AVX2; the branch-free scalar codec, compiled with
 * this row's flags, is vectorised by the compiler. */
NM_DEFINE_CODEC_LOOP(decode_bf16_avx2, uint16_t, float, nm_bf16_to_f32)
NM_DEFINE_CODEC_LOOP(encode_bf16_avx2, float, uint16_t, nm_f32_to_bf16)

/* ---- limit probes --------------------------------------------------------------------- */

/* 12 independent vector chains: enough to cover the FMA latency on both FMA ports. */
static float probe_fma_avx2(int64_t iters) {
    __m256 acc[12];
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_set1_ps((float)j);
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int64_t i = 0; i < iters; ++i) {
        acc[0] = _mm256_fmadd_ps(acc[0], x, y);
        acc[1] = _mm256_fmadd_ps(acc[1], x, y);
        acc[2] = _mm256_fmadd_ps(acc[2], x, y);
        acc[3] = _mm256_fmadd_ps(acc[3], x, y);
        acc[4] = _mm256_fmadd_ps(acc[4], x, y);
        acc[5] = _mm256_fmadd_ps(acc[5], x, y);
        acc[6] = _mm256_fmadd_ps(acc[6], x, y);
        acc[7] = _mm256_fmadd_ps(acc[7], x, y);
        acc[8] = _mm256_fmadd_ps(acc[8], x, y);
        acc[9] = _mm256_fmadd_ps(acc[9], x, y);
        acc[10] = _mm256_fmadd_ps(acc[10], x, y);
        acc[11] = _mm256_fmadd_ps(acc[11], x, y);
    }
    __m256 s = acc[0];
    for (int j = 1; j < 12; ++j) s = _mm256_add_ps(s, acc[j]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[7];
}

static float probe_read_avx2(const float *buf, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t i = 0; i < n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(buf + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(buf + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(buf + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(buf + i + 24));
    }
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    return out[0] + out[7];
}

/* ---- SiLU and exp: ops/exact_math.h's operations, 4 doubles a vector -------- */

typedef double v4d_avx2 __attribute__((vector_size(32)));
typedef int64_t v4i_avx2 __attribute__((vector_size(32)));
typedef uint64_t v4u_avx2 __attribute__((vector_size(32)));
NM_DEFINE_VECTOR_EXP(exp_v4d_avx2, v4d_avx2, v4i_avx2, v4u_avx2)
NM_DEFINE_SILU_ARRAY(silu_avx2, v4d_avx2, 4, exp_v4d_avx2)
NM_DEFINE_EXPF_ARRAY(expf_avx2, v4d_avx2, 4, exp_v4d_avx2)

/* ---- a factored grid's blocks multiplied out (the frame's, for the K types) ---------
 * 8 codes a step: widened, converted (exact), times the factors. The plain loop compiled
 * with these flags took about 0.5 cycles a value on a Zen 3 for rows of 96, its checks and
 * tails costing as much as the work; this takes 4 operations a vector. */
#define FACTORED8_STORE(dst, cp, fp) _mm256_storeu_ps(dst, FACTORED8(cp, fp))
NM_DEFINE_WIDEN_FACTORED_SIMD(widen_factored_avx2, 8, FACTORED8_STORE)

NM_ROW_FILL void nm_fill_row_avx2(nm_isa_kernels *row) {
    nm_fill_row_scalar(row); /* every slot starts full of portable C */
    row->isa = "avx2";
    row->silu = silu_avx2;
    row->silu_name = "silu_avx2";
    row->expf = expf_avx2;
    row->expf_name = "expf_avx2";
    row->widen_factored = widen_factored_avx2;
    row->widen_factored_name = "widen_factored_avx2";
    row->mr = MR;
    row->nr = NR;
    row->pack_width = PACK_WIDTH;
    row->kc = 256; /* a 24 KiB sliver, which the tiles below the first reuse from L1 */
    /* slivers outside for one tile's rows of a byte format (two, m = 9 to 16, ran Q8_0 and
     * Q6_K 0.96-1.01x on a Zen 4), never for the 4-bit ones (0.93-1.18x, median about 1.06x,
     * with k blocks outside on a Zen 5: docs/kernels.md) */
    row->byte_outer_rows = MR, row->nibble_outer_rows = 0;
    row->packed_gemv_ahead = PACKED_GEMV_AHEAD_DEFAULT;
    NM_SET_MATMUL_SLOTS(row, gemv, avx2);
    NM_SET_MATMUL_SLOTS(row, gemv2, avx2);
    NM_SET_MATMUL_SLOTS(row, gemv_packed, avx2);
    NM_SET_MATMUL_SLOTS(row, gemv2_packed, avx2);
    NM_SET_HALF_SCALE_SLOTS(row, avx2);
    NM_SET_SLOT(row, gemv_packed, NM_FMT_Q4_1, gemv_packed_q4_1_staged_avx2);
    NM_SET_SLOT(row, gemv_packed_half, NM_FMT_Q4_1, gemv_packed_q4_1_half_staged_avx2);
    NM_SET_SLOT(row, gemv_packed_half, NM_FMT_Q4_0, gemv_packed_q4_0_half_signed_avx2);
    NM_SET_SLOT(row, gemv2_packed_half, NM_FMT_Q4_0, gemv2_packed_q4_0_half_signed_avx2);
    NM_SET_SLOT(row, gemv4_packed_half, NM_FMT_Q4_0, gemv4_packed_q4_0_half_signed_avx2);
    NM_SET_SLOT(row, gemv4_packed_half, NM_FMT_Q4_1, gemv4_packed_q4_1_half_avx2);
    NM_SET_SLOT(row, gemv4_packed_half, NM_FMT_Q8_0, gemv4_packed_q8_0_half_avx2);
    NM_SET_SLOT(row, gemv4_packed, NM_FMT_Q4_1, gemv4_packed_q4_1_avx2);
    NM_SET_SLOT(row, gemv4_packed, NM_FMT_Q8_0, gemv4_packed_q8_0_avx2);
    NM_SET_SLOT(row, gemv4_packed_half, NM_FMT_Q5_1, gemv4_packed_q5_1_half_avx2);
    NM_SET_SLOT(row, gemv4_packed, NM_FMT_Q5_1, gemv4_packed_q5_1_avx2);
    NM_SET_SLOT(row, gemv_packed_factored, NM_FMT_Q4_1, gemv_packed_q4_1_factored_avx2);
    NM_SET_SLOT(row, gemv_packed_factored, NM_FMT_Q8_0, gemv_packed_q8_0_factored_avx2);
    NM_SET_MATMUL_SLOTS(row, pack, avx2);
    row->ukernel = ukernel_4x24_avx2;
    row->ukernel_name = "ukernel_4x24_avx2";
    NM_SET_MATMUL_SLOTS(row, ukernel_pack, avx2);
    NM_SET_PACKED_CODE_SLOTS(row, avx2);
    NM_SET_ALL_FINITE_SLOTS(row, avx2);
    NM_SET_CODEC_SLOTS(row, avx2);
    row->probe_fma = probe_fma_avx2;
    row->probe_fma_flops = 12 * 8 * 2;
    row->probe_read = probe_read_avx2;
}
