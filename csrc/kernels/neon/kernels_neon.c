/* narrowmm: the neon row (AArch64 Advanced SIMD). Advanced SIMD, fused multiply-add and
 * the half-precision conversions used here (FCVTL / FCVTN) are all base ARMv8-A, so this
 * file needs no extra -march flags.
 *
 * Same contract as the scalar row: one fma per p, p ascending, per C element; vector lanes
 * are distinct output columns. Tails use fmaf, a single FMADD instruction here. */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "../kernel_common.h"
#include "../nm_kernels.h"

#define MR 8
#define NR 8
/* packed weights of the byte formats: groups of four slivers side by side, so the m <= 2
 * walks read one stream of weights for four slivers (nm_pack_width; docs/kernels.md,
 * "Groups of slivers") */
#define PACK_WIDTH (4 * NR)
/* no software prefetch in the packed m <= 2 walks (NM_PACKED_GEMV_PREFETCH): untimed here */
#define PACKED_GEMV_AHEAD 0

/* ---- loading 4 weights as float32 (B may sit at any byte address) ------------------- */

static inline float32x4_t load4_f32(const uint8_t *p) { return vreinterpretq_f32_u8(vld1q_u8(p)); }

static inline float32x4_t load4_fp16(const uint8_t *p) {
    /* FCVTL: exact; a signalling NaN comes back quiet with its payload, like vcvtph2ps */
    return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(p)));
}

static inline float32x4_t load4_bf16(const uint8_t *p) {
    uint16x4_t h = vreinterpret_u16_u8(vld1_u8(p));
    return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
}

/* raw() of 4 FP8 weights (nm_kernels.h), 4 bytes read (exactly: B may end there): as
 * binary16 bits, then FCVTL, as the x86 rows do (x86_common.h): e5m2 is a binary16's high
 * byte; e4m3fn's magnitude << 7 is a binary16 of value / 2^8, its NaN code becomes 0x7E00,
 * and the sign moves to bit 15. Finite e4m3fn codes: sign-extend, shift and mask
 * (kernel_common.h); e5m2 needs no patch for any code. Exact either way. */
static inline uint16x4_t load4_u8_as_u16(const uint8_t *p) {
    uint32_t w;
    memcpy(&w, p, sizeof w);
    return vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(w))));
}

static inline float32x4_t load4_e5m2(const uint8_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vshl_n_u16(load4_u8_as_u16(p), 8)));
}

static inline float32x4_t load4_e4m3fn(const uint8_t *p) {
    const uint16x4_t u = load4_u8_as_u16(p);
    uint16x4_t mag = vand_u16(vshl_n_u16(u, 7), vdup_n_u16(0x3F80));
    const uint16x4_t nan = vceq_u16(mag, vdup_n_u16(0x3F80));
    mag = veor_u16(mag, vand_u16(nan, vdup_n_u16(0x3F80 ^ 0x7E00)));
    const uint16x4_t h = vorr_u16(mag, vand_u16(vshl_n_u16(u, 8), vdup_n_u16(0x8000)));
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

static inline int16x4_t load4_s8_as_s16(const uint8_t *p) {
    uint32_t w;
    memcpy(&w, p, sizeof w);
    return vget_low_s16(vmovl_s8(vreinterpret_s8_u32(vdup_n_u32(w))));
}

static inline float32x4_t load4_e4m3fn_finite(const uint8_t *p) {
    const uint16x4_t x =
        vreinterpret_u16_s16(vshl_n_s16(load4_s8_as_s16(p), NM_E4M3FN_FP16_SHIFT));
    return vcvt_f32_f16(vreinterpret_f16_u16(vand_u16(x, vdup_n_u16(NM_E4M3FN_FP16_MASK))));
}

#define load4_e5m2_finite load4_e5m2

/* raw() of 4 Q8_0 weights: their int8 codes, widened and converted (exact; 4 bytes read) */
static inline float32x4_t load4_q8_0(const uint8_t *p) {
    return vcvtq_f32_s32(vmovl_s16(load4_s8_as_s16(p)));
}

/* raw() of 4 Q5_1 weights: their codes, bytes widened and converted (exact; 4 bytes read) */
static inline float32x4_t load4_q5_1(const uint8_t *p) {
    return vcvtq_f32_u32(vmovl_u16(load4_u8_as_u16(p)));
}

#define SCALE4(w, sp, op) vmulq_f32(w, vld1q_f32(sp))
/* the same on binary16 scales (nm_scales.s16), widened exactly */
#define HALF4(sp) vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(sp)))
#define SCALE4_HALF(w, sp, op) vmulq_f32(w, HALF4(sp))
/* scales and offsets (Q5_1): fma(q, scale, offset), one rounding (vfmaq_f32(acc, x, y) is
 * acc + x * y) */
#define OFFSET4(w, sp, op) vfmaq_f32(vld1q_f32(op), w, vld1q_f32(sp))
#define OFFSET4_HALF(w, sp, op) vfmaq_f32(HALF4(op), w, HALF4(sp))

/* ---- m == 1: stream B four rows at a time, 16 columns per step ----------------------- */

/* No software prefetch: unmeasured on Arm hardware, the hardware prefetchers are trusted. */
#define NO_PREFETCH(p) ((void)(p))

/* m == 2 (gemv2): the avx2 row's walk (unmeasured on Arm) */
NM_DEFINE_ROW_MAJOR_GEMVS(neon, float32x4_t, 4, vdupq_n_f32, vld1q_f32, vst1q_f32, load4_f32,
                          load4_fp16, load4_bf16, load4_e4m3fn, load4_e5m2, load4_e4m3fn_finite,
                          load4_e5m2_finite, load4_q8_0, vfmaq_f32, NO_PREFETCH, nm_load1_fp16,
                          SCALE4)

/* packed weights: four 8-column slivers at a time, for one row and for two (16 of the 32
 * registers); unmeasured on Arm, the avx2 walk */
/* slivers the packed gemvs walk at a time (NM_DEFINE_PACKED_GEMVS): 16-bit and f32 weights
 * at m = 1 and m = 2, then the FP8 formats at m = 1 and m = 2 */
#define PACKED_SLIVERS_M1 4
#define PACKED_SLIVERS_M2 4
#define PACKED_SLIVERS_FP8_M1 4
#define PACKED_SLIVERS_FP8_M2 4
NM_DEFINE_PACKED_GEMVS(neon, float32x4_t, 4, NR,
                       PACKED_SLIVERS_M1, PACKED_SLIVERS_M2, PACKED_SLIVERS_FP8_M1,
                       PACKED_SLIVERS_FP8_M2, vdupq_n_f32, vld1q_f32, vst1q_f32,
                       load4_f32, load4_fp16, load4_bf16, load4_e4m3fn, load4_e5m2,
                       load4_e4m3fn_finite, load4_e5m2_finite, load4_q8_0, vfmaq_f32, SCALE4,
                       SCALE4_HALF, NM_GEMV_PACKED_SLIVERS_)
NM_DEFINE_Q5_1_FORMAT(neon, float32x4_t, 4, NR, PACKED_SLIVERS_FP8_M1, PACKED_SLIVERS_FP8_M2,
                      vdupq_n_f32, vld1q_f32, vst1q_f32, load4_q5_1, vfmaq_f32, NO_PREFETCH,
                      OFFSET4, OFFSET4_HALF, NM_GEMV_PACKED_SLIVERS_)

/* ---- packing a narrow sliver (the last of a column range) --------------------------- */

NM_DEFINE_PACK(pack_f32_neon, 4, 4, load4_f32, vst1q_f32, nm_load1_f32, NM_UNSCALED,
               NM_UNSCALED)
NM_DEFINE_PACK(pack_fp16_neon, 2, 4, load4_fp16, vst1q_f32, nm_load1_fp16, NM_UNSCALED,
               NM_UNSCALED)
NM_DEFINE_PACK(pack_bf16_neon, 2, 4, load4_bf16, vst1q_f32, nm_load1_bf16, NM_UNSCALED,
               NM_UNSCALED)
NM_DEFINE_PACK(pack_e4m3fn_neon, 1, 4, load4_e4m3fn, vst1q_f32, nm_load1_e4m3fn_raw, SCALE4,
               NM_SCALE1)
NM_DEFINE_PACK(pack_e5m2_neon, 1, 4, load4_e5m2, vst1q_f32, nm_load1_e5m2_raw, SCALE4,
               NM_SCALE1)
NM_DEFINE_PACK(pack_e4m3fn_finite_neon, 1, 4, load4_e4m3fn_finite, vst1q_f32,
               nm_load1_e4m3fn_raw, SCALE4, NM_SCALE1)
NM_DEFINE_PACK(pack_e5m2_finite_neon, 1, 4, load4_e5m2_finite, vst1q_f32, nm_load1_e5m2_raw,
               SCALE4, NM_SCALE1)
NM_DEFINE_PACK(pack_q8_0_neon, 1, 4, load4_q8_0, vst1q_f32, nm_load1_q8_0_raw, SCALE4,
               NM_SCALE1)

/* ---- the 8 x 8 microkernel: 16 accumulators of the 32 vector registers ---------------
 * Packed A gives the 8 multipliers of step p as two contiguous vectors; each is applied
 * with a by-lane fma (vfmaq_laneq_f32: a plain fused multiply-add by one lane). */

/* row i of the tile, step p: fma by lane l of the A vector v */
#define LANE_STEP(i, v, l)                                                                   \
    (lo[i] = vfmaq_laneq_f32(lo[i], b0, v, l), hi[i] = vfmaq_laneq_f32(hi[i], b1, v, l))

#define TILE_8X8_BODY(c, ldc, B_STEP)                                                        \
    do {                                                                                     \
        float32x4_t lo[MR], hi[MR];                                                          \
        for (int i = 0; i < MR; ++i) {                                                       \
            lo[i] = vld1q_f32((c) + i * (ldc));                                              \
            hi[i] = vld1q_f32((c) + i * (ldc) + 4);                                          \
        }                                                                                    \
        for (int64_t p = 0; p < kc; ++p) {                                                   \
            float32x4_t b0, b1;                                                              \
            B_STEP;                                                                          \
            const float32x4_t a03 = vld1q_f32(ap + p * MR);                                  \
            const float32x4_t a47 = vld1q_f32(ap + p * MR + 4);                              \
            LANE_STEP(0, a03, 0), LANE_STEP(1, a03, 1), LANE_STEP(2, a03, 2);                \
            LANE_STEP(3, a03, 3), LANE_STEP(4, a47, 0), LANE_STEP(5, a47, 1);                \
            LANE_STEP(6, a47, 2), LANE_STEP(7, a47, 3);                                      \
        }                                                                                    \
        for (int i = 0; i < MR; ++i) {                                                       \
            vst1q_f32((c) + i * (ldc), lo[i]);                                               \
            vst1q_f32((c) + i * (ldc) + 4, hi[i]);                                           \
        }                                                                                    \
    } while (0)

static void tile_8x8(int64_t kc, const float *ap, const float *bp, float *c, int64_t ldc) {
    TILE_8X8_BODY(c, ldc, (b0 = vld1q_f32(bp + p * NR), b1 = vld1q_f32(bp + p * NR + 4)));
}

static void ukernel_8x8_neon(int64_t kc, int64_t mr, int64_t nr, const float *ap,
                             const float *bp, float *c, int64_t ldc, const float *c_next) {
    (void)c_next; /* C comes from L2 on the cores this row has been measured on: none */
    if (mr == MR && nr == NR) {
        tile_8x8(kc, ap, bp, c, ldc);
        return;
    }
    WITH_SCRATCH_TILE(mr, nr, c, ldc, tile_8x8(kc, ap, bp, scratch, NR));
}

/* The first tile of a whole sliver decodes B as it goes (see nm_kernels.h). */
#define NM_DEFINE_UKERNEL_PACK(NAME, TILE, ITEM, LOAD4, SCV)                                 \
    static void TILE(int64_t kc, const float *ap, const uint8_t *b, int64_t ldb, float *bp,  \
                     float *c, int64_t ldc, const float *c_next, const float *s,             \
                     const float *o, int64_t bk, int64_t lds) {                              \
        (void)c_next; /* no software prefetch on this row */                                 \
        NM_TILE_SCALES_INIT_(s, kc, bk, 1);                                                  \
        TILE_8X8_BODY(c, ldc,                                                                \
                      (NM_TILE_SCALES_NEXT_(s, o, bk, lds, 1),                               \
                       b0 = SCV(LOAD4(b + p * ldb), s, o),                                   \
                       b1 = SCV(LOAD4(b + p * ldb + 4 * (ITEM)), s + 4, o + 4),              \
                       vst1q_f32(bp + p * NR, b0), vst1q_f32(bp + p * NR + 4, b1)));         \
    }                                                                                        \
    NM_DEFINE_UKERNEL_PACK_FROM_TILE(NAME, TILE)

NM_DEFINE_UKERNEL_PACK(ukernel_pack_f32_neon, tile_pack_f32, 4, load4_f32, NM_UNSCALED)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_fp16_neon, tile_pack_fp16, 2, load4_fp16, NM_UNSCALED)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_bf16_neon, tile_pack_bf16, 2, load4_bf16, NM_UNSCALED)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_e4m3fn_neon, tile_pack_e4m3fn, 1, load4_e4m3fn, SCALE4)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_e5m2_neon, tile_pack_e5m2, 1, load4_e5m2, SCALE4)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_e4m3fn_finite_neon, tile_pack_e4m3fn_finite, 1,
                       load4_e4m3fn_finite, SCALE4)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_e5m2_finite_neon, tile_pack_e5m2_finite, 1,
                       load4_e5m2_finite, SCALE4)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_q8_0_neon, tile_pack_q8_0, 1, load4_q8_0, SCALE4)
NM_DEFINE_UKERNEL_PACK(ukernel_pack_q5_1_neon, tile_pack_q5_1, 1, load4_q5_1, OFFSET4)

/* ---- the 4-bit formats (kernel_common.h): 4 bytes, 8 codes, two rows (4 bytes read) - */

static inline void nibbles4(const uint8_t *p, float32x4_t *lo, float32x4_t *hi) {
    const uint32x4_t v = vmovl_u16(load4_u8_as_u16(p));
    *lo = vcvtq_f32_u32(vandq_u32(v, vdupq_n_u32(15))); /* exact */
    *hi = vcvtq_f32_u32(vshrq_n_u32(v, 4));
}
#define NIBBLES4(p, lo, hi) nibbles4((p), &(lo), &(hi))
/* Q4_0's packed codes: each byte XOR-ed back to q first */
static inline void nibbles4_q4_0p(const uint8_t *p, float32x4_t *lo, float32x4_t *hi) {
    const uint32x4_t v = veorq_u32(vmovl_u16(load4_u8_as_u16(p)), vdupq_n_u32(0x88));
    *lo = vcvtq_f32_u32(vandq_u32(v, vdupq_n_u32(15)));
    *hi = vcvtq_f32_u32(vshrq_n_u32(v, 4));
}
#define NIBBLES4_Q4_0P(p, lo, hi) nibbles4_q4_0p((p), &(lo), &(hi))
#define DEQ4_Q4_0(q, sp, op) vmulq_f32(vsubq_f32(q, vdupq_n_f32(8.0f)), vld1q_f32(sp))
#define DEQ4_Q4_1(q, sp, op) vfmaq_f32(vld1q_f32(op), q, vld1q_f32(sp))
/* the same on binary16 scales and offsets (nm_scales.s16), widened exactly */
#define LOAD4_HALF(sp) vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(sp)))
#define DEQH4_Q4_0(q, sp, op) vmulq_f32(vsubq_f32(q, vdupq_n_f32(8.0f)), LOAD4_HALF(sp))
#define DEQH4_Q4_1(q, sp, op) vfmaq_f32(LOAD4_HALF(op), q, LOAD4_HALF(sp))
NM_DEFINE_NIBBLE_FORMATS(neon, float32x4_t, 4, NR, 4, 2, vdupq_n_f32, vld1q_f32, vst1q_f32,
                         vfmaq_f32, NIBBLES4, DEQ4_Q4_0, NIBBLES4_Q4_0P, DEQ4_Q4_0,
                         DEQH4_Q4_0, NIBBLES4, DEQ4_Q4_1, DEQH4_Q4_1, NM_NIBBLE_SLIVERS_)
NM_DEFINE_NIBBLE_UKERNEL_PACKS_BY_PARTS(neon, ukernel_8x8_neon, NR)

/* ---- codecs ------------------------------------------------------------------------- */

static void decode_fp16_neon(const uint16_t *src, float *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, load4_fp16((const uint8_t *)(src + i)));
    for (; i < n; ++i) dst[i] = nm_fp16_to_f32(src[i]);
}

static void encode_fp16_neon(const float *src, uint16_t *dst, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) /* FCVTN: nearest even, NaN quieted with top payload bits */
        vst1_u16(dst + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
    for (; i < n; ++i) dst[i] = nm_f32_to_fp16(src[i]);
}

NM_DEFINE_CODEC_LOOP(decode_bf16_neon, uint16_t, float, nm_bf16_to_f32)
NM_DEFINE_CODEC_LOOP(encode_bf16_neon, float, uint16_t, nm_f32_to_bf16)

/* ---- limit probes --------------------------------------------------------------------- */

static float probe_fma_neon(int64_t iters) {
    float32x4_t acc[16];
    for (int j = 0; j < 16; ++j) acc[j] = vdupq_n_f32((float)j);
    const float32x4_t x = vdupq_n_f32(0.999999f), y = vdupq_n_f32(1e-7f);
    for (int64_t i = 0; i < iters; ++i)
        for (int j = 0; j < 16; ++j) acc[j] = vfmaq_f32(y, acc[j], x);
    float32x4_t s = acc[0];
    for (int j = 1; j < 16; ++j) s = vaddq_f32(s, acc[j]);
    return vgetq_lane_f32(s, 0) + vgetq_lane_f32(s, 3);
}

static float probe_read_neon(const float *buf, int64_t n) {
    float32x4_t s0 = vdupq_n_f32(0), s1 = s0, s2 = s0, s3 = s0;
    for (int64_t i = 0; i < n; i += 16) {
        s0 = vaddq_f32(s0, vld1q_f32(buf + i));
        s1 = vaddq_f32(s1, vld1q_f32(buf + i + 4));
        s2 = vaddq_f32(s2, vld1q_f32(buf + i + 8));
        s3 = vaddq_f32(s3, vld1q_f32(buf + i + 12));
    }
    float32x4_t s = vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3));
    return vgetq_lane_f32(s, 0) + vgetq_lane_f32(s, 3);
}

NM_ROW_FILL void nm_fill_row_neon(nm_isa_kernels *row) {
    nm_fill_row_scalar(row); /* every slot starts full of portable C */
    row->isa = "neon";
    row->mr = MR;
    row->nr = NR;
    row->pack_width = PACK_WIDTH;
    row->kc = 256;
    /* as the avx2 row (not timed on an Arm core) */
    row->byte_outer_rows = MR, row->nibble_outer_rows = 0;
    NM_SET_MATMUL_SLOTS(row, gemv, neon);
    NM_SET_MATMUL_SLOTS(row, gemv2, neon);
    NM_SET_MATMUL_SLOTS(row, gemv_packed, neon);
    NM_SET_MATMUL_SLOTS(row, gemv2_packed, neon);
    NM_SET_HALF_SCALE_SLOTS(row, neon);
    NM_SET_MATMUL_SLOTS(row, pack, neon);
    row->ukernel = ukernel_8x8_neon;
    row->ukernel_name = "ukernel_8x8_neon";
    NM_SET_MATMUL_SLOTS(row, ukernel_pack, neon);
    NM_SET_PACKED_CODE_SLOTS(row, neon);
    NM_SET_ALL_FINITE_SLOTS(row, neon);
    NM_SET_CODEC_SLOTS(row, neon);
    row->probe_fma = probe_fma_neon;
    row->probe_fma_flops = 16 * 4 * 2;
    row->probe_read = probe_read_neon;
}
