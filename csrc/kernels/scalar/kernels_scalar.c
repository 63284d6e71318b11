/* narrowmm: portable C kernels, the row every other row starts from.
 *
 * fmaf is exact (a single rounding) whether or not the CPU has FMA: the C library falls
 * back to a correct software version, so this row keeps the contract everywhere. */
#include <math.h>
#include <string.h>

#include "../kernel_common.h"
#include "../nm_kernels.h"
#include "../../ops/exact_math.h" /* SiLU, exp: one body, as wide as the row's vectors */

/* One definition of each gemv: straight i-p-j, B streamed row by row exactly once. */
#define NM_DEFINE_GEMV(NAME, LOAD)                                                         \
    static void NAME(int64_t k, int64_t n, const float *a, const uint8_t *b, int64_t ldb,  \
                     float *c, const float *s, const float *o) {                           \
        (void)s, (void)o;                                                                  \
        for (int64_t p = 0; p < k; ++p) {                                                  \
            const float ap = a[p];                                                         \
            const uint8_t *row = b + p * ldb;                                              \
            for (int64_t j = 0; j < n; ++j) c[j] = fmaf(ap, LOAD, c[j]);                  \
        }                                                                                  \
    }

NM_DEFINE_GEMV(gemv_f32_scalar, nm_load1_f32(row + 4 * j))
NM_DEFINE_GEMV(gemv_fp16_scalar, nm_load1_fp16(row + 2 * j))
NM_DEFINE_GEMV(gemv_bf16_scalar, nm_load1_bf16(row + 2 * j))
/* scaled: fl32(raw(q) * s[j]), then the fma (nm_kernels.h) */
NM_DEFINE_GEMV(gemv_e4m3fn_scalar, nm_load1_e4m3fn_raw(row + j) * s[j])
NM_DEFINE_GEMV(gemv_e5m2_scalar, nm_load1_e5m2_raw(row + j) * s[j])
NM_DEFINE_GEMV(gemv_q8_0_scalar, nm_load1_q8_0_raw(row + j) * s[j])

#define STORE1(p, v) (*(p) = (v))
#define LOAD1C(p) (*(p))
#define SET1(x) (x)
#define FMAF_ACC(acc, x, y) fmaf(x, y, acc)
#define SCALAR_NR 8
/* packed weights of the byte formats: groups of two slivers side by side (nm_pack_width;
 * the SIMD rows take four: two here, so the tests meet another width) */
#define PACK_WIDTH (2 * SCALAR_NR)
#define PACKED_GEMV_AHEAD 0 /* the portable row: no hints in its packed walks */
#define NO_PREFETCH(p) ((void)(p))

/* Two rows at once, from the SIMD rows' template with one-float "vectors": the same chains. */
NM_DEFINE_GEMV2_SIMD(gemv2_f32_scalar, 4, float, 1, SET1, LOAD1C, STORE1, nm_load1_f32, FMAF_ACC,
                     NO_PREFETCH, nm_load1_f32, NM_UNSCALED, NM_UNSCALED)
NM_DEFINE_GEMV2_SIMD(gemv2_fp16_scalar, 2, float, 1, SET1, LOAD1C, STORE1, nm_load1_fp16,
                     FMAF_ACC, NO_PREFETCH, nm_load1_fp16, NM_UNSCALED, NM_UNSCALED)
NM_DEFINE_GEMV2_SIMD(gemv2_bf16_scalar, 2, float, 1, SET1, LOAD1C, STORE1, nm_load1_bf16,
                     FMAF_ACC, NO_PREFETCH, nm_load1_bf16, NM_UNSCALED, NM_UNSCALED)
NM_DEFINE_GEMV2_SIMD(gemv2_e4m3fn_scalar, 1, float, 1, SET1, LOAD1C, STORE1,
                     nm_load1_e4m3fn_raw, FMAF_ACC, NO_PREFETCH, nm_load1_e4m3fn_raw, NM_SCALE1,
                     NM_SCALE1)
NM_DEFINE_GEMV2_SIMD(gemv2_e5m2_scalar, 1, float, 1, SET1, LOAD1C, STORE1, nm_load1_e5m2_raw,
                     FMAF_ACC, NO_PREFETCH, nm_load1_e5m2_raw, NM_SCALE1, NM_SCALE1)
NM_DEFINE_GEMV2_SIMD(gemv2_q8_0_scalar, 1, float, 1, SET1, LOAD1C, STORE1, nm_load1_q8_0_raw,
                     FMAF_ACC, NO_PREFETCH, nm_load1_q8_0_raw, NM_SCALE1, NM_SCALE1)

/* Packed weights, one 8-column sliver at a time: eight chains in locals for all of k, or
 * sixteen for two rows. */
/* slivers the packed gemvs walk at a time (NM_DEFINE_PACKED_GEMVS): 16-bit and f32 weights
 * at m = 1 and m = 2, then the FP8 formats at m = 1 and m = 2 */
#define PACKED_SLIVERS_M1 1
#define PACKED_SLIVERS_M2 1
#define PACKED_SLIVERS_FP8_M1 1
#define PACKED_SLIVERS_FP8_M2 1
NM_DEFINE_PACKED_GEMVS(scalar, float, 1, SCALAR_NR,
                       PACKED_SLIVERS_M1, PACKED_SLIVERS_M2, PACKED_SLIVERS_FP8_M1,
                       PACKED_SLIVERS_FP8_M2, SET1, LOAD1C, STORE1,
                       nm_load1_f32, nm_load1_fp16, nm_load1_bf16, nm_load1_e4m3fn_raw,
                       nm_load1_e5m2_raw, nm_load1_e4m3fn_raw, nm_load1_e5m2_raw,
                       nm_load1_q8_0_raw, FMAF_ACC, NM_SCALE1, NM_SCALE1_HALF,
                       NM_GEMV_PACKED_SLIVERS_)

NM_DEFINE_PACK(pack_f32_scalar, 4, 1, nm_load1_f32, STORE1, nm_load1_f32, NM_UNSCALED,
               NM_UNSCALED)
NM_DEFINE_PACK(pack_fp16_scalar, 2, 1, nm_load1_fp16, STORE1, nm_load1_fp16, NM_UNSCALED,
               NM_UNSCALED)
NM_DEFINE_PACK(pack_bf16_scalar, 2, 1, nm_load1_bf16, STORE1, nm_load1_bf16, NM_UNSCALED,
               NM_UNSCALED)
NM_DEFINE_PACK(pack_e4m3fn_scalar, 1, 1, nm_load1_e4m3fn_raw, STORE1, nm_load1_e4m3fn_raw,
               NM_SCALE1, NM_SCALE1)
NM_DEFINE_PACK(pack_e5m2_scalar, 1, 1, nm_load1_e5m2_raw, STORE1, nm_load1_e5m2_raw,
               NM_SCALE1, NM_SCALE1)
NM_DEFINE_PACK(pack_q8_0_scalar, 1, 1, nm_load1_q8_0_raw, STORE1, nm_load1_q8_0_raw,
               NM_SCALE1, NM_SCALE1)

#define SCALAR_MR 4

/* i-p-j over one tile: each C element still sees p ascending. Portable C has no prefetch,
 * so the c_next hint is unused. */
static void ukernel_4x8_scalar(int64_t kc, int64_t mr, int64_t nr, const float *ap,
                               const float *bp, float *c, int64_t ldc, const float *c_next) {
    (void)c_next;
    for (int64_t i = 0; i < mr; ++i) {
        float acc[SCALAR_NR];
        for (int64_t j = 0; j < nr; ++j) acc[j] = c[i * ldc + j];
        for (int64_t p = 0; p < kc; ++p) {
            const float a = ap[p * SCALAR_MR + i];
            const float *bj = bp + p * SCALAR_NR;
            for (int64_t j = 0; j < nr; ++j) acc[j] = fmaf(a, bj[j], acc[j]);
        }
        for (int64_t j = 0; j < nr; ++j) c[i * ldc + j] = acc[j];
    }
}

NM_DEFINE_UKERNEL_PACK_BY_PARTS(ukernel_pack_f32_scalar, pack_f32_scalar, ukernel_4x8_scalar,
                                SCALAR_NR, 1)
NM_DEFINE_UKERNEL_PACK_BY_PARTS(ukernel_pack_fp16_scalar, pack_fp16_scalar, ukernel_4x8_scalar,
                                SCALAR_NR, 1)
NM_DEFINE_UKERNEL_PACK_BY_PARTS(ukernel_pack_bf16_scalar, pack_bf16_scalar, ukernel_4x8_scalar,
                                SCALAR_NR, 1)
NM_DEFINE_UKERNEL_PACK_BY_PARTS(ukernel_pack_e4m3fn_scalar, pack_e4m3fn_scalar,
                                ukernel_4x8_scalar, SCALAR_NR, 1)
NM_DEFINE_UKERNEL_PACK_BY_PARTS(ukernel_pack_e5m2_scalar, pack_e5m2_scalar, ukernel_4x8_scalar,
                                SCALAR_NR, 1)
NM_DEFINE_UKERNEL_PACK_BY_PARTS(ukernel_pack_q8_0_scalar, pack_q8_0_scalar, ukernel_4x8_scalar,
                                SCALAR_NR, 1)

/* Q5_1 (fma(q, scale, offset)): every slot from the shared templates (kernel_common.h) on
 * one-float "vectors", the same chains */
NM_DEFINE_Q5_1_FORMAT(scalar, float, 1, SCALAR_NR, 1, 1, SET1, LOAD1C, STORE1,
                      nm_load1_q5_1_raw, FMAF_ACC, NO_PREFETCH, NM_OFFSET1, NM_OFFSET1_HALF,
                      NM_GEMV_PACKED_SLIVERS_)
NM_DEFINE_UKERNEL_PACK_BY_PARTS(ukernel_pack_q5_1_scalar, pack_q5_1_scalar, ukernel_4x8_scalar,
                                SCALAR_NR, 1)

NM_DEFINE_CODEC_LOOP(decode_fp16_scalar, uint16_t, float, nm_fp16_to_f32)
NM_DEFINE_CODEC_LOOP(decode_bf16_scalar, uint16_t, float, nm_bf16_to_f32)
NM_DEFINE_CODEC_LOOP(encode_fp16_scalar, float, uint16_t, nm_f32_to_fp16)
NM_DEFINE_CODEC_LOOP(encode_bf16_scalar, float, uint16_t, nm_f32_to_bf16)
/* the 8-bit codecs serve every row (they are not on the matmul path) */
NM_DEFINE_CODEC_LOOP(decode_e4m3fn_scalar, uint8_t, float, nm_e4m3fn_to_f32)
NM_DEFINE_CODEC_LOOP(decode_e5m2_scalar, uint8_t, float, nm_e5m2_to_f32)
NM_DEFINE_ENCODE8_LOOP(encode_e4m3fn_scalar, nm_f32_to_e4m3fn)
NM_DEFINE_ENCODE8_LOOP(encode_e5m2_scalar, nm_f32_to_e5m2)
NM_DEFINE_CODEC_LOOP(decode_q8_0_scalar, uint8_t, float, nm_q8_0_to_f32)
NM_DEFINE_ENCODE8_LOOP(encode_q8_0_scalar, nm_f32_to_q8_0)
NM_DEFINE_CODEC_LOOP(decode_q5_1_scalar, uint8_t, float, nm_q5_1_to_f32)
NM_DEFINE_ENCODE8_LOOP(encode_q5_1_scalar, nm_f32_to_q5_1)

/* The 4-bit formats (kernel_common.h): one column at a time. */
#define NIBBLES1(p, lo, hi) ((lo) = NM_NIBBLE_LO(*(p)), (hi) = NM_NIBBLE_HI(*(p)))
/* Q4_0's packed codes: the byte XOR-ed back, then as above */
#define NIBBLES1_Q4_0P(p, lo, hi)                                                            \
    ((lo) = NM_NIBBLE_LO(*(p) ^ 0x88u), (hi) = NM_NIBBLE_HI(*(p) ^ 0x88u))
NM_DEFINE_NIBBLE_FORMATS(scalar, float, 1, SCALAR_NR, 1, 1, SET1, LOAD1C, STORE1, FMAF_ACC,
                         NIBBLES1, NM_DEQ1_Q4_0, NIBBLES1_Q4_0P, NM_DEQ1_Q4_0, NM_DEQ1H_Q4_0,
                         NIBBLES1, NM_DEQ1_Q4_1, NM_DEQ1H_Q4_1, NM_NIBBLE_SLIVERS_)
NM_DEFINE_NIBBLE_UKERNEL_PACKS_BY_PARTS(scalar, ukernel_4x8_scalar, SCALAR_NR)

/* their codecs: n bytes, 2n values, the low nibble first */
#define NM_DEFINE_NIBBLE_CODECS(FMT)                                                         \
    static void decode_##FMT##_scalar(const uint8_t *src, float *dst, int64_t n) {           \
        for (int64_t i = 0; i < n; ++i)                                                      \
            dst[2 * i] = nm_##FMT##_to_f32(src[i]), dst[2 * i + 1] = nm_##FMT##_to_f32(src[i] >> 4); \
    }                                                                                        \
    static void encode_##FMT##_scalar(const float *src, uint8_t *dst, int64_t n, int saturate) { \
        (void)saturate; /* codes always clamp: the API checks the range */                   \
        for (int64_t i = 0; i < n; ++i)                                                      \
            dst[i] = (uint8_t)(nm_f32_to_##FMT(src[2 * i]) | nm_f32_to_##FMT(src[2 * i + 1]) << 4); \
    }
NM_DEFINE_NIBBLE_CODECS(q4_0)
NM_DEFINE_NIBBLE_CODECS(q4_1)

/* 8 independent scalar chains; the multiplier keeps values bounded and exact-free. */
static float probe_fma_scalar(int64_t iters) {
    float acc[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    const float x = 0.999999f, y = 1e-7f;
    for (int64_t i = 0; i < iters; ++i)
        for (int j = 0; j < 8; ++j) acc[j] = fmaf(acc[j], x, y);
    float s = 0;
    for (int j = 0; j < 8; ++j) s += acc[j];
    return s;
}

static float probe_read_scalar(const float *buf, int64_t n) {
    float acc[8] = {0};
    for (int64_t i = 0; i < n; i += 8)
        for (int j = 0; j < 8; ++j) acc[j] += buf[i + j];
    float s = 0;
    for (int j = 0; j < 8; ++j) s += acc[j];
    return s;
}

/* SiLU and exp: ops/exact_math.h's two-lane versions (GNU C vectors; plain C elsewhere) */
static void silu_scalar(int64_t n, const float *x, float *y) { nm_silu_array(n, x, y); }
static void expf_scalar(int64_t n, const float *x, float *y) { nm_expf_array(n, x, y); }
NM_DEFINE_WIDEN_FACTORED(widen_factored_scalar)

NM_ROW_FILL void nm_fill_row_scalar(nm_isa_kernels *row) {
    memset(row, 0, sizeof *row);
    row->isa = "scalar";
    row->mr = SCALAR_MR;
    row->nr = SCALAR_NR;
    row->pack_width = PACK_WIDTH;
    row->kc = 256;
    row->byte_outer_rows = SCALAR_MR, row->nibble_outer_rows = 0;
    row->packed_gemv_ahead = -1; /* no hint compiled here, nor on the neon row */
    row->nibble_decode = -1;     /* one decode here, as on every row but avx512 */
    row->gemv_streams = -1;      /* no pair walks here, as on every row but avx512 */
    NM_SET_MATMUL_SLOTS(row, gemv, scalar);
    NM_SET_MATMUL_SLOTS(row, gemv2, scalar);
    NM_SET_MATMUL_SLOTS(row, gemv_packed, scalar); /* every row sets its own: the layout is NR */
    NM_SET_MATMUL_SLOTS(row, gemv2_packed, scalar);
    NM_SET_HALF_SCALE_SLOTS(row, scalar);
    NM_SET_MATMUL_SLOTS(row, pack, scalar);
    row->ukernel = ukernel_4x8_scalar;
    row->ukernel_name = "ukernel_4x8_scalar";
    row->silu = silu_scalar;
    row->silu_name = "silu_scalar";
    row->expf = expf_scalar;
    row->expf_name = "expf_scalar";
    row->widen_factored = widen_factored_scalar;
    row->widen_factored_name = "widen_factored_scalar";
    NM_SET_MATMUL_SLOTS(row, ukernel_pack, scalar);
    NM_SET_PACKED_CODE_SLOTS(row, scalar);
    /* no faster decode for finite FP8 weights in portable C: the exact kernels serve them */
    NM_SET_FINITE_SLOTS(row, gemv_packed, scalar);
    NM_SET_FINITE_SLOTS(row, gemv2_packed, scalar);
    for (int f = NM_FMT_E4M3FN; f <= NM_FMT_E5M2; ++f) {
        const int v = f == NM_FMT_E4M3FN ? NM_SLOT_E4M3FN_FINITE : NM_SLOT_E5M2_FINITE;
        row->gemv[v] = row->gemv[f], row->gemv_name[v] = row->gemv_name[f];
        row->gemv2[v] = row->gemv2[f], row->gemv2_name[v] = row->gemv2_name[f];
        row->pack[v] = row->pack[f], row->pack_name[v] = row->pack_name[f];
        row->ukernel_pack[v] = row->ukernel_pack[f];
        row->ukernel_pack_name[v] = row->ukernel_pack_name[f];
    }
    NM_SET_CODEC_SLOTS(row, scalar);
    NM_SET_SLOT(row, decode8, NM_FMT_E4M3FN, decode_e4m3fn_scalar);
    NM_SET_SLOT(row, decode8, NM_FMT_E5M2, decode_e5m2_scalar);
    NM_SET_SLOT(row, encode8, NM_FMT_E4M3FN, encode_e4m3fn_scalar);
    NM_SET_SLOT(row, encode8, NM_FMT_E5M2, encode_e5m2_scalar);
    NM_SET_SLOT(row, decode8, NM_FMT_Q8_0, decode_q8_0_scalar);
    NM_SET_SLOT(row, encode8, NM_FMT_Q8_0, encode_q8_0_scalar);
    NM_SET_SLOT(row, decode8, NM_FMT_Q4_0, decode_q4_0_scalar);
    NM_SET_SLOT(row, encode8, NM_FMT_Q4_0, encode_q4_0_scalar);
    NM_SET_SLOT(row, decode8, NM_FMT_Q4_1, decode_q4_1_scalar);
    NM_SET_SLOT(row, encode8, NM_FMT_Q4_1, encode_q4_1_scalar);
    NM_SET_SLOT(row, decode8, NM_FMT_Q5_1, decode_q5_1_scalar);
    NM_SET_SLOT(row, encode8, NM_FMT_Q5_1, encode_q5_1_scalar);
    row->probe_fma = probe_fma_scalar;
    row->probe_fma_flops = 8 * 2;
    row->probe_read = probe_read_scalar;
}
