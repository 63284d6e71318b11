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

/* One row of a partial sliver: the w < nr decoded columns at src, zero-padded to nr. */
#define NM_PACK_PARTIAL_ROW(out, src, ITEM, w, nr, LOAD1)                                    \
    do {                                                                                     \
        for (int64_t j_ = 0; j_ < (w); ++j_) (out)[j_] = LOAD1((src) + (ITEM) * j_);         \
        for (int64_t j_ = (w); j_ < (nr); ++j_) (out)[j_] = 0.0f;                            \
    } while (0)

/* The columns j..n-1 a vector gemv step leaves over: rows b0..b3 (weights a[p..p+3]), one
 * fmaf per row, in order. */
#define NM_GEMV_TAIL4(ITEM, LOAD1, a, p, b0, b1, b2, b3, c, j, n)                            \
    for (; (j) < (n); ++(j)) {                                                               \
        const int64_t o_ = (ITEM) * (j);                                                     \
        float c_ = (c)[j];                                                                   \
        c_ = fmaf((a)[p], LOAD1((b0) + o_), c_);                                             \
        c_ = fmaf((a)[(p) + 1], LOAD1((b1) + o_), c_);                                       \
        c_ = fmaf((a)[(p) + 2], LOAD1((b2) + o_), c_);                                       \
        c_ = fmaf((a)[(p) + 3], LOAD1((b3) + o_), c_);                                       \
        (c)[j] = c_;                                                                         \
    }

/* An edge tile (mr < MR or nr < NR, the including row's tile) runs on a full-size scratch
 * copy of its C, so only mr x nr of C is touched; packed A's rows past mr are zero and their
 * results are dropped. CALL computes on `scratch` (leading dimension NR). */
#define WITH_SCRATCH_TILE(mr, nr, c, ldc, CALL)                                              \
    do {                                                                                     \
        _Alignas(64) float scratch[MR * NR] = {0};                                           \
        for (int64_t i_ = 0; i_ < (mr); ++i_)                                                \
            memcpy(scratch + i_ * NR, (c) + i_ * (ldc), (size_t)(nr) * sizeof(float));      \
        CALL;                                                                                \
        for (int64_t i_ = 0; i_ < (mr); ++i_)                                                \
            memcpy((c) + i_ * (ldc), scratch + i_ * NR, (size_t)(nr) * sizeof(float));      \
    } while (0)

/* A ukernel_pack made of the row's own parts, for rows without a fused one: pack the whole
 * sliver, then run the microkernel on it. Same bits; the decode just is not overlapped. */
#define NM_DEFINE_UKERNEL_PACK_BY_PARTS(NAME, PACK, UKERNEL, NR)                             \
    static void NAME(int64_t kc, int64_t mr, const float *ap, const uint8_t *b, int64_t ldb, \
                     float *bp, float *c, int64_t ldc, const float *c_next) {                \
        PACK(kc, (NR), b, ldb, (NR), bp);                                                    \
        UKERNEL(kc, mr, (NR), ap, bp, c, ldc, c_next);                                       \
    }

/* An array codec named NAME applying the scalar codec FN element by element. */
#define NM_DEFINE_CODEC_LOOP(NAME, IN, OUT, FN)                                              \
    static void NAME(const IN *src, OUT *dst, int64_t n) {                                   \
        for (int64_t i = 0; i < n; ++i) dst[i] = FN(src[i]);                                 \
    }

#endif
