/* narrowmm: helpers the x86 SIMD rows (avx2, avx512) share. Included, not linked, so each
 * row's translation unit compiles them with its own flags (both have F16C). */
#ifndef NM_X86_COMMON_H
#define NM_X86_COMMON_H

#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>

#include "kernel_common.h"

/* one fp16 weight through F16C: the portable codec's bits in one instruction */
static inline float load1_fp16_f16c(const uint8_t *p) { return _cvtsh_ss(nm_load_u16(p)); }

#define PREFETCH_T0(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)

/* Whether CPUID leaf 0 names Intel as the maker ("GenuineIntel" in EBX, EDX, ECX), for the
 * rows' defaults that differ by CPU (their fill functions) */
static inline int nm_x86_is_intel(void) {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return 0;
    return ebx == 0x756E6547u && edx == 0x49656E69u && ecx == 0x6C65746Eu;
}

/* FP8 bytes (the low 8 of q) as binary16 bits for F16C, 8 lanes of 16 bits: converted,
 * they are raw() (nm_kernels.h). e5m2 is the high byte of a binary16. e4m3fn's 7 magnitude
 * bits shifted left by 7 are a binary16 of value / 2^8 (nm_e4m3fn_to_f32), its NaN code
 * becomes the binary16 quiet NaN 0x7E00, and the sign moves to bit 15; for finite codes
 * a sign extension, the shift and a mask do it (kernel_common.h). Integer ops only. */
static inline __m128i fp16_bits_of_e5m2(__m128i q) {
    return _mm_unpacklo_epi8(_mm_setzero_si128(), q);
}

static inline __m128i fp16_bits_of_e4m3fn(__m128i q) {
    const __m128i u = _mm_cvtepu8_epi16(q);
    __m128i mag = _mm_and_si128(_mm_slli_epi16(u, 7), _mm_set1_epi16(0x3F80));
    const __m128i nan = _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x3F80));
    mag = _mm_xor_si128(mag, _mm_and_si128(nan, _mm_set1_epi16(0x3F80 ^ 0x7E00)));
    return _mm_or_si128(mag, _mm_and_si128(_mm_slli_epi16(u, 8), _mm_set1_epi16((short)0x8000)));
}

static inline __m128i fp16_bits_of_e4m3fn_finite(__m128i q) {
    return _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(q), NM_E4M3FN_FP16_SHIFT),
                         _mm_set1_epi16((short)NM_E4M3FN_FP16_MASK));
}

/* For a fused tile (ITEM-byte weights, NR to a sliver): every line that a sliver row's
 * worth of weights `ahead` bytes on can touch (SLIVER_AHEAD_BYTES). One line a step is not
 * enough once a sliver's row is wider than a line (f32: 96 bytes in avx2, 128 in avx512).
 * On row-major weights the window moves one sliver per call, so a single prefetch skipped
 * every third line, and those lines came from DRAM on demand. Taking all of them made f32
 * at m = 16 23-33% faster, and m = 128 6% (two builds timed in one process: 31 -> 41
 * GFLOP/s on 1 thread, 56 -> 71 on 2, q_proj 8B); fp16 and bf16 rows fit in one line. */
#define PREFETCH_SLIVER_ROW_AHEAD(src, ITEM, ahead)                                          \
    do {                                                                                     \
        for (int l_ = 0; l_ < (ITEM) * NR; l_ += 64)                                         \
            _mm_prefetch((const char *)(src) + (ahead) + l_, _MM_HINT_T0);                   \
    } while (0)

/* How far ahead a fused tile prefetches, in bytes, for weights ldb bytes a row: row-major
 * weights, the same row B_AHEAD weights on (the slivers to come); packed weights (a group's
 * rows back to back, ldb = PACKED_LDB), 64 rows down the same stream. 64 rows made
 * packed fp16 at m = 16 1.12-1.18x the row-major speed on q_proj and ffn_down (1.05-1.09x
 * with the row-major distance, which lands 2-3 rows on); ffn_up stays at 0.95-1.00x. The
 * byte formats' groups, whose stored rows hold several slivers, go BYTE_GROUP_AHEAD_ROWS
 * rows down (the including row's). */
#define SLIVER_AHEAD_BYTES(ldb, ITEM)                                                        \
    ((ldb) == PACKED_LDB(ITEM) ? ((ITEM) == 1 ? BYTE_GROUP_AHEAD_ROWS : 64) * (ldb)          \
                               : (ITEM) * B_AHEAD)
/* The bytes between stored rows of packed weights of ITEM-byte elements (kernel_common.h) */
#define PACKED_LDB(ITEM) NM_PACKED_LDB(ITEM, NR)

/* The next tile's C rows (MR rows of NR floats of the including row), asked for now: they
 * come from L3 or DRAM when m x n is large. A macro, not a function: GCC 12 takes a static
 * function that only prefetches for one without effects and deletes its calls. */
#define PREFETCH_C_TILE(c_next, ldc)                                                         \
    do {                                                                                     \
        if (c_next)                                                                          \
            for (int i_ = 0; i_ < MR; ++i_) {                                                \
                const char *r_ = (const char *)((c_next) + i_ * (ldc));                      \
                _mm_prefetch(r_, _MM_HINT_T0);                                               \
                _mm_prefetch(r_ + 64, _MM_HINT_T0);                                          \
                _mm_prefetch(r_ + NR * sizeof(float) - 1, _MM_HINT_T0);                      \
            }                                                                                \
    } while (0)

#endif
