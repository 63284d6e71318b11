/* narrowmm: helpers the x86 SIMD rows (avx2, avx512) share. Included, not linked, so each
 * row's translation unit compiles them with its own flags (both have F16C). */
#ifndef NM_X86_COMMON_H
#define NM_X86_COMMON_H

#include <immintrin.h>
#include <stdint.h>

#include "kernel_common.h"

/* one fp16 weight through F16C: the portable codec's bits in one instruction */
static inline float load1_fp16_f16c(const uint8_t *p) { return _cvtsh_ss(nm_load_u16(p)); }

#define PREFETCH_T0(p) _mm_prefetch((const char *)(p), _MM_HINT_T0)

/* For a fused tile (ITEM-byte weights, NR to a sliver): every line that row segment of the
 * sliver B_AHEAD weights further along the row can touch. One line a step is not enough once
 * a sliver's row is wider than a line (f32: 96 bytes in avx2, 128 in avx512). The window
 * moves one sliver per call, so a single prefetch skipped every third line, and those lines
 * came from DRAM on demand. Taking all of them made f32 at m = 16 23-33% faster, and m = 128
 * 6% (two builds timed in one process: 31 -> 41 GFLOP/s on 1 thread, 56 -> 71 on 2, q_proj
 * 8B); fp16 and bf16 rows fit in one line and are unchanged. */
#define PREFETCH_SLIVER_ROW_AHEAD(src, ITEM)                                                 \
    do {                                                                                     \
        for (int l_ = 0; l_ < (ITEM) * NR; l_ += 64)                                         \
            _mm_prefetch((const char *)(src) + (ITEM) * B_AHEAD + l_, _MM_HINT_T0);          \
    } while (0)

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
