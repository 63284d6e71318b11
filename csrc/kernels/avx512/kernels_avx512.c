/* narrowmm: the avx512 row (AVX-512 F/BW/VL/DQ + F16C + FMA). Compiled with exactly those
 * flags; chosen at run time only on CPUs (and OSes) that have them (dispatch/isa_table.c).
 *
 * Same contract and the same shape of code as the avx2 row, on 16-lane registers: vector
 * lanes are distinct output columns, one fma per p in ascending p, so no bit changes.
 *
 * It was written on a machine without AVX-512 and is verified bit for bit in an
 * instruction-set emulator (tests/test_avx512_emulated.py, Bochs through bochscpu); its
 * blocking (8 x 32 tile, kc = 128) is chosen from the cache sizes of AVX-512 cores. First
 * timed on an AMD EPYC Zen 4 (docs/results/bench-avx512-zen4-2026-12-01.txt); its block
 * formats' m <= 2 walks were tuned on Zen 4 and Zen 5 cores since (docs/kernels.md, "The
 * block formats' speed"). */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../kernel_common.h"
#include "../nm_kernels.h"
#include "../../ops/exact_math.h" /* SiLU, exp: one body, as wide as the row's vectors */
#include "../x86_common.h"

#define MR 8
#define NR 32
/* packed weights of the byte formats: groups of four slivers side by side, so the m <= 2
 * walks read one stream of weights for four slivers (nm_pack_width; docs/kernels.md,
 * "Groups of slivers") */
#define PACK_WIDTH (4 * NR)
/* The packed m <= 2 walks' software prefetch (NM_PACKED_GEMV_PREFETCH) differs by CPU, so
 * a walk reads the distance when it starts; the fill below sets the default. On an Intel
 * Xeon 2048 bytes ahead ran the 4-bit and byte formats 1.35-2.2x at m = 1 and 2, ahead of
 * 1024 and 4096 (docs/results/gemv-prefetch-avx512-xeon-2026-12-07.txt); on an AMD Zen 4,
 * 1024 to 4096 gained the 4-bit walks 1-9 % on one thread and lost on two, and lost the
 * byte walks 0-5 % on one (docs/results/gemv-prefetch-avx512-zen4-2026-12-06.txt): none
 * there. */
#define PACKED_GEMV_AHEAD_INTEL 2048
static _Atomic int64_t packed_gemv_ahead_avx512;
#define PACKED_GEMV_AHEAD                                                                    \
    nm_packed_gemv_ahead(atomic_load_explicit(&packed_gemv_ahead_avx512, memory_order_relaxed))
/* The 4-bit walks' decode (nm_isa_kernels.nibble_decode) differs by CPU too, and a walk reads
 * it when it starts: on an Intel Xeon the permute on byte views (NIBBLE_VIEW_) ran the walks
 * 7-20 % faster from L2 than the decodes before it (Q4_0 shifted then permuted, Q4_1 and
 * Q4_K in place), -1 to +5 % from memory (docs/results/nibble-views-xeon-2026-12-07.txt); on
 * an AMD Zen 4 the shifts do not take the FMAs' pipes, the views ran 0.94-1.06x and in place
 * beat the permute (docs/kernels.md): the permute on Intel CPUs, the rest elsewhere. */
static _Atomic int nibble_decode_avx512;
#define NIBBLE_VIEWS_                                                                        \
    (nm_nibble_decode(atomic_load_explicit(&nibble_decode_avx512, memory_order_relaxed)) ==   \
     NM_NIBBLE_DECODE_PERMUTE)

/* ---- loading 16 weights as float32 (B may sit at any byte address) ------------------ */

static inline __m512 load16_f32(const uint8_t *p) { return _mm512_loadu_ps((const float *)p); }

static inline __m512 load16_fp16(const uint8_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); /* exact */
}

static inline __m512 load16_bf16(const uint8_t *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)); /* exact (NaNs feed an fma) */
}

/* raw() of 16 FP8 weights through F16C, the avx2 row's binary16 bits (x86_common.h)
 * widened, exact for every code; finite e4m3fn codes skip the NaN patch, and e5m2 needs
 * none, so its finite slot is the same function */
static inline __m512 load16_e4m3fn(const uint8_t *p) {
    const __m256i u = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    __m256i mag = _mm256_and_si256(_mm256_slli_epi16(u, 7), _mm256_set1_epi16(0x3F80));
    const __m256i nan = _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x3F80));
    mag = _mm256_xor_si256(mag, _mm256_and_si256(nan, _mm256_set1_epi16(0x3F80 ^ 0x7E00)));
    const __m256i h = _mm256_or_si256(
        mag, _mm256_and_si256(_mm256_slli_epi16(u, 8), _mm256_set1_epi16((short)0x8000)));
    return _mm512_cvtph_ps(h);
}

static inline __m512 load16_e5m2(const uint8_t *p) {
    const __m256i u = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm512_cvtph_ps(_mm256_slli_epi16(u, 8));
}

static inline __m512 load16_e4m3fn_finite(const uint8_t *p) {
    const __m256i x = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    return _mm512_cvtph_ps(_mm256_and_si256(_mm256_slli_epi16(x, NM_E4M3FN_FP16_SHIFT),
                                            _mm256_set1_epi16((short)NM_E4M3FN_FP16_MASK)));
}

#define load16_e5m2_finite load16_e5m2

/* raw() of 16 Q8_0 weights: their int8 codes, widened and converted (exact) */
static inline __m512 load16_q8_0(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* raw() of 16 Q5_1 weights: their codes, bytes widened and converted (exact) */
static inline __m512 load16_q5_1(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

#define SCALE16(w, sp, op) _mm512_mul_ps(w, _mm512_loadu_ps(sp))
/* the same on binary16 scales (nm_scales.s16), widened exactly */
#define SCALE16_HALF(w, sp, op)                                                              \
    _mm512_mul_ps(w, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sp))))
/* scales and offsets (Q5_1): fma(q, scale, offset), one rounding */
#define OFFSET16(w, sp, op) _mm512_fmadd_ps(w, _mm512_loadu_ps(sp), _mm512_loadu_ps(op))
#define OFFSET16_HALF(w, sp, op)                                                             \
    _mm512_fmadd_ps(w, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sp))),          \
                    _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(op))))

/* ---- m == 1: stream B four rows at a time, 64 columns per step ----------------------- */

#define FMADD16(acc, x, y) _mm512_fmadd_ps(x, y, acc)

/* m == 2 (gemv2): the avx2 row's walk (timed in the benches, not tuned for this row) */
NM_DEFINE_ROW_MAJOR_GEMVS(avx512, __m512, 16, _mm512_set1_ps, _mm512_loadu_ps,
                          _mm512_storeu_ps, load16_f32, load16_fp16, load16_bf16, load16_e4m3fn,
                          load16_e5m2, load16_e4m3fn_finite, load16_e5m2_finite, load16_q8_0,
                          FMADD16, PREFETCH_T0, load1_fp16_f16c, SCALE16)

/* slivers the packed gemvs walk at a time (NM_DEFINE_PACKED_GEMVS, below the strided walks):
 * 16-bit and f32 weights at m = 1 and m = 2, then the FP8 formats (and Q8_0, Q5_1) at m = 1
 * and m = 2 */
#define PACKED_SLIVERS_M1 4
#define PACKED_SLIVERS_M2 4
#define PACKED_SLIVERS_FP8_M1 4
#define PACKED_SLIVERS_FP8_M2 4

/* ---- packing a narrow sliver (the last of a column range) --------------------------- */

NM_DEFINE_PACK(pack_f32_avx512, 4, 16, load16_f32, _mm512_storeu_ps, nm_load1_f32,
               NM_UNSCALED, NM_UNSCALED)
NM_DEFINE_PACK(pack_fp16_avx512, 2, 16, load16_fp16, _mm512_storeu_ps, load1_fp16_f16c,
               NM_UNSCALED, NM_UNSCALED)
NM_DEFINE_PACK(pack_bf16_avx512, 2, 16, load16_bf16, _mm512_storeu_ps, nm_load1_bf16,
               NM_UNSCALED, NM_UNSCALED)
NM_DEFINE_PACK(pack_e4m3fn_avx512, 1, 16, load16_e4m3fn, _mm512_storeu_ps, nm_load1_e4m3fn_raw,
               SCALE16, NM_SCALE1)
NM_DEFINE_PACK(pack_e5m2_avx512, 1, 16, load16_e5m2, _mm512_storeu_ps, nm_load1_e5m2_raw,
               SCALE16, NM_SCALE1)
NM_DEFINE_PACK(pack_e4m3fn_finite_avx512, 1, 16, load16_e4m3fn_finite, _mm512_storeu_ps,
               nm_load1_e4m3fn_raw, SCALE16, NM_SCALE1)
NM_DEFINE_PACK(pack_e5m2_finite_avx512, 1, 16, load16_e5m2_finite, _mm512_storeu_ps,
               nm_load1_e5m2_raw, SCALE16, NM_SCALE1)
NM_DEFINE_PACK(pack_q8_0_avx512, 1, 16, load16_q8_0, _mm512_storeu_ps, nm_load1_q8_0_raw,
               SCALE16, NM_SCALE1)

/* ---- the 8 x 32 microkernel: 16 accumulators, 2 B vectors, 1 broadcast ---------------
 * Half of the 32 zmm registers hold the tile; named registers, as in the avx2 row. A row of
 * a 32-wide fp16/bf16 sliver is one 64-byte line of B. */

#define LOAD_ROW_C(i, c, ldc)                                                                \
    __m512 c##i##0 = _mm512_loadu_ps((c) + (i) * (ldc));                                     \
    __m512 c##i##1 = _mm512_loadu_ps((c) + (i) * (ldc) + 16);
#define STORE_ROW_C(i, c, ldc)                                                               \
    _mm512_storeu_ps((c) + (i) * (ldc), c##i##0);                                            \
    _mm512_storeu_ps((c) + (i) * (ldc) + 16, c##i##1);
#define FMA_ROW(i, ap, p, b0, b1)                                                            \
    do {                                                                                     \
        const __m512 ai = _mm512_set1_ps((ap)[(p) * MR + (i)]);                              \
        c##i##0 = _mm512_fmadd_ps(ai, b0, c##i##0);                                          \
        c##i##1 = _mm512_fmadd_ps(ai, b1, c##i##1);                                          \
    } while (0)

/* the full tile's rows, and the half tile's (rows 0-3: m <= 4 runs half the FMAs) */
#define TILE_LOAD_C(c, ldc)                                                                  \
    TILE_HALF_LOAD_C(c, ldc)                                                                 \
    LOAD_ROW_C(4, c, ldc) LOAD_ROW_C(5, c, ldc) LOAD_ROW_C(6, c, ldc) LOAD_ROW_C(7, c, ldc)
#define TILE_STORE_C(c, ldc)                                                                 \
    TILE_HALF_STORE_C(c, ldc)                                                                \
    STORE_ROW_C(4, c, ldc) STORE_ROW_C(5, c, ldc) STORE_ROW_C(6, c, ldc) STORE_ROW_C(7, c, ldc)
#define TILE_FMA_STEP(ap, p, b0, b1)                                                         \
    TILE_HALF_FMA_STEP(ap, p, b0, b1);                                                       \
    FMA_ROW(4, ap, p, b0, b1);                                                               \
    FMA_ROW(5, ap, p, b0, b1);                                                               \
    FMA_ROW(6, ap, p, b0, b1);                                                               \
    FMA_ROW(7, ap, p, b0, b1)
#define TILE_HALF_LOAD_C(c, ldc)                                                             \
    LOAD_ROW_C(0, c, ldc) LOAD_ROW_C(1, c, ldc) LOAD_ROW_C(2, c, ldc) LOAD_ROW_C(3, c, ldc)
#define TILE_HALF_STORE_C(c, ldc)                                                            \
    STORE_ROW_C(0, c, ldc) STORE_ROW_C(1, c, ldc) STORE_ROW_C(2, c, ldc) STORE_ROW_C(3, c, ldc)
#define TILE_HALF_FMA_STEP(ap, p, b0, b1)                                                    \
    FMA_ROW(0, ap, p, b0, b1);                                                               \
    FMA_ROW(1, ap, p, b0, b1);                                                               \
    FMA_ROW(2, ap, p, b0, b1);                                                               \
    FMA_ROW(3, ap, p, b0, b1)

/* The tile on a packed sliver, with the given row set (TILE_ or TILE_HALF_) */
#define NM_DEFINE_TILE(NAME, ROWS)                                                           \
    static void NAME(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc,    \
                     const float *c_next) {                                                  \
        PREFETCH_C_TILE(c_next, ldc);                                                        \
        ROWS##LOAD_C(c, ldc)                                                                 \
        for (int64_t p = 0; p < kc; ++p) {                                                   \
            const __m512 b0 = _mm512_load_ps(bp + p * NR);                                   \
            const __m512 b1 = _mm512_load_ps(bp + p * NR + 16);                              \
            ROWS##FMA_STEP(ap, p, b0, b1);                                                   \
        }                                                                                    \
        ROWS##STORE_C(c, ldc)                                                                \
    }
NM_DEFINE_TILE(tile_8x32, TILE_)
NM_DEFINE_TILE(tile_4x32, TILE_HALF_)

static void ukernel_8x32_avx512(int64_t kc, int64_t mr, int64_t nr, const float *ap,
                                const float *bp, float *c, int64_t ldc, const float *c_next) {
    if (nr == NR && (mr == MR || mr == MR / 2)) {
        (mr == MR ? tile_8x32 : tile_4x32)(kc, ap, bp, c, ldc, c_next);
    } else if (mr <= MR / 2) { /* half the FMAs of a full tile */
        WITH_SCRATCH_ROWS(MR / 2, mr, nr, c, ldc, tile_4x32(kc, ap, bp, scratch, NR, c_next));
    } else {
        WITH_SCRATCH_TILE(mr, nr, c, ldc, tile_8x32(kc, ap, bp, scratch, NR, c_next));
    }
}

/* ---- the first tile of a sliver, decoding B on the way (see the avx2 row) ------------- */
#define B_AHEAD 64 /* weights: two slivers further along the same row */
/* A group of byte-format slivers: a k block (kc) down, the same sliver's rows of the next
 * block. Against 64 rows (Zen 4, cold, one thread, m = 8): Q8_0 896 x 4864 1.09x, 4096 x
 * 4096 1.06x, e4m3fn 1.05x; m = 16 1.03x. */
#define BYTE_GROUP_AHEAD_ROWS 128
/* Where those rows go: into L2 on Intel CPUs, into L1 elsewhere (nm_fill_row_avx512). Into
 * L1, 16 KiB of the next block joins the block's codes, the 16 KiB sliver and A's panels
 * in a 48 KiB L1 and pushes out lines still in use. On an Intel Xeon, in one process against
 * L1, the byte formats ran 1.07-1.18x at m = 8, 1.05-1.11x at m = 16, 1.01-1.08x at 32 and
 * 64 (cold, 1 and 2 threads; docs/results/tile-prefetch-l2-xeon-2026-12-08.txt); the 4-bit
 * tile's prefetch into L2 did not move. Untimed on AMD's CPUs, which keep L1. */
static _Atomic int byte_group_ahead_l2_avx512;

#define NM_DEFINE_TILE_PACK(TILE, ROWS, ITEM, LOAD16, SCV)                                   \
    static void TILE(int64_t kc, const float *ap, const uint8_t *b, int64_t ldb, float *bp,  \
                     float *c, int64_t ldc, const float *c_next, const float *s,             \
                     const float *o, int64_t bk, int64_t lds) {                              \
        PREFETCH_C_TILE(c_next, ldc);                                                        \
        ROWS##LOAD_C(c, ldc)                                                                 \
        const int64_t ahead = SLIVER_AHEAD_BYTES(ldb, ITEM);                                 \
        const int to_l2 = (ITEM) == 1 && ldb == PACKED_LDB(1) &&                             \
                          atomic_load_explicit(&byte_group_ahead_l2_avx512,                  \
                                               memory_order_relaxed);                        \
        NM_TILE_SCALES_INIT_(s, kc, bk, 1);                                                  \
        for (int64_t p = 0; p < kc; ++p) {                                                   \
            NM_TILE_SCALES_NEXT_(s, o, bk, lds, 1);                                          \
            const uint8_t *src = b + p * ldb;                                                \
            if (to_l2) /* one line a row: a byte sliver's row is 32 bytes */                 \
                _mm_prefetch((const char *)src + ahead, _MM_HINT_T1);                        \
            else                                                                             \
                PREFETCH_SLIVER_ROW_AHEAD(src, ITEM, ahead);                                 \
            const __m512 b0 = SCV(LOAD16(src), s, o);                                        \
            const __m512 b1 = SCV(LOAD16(src + 16 * (ITEM)), s + 16, o + 16);                \
            _mm512_store_ps(bp + p * NR, b0);                                                \
            _mm512_store_ps(bp + p * NR + 16, b1);                                           \
            ROWS##FMA_STEP(ap, p, b0, b1);                                                   \
        }                                                                                    \
        ROWS##STORE_C(c, ldc)                                                                \
    }
/* The full tile and the half one (m <= 4), and the slot around them. The half tile saves
 * FMAs; on row-major weights of the unscaled formats the FMAs are not what limits the first
 * tile (it reads B rows a row apart), and there it measured 0.88-1.02x the full tile at
 * m = 3 and 4 (docs/kernels.md), so those keep the full one unless packed (HALF_ROWS 0). */
#define NM_HALF_ALWAYS(ldb) 1
#define NM_DEFINE_UKERNEL_PACK(NAME, TILE, ITEM, LOAD16, SCV, HALF_ROWS)                     \
    NM_DEFINE_TILE_PACK(TILE, TILE_, ITEM, LOAD16, SCV)                                      \
    NM_DEFINE_TILE_PACK(TILE##_half, TILE_HALF_, ITEM, LOAD16, SCV)                          \
    static inline int NAME##_half_ok(int64_t ldb) {                                          \
        return (HALF_ROWS) || ldb == PACKED_LDB(ITEM); /* packed: a group's rows */          \
    }                                                                                        \
    NM_DEFINE_UKERNEL_PACK_FROM_TILES(NAME, TILE, TILE##_half, NAME##_half_ok)

NM_DEFINE_UKERNEL_PACK(ukernel_pack_f32_avx512, tile_pack_f32, 4, load16_f32, NM_UNSCALED, 0)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_fp16_avx512, tile_pack_fp16, 2, load16_fp16, NM_UNSCALED, 0)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_bf16_avx512, tile_pack_bf16, 2, load16_bf16, NM_UNSCALED, 0)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_e4m3fn_avx512, tile_pack_e4m3fn, 1, load16_e4m3fn, SCALE16,
                       1)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_e5m2_avx512, tile_pack_e5m2, 1, load16_e5m2, SCALE16, 1)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_e4m3fn_finite_avx512, tile_pack_e4m3fn_finite, 1,
                       load16_e4m3fn_finite, SCALE16, 1)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_e5m2_finite_avx512, tile_pack_e5m2_finite, 1,
                       load16_e5m2_finite, SCALE16, 1)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_q8_0_avx512, tile_pack_q8_0, 1, load16_q8_0, SCALE16, 1)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_q5_1_avx512, tile_pack_q5_1, 1, load16_q5_1, OFFSET16, 1)

/* ---- the 4-bit formats (kernel_common.h): 16 bytes, 32 codes, two rows -------------- */

/* vpermps reads the low 4 bits of each lane: the low nibble picks its value from a table of
 * the 16 codes without a mask or a conversion, and the high nibble after a shift. Q4_0's
 * table holds q - 8, so its weights take one multiplication (10 -> 8 operations for 32). */
static inline void nibbles16(const uint8_t *p, __m512 table, __m512 *lo, __m512 *hi) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    *lo = _mm512_permutexvar_ps(v, table);
    *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
}
#define CODES16 _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#define CODES16_MINUS_8 _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7)
#define NIBBLES16_Q4_0(p, lo, hi) nibbles16((p), CODES16_MINUS_8, &(lo), &(hi))
/* Q4_0's packed codes (each byte XOR 0x88): nibble i stands for (i ^ 8) - 8, the signed
 * nibble, so the same permute from a reordered table */
#define CODES16_SIGNED _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1)
#define NIBBLES16_Q4_0P(p, lo, hi) nibbles16((p), CODES16_SIGNED, &(lo), &(hi))
#define NIBBLES16_Q4_1(p, lo, hi) nibbles16((p), CODES16, &(lo), &(hi))
/* (q - 8) * d from the table's q - 8, and fma(q, d, m): each product exact */
#define DEQ16_Q4_0(q8, sp, op) _mm512_mul_ps(q8, _mm512_loadu_ps(sp))
#define DEQ16_Q4_1(q, sp, op) _mm512_fmadd_ps(q, _mm512_loadu_ps(sp), _mm512_loadu_ps(op))
/* the same on binary16 scales and offsets (nm_scales.s16), widened exactly */
#define LOAD16_HALF(sp) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sp)))
#define DEQH16_Q4_0(q8, sp, op) _mm512_mul_ps(q8, LOAD16_HALF(sp))
#define DEQH16_Q4_1(q, sp, op) _mm512_fmadd_ps(q, LOAD16_HALF(sp), LOAD16_HALF(op))

/* ---- m <= 2 on a packed group of a 4-bit format: strided lanes ---------------------- */

/* A group's stored row r is 128 bytes, its four slivers side by side (slb == NR: every group
 * of a 4-bit format, nm_pack_width), byte j holding column j's rows 2r (low nibble) and
 * 2r + 1 (high). Read as two vectors of 16 dwords, lane i of half h holds columns 64h + 4i to
 * 64h + 4i + 3, column 64h + 4i + q's two codes at bits 8q and 8q + 4: one shift brings a
 * code down to the low 4 bits that vpermps reads. So 16 weights take a shift and a permute
 * (and the scale's multiplication, and the chain's FMA), where NIBBLES16 widens 16 bytes and
 * permutes twice for 32: on a Zen 4 the widening and the permutes share a pipe with the FMA
 * units, the shifts do not. For two rows of A each weight is decoded once. Accumulator
 * 4h + q (of a row's eight) holds columns 64h + 4i + q (lane i): C, the scales and the
 * offsets are put in that order first (strided128), C back after (unstrided128). Each
 * column's FMAs are NM_NIBBLE_SLIVERS_'s, in the same order: the same bits. */

/* x: 128 columns in order, 16 a vector; out[4h + q] lane i: column 64h + 4i + q */
static inline void strided128(__m512 out[8], const __m512 x[8]) {
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h)
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; ++q) {
            const __m512i idx = _mm512_add_epi32(
                _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28),
                _mm512_set1_epi32(q)); /* lanes 0-7 from columns 0-31, 8-15 from 32-63 */
            out[4 * h + q] = _mm512_mask_blend_ps(
                0xFF00, _mm512_permutex2var_ps(x[4 * h], idx, x[4 * h + 1]),
                _mm512_permutex2var_ps(x[4 * h + 2], idx, x[4 * h + 3]));
        }
}

/* the inverse: x[4h + u] lane t is column 64h + 16u + t, from acc[4h + t % 4] lane
 * 4u + t / 4 */
static inline void unstrided128(__m512 x[8], const __m512 acc[8]) {
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h)
        _Pragma("GCC unroll 4") for (int u = 0; u < 4; ++u) {
            const __m512i idx = _mm512_add_epi32(
                _mm512_setr_epi32(0, 16, 0, 16, 1, 17, 1, 17, 2, 18, 2, 18, 3, 19, 3, 19),
                _mm512_set1_epi32(4 * u));
            x[4 * h + u] = _mm512_mask_blend_ps(
                0xCCCC, _mm512_permutex2var_ps(acc[4 * h], idx, acc[4 * h + 1]),
                _mm512_permutex2var_ps(acc[4 * h + 2], idx, acc[4 * h + 3]));
        }
}

/* 16 scales (or offsets) of either grid type, float32 or binary16 (widened exactly) */
static inline __m512 load16_scales(const float *p) { return _mm512_loadu_ps(p); }
static inline __m512 load16_scales_half(const uint16_t *p) { return LOAD16_HALF(p); }
#define LOAD16_SCALES(p)                                                                     \
    _Generic((p), const float *: load16_scales, const uint16_t *: load16_scales_half)(p)
/* dst (64-byte aligned) gets the 128 vectors X16(w_) (16 columns each, w_ = 0..7) in the
 * strided order */
#define STAGE_STRIDED128(dst, X16)                                                           \
    do {                                                                                     \
        __m512 x_[8], y_[8];                                                                 \
        _Pragma("GCC unroll 8") for (int w_ = 0; w_ < 8; ++w_) x_[w_] = X16(w_);             \
        strided128(y_, x_);                                                                  \
        _Pragma("GCC unroll 8") for (int w_ = 0; w_ < 8; ++w_)                               \
            _mm512_store_ps((dst) + 16 * w_, y_[w_]);                                        \
    } while (0)

/* The formats' strided decodes, NIBBLES##_STRIDED beside each NIBBLES: the code at bit
 * `shift` of each lane of v, through the format's table, with its scale at sp (float32,
 * strided) and offset at op; each DEQ16's operations. NIBBLES##_OFFSETS: whether the format
 * has offsets to stage. */
#define NIBBLES16_Q4_0P_OFFSETS 0
#define NIBBLES16_Q4_1_OFFSETS 1
#define NIBBLES16_Q4_0P_STRIDED(v, shift, sp, op)                                            \
    _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, shift), CODES16_SIGNED),        \
                  _mm512_load_ps(sp))
#define NIBBLES16_Q4_1_STRIDED(v, shift, sp, op)                                             \
    _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, shift), CODES16),             \
                    _mm512_load_ps(sp), _mm512_load_ps(op))

/* Q4_1's codes decoded where they sit: the code at bit t of a lane, masked there, is
 * q * 2^t (t <= 28: a uint32 of 4 significant bits, converted exactly), and the scale staged
 * as s * 2^-t, so that fma(q * 2^t, s * 2^-t, o) is fma(q, s, o), the same bits (a zero's
 * sign, Inf and NaN included), when s * 2^-t is exact: |s| >= 2^-98 or s == 0 (or not
 * finite), which stage_in_place256 checks for a block. An AND and a conversion for 16
 * weights where the shift and the permute took 3-5 % more time in a loop of their own on a
 * Zen 4 (docs/results/in-place-nibbles-zen4-2026-12-07.txt); Q4_0's signed codes keep the
 * permute (in place they would need the sign brought down). A walk on the permute's views
 * (NIBBLE_VIEWS_: Intel CPUs) never takes it. NIBBLES##_IN_PLACE: whether the format has
 * this decode; NIBBLES##_STRIDED_IN_PLACE takes the staged scale of t at sp. */
#define NIBBLES16_Q4_0P_IN_PLACE 0
#define NIBBLES16_Q4_1_IN_PLACE 1
#define NIBBLES16_Q4_0P_STRIDED_IN_PLACE NIBBLES16_Q4_0P_STRIDED /* never taken */
#define NIBBLES16_Q4_1_STRIDED_IN_PLACE(v, shift, sp, op)                                    \
    _mm512_fmadd_ps(                                                                         \
        _mm512_cvtepu32_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)(15u << (shift))))),  \
        _mm512_load_ps(sp), _mm512_load_ps(op))

/* dst (64-byte aligned) gets, for each of the 8 strided vectors w of scales at sc (strided
 * order, q = w % 4), the scale of the low nibbles' bit 8q, sc * 2^-8q, at dst + 32w and the
 * high nibbles' (bit 8q + 4) at dst + 32w + 16; 0 (nothing staged) when some scale is below
 * 2^-98 in magnitude but not zero, where a product would leave the normal range and round.
 * The test reads the bits: no floating-point operation on a subnormal scale. */
static inline int stage_in_place256(float *dst, const float *sc) {
    const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
    const __m512i smallest = _mm512_set1_epi32(0x0E800000); /* 2^-98's bits */
    __mmask16 tiny = 0;
    _Pragma("GCC unroll 8") for (int w = 0; w < 8; ++w) {
        const __m512i x =
            _mm512_and_si512(_mm512_load_si512((const void *)(sc + 16 * w)), magnitude);
        tiny |= _mm512_mask_cmplt_epu32_mask(_mm512_test_epi32_mask(x, x), x, smallest);
    }
    if (tiny) return 0;
    _Pragma("GCC unroll 8") for (int w = 0; w < 8; ++w) {
        static const float low[4] = {1.0f, 0x1p-8f, 0x1p-16f, 0x1p-24f};
        const __m512 x = _mm512_load_ps(sc + 16 * w);
        const __m512 high = _mm512_set1_ps(low[w % 4] * 0x1p-4f);
        _mm512_store_ps(dst + 32 * w, w % 4 ? _mm512_mul_ps(x, _mm512_set1_ps(low[w % 4])) : x);
        _mm512_store_ps(dst + 32 * w + 16, _mm512_mul_ps(x, high));
    }
    return 1;
}

/* where a strided row finds vector w's scales for the nibble n (0 low, 1 high) in sc_: the
 * permute decode's one per w, the in-place decode's two (stage_in_place256) */
#define STRIDED_SCALES_(sc_, w_, n_) ((sc_) + 16 * (w_))
#define IN_PLACE_SCALES_(sc_, w_, n_) ((sc_) + 32 * (w_) + 16 * (n_))

/* The lanes of half h_ of stored row row_ (already loaded as v_) that hold, in their low
 * byte, byte q_ of each lane of v_ (column 64h + 4i + q's two codes): the same 64 bytes read
 * q_ bytes further on, so that the permute finds the low nibble without a shift and the high
 * one after a shift of 4, where v_ itself needs a shift for 7 of its 8 codes. On an Intel
 * Xeon the shifts share the FMAs' two pipes with the permutes (docs/kernels.md). Half 1's
 * views read up to 3 bytes past the row, the next row's: the call's last row (LAST_) shifts
 * v_ instead, so no byte past the call's rows is read. */
#define NIBBLE_VIEW_(v_, row_, h_, q_, LAST_)                                                \
    ((q_) == 0                 ? (v_)                                                        \
     : (LAST_) && (h_) == 1    ? _mm512_srli_epi32((v_), 8 * (q_))                           \
                               : _mm512_loadu_si512((const void *)((row_) + 64 * (h_) + (q_))))

/* Stored row r (at row_) of a group for RR rows of A (lda apart): the two codes of every
 * column, decoded once for the RR rows by DECODE (a NIBBLES##_STRIDED form), the low
 * nibble's FMA first, into acc_ (row r_'s eight strided vectors at acc_ + 8 r_), the scales
 * staged at sc_ (where SCALES_AT finds them) and the offsets at of_. VIEWS_ (a constant):
 * the codes through NIBBLE_VIEW_ (the permute decodes), LAST_ saying whether r is the
 * call's last row; else each half's one load, a code at bit 8q or 8q + 4 (the in-place
 * decode's scales are staged for those bits). */
#define NIBBLE_STRIDED_ROW_(DECODE, SCALES_AT, VIEWS_, LAST_, RR, acc_, a, lda, r, row_, sc_, \
                            of_)                                                             \
    do {                                                                                     \
        __m512 al_[RR], ah_[RR];                                                             \
        _Pragma("GCC unroll 2") for (int r_ = 0; r_ < (RR); ++r_) {                          \
            al_[r_] = _mm512_set1_ps((a)[r_ * (lda) + 2 * (r)]);                             \
            ah_[r_] = _mm512_set1_ps((a)[r_ * (lda) + 2 * (r) + 1]);                         \
        }                                                                                    \
        _Pragma("GCC unroll 2") for (int h_ = 0; h_ < 2; ++h_) {                             \
            const __m512i v_ = _mm512_loadu_si512((const void *)((row_) + 64 * h_));         \
            _Pragma("GCC unroll 4") for (int q_ = 0; q_ < 4; ++q_) {                         \
                const int w_ = 4 * h_ + q_;                                                  \
                const __m512i u_ = (VIEWS_) ? NIBBLE_VIEW_(v_, row_, h_, q_, LAST_) : v_;    \
                const int t_ = (VIEWS_) ? 0 : 8 * q_; /* the low nibble's bit in u_ */      \
                const __m512 wl_ = DECODE(u_, t_, SCALES_AT(sc_, w_, 0), (of_) + 16 * w_);   \
                const __m512 wh_ =                                                           \
                    DECODE(u_, t_ + 4, SCALES_AT(sc_, w_, 1), (of_) + 16 * w_);              \
                _Pragma("GCC unroll 2") for (int r_ = 0; r_ < (RR); ++r_) {                  \
                    acc_[8 * r_ + w_] = _mm512_fmadd_ps(al_[r_], wl_, acc_[8 * r_ + w_]);    \
                    acc_[8 * r_ + w_] = _mm512_fmadd_ps(ah_[r_], wh_, acc_[8 * r_ + w_]);    \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    } while (0)
/* Stored rows [r0_, end_) under one block, in place (IP_ 1: the scales at sc_ staged by
 * stage_in_place256) or through the permute (sc_ as STAGE_STRIDED128 stages them), on
 * byte views (views_, the walk's NIBBLE_VIEWS_) or shifting each half's one load; rows_:
 * the call's stored rows (the views read the last one in its own form) */
#define NIBBLE_STRIDED_ROWS_(NIBBLES, IP_, views_, RR, acc_, a, lda, b, ldb, r0_, end_, rows_, \
                             sc_, of_)                                                       \
    do {                                                                                     \
        if (IP_) {                                                                           \
            for (int64_t r = (r0_); r < (end_); ++r) {                                       \
                NM_PACKED_GEMV_PREFETCH((b) + r * (ldb), ldb);                               \
                NIBBLE_STRIDED_ROW_(NIBBLES##_STRIDED_IN_PLACE, IN_PLACE_SCALES_, 0, 0, RR,  \
                                    acc_, a, lda, r, (b) + r * (ldb), sc_, of_);             \
            }                                                                                \
        } else if (views_) {                                                                 \
            const int64_t before_last_ = (end_) < (rows_) ? (end_) : (rows_) - 1;            \
            for (int64_t r = (r0_); r < before_last_; ++r) {                                 \
                NM_PACKED_GEMV_PREFETCH((b) + r * (ldb), ldb);                               \
                NIBBLE_STRIDED_ROW_(NIBBLES##_STRIDED, STRIDED_SCALES_, 1, 0, RR, acc_, a,   \
                                    lda, r, (b) + r * (ldb), sc_, of_);                      \
            }                                                                                \
            if ((end_) == (rows_)) {                                                         \
                const int64_t r = (rows_) - 1;                                               \
                NIBBLE_STRIDED_ROW_(NIBBLES##_STRIDED, STRIDED_SCALES_, 1, 1, RR, acc_, a,   \
                                    lda, r, (b) + r * (ldb), sc_, of_);                      \
            }                                                                                \
        } else {                                                                             \
            for (int64_t r = (r0_); r < (end_); ++r) {                                       \
                NM_PACKED_GEMV_PREFETCH((b) + r * (ldb), ldb);                               \
                NIBBLE_STRIDED_ROW_(NIBBLES##_STRIDED, STRIDED_SCALES_, 0, 0, RR, acc_, a,   \
                                    lda, r, (b) + r * (ldb), sc_, of_);                      \
            }                                                                                \
        }                                                                                    \
    } while (0)
/* The same under one block of scales staged at sc_ (strided) and offsets at of_: in place
 * where the format, the walk's decode and the scales allow it */
#define NIBBLE_STRIDED_BLOCK_(NIBBLES, views_, RR, acc_, a, lda, b, ldb, r0_, end_, rows_, sc_, \
                              of_)                                                           \
    do {                                                                                     \
        _Alignas(64) float sp_[256];                                                         \
        if (NIBBLES##_IN_PLACE && !(views_) && stage_in_place256(sp_, sc_))                  \
            NIBBLE_STRIDED_ROWS_(NIBBLES, 1, 0, RR, acc_, a, lda, b, ldb, r0_, end_, rows_,  \
                                 sp_, of_);                                                  \
        else                                                                                 \
            NIBBLE_STRIDED_ROWS_(NIBBLES, 0, views_, RR, acc_, a, lda, b, ldb, r0_, end_,    \
                                 rows_, sc_, of_);                                           \
    } while (0)
/* C's RR rows (ldc apart) of 128 columns in (strided) and out */
#define NIBBLE_STRIDED_C_IN_(RR, acc_, c, ldc)                                               \
    _Pragma("GCC unroll 2") for (int r_ = 0; r_ < (RR); ++r_) {                              \
        __m512 x_[8];                                                                        \
        _Pragma("GCC unroll 8") for (int w_ = 0; w_ < 8; ++w_) x_[w_] =                      \
            _mm512_loadu_ps((c) + r_ * (ldc) + 16 * w_);                                     \
        strided128(acc_ + 8 * r_, x_);                                                       \
    }
#define NIBBLE_STRIDED_C_OUT_(RR, acc_, c, ldc)                                              \
    _Pragma("GCC unroll 2") for (int r_ = 0; r_ < (RR); ++r_) {                              \
        __m512 x_[8];                                                                        \
        unstrided128(x_, acc_ + 8 * r_);                                                     \
        _Pragma("GCC unroll 8") for (int w_ = 0; w_ < 8; ++w_)                               \
            _mm512_storeu_ps((c) + r_ * (ldc) + 16 * w_, x_[w_]);                            \
    }

/* vector w of the walks' scales and offsets (s, o: a grid's), and of a factored grid's
 * super-block factors (fs, fo) */
#define GRID16_S_(w) LOAD16_SCALES(s + 16 * (w))
#define GRID16_O_(w) LOAD16_SCALES(o + 16 * (w))
#define FACTORS16_S_(w) _mm512_loadu_ps(fs + 16 * (w))
#define FACTORS16_O_(w) _mm512_loadu_ps(fo + 16 * (w))
/* the super-block's factors at fs and fo, into the strided order at fs_ and fo_ */
#define STAGE_STRIDED_FACTORS_(fs_, fo_)                                                     \
    do {                                                                                     \
        STAGE_STRIDED128(fs_, FACTORS16_S_);                                                 \
        STAGE_STRIDED128(fo_, FACTORS16_O_);                                                 \
    } while (0)

/* The walk over a group on a grid for RR rows (GROUP of NM_DEFINE_NIBBLE_FORMATS):
 * NM_NIBBLE_SLIVERS_'s parameters, of which it reads ST and NIBBLES (its _STRIDED decode),
 * through the blocks of scales as NM_NIBBLE_SLIVERS_ steps them */
#define NIBBLE_STRIDED_GROUP(NAME, ST, RR, GG, VEC, L, NRW, SET1, LOADC, STOREC, FMA, NIBBLES, \
                             DEQ)                                                            \
    _Static_assert((RR) <= 2 && (GG) * (NRW) == 128 && (L) == 16, "1 or 2 rows, 128 columns"); \
    static inline void NAME(int64_t k, int64_t ldb, int64_t slb, const float *a,             \
                            int64_t lda, const uint8_t *b, float *c, int64_t ldc,            \
                            const ST *s, const ST *o, int64_t bk, int64_t lds) {             \
        (void)slb, (void)lda, (void)ldc; /* slb == NR */                                     \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        const int views_ = NIBBLE_VIEWS_;                                                    \
        const int64_t block_ = (bk < k ? bk : k) / 2; /* stored rows under one block */      \
        __m512 acc_[8 * (RR)];                                                               \
        NIBBLE_STRIDED_C_IN_(RR, acc_, c, ldc);                                              \
        for (int64_t r0_ = 0; r0_ < k / 2; r0_ += block_, s = r0_ < k / 2 ? s + lds : s,     \
                     o = o && r0_ < k / 2 ? o + lds : o) {                                   \
            _Alignas(64) float sc_[128], of_[128];                                           \
            STAGE_STRIDED128(sc_, GRID16_S_);                                                \
            if (NIBBLES##_OFFSETS) STAGE_STRIDED128(of_, GRID16_O_);                         \
            NIBBLE_STRIDED_BLOCK_(NIBBLES, views_, RR, acc_, a, lda, b, ldb, r0_,            \
                                  NM_BLOCK_END_(r0_, block_, k / 2), k / 2, sc_, of_);       \
        }                                                                                    \
        NIBBLE_STRIDED_C_OUT_(RR, acc_, c, ldc);                                             \
    }

/* dst (64-byte aligned) gets a block's 128 products f[x] * (float)cp[x], FACTORED16_V's, in
 * the strided order, from f, the super-block's 128 factors already in that order: the block's
 * int8 codes are read as the weights are (two vectors of 16 dwords, lane i of half h holding
 * columns 64h + 4i to 64h + 4i + 3), a code brought to the top byte and sign-extended by two
 * shifts, where widening and permuting per block took the pipes the FMAs use */
static inline void stage_strided_factored(float *dst, const int8_t *cp, const float *f,
                                          int per_w) {
    _Pragma("GCC unroll 2") for (int h = 0; h < 2; ++h) {
        const __m512i v = _mm512_loadu_si512((const void *)(cp + 64 * h));
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; ++q) {
            const __m512 code =
                _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * q), 24));
            const int w = 4 * h + q;
            _Pragma("GCC unroll 2") for (int t = 0; t < per_w; ++t)
                _mm512_store_ps(dst + 16 * (per_w * w + t),
                                _mm512_mul_ps(_mm512_load_ps(f + 16 * (per_w * w + t)), code));
        }
    }
}
static inline void stage_strided_factored128(float *dst, const int8_t *cp, const float *f) {
    stage_strided_factored(dst, cp, f, 1);
}
/* for the in-place decode: f holds two factors a w (stage_in_place256's order), so dst gets
 * the block's scales times 2^-t, each exact where f's are (the products f * code are) */
static inline void stage_strided_factored256(float *dst, const int8_t *cp, const float *f) {
    stage_strided_factored(dst, cp, f, 2);
}

/* The same on a factored grid (the q4_1 form's GROUP of NM_DEFINE_FACTORED_GEMVS):
 * NM_FACTORED_NIBBLE_SLIVERS_'s parameters; each block's scales and offsets are the products
 * that walk makes (FACTORED, which is FACTORED16: FACTORED16_V's), made in the strided order
 * from the super-block's factors, put in that order once per super-block */
#define NIBBLE_STRIDED_FACTORED_GROUP(NAME, RR, GG, VEC, L, NRW, SET1, LOADC, STOREC, FMA,   \
                                      NIBBLES, DEQ, FACTORED)                                \
    _Static_assert((RR) <= 2 && (GG) * (NRW) == 128 && (L) == 16, "1 or 2 rows, 128 columns"); \
    static inline NM_FACTORED_SIGNATURE_(NAME) {                                             \
        (void)slb, (void)lda, (void)ldc; /* slb == NR */                                     \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        const int views_ = NIBBLE_VIEWS_;                                                    \
        const int64_t block_ = (bk < k ? bk : k) / 2; /* stored rows under one block */      \
        __m512 acc_[8 * (RR)];                                                               \
        NIBBLE_STRIDED_C_IN_(RR, acc_, c, ldc);                                              \
        _Alignas(64) float fs_[128], fo_[128]; /* the super-block's factors, strided */     \
        _Alignas(64) float fi_[256]; /* and its scale factors times 2^-t, for in place */   \
        STAGE_STRIDED_FACTORS_(fs_, fo_);                                                    \
        int in_place_ = NIBBLES##_IN_PLACE && !views_ && stage_in_place256(fi_, fs_);       \
        for (int64_t r0_ = 0, left_ = per_super; r0_ < k / 2; r0_ += block_) {               \
            _Alignas(64) float sc_[256], of_[128];                                           \
            stage_strided_factored128(of_, co, fo_);                                         \
            if (in_place_) {                                                                 \
                stage_strided_factored256(sc_, cs, fi_);                                     \
                NIBBLE_STRIDED_ROWS_(NIBBLES, 1, 0, RR, acc_, a, lda, b, ldb, r0_,           \
                                     NM_BLOCK_END_(r0_, block_, k / 2), k / 2, sc_, of_);    \
            } else {                                                                         \
                stage_strided_factored128(sc_, cs, fs_);                                     \
                NIBBLE_STRIDED_ROWS_(NIBBLES, 0, views_, RR, acc_, a, lda, b, ldb, r0_,      \
                                     NM_BLOCK_END_(r0_, block_, k / 2), k / 2, sc_, of_);    \
            }                                                                                \
            NM_FACTORED_NEXT_(r0_ + block_ >= k / 2, cs, co, fs, fo, ld, left_, per_super);  \
            if (left_ == per_super) { /* fs and fo stepped to the next super-block */        \
                STAGE_STRIDED_FACTORS_(fs_, fo_);                                            \
                in_place_ = NIBBLES##_IN_PLACE && !views_ && stage_in_place256(fi_, fs_);   \
            }                                                                                \
        }                                                                                    \
        NIBBLE_STRIDED_C_OUT_(RR, acc_, c, ldc);                                             \
    }

/* ---- m <= 2 on a packed group of a byte format (Q8_0, Q5_1): strided lanes ---------- */

/* A group's stored row p is 128 bytes, column j's code at byte j (slb == NR). The 64 bytes
 * from byte 64h + q - 3 (q = 0..3), read as 16 dwords, hold column 64h + 4i + q's code in
 * lane i's top byte, which one shift brings down (arithmetic for Q8_0's int8 codes, logical
 * for Q5_1's): 16 weights take a load, a shift and a conversion (and the scale's
 * multiplication or the scale and offset's FMA, and the chain's FMA), where
 * widening 16 bytes (vpmovsxbd) takes the pipe that the FMAs share with the permutes on a
 * Zen 4, and the shift and the conversion do not. Lanes, accumulators, C, the scales: the
 * nibble walks' strided order. The views at q < 3 of half 0 read up to 3 bytes before the
 * row, the previous row's, so a call's first row shifts its aligned half 0 instead. Each
 * column's FMAs are NM_GEMV_PACKED_SLIVERS_'s, in the same order: the same bits
 * (docs/results/byte-strided-walks-zen4-2026-12-07.txt). */
#define BYTE_VIEW_(row_, h_, q_, FIRST_)                                                     \
    ((FIRST_) && (h_) == 0 && (q_) < 3                                                       \
         ? _mm512_slli_epi32(_mm512_loadu_si512((const void *)(row_)), 24 - 8 * (q_))        \
         : _mm512_loadu_si512((const void *)((row_) + 64 * (h_) + (q_) - 3)))

/* The byte formats' strided decodes, by the operation the group's walk is given for the
 * scales (its SCV, either grid type): a view's top bytes as weights, with their scales at
 * sp and offsets at op (strided); BYTE_OFFSETS_: whether the format has offsets to stage */
#define BYTE_DEQ_SCALE16(v, sp, op)                                                          \
    _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(v, 24)), _mm512_load_ps(sp))
#define BYTE_DEQ_SCALE16_HALF(v, sp, op) BYTE_DEQ_SCALE16(v, sp, op)
#define BYTE_DEQ_OFFSET16(v, sp, op)                                                         \
    _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 24)), _mm512_load_ps(sp),        \
                    _mm512_load_ps(op))
#define BYTE_DEQ_OFFSET16_HALF(v, sp, op) BYTE_DEQ_OFFSET16(v, sp, op)
#define BYTE_OFFSETS_SCALE16 0
#define BYTE_OFFSETS_SCALE16_HALF 0
#define BYTE_OFFSETS_OFFSET16 1
#define BYTE_OFFSETS_OFFSET16_HALF 1

/* Stored row p (at row_) for RR rows of A (lda apart) into acc_ (row r_'s eight strided
 * vectors at acc_ + 8 r_), through DEQ (a BYTE_DEQ_), the block's scales and offsets staged
 * at sc_ and of_; FIRST_ (a constant): the call's first row */
#define BYTE_STRIDED_ROW_(DEQ, RR, acc_, a, lda, p, row_, sc_, of_, FIRST_)                  \
    do {                                                                                     \
        __m512 ap_[RR];                                                                      \
        _Pragma("GCC unroll 2") for (int r_ = 0; r_ < (RR); ++r_) ap_[r_] =                  \
            _mm512_set1_ps((a)[r_ * (lda) + (p)]);                                           \
        _Pragma("GCC unroll 2") for (int h_ = 0; h_ < 2; ++h_)                               \
            _Pragma("GCC unroll 4") for (int q_ = 0; q_ < 4; ++q_) {                         \
                const int w_ = 4 * h_ + q_;                                                  \
                const __m512 wv_ = DEQ(BYTE_VIEW_(row_, h_, q_, FIRST_), (sc_) + 16 * w_,    \
                                       (of_) + 16 * w_);                                     \
                _Pragma("GCC unroll 2") for (int r_ = 0; r_ < (RR); ++r_)                    \
                    acc_[8 * r_ + w_] = _mm512_fmadd_ps(ap_[r_], wv_, acc_[8 * r_ + w_]);    \
            }                                                                                \
    } while (0)
/* Rows [p0_, end_) of a block, the call's first one (row 0) in its own form */
#define BYTE_STRIDED_ROWS_(DEQ, RR, acc_, a, lda, b, ldb, p0_, end_, sc_, of_)               \
    do {                                                                                     \
        int64_t p_ = (p0_);                                                                  \
        if (p_ == 0) {                                                                       \
            NM_PACKED_GEMV_PREFETCH(b, ldb);                                                 \
            BYTE_STRIDED_ROW_(DEQ, RR, acc_, a, lda, 0, b, sc_, of_, 1);                     \
            p_ = 1;                                                                          \
        }                                                                                    \
        for (; p_ < (end_); ++p_) {                                                          \
            NM_PACKED_GEMV_PREFETCH((b) + p_ * (ldb), ldb);                                  \
            BYTE_STRIDED_ROW_(DEQ, RR, acc_, a, lda, p_, (b) + p_ * (ldb), sc_, of_, 0);     \
        }                                                                                    \
    } while (0)

/* The walk over a group for RR rows (BYTE_GROUP of NM_DEFINE_PACKED_GEMVS and
 * NM_DEFINE_Q5_1_FORMAT): NM_GEMV_PACKED_SLIVERS_'s parameters, of which it reads ST
 * (float32 or binary16 scales) and SCV (the decode: BYTE_DEQ_##SCV), through the blocks of
 * scales (and offsets) as that walk steps them */
#define BYTE_STRIDED_GROUP(NAME, ST, RR, GG, ITEM, VEC, L, NRW, SET1, LOADC, STOREC, LOADW,  \
                           FMA, SCV)                                                         \
    _Static_assert((RR) <= 2 && (GG) * (NRW) == 128 && (L) == 16 && (ITEM) == 1,            \
                   "1 or 2 rows, 128 one-byte columns");                                     \
    static inline void NAME(int64_t k, int64_t ldb, int64_t slb, const float *a,             \
                            int64_t lda, const uint8_t *b, float *c, int64_t ldc,            \
                            const ST *s, const ST *o, int64_t bk, int64_t lds) {             \
        (void)slb, (void)lda, (void)ldc; /* slb == NR */                                     \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        const int64_t block_ = bk < k ? bk : k; /* rows under one block of scales */        \
        __m512 acc_[8 * (RR)];                                                               \
        NIBBLE_STRIDED_C_IN_(RR, acc_, c, ldc);                                              \
        for (int64_t p0_ = 0; p0_ < k; p0_ += block_, s = p0_ < k ? s + lds : s,             \
                     o = o && p0_ < k ? o + lds : o) {                                       \
            _Alignas(64) float sc_[128], of_[128];                                           \
            STAGE_STRIDED128(sc_, GRID16_S_);                                                \
            if (BYTE_OFFSETS_##SCV) STAGE_STRIDED128(of_, GRID16_O_);                        \
            BYTE_STRIDED_ROWS_(BYTE_DEQ_##SCV, RR, acc_, a, lda, b, ldb, p0_,                \
                               NM_BLOCK_END_(p0_, block_, k), sc_, of_);                     \
        }                                                                                    \
        NIBBLE_STRIDED_C_OUT_(RR, acc_, c, ldc);                                             \
    }

/* The same on a factored grid (the q8_0 form's GROUP of NM_DEFINE_FACTORED_GEMVS: Q6_K,
 * Q3_K, IQ4_XS): NM_FACTORED_BYTE_SLIVERS_'s parameters; a block's scales are its products
 * (FACTORED16_V's) made in the strided order, as in NIBBLE_STRIDED_FACTORED_GROUP */
#define BYTE_STRIDED_FACTORED_GROUP(NAME, RR, GG, VEC, L, NRW, SET1, LOADC, STOREC, FMA,     \
                                    LOADW, SCV, FACTORED)                                    \
    _Static_assert((RR) <= 2 && (GG) * (NRW) == 128 && (L) == 16, "1 or 2 rows, 128 columns"); \
    static inline NM_FACTORED_SIGNATURE_(NAME) {                                             \
        (void)slb, (void)lda, (void)ldc; /* slb == NR */                                     \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        const int64_t block_ = bk < k ? bk : k; /* rows under one block */                  \
        __m512 acc_[8 * (RR)];                                                               \
        NIBBLE_STRIDED_C_IN_(RR, acc_, c, ldc);                                              \
        _Alignas(64) float fs_[128]; /* the super-block's factors, strided */               \
        STAGE_STRIDED128(fs_, FACTORS16_S_);                                                 \
        for (int64_t p0_ = 0, left_ = per_super; p0_ < k; p0_ += block_) {                   \
            _Alignas(64) float sc_[128];                                                     \
            stage_strided_factored128(sc_, cs, fs_);                                         \
            BYTE_STRIDED_ROWS_(BYTE_DEQ_SCALE16, RR, acc_, a, lda, b, ldb, p0_,              \
                               NM_BLOCK_END_(p0_, block_, k), sc_, sc_); /* no offsets */   \
            NM_FACTORED_NEXT_(p0_ + block_ >= k, cs, co, fs, fo, ld, left_, per_super);      \
            if (left_ == per_super) /* fs stepped to the next super-block */                 \
                STAGE_STRIDED128(fs_, FACTORS16_S_);                                         \
        }                                                                                    \
        NIBBLE_STRIDED_C_OUT_(RR, acc_, c, ldc);                                             \
    }

/* ---- m == 1 on two groups at once (gemv_packed_pair): two streams of weights --------- */

/* On an Intel Xeon one core read one stream of packed weights at 10-11 GB/s while the walk's
 * decode kept its FMA pipes busy, where a plain read runs at 14: two streams side by side
 * keep more lines coming (the hardware's prefetch follows a page at a time). From memory the
 * pair walks ran Q8_0 1.22-1.25x, Q6_K 1.10-1.19x, Q5_1 1.05-1.12x and Q4_0 1.11x (median);
 * from L2 Q4_0 0.93x and Q5_1 0.87x (docs/results/gemv-streams-xeon-2026-12-07.txt). They
 * step through two groups' stored rows in turn, each group's eight accumulators in
 * registers (four groups would need all 32), each column's chain the one-group walk's: the
 * same bits. */

/* a group's block of scales (and offsets) at s_ (o_), grid type ST, staged strided */
#define STAGE_GROUP_GRID_(ST, sc_, of_, s_, o_, OFFSETS)                                     \
    do {                                                                                     \
        const ST *s = (s_), *o = (o_);                                                       \
        (void)o;                                                                             \
        STAGE_STRIDED128(sc_, GRID16_S_);                                                    \
        if (OFFSETS) STAGE_STRIDED128(of_, GRID16_O_);                                       \
    } while (0)
/* the pair's blocks of scales step together (never past the last block) */
#define PAIR_NEXT_BLOCK_(more)                                                               \
    if (more) {                                                                              \
        s0 += lds, s1 += lds;                                                                \
        if (o0) o0 += lds, o1 += lds;                                                        \
    }
/* the pair's accumulators, from C and back */
#define PAIR_C_IN_                                                                           \
    __m512 acc0_[8], acc1_[8];                                                               \
    NIBBLE_STRIDED_C_IN_(1, acc0_, c0, 0);                                                   \
    NIBBLE_STRIDED_C_IN_(1, acc1_, c1, 0)
#define PAIR_C_OUT_                                                                          \
    NIBBLE_STRIDED_C_OUT_(1, acc0_, c0, 0);                                                  \
    NIBBLE_STRIDED_C_OUT_(1, acc1_, c1, 0)
/* both groups' blocks of scales (and offsets) staged */
#define STAGE_PAIR_GRIDS_(ST, OFFSETS)                                                       \
    _Alignas(64) float sc0_[128], sc1_[128], of0_[128], of1_[128];                           \
    STAGE_GROUP_GRID_(ST, sc0_, of0_, s0, o0, OFFSETS);                                      \
    STAGE_GROUP_GRID_(ST, sc1_, of1_, s1, o1, OFFSETS)
#define PAIR_SIGNATURE_(NAME, ST)                                                            \
    static void NAME(int64_t k, int64_t ldb, const float *a, const uint8_t *b0,              \
                     const uint8_t *b1, float *c0, float *c1, const ST *s0, const ST *s1,    \
                     const ST *o0, const ST *o1, int64_t bk, int64_t lds)

/* Stored rows [r0_, end_) of both groups (rows_ in all) through the permute, on byte views
 * (VIEWS_, a constant: the last stored row read in its own form) or shifting each half's
 * one load, as NIBBLE_STRIDED_ROWS_ walks one group */
#define NIBBLE_PAIR_ROWS_(NIBBLES, VIEWS_, r0_, end_, rows_)                                 \
    do {                                                                                     \
        const int64_t before_last_ = (VIEWS_) && (end_) == (rows_) ? (rows_) - 1 : (end_);   \
        for (int64_t r = (r0_); r < before_last_; ++r) {                                     \
            NM_PACKED_GEMV_PREFETCH(b0 + r * ldb, ldb);                                      \
            NM_PACKED_GEMV_PREFETCH(b1 + r * ldb, ldb);                                      \
            NIBBLE_STRIDED_ROW_(NIBBLES##_STRIDED, STRIDED_SCALES_, VIEWS_, 0, 1, acc0_, a,  \
                                0, r, b0 + r * ldb, sc0_, of0_);                             \
            NIBBLE_STRIDED_ROW_(NIBBLES##_STRIDED, STRIDED_SCALES_, VIEWS_, 0, 1, acc1_, a,  \
                                0, r, b1 + r * ldb, sc1_, of1_);                             \
        }                                                                                    \
        if (before_last_ < (end_)) {                                                         \
            const int64_t r = before_last_;                                                  \
            NIBBLE_STRIDED_ROW_(NIBBLES##_STRIDED, STRIDED_SCALES_, VIEWS_, 1, 1, acc0_, a,  \
                                0, r, b0 + r * ldb, sc0_, of0_);                             \
            NIBBLE_STRIDED_ROW_(NIBBLES##_STRIDED, STRIDED_SCALES_, VIEWS_, 1, 1, acc1_, a,  \
                                0, r, b1 + r * ldb, sc1_, of1_);                             \
        }                                                                                    \
    } while (0)
/* A 4-bit format's pair walk on grid type ST: the decode the walk's NIBBLE_VIEWS_ says
 * (the in-place one is not taken: Q4_0 has none) */
#define NIBBLE_STRIDED_PAIR(NAME, ST, NIBBLES)                                               \
    _Static_assert(!NIBBLES##_IN_PLACE, "the pair walks permute every code");                \
    PAIR_SIGNATURE_(NAME, ST) {                                                              \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        const int views_ = NIBBLE_VIEWS_;                                                    \
        const int64_t block_ = (bk < k ? bk : k) / 2, rows_ = k / 2;                         \
        PAIR_C_IN_;                                                                          \
        for (int64_t r0_ = 0; r0_ < rows_; r0_ += block_) {                                  \
            STAGE_PAIR_GRIDS_(ST, NIBBLES##_OFFSETS);                                        \
            const int64_t end_ = NM_BLOCK_END_(r0_, block_, rows_);                          \
            if (views_)                                                                      \
                NIBBLE_PAIR_ROWS_(NIBBLES, 1, r0_, end_, rows_);                             \
            else                                                                             \
                NIBBLE_PAIR_ROWS_(NIBBLES, 0, r0_, end_, rows_);                             \
            PAIR_NEXT_BLOCK_(r0_ + block_ < rows_);                                          \
        }                                                                                    \
        PAIR_C_OUT_;                                                                         \
    }

/* A byte format's pair walk on grid type ST through BYTE_DEQ_##SCV, the call's first row
 * of each group in its own form, as BYTE_STRIDED_ROWS_ walks one group */
#define BYTE_STRIDED_PAIR(NAME, ST, SCV)                                                     \
    PAIR_SIGNATURE_(NAME, ST) {                                                              \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        const int64_t block_ = bk < k ? bk : k;                                              \
        PAIR_C_IN_;                                                                          \
        for (int64_t p0_ = 0; p0_ < k; p0_ += block_) {                                      \
            STAGE_PAIR_GRIDS_(ST, BYTE_OFFSETS_##SCV);                                       \
            int64_t p = p0_;                                                                 \
            if (p == 0) {                                                                    \
                BYTE_STRIDED_ROW_(BYTE_DEQ_##SCV, 1, acc0_, a, 0, 0, b0, sc0_, of0_, 1);     \
                BYTE_STRIDED_ROW_(BYTE_DEQ_##SCV, 1, acc1_, a, 0, 0, b1, sc1_, of1_, 1);     \
                p = 1;                                                                       \
            }                                                                                \
            for (; p < NM_BLOCK_END_(p0_, block_, k); ++p) {                                 \
                NM_PACKED_GEMV_PREFETCH(b0 + p * ldb, ldb);                                  \
                NM_PACKED_GEMV_PREFETCH(b1 + p * ldb, ldb);                                  \
                BYTE_STRIDED_ROW_(BYTE_DEQ_##SCV, 1, acc0_, a, 0, p, b0 + p * ldb, sc0_,     \
                                  of0_, 0);                                                  \
                BYTE_STRIDED_ROW_(BYTE_DEQ_##SCV, 1, acc1_, a, 0, p, b1 + p * ldb, sc1_,     \
                                  of1_, 0);                                                  \
            }                                                                                \
            PAIR_NEXT_BLOCK_(p0_ + block_ < k);                                              \
        }                                                                                    \
        PAIR_C_OUT_;                                                                         \
    }

/* The same on the K types' factored grids of the q8_0 form (Q6_K, Q3_K, IQ4_XS; no
 * offsets: co and fo are not read): each group's block codes cs and super-block factors fs
 * as BYTE_STRIDED_FACTORED_GROUP reads them, the factors staged strided once per
 * super-block. The q4_1 form's pair (Q4_K) ran no faster from memory than one group and
 * 0.77-0.95x from L2 (docs/results/gemv-streams-xeon-2026-12-07.txt): none. */
#define FACTORED_PAIR_SIGNATURE_(NAME)                                                       \
    static void NAME(int64_t k, int64_t ldb, const float *a, const uint8_t *b0,              \
                     const uint8_t *b1, float *c0, float *c1, const int8_t *cs0,             \
                     const int8_t *cs1, const int8_t *co0, const int8_t *co1,                \
                     const float *fs0, const float *fs1, const float *fo0, const float *fo1, \
                     int64_t bk, int64_t ld, int64_t per_super)
/* both groups' super-block factors, strided */
#define STAGE_PAIR_FACTORS_                                                                  \
    do {                                                                                     \
        const float *fs = fs0;                                                               \
        STAGE_STRIDED128(fs0_, FACTORS16_S_);                                                \
        fs = fs1;                                                                            \
        STAGE_STRIDED128(fs1_, FACTORS16_S_);                                                \
    } while (0)
#define BYTE_STRIDED_FACTORED_PAIR(NAME)                                                     \
    FACTORED_PAIR_SIGNATURE_(NAME) {                                                         \
        (void)co0, (void)co1, (void)fo0, (void)fo1;                                          \
        NM_PACKED_GEMV_AHEAD_;                                                               \
        const int64_t block_ = bk < k ? bk : k;                                              \
        PAIR_C_IN_;                                                                          \
        _Alignas(64) float fs0_[128], fs1_[128];                                             \
        STAGE_PAIR_FACTORS_;                                                                 \
        for (int64_t p0_ = 0, left_ = per_super; p0_ < k; p0_ += block_) {                   \
            _Alignas(64) float sc0_[128], sc1_[128];                                         \
            stage_strided_factored128(sc0_, cs0, fs0_);                                      \
            stage_strided_factored128(sc1_, cs1, fs1_);                                      \
            int64_t p = p0_;                                                                 \
            if (p == 0) {                                                                    \
                BYTE_STRIDED_ROW_(BYTE_DEQ_SCALE16, 1, acc0_, a, 0, 0, b0, sc0_, sc0_, 1);   \
                BYTE_STRIDED_ROW_(BYTE_DEQ_SCALE16, 1, acc1_, a, 0, 0, b1, sc1_, sc1_, 1);   \
                p = 1;                                                                       \
            }                                                                                \
            for (; p < NM_BLOCK_END_(p0_, block_, k); ++p) {                                 \
                NM_PACKED_GEMV_PREFETCH(b0 + p * ldb, ldb);                                  \
                NM_PACKED_GEMV_PREFETCH(b1 + p * ldb, ldb);                                  \
                BYTE_STRIDED_ROW_(BYTE_DEQ_SCALE16, 1, acc0_, a, 0, p, b0 + p * ldb, sc0_,   \
                                  sc0_, 0);                                                  \
                BYTE_STRIDED_ROW_(BYTE_DEQ_SCALE16, 1, acc1_, a, 0, p, b1 + p * ldb, sc1_,   \
                                  sc1_, 0);                                                  \
            }                                                                                \
            /* the next block's codes; the next super-block's factors after per_super */    \
            if (p0_ + block_ >= k) break;                                                    \
            cs0 += ld, cs1 += ld;                                                            \
            if (--left_ == 0) {                                                              \
                fs0 += ld, fs1 += ld, left_ = per_super;                                     \
                STAGE_PAIR_FACTORS_;                                                         \
            }                                                                                \
        }                                                                                    \
        PAIR_C_OUT_;                                                                         \
    }

NIBBLE_STRIDED_PAIR(gemv_packed_pair_q4_0_avx512, float, NIBBLES16_Q4_0P)
NIBBLE_STRIDED_PAIR(gemv_packed_pair_q4_0_half_avx512, uint16_t, NIBBLES16_Q4_0P)
BYTE_STRIDED_PAIR(gemv_packed_pair_q8_0_avx512, float, SCALE16)
BYTE_STRIDED_PAIR(gemv_packed_pair_q8_0_half_avx512, uint16_t, SCALE16_HALF)
BYTE_STRIDED_PAIR(gemv_packed_pair_q5_1_avx512, float, OFFSET16)
BYTE_STRIDED_PAIR(gemv_packed_pair_q5_1_half_avx512, uint16_t, OFFSET16_HALF)
BYTE_STRIDED_FACTORED_PAIR(gemv_packed_pair_q8_0_factored_avx512)

/* packed weights: four 32-column slivers at a time (four streams, as in the avx2 row), for
 * one row and for two (16 accumulators of the 32 registers); Q8_0's and Q5_1's groups
 * through the strided walk above */
NM_DEFINE_PACKED_GEMVS(avx512, __m512, 16, NR,
                       PACKED_SLIVERS_M1, PACKED_SLIVERS_M2, PACKED_SLIVERS_FP8_M1,
                       PACKED_SLIVERS_FP8_M2, _mm512_set1_ps, _mm512_loadu_ps,
                       _mm512_storeu_ps, load16_f32, load16_fp16, load16_bf16, load16_e4m3fn,
                       load16_e5m2, load16_e4m3fn_finite, load16_e5m2_finite, load16_q8_0,
                       FMADD16, SCALE16, SCALE16_HALF, BYTE_STRIDED_GROUP)
NM_DEFINE_Q5_1_FORMAT(avx512, __m512, 16, NR, PACKED_SLIVERS_FP8_M1, PACKED_SLIVERS_FP8_M2,
                      _mm512_set1_ps, _mm512_loadu_ps, _mm512_storeu_ps, load16_q5_1, FMADD16,
                      PREFETCH_T0, OFFSET16, OFFSET16_HALF, BYTE_STRIDED_GROUP)

/* packed: a group's whole stored row at a time (four 32-column slivers), for one row and for
 * two (16 accumulators), through the strided walks above
 * (docs/results/strided-lanes-avx512-zen4-2026-12-06.txt). Two slivers for two rows read half
 * of each 128-byte group row a pass, and took 1.2-1.4x the time at m = 2 and 1.1-1.2x at
 * m = 3 to 6 on a Zen 4 (docs/results/nibble-pairs-four-slivers-zen4-2026-12-06.txt). */
NM_DEFINE_NIBBLE_FORMATS(avx512, __m512, 16, NR, 4, 4, _mm512_set1_ps, _mm512_loadu_ps,
                         _mm512_storeu_ps, FMADD16, NIBBLES16_Q4_0, DEQ16_Q4_0, NIBBLES16_Q4_0P,
                         DEQ16_Q4_0, DEQH16_Q4_0, NIBBLES16_Q4_1, DEQ16_Q4_1, DEQH16_Q4_1,
                         NIBBLE_STRIDED_GROUP)

/* The K types' m == 1 and m == 2 walks on their factored grids (kernel_common.h): 16 codes
 * widened and converted (exact), times their factors, a block's scales made in three
 * operations a vector, where the frame's pass over the grid cost Q4_K and Q6_K 1.17-1.31x at
 * m = 1 on a Zen 4 (docs/kernels.md). Four slivers at a time, as the walks on float32
 * grids; the q4_1 form's group walks are the strided ones above. */
#define FACTORED16_V(cp, fp)                                                                 \
    _mm512_mul_ps(_mm512_loadu_ps(fp), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(                \
                                           _mm_loadu_si128((const __m128i *)(cp)))))
#define FACTORED16(dst, cp, fp) _mm512_storeu_ps(dst, FACTORED16_V(cp, fp))
NM_DEFINE_FACTORED_GEMVS(avx512, __m512, 16, NR, 4, 4, 4, 4, _mm512_set1_ps, _mm512_loadu_ps,
                         _mm512_storeu_ps, FMADD16, NIBBLES16_Q4_1, DEQ16_Q4_1, load16_q8_0,
                         SCALE16, FACTORED16, NIBBLE_STRIDED_FACTORED_GROUP,
                         BYTE_STRIDED_FACTORED_GROUP)

/* The first tile of a 4-bit sliver through the blocks of scales of its k block (bk, lds),
 * decoding on the way: stored row r gives sliver rows 2r (low nibbles) and 2r + 1
 * (high), each stored for the tiles below and fed to its 16 FMAs in the same step, so the
 * decode's permutes and multiplies share the cycles of the tile's FMAs instead of running
 * as a pass of their own. The decode is pack's (NIBBLES, DEQ), so are the bits. On packed
 * weights a sliver's stored rows are a group's row apart (ldb = PACKED_LDB(1)), and a
 * prefetch 32 stored rows down took m = 8 from 0.85-0.96x back to 0.92-1.01x the speed of
 * the layout before the groups (docs/kernels.md, "Groups of slivers"). */
#define NM_DEFINE_NIBBLE_TILE_PACK(TILE, ROWS, NIBBLES, DEQ)                                 \
    static void TILE(int64_t kc, const float *ap, const uint8_t *b, int64_t ldb, float *bp,  \
                     float *c, int64_t ldc, const float *c_next, const float *s,             \
                     const float *o, int64_t bk, int64_t lds) {                              \
        (void)o; /* Q4_0 has no offsets */                                                   \
        PREFETCH_C_TILE(c_next, ldc);                                                        \
        ROWS##LOAD_C(c, ldc)                                                                 \
        NM_TILE_SCALES_INIT_(s, kc, bk, 2);                                                  \
        const int64_t ahead = ldb == PACKED_LDB(1) ? 32 * ldb : 0; /* packed: see above */   \
        for (int64_t r = 0; r < kc / 2; ++r) {                                               \
            NM_TILE_SCALES_NEXT_(s, o, bk, lds, 2);                                          \
            if (ahead) _mm_prefetch((const char *)(b + r * ldb + ahead), _MM_HINT_T0);      \
            __m512 lo0, hi0, lo1, hi1;                                                       \
            NIBBLES(b + r * ldb, lo0, hi0);                                                  \
            NIBBLES(b + r * ldb + 16, lo1, hi1);                                             \
            lo0 = DEQ(lo0, s, o), hi0 = DEQ(hi0, s, o);                                      \
            lo1 = DEQ(lo1, s + 16, o + 16), hi1 = DEQ(hi1, s + 16, o + 16);                  \
            float *bq = bp + 2 * r * NR;                                                     \
            _mm512_store_ps(bq, lo0);                                                        \
            _mm512_store_ps(bq + 16, lo1);                                                   \
            _mm512_store_ps(bq + NR, hi0);                                                   \
            _mm512_store_ps(bq + NR + 16, hi1);                                              \
            ROWS##FMA_STEP(ap, 2 * r, lo0, lo1);                                             \
            ROWS##FMA_STEP(ap, 2 * r + 1, hi0, hi1);                                         \
        }                                                                                    \
        ROWS##STORE_C(c, ldc)                                                                \
    }
#define NM_DEFINE_NIBBLE_UKERNEL_PACK(FMT, NIBBLES, DEQ)                                     \
    NM_DEFINE_NIBBLE_TILE_PACK(tile_pack_##FMT, TILE_, NIBBLES, DEQ)                         \
    NM_DEFINE_NIBBLE_TILE_PACK(tile_pack_##FMT##_half, TILE_HALF_, NIBBLES, DEQ)             \
    NM_DEFINE_UKERNEL_PACK_FROM_TILES(ukernel_pack_##FMT##_avx512, tile_pack_##FMT,          \
                                      tile_pack_##FMT##_half, NM_HALF_ALWAYS)

NM_DEFINE_NIBBLE_UKERNEL_PACK(q4_0, NIBBLES16_Q4_0, DEQ16_Q4_0)
NM_DEFINE_NIBBLE_UKERNEL_PACK(q4_0_packed, NIBBLES16_Q4_0P, DEQ16_Q4_0)
NM_DEFINE_NIBBLE_UKERNEL_PACK(q4_1, NIBBLES16_Q4_1, DEQ16_Q4_1)

/* ---- codecs ------------------------------------------------------------------------- */

static void decode_fp16_avx512(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, load16_fp16((const uint8_t *)(src + i)));
    for (; i < n; ++i) dst[i] = nm_fp16_to_f32(src[i]);
}

static void encode_fp16_avx512(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_si256((__m256i *)(dst + i), h);
    }
    for (; i < n; ++i) dst[i] = nm_f32_to_fp16(src[i]);
}

/* bf16: the branch-free scalar codec, vectorised by the compiler for this row's flags. */
NM_DEFINE_CODEC_LOOP(decode_bf16_avx512, uint16_t, float, nm_bf16_to_f32)
NM_DEFINE_CODEC_LOOP(encode_bf16_avx512, float, uint16_t, nm_f32_to_bf16)

/* ---- limit probes --------------------------------------------------------------------- */

/* 12 independent 16-lane chains: enough to cover the FMA latency on two FMA ports. */
static float probe_fma_avx512(int64_t iters) {
    __m512 a0 = _mm512_set1_ps(0.0f), a1 = _mm512_set1_ps(1.0f), a2 = _mm512_set1_ps(2.0f);
    __m512 a3 = _mm512_set1_ps(3.0f), a4 = _mm512_set1_ps(4.0f), a5 = _mm512_set1_ps(5.0f);
    __m512 a6 = _mm512_set1_ps(6.0f), a7 = _mm512_set1_ps(7.0f), a8 = _mm512_set1_ps(8.0f);
    __m512 a9 = _mm512_set1_ps(9.0f), a10 = _mm512_set1_ps(10.0f), a11 = _mm512_set1_ps(11.0f);
    const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
    for (int64_t i = 0; i < iters; ++i) {
        a0 = _mm512_fmadd_ps(a0, x, y), a1 = _mm512_fmadd_ps(a1, x, y);
        a2 = _mm512_fmadd_ps(a2, x, y), a3 = _mm512_fmadd_ps(a3, x, y);
        a4 = _mm512_fmadd_ps(a4, x, y), a5 = _mm512_fmadd_ps(a5, x, y);
        a6 = _mm512_fmadd_ps(a6, x, y), a7 = _mm512_fmadd_ps(a7, x, y);
        a8 = _mm512_fmadd_ps(a8, x, y), a9 = _mm512_fmadd_ps(a9, x, y);
        a10 = _mm512_fmadd_ps(a10, x, y), a11 = _mm512_fmadd_ps(a11, x, y);
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    return _mm512_reduce_add_ps(s);
}

static float probe_read_avx512(const float *buf, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t i = 0; i < n; i += 64) {
        s0 = _mm512_add_ps(s0, _mm512_load_ps(buf + i));
        s1 = _mm512_add_ps(s1, _mm512_load_ps(buf + i + 16));
        s2 = _mm512_add_ps(s2, _mm512_load_ps(buf + i + 32));
        s3 = _mm512_add_ps(s3, _mm512_load_ps(buf + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

/* ---- SiLU and exp: ops/exact_math.h's operations, 8 doubles a vector -------- */

typedef double v8d_avx512 __attribute__((vector_size(64)));
typedef int64_t v8i_avx512 __attribute__((vector_size(64)));
typedef uint64_t v8u_avx512 __attribute__((vector_size(64)));
NM_DEFINE_VECTOR_EXP(exp_v8d_avx512, v8d_avx512, v8i_avx512, v8u_avx512)
NM_DEFINE_SILU_ARRAY(silu_avx512, v8d_avx512, 8, exp_v8d_avx512)
NM_DEFINE_EXPF_ARRAY(expf_avx512, v8d_avx512, 8, exp_v8d_avx512)

/* ---- a factored grid's blocks multiplied out (the frame's, for the K types) --------- */

/* 16 codes a step, the walks' products (FACTORED16) */
NM_DEFINE_WIDEN_FACTORED_SIMD(widen_factored_avx512, 16, FACTORED16)

NM_ROW_FILL void nm_fill_row_avx512(nm_isa_kernels *row) {
    nm_fill_row_scalar(row); /* every slot starts full of portable C */
    row->isa = "avx512";
    row->silu = silu_avx512;
    row->silu_name = "silu_avx512";
    row->expf = expf_avx512;
    row->expf_name = "expf_avx512";
    row->widen_factored = widen_factored_avx512;
    row->widen_factored_name = "widen_factored_avx512";
    row->mr = MR;
    row->nr = NR;
    row->pack_width = PACK_WIDTH;
    row->kc = 128; /* a 16 KiB sliver and a 4 KiB A micro-panel stay in a 32 KiB L1 */
    /* slivers outside for two tiles' rows of every block format: on a Zen 4, against the k
     * blocks outside, Q8_0, Q6_K and Q5_0 at m = 9 to 16 ran 1.03-1.17x, Q4_0, Q4_1 and Q4_K
     * at m = 7 to 16 mostly 1.03-1.20x (docs/results/byte-sliver-outer-zen4-2026-12-06.txt) */
    row->byte_outer_rows = 2 * MR, row->nibble_outer_rows = 2 * MR;
    row->packed_gemv_ahead = nm_x86_is_intel() ? PACKED_GEMV_AHEAD_INTEL : 0;
    atomic_store_explicit(&packed_gemv_ahead_avx512, row->packed_gemv_ahead,
                          memory_order_relaxed);
    atomic_store_explicit(&byte_group_ahead_l2_avx512, nm_x86_is_intel(), memory_order_relaxed);
    row->nibble_decode = nm_x86_is_intel() ? NM_NIBBLE_DECODE_PERMUTE : NM_NIBBLE_DECODE_IN_PLACE;
    atomic_store_explicit(&nibble_decode_avx512, row->nibble_decode, memory_order_relaxed);
    /* two groups a call at m = 1 on Intel CPUs (gemv_packed_pair): untimed on AMD's */
    row->gemv_streams = nm_x86_is_intel() ? 2 : 1;
    NM_SET_SLOT(row, gemv_packed_pair, NM_FMT_Q8_0, gemv_packed_pair_q8_0_avx512);
    NM_SET_SLOT(row, gemv_packed_pair, NM_FMT_Q4_0, gemv_packed_pair_q4_0_avx512);
    NM_SET_SLOT(row, gemv_packed_pair, NM_FMT_Q5_1, gemv_packed_pair_q5_1_avx512);
    NM_SET_SLOT(row, gemv_packed_pair_half, NM_FMT_Q8_0, gemv_packed_pair_q8_0_half_avx512);
    NM_SET_SLOT(row, gemv_packed_pair_half, NM_FMT_Q4_0, gemv_packed_pair_q4_0_half_avx512);
    NM_SET_SLOT(row, gemv_packed_pair_half, NM_FMT_Q5_1, gemv_packed_pair_q5_1_half_avx512);
    NM_SET_SLOT(row, gemv_packed_factored_pair, NM_FMT_Q8_0,
                gemv_packed_pair_q8_0_factored_avx512);
    NM_SET_MATMUL_SLOTS(row, gemv, avx512);
    NM_SET_MATMUL_SLOTS(row, gemv2, avx512);
    NM_SET_MATMUL_SLOTS(row, gemv_packed, avx512);
    NM_SET_MATMUL_SLOTS(row, gemv2_packed, avx512);
    NM_SET_HALF_SCALE_SLOTS(row, avx512);
    NM_SET_SLOT(row, gemv_packed_factored, NM_FMT_Q4_1, gemv_packed_q4_1_factored_avx512);
    NM_SET_SLOT(row, gemv_packed_factored, NM_FMT_Q8_0, gemv_packed_q8_0_factored_avx512);
    NM_SET_SLOT(row, gemv2_packed_factored, NM_FMT_Q4_1, gemv2_packed_q4_1_factored_avx512);
    NM_SET_SLOT(row, gemv2_packed_factored, NM_FMT_Q8_0, gemv2_packed_q8_0_factored_avx512);
    NM_SET_MATMUL_SLOTS(row, pack, avx512);
    row->ukernel = ukernel_8x32_avx512;
    row->ukernel_name = "ukernel_8x32_avx512";
    NM_SET_MATMUL_SLOTS(row, ukernel_pack, avx512);
    NM_SET_PACKED_CODE_SLOTS(row, avx512);
    NM_SET_ALL_FINITE_SLOTS(row, avx512);
    NM_SET_CODEC_SLOTS(row, avx512);
    row->probe_fma = probe_fma_avx512;
    row->probe_fma_flops = 12 * 16 * 2;
    row->probe_read = probe_read_avx512;
}
