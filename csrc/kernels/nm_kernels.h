/* narrowmm: the microkernel contract and the kernel table (one row per ISA).
 *
 * Three rooms, as in BLIS:
 *   kernels/<isa>/  microkernels: compute, never decide blocking or threads;
 *   frame/          the loops: zeroing, blocking, packing, splitting work across threads;
 *   dispatch/       which row of this table a CPU uses.
 * docs/kernels.md draws the contract below.
 *
 * Numerical contract shared by every slot: each float32 output element c is updated as
 *     c = fma(a[p], w[p], c)   for p ascending,
 * one fused multiply-add per step, starting from the value c holds on entry. Nothing is
 * summed in another order, so every row of this table gives identical bits. All sizes and
 * strides are 64-bit; strides are leading dimensions of a parent matrix. */
#ifndef NM_KERNELS_H
#define NM_KERNELS_H

#include <stdatomic.h>
#include <stdint.h>
#include "nm_formats.h"

/* Scales. A format with scales (nm_format_info.scaled: FP8, the GGUF formats) multiplies
 * each decoded weight by a float32 scale before it enters the chain, one rounding:
 *     w[p][j] = fl32(decode(B[p][j]) * scale[j])
 * or, for a format with offsets (nm_format_info.offset: Q4_1, Q5_1), adds the column's
 * offset o[j] in the same rounding: w[p][j] = fma(decode(B[p][j]), scale[j], o[j]).
 * Every slot below takes `s`, the scales of the columns it is given (s[j] for column j of the
 * call, j counted like c's), the same for every row p of the call: the frame splits k where
 * a block of scales ends (nm_matmul), except for the packed gemvs, which take the blocks'
 * layout (nm_gemv_packed_fn). Formats without scales get s == NULL and never read
 * it. A kernel must apply the multiplication as written, never fold it into a or c.
 *
 * The kernels' scales are s[j] = scale[j] * 2^r, r = nm_format_info.scale_exponent (exact:
 * the caller keeps them finite), and they multiply raw(B[p][j]) = decode(B[p][j]) * 2^-r
 * (exact too; NaN and Inf stay as they are). raw() is what the hardware's binary16
 * conversion (F16C, FCVTL) gives for the code's bits moved into a binary16 (e5m2: the top
 * byte, r = 0; e4m3fn: the magnitude << 7, r = 8), so
 *     w[p][j] = fl32(raw(B[p][j]) * s[j])
 * is the same number rounded once, without a decode table or a rebias multiply. raw() of
 * every code is a normal float32, zero, Inf or NaN, never a subnormal: some CPUs take a
 * microcode assist for each subnormal operand (an Intel Xeon ran FP8 weights of small
 * values 10-40x slower when raw() landed on float32 subnormals), and the C driver checks
 * that no kernel's decode raises the x86 denormal-operand flag. */

/* The matmul slots of a row: one per format, then, for each scaled format, one for weights
 * known to hold no NaN or Inf code (nm_scales.finite), whose raw() may skip those cases. A
 * row without a faster decode fills them with its exact kernels. */
enum {
    NM_SLOT_E4M3FN_FINITE = NM_FMT_COUNT,
    NM_SLOT_E5M2_FINITE,
    NM_MATMUL_SLOTS
};

/* The slot that serves weights of `fmt` known to hold no NaN or Inf code: the FP8 formats'
 * finite slot, else the format's own (an integer code is always finite). */
static inline int nm_finite_slot(int fmt) {
    return fmt == NM_FMT_E4M3FN ? NM_SLOT_E4M3FN_FINITE
           : fmt == NM_FMT_E5M2 ? NM_SLOT_E5M2_FINITE
                                : fmt;
}

/* The packing slots (pack, ukernel_pack) serve row-major and packed weights alike, so a
 * format whose packed codes differ from its row-major ones (nm_format_info.packed_xor: Q4_0)
 * has one more: the slot that reads its packed codes. The packed gemvs (gemv_packed,
 * gemv2_packed and their binary16 forms) only ever read packed weights, so a format's own
 * slot there reads its packed codes. */
enum {
    NM_SLOT_Q4_0_PACKED = NM_MATMUL_SLOTS,
    NM_PACK_SLOTS
};

/* The packing slot for a job of matmul slot `slot` of format `fmt` on packed weights
 * (packed != 0) or row-major ones. */
static inline int nm_pack_slot(int slot, int fmt, int packed) {
    return packed && fmt == NM_FMT_Q4_0 ? NM_SLOT_Q4_0_PACKED : slot;
}

/* m == 1 streaming product over a column range:
 *     c[j] = fma(a[p], w[p][j], c[j])   for p = 0..k-1, j = 0..n-1
 * B element (p, j) is the itemsize bytes at b + p*ldb + j*itemsize (ldb in bytes; b needs
 * no alignment). a and c are float-aligned; c holds the chain's starting values. */
typedef void (*nm_gemv_fn)(int64_t k, int64_t n, const float *a, const uint8_t *b,
                           int64_t ldb, float *c, const float *s, const float *o);

/* m == 2, row-major: the gemv chains for two rows at once, row r of A at a + r*lda and of C
 * at c + r*ldc (float strides). Each weight is read once for both rows. */
typedef void (*nm_gemv2_fn)(int64_t k, int64_t n, const float *a, int64_t lda,
                            const uint8_t *b, int64_t ldb, float *c, int64_t ldc,
                            const float *s, const float *o);

/* m == 1 on packed weights (the row's packed layout, see nm_matmul_packed): the same chains
 * as gemv over columns 0..n-1 of slivers of NR columns (NR of the including row) starting at
 * b: stored row p of sliver t at b + t*slb + p*ldb, its columns itemsize bytes apart, each
 * byte XOR-ed with the format's packed_xor (Q4_0's 0x88: nm_formats.h). In a
 * group of several slivers (nm_pack_width > NR: the byte formats) the slivers are side by
 * side, slb = NR*itemsize and ldb the group's row, and the frame never gives a call columns
 * of two groups; in a group of one, slb is a whole sliver (k rows) and ldb = NR*itemsize.
 * Columns of the last sliver past n are read (they are zero; s is padded there too) but C
 * past n is not touched. Walking a few slivers at a time keeps their accumulators in
 * registers for all of k and reads their weights as a few long streams (one, in a group),
 * which the hardware prefetchers follow.
 * Unlike the other slots, these take several blocks of scales in one call: rows [t*bk,
 * t*bk + bk) use the scales (and offsets) at s + t*lds (o + t*lds); bk >= k is one block
 * (lds unused). bk is a multiple of the format's kpack. A call per block would reload C
 * and restart the walk every 32 rows of a GGUF format (docs/kernels.md, "The block
 * formats' speed"). Column j's scales are at s + j in each block: a row-major grid, or the
 * group's part of a group-major one (nm_scales.lsl). */
typedef void (*nm_gemv_packed_fn)(int64_t k, int64_t ldb, int64_t slb, int64_t n,
                                  const float *a, const uint8_t *b, float *c, const float *s,
                                  const float *o, int64_t bk, int64_t lds);

/* m == 2 on packed weights: the gemv_packed chains for two rows at once, row r of A at
 * a + r*lda and of C at c + r*ldc (float strides). Each weight is read once for both rows,
 * so two rows cost about what one does when the weights come from DRAM. */
typedef void (*nm_gemv2_packed_fn)(int64_t k, int64_t ldb, int64_t slb, int64_t n,
                                   const float *a, int64_t lda, const uint8_t *b, float *c,
                                   int64_t ldc, const float *s, const float *o, int64_t bk,
                                   int64_t lds);

/* The packed gemvs of a format whose scales (and offsets) may be binary16 grids
 * (nm_format_info.half_scales, nm_scales.s16): the same walk, the same chains, each scale
 * read as a binary16 and widened exactly. At m <= 2 the walk streams its blocks' scales with
 * its codes, and a float32 grid is a ninth (Q8_0), a fifth (Q4_0) or a third (Q4_1) of the
 * bytes a weight costs; the other slots take float32 scales, which the frame widens. */
typedef void (*nm_gemv_packed_half_fn)(int64_t k, int64_t ldb, int64_t slb, int64_t n,
                                       const float *a, const uint8_t *b, float *c,
                                       const uint16_t *s, const uint16_t *o, int64_t bk,
                                       int64_t lds);
typedef void (*nm_gemv2_packed_half_fn)(int64_t k, int64_t ldb, int64_t slb, int64_t n,
                                        const float *a, int64_t lda, const uint8_t *b, float *c,
                                        int64_t ldc, const uint16_t *s, const uint16_t *o,
                                        int64_t bk, int64_t lds);

/* m == 4 on packed weights under a binary16 grid, where a row has it (NULL: the frame takes
 * pairs of rows): the gemv_packed_half chains for four rows at once, row r of A at
 * a + r*lda and of C at c + r*ldc, each decoded weight feeding the four rows' FMAs. The
 * same arguments as nm_gemv2_packed_half_fn; n columns inside one group. */
typedef void (*nm_gemv4_packed_half_fn)(int64_t k, int64_t ldb, int64_t slb, int64_t n,
                                        const float *a, int64_t lda, const uint8_t *b, float *c,
                                        int64_t ldc, const uint16_t *s, const uint16_t *o,
                                        int64_t bk, int64_t lds);

/* m == 4 on packed weights under float32 scales, where a row has it (NULL: the frame takes
 * pairs of rows): nm_gemv4_packed_half_fn's chains on the scales gemv2_packed takes. The
 * frame uses it for factored grids (the K types), whose blocks it multiplies out a chunk of
 * k at a time for every row of the part. */
typedef void (*nm_gemv4_packed_fn)(int64_t k, int64_t ldb, int64_t slb, int64_t n,
                                   const float *a, int64_t lda, const uint8_t *b, float *c,
                                   int64_t ldc, const float *s, const float *o, int64_t bk,
                                   int64_t lds);

/* The m == 1 packed gemv on a factored grid (nm_scales.c8), where a row has one (NULL: the
 * frame multiplies the grid out for gemv_packed): the same walk and chains, each block's
 * scales (offsets) the products of its codes cs (co), ld apart from block to block, and its
 * super-block's factors fs (fo), ld apart from one super-block of per_super blocks to the
 * next, in float32. n columns inside one group of the packed layout. */
typedef void (*nm_gemv_packed_factored_fn)(int64_t k, int64_t ldb, int64_t slb, int64_t n,
                                           const float *a, const uint8_t *b, float *c,
                                           const int8_t *cs, const int8_t *co, const float *fs,
                                           const float *fo, int64_t bk, int64_t ld,
                                           int64_t per_super);

/* The same for two rows of A (lda apart) and C (ldc apart) at once, where a row has it (NULL:
 * the frame multiplies the grid out a chunk of k at a time for gemv2_packed). */
typedef void (*nm_gemv2_packed_factored_fn)(int64_t k, int64_t ldb, int64_t slb, int64_t n,
                                            const float *a, int64_t lda, const uint8_t *b,
                                            float *c, int64_t ldc, const int8_t *cs,
                                            const int8_t *co, const float *fs, const float *fo,
                                            int64_t bk, int64_t ld, int64_t per_super);

/* Packing: decode a kc x nc block of B into float32 slivers of width nr:
 *     dst[(j / nr) * kc * nr + p * nr + (j % nr)] = w[p][j]
 * with the last sliver zero-padded to nr columns. dst is 64-byte aligned. The frame uses it
 * only for a sliver narrower than NR (at most one per k block and thread: column ranges are
 * whole grains); whole slivers are decoded by ukernel_pack below. */
typedef void (*nm_pack_fn)(int64_t kc, int64_t nc, const uint8_t *b, int64_t ldb, int nr,
                           float *dst, const float *s, const float *o);

/* Register-blocked microkernel on one mr x nr tile of C (mr <= MR, nr <= NR of its row):
 *     c[i*ldc + j] = fma(ap[p*MR + i], bp[p*NR + j], c[i*ldc + j])  for p = 0..kc-1
 * ap is a packed A micro-panel (kc steps of MR floats, rows past mr are zero, 64-byte
 * aligned); bp is one packed sliver (kc rows of NR floats, 64-byte aligned, already scaled).
 * Only the mr x nr elements of C are read or written. c_next is a hint: the C tile the frame
 * computes next (same ldc), or NULL; a row may prefetch it, never dereference it. */
typedef void (*nm_ukernel_fn)(int64_t kc, int64_t mr, int64_t nr, const float *ap,
                              const float *bp, float *c, int64_t ldc, const float *c_next);

/* The microkernel that also packs: the first tile of a whole sliver (NR columns) reads B
 * straight from the weights, decodes (and scales) each row once, writes it to bp (as pack
 * would, so the tiles below reuse it) and applies it to the tile with the same fma chain as
 * ukernel:
 *     bp[p*NR + j] = w[p][j];  c[i*ldc + j] = fma(ap[p*MR + i], bp[p*NR + j], c[...])
 * Decoding while the FMAs run hides its cost and keeps the sliver in L1 for the next tiles.
 * b is the sliver's top-left weight (any byte address); it may prefetch further along the
 * same rows of B (a prefetch never faults) but reads only the kc x NR block. s and o are
 * the scales and offsets of the sliver's first block of rows (NULL without): rows
 * [t*bk, t*bk + bk) of the kc take those at s + t*lds and o + t*lds, so a k block spanning
 * several blocks of scales (GGUF's 32 rows under a KC of 128) is one call, C in registers
 * throughout (bk >= kc: one block, lds unused; bk is a multiple of the format's kpack). */
typedef void (*nm_ukernel_pack_fn)(int64_t kc, int64_t mr, const float *ap, const uint8_t *b,
                                   int64_t ldb, float *bp, float *c, int64_t ldc,
                                   const float *c_next, const float *s, const float *o,
                                   int64_t bk, int64_t lds);

/* Array codecs over n contiguous elements (no alignment needed): 16-bit formats, and the
 * 8-bit ones, whose encoder either follows ml_dtypes (saturate == 0) or clamps to the
 * largest finite value (saturate != 0). */
typedef void (*nm_decode_fn)(const uint16_t *src, float *dst, int64_t n);
typedef void (*nm_encode_fn)(const float *src, uint16_t *dst, int64_t n);
typedef void (*nm_decode8_fn)(const uint8_t *src, float *dst, int64_t n);
typedef void (*nm_encode8_fn)(const float *src, uint8_t *dst, int64_t n, int saturate);

/* Probes of the machine's limits, for the benchmark's roofline:
 * probe_fma runs `iters` rounds of independent fused multiply-adds on the row's widest
 * registers and returns a value that depends on all of them (so none is optimised away);
 * probe_fma_flops is the floating-point operations one round performs.
 * probe_read sums n floats (n a multiple of 64, 64-byte aligned) with vector loads. */
typedef float (*nm_probe_fma_fn)(int64_t iters);
typedef float (*nm_probe_read_fn)(const float *buf, int64_t n);

/* y[i] = silu(x[i]) for i < n (y may be x) */
typedef void (*nm_silu_fn)(int64_t n, const float *x, float *y);
/* y[i] = nm_expf(x[i]) for i < n (y may be x) */
typedef void (*nm_expf_fn)(int64_t n, const float *x, float *y);

/* out[r * w + x] = f[x] * (float)c[r * ldc + x] for r < rows, x < w: rows of a factored
 * grid's codes (nm_scales.c8, ldc apart) times their super-block's factors, one float32
 * multiplication each, which the frame asks for a call's blocks. */
typedef void (*nm_widen_factored_fn)(const int8_t *c, int64_t ldc, const float *f,
                                     int64_t rows, int64_t w, float *out);

/* The packed layout's group width for weights of `itemsize` bytes on a row of NR-column
 * slivers grouped `group` columns wide (nm_isa_kernels.pack_width): the formats of a byte or
 * less a weight take the group, the others one sliver. The one statement of the rule: the
 * frame asks nm_pack_width (narrowmm.h), a row's kernels NM_PACKED_LDB (kernel_common.h). */
#define NM_PACK_WIDTH_OF(itemsize, nr, group) ((itemsize) == 1 ? (group) : (nr))

/* m == 1 on two whole groups of packed weights at once, where a row has it (NULL: the frame
 * walks one group a call): the gemv_packed (gemv_packed_half) chains of group 0 (codes at b0,
 * C at c0, scales and offsets at s0, o0) and of group 1 (b1, c1, s1, o1), each pack_width
 * columns wide, all of k, their stored rows read in turn. One core's memory reads a long
 * stream of weights more slowly than two side by side, when the decode leaves it no slack
 * (docs/kernels.md, "The block formats' speed"); each column's chain is the one gemv_packed
 * makes, so the bits do not change. k, ldb, bk, lds as for nm_gemv_packed_fn. */
typedef void (*nm_gemv_packed_pair_fn)(int64_t k, int64_t ldb, const float *a,
                                       const uint8_t *b0, const uint8_t *b1, float *c0,
                                       float *c1, const float *s0, const float *s1,
                                       const float *o0, const float *o1, int64_t bk,
                                       int64_t lds);
typedef void (*nm_gemv_packed_pair_half_fn)(int64_t k, int64_t ldb, const float *a,
                                            const uint8_t *b0, const uint8_t *b1, float *c0,
                                            float *c1, const uint16_t *s0, const uint16_t *s1,
                                            const uint16_t *o0, const uint16_t *o1, int64_t bk,
                                            int64_t lds);

/* The same on factored grids (the K types' forms): each group's block codes and
 * super-block factors as nm_gemv_packed_factored_fn takes them (cs0, co0, fs0, fo0 for
 * group 0; cs1, ... for group 1; co and fo NULL without offsets) */
typedef void (*nm_gemv_packed_factored_pair_fn)(
    int64_t k, int64_t ldb, const float *a, const uint8_t *b0, const uint8_t *b1, float *c0,
    float *c1, const int8_t *cs0, const int8_t *cs1, const int8_t *co0, const int8_t *co1,
    const float *fs0, const float *fs1, const float *fo0, const float *fo1, int64_t bk,
    int64_t ld, int64_t per_super);

typedef struct nm_isa_kernels {
    const char *isa;      /* "scalar", "avx2", ... */
    int mr, nr;           /* microkernel tile */
    int pack_width;       /* packed byte formats' groups: pack_width / nr slivers side by side
                           * (nm_pack_width in narrowmm.h) */
    int64_t kc;           /* k block the frame uses with this row (a sliver is kc x nr) */
    /* Packed weights: the tiled path walks slivers outside, k blocks inside, up to this many
     * rows (matmul_tiled in frame/matmul.c), for the formats of a byte or more a weight under
     * blocks of scales shorter than kc, and for the 4-bit formats (0: never) */
    int byte_outer_rows, nibble_outer_rows;
    /* How many bytes down its stream of weights a packed m <= 2 walk asks for by default on
     * this CPU (NM_PACKED_GEMV_PREFETCH, kernel_common.h; 0: no hint), unless
     * nm_set_packed_gemv_ahead forces another; -1: the row's walks have no hint compiled */
    int64_t packed_gemv_ahead;
    /* How its packed m <= 2 walks decode 4-bit codes by default on this CPU
     * (NM_NIBBLE_DECODE_*, narrowmm.h), unless nm_set_nibble_decode forces the other; -1: the
     * row has one decode */
    int nibble_decode;
    /* How many groups of packed weights its m == 1 walks take at once by default on this CPU
     * (1, or 2 through gemv_packed_pair), unless nm_set_gemv_streams forces the other; -1:
     * the row has no pair walks */
    int gemv_streams;
    nm_gemv_fn gemv[NM_MATMUL_SLOTS];
    const char *gemv_name[NM_MATMUL_SLOTS];
    nm_gemv2_fn gemv2[NM_MATMUL_SLOTS];
    const char *gemv2_name[NM_MATMUL_SLOTS];
    nm_gemv_packed_fn gemv_packed[NM_MATMUL_SLOTS];
    const char *gemv_packed_name[NM_MATMUL_SLOTS];
    nm_gemv2_packed_fn gemv2_packed[NM_MATMUL_SLOTS];
    const char *gemv2_packed_name[NM_MATMUL_SLOTS];
    /* the formats with half_scales only; NULL for the others */
    nm_gemv_packed_factored_fn gemv_packed_factored[NM_FMT_COUNT];
    const char *gemv_packed_factored_name[NM_FMT_COUNT];
    nm_gemv2_packed_factored_fn gemv2_packed_factored[NM_FMT_COUNT];
    const char *gemv2_packed_factored_name[NM_FMT_COUNT];
    nm_gemv_packed_half_fn gemv_packed_half[NM_FMT_COUNT];
    const char *gemv_packed_half_name[NM_FMT_COUNT];
    nm_gemv2_packed_half_fn gemv2_packed_half[NM_FMT_COUNT];
    const char *gemv2_packed_half_name[NM_FMT_COUNT];
    /* optional (NULL: none): Q8_0, Q4_0 and Q5_1 on the avx512 row (gemv_streams); on
     * factored grids, Q8_0's form there (Q6_K, Q3_K, IQ4_XS) */
    nm_gemv_packed_pair_fn gemv_packed_pair[NM_FMT_COUNT];
    const char *gemv_packed_pair_name[NM_FMT_COUNT];
    nm_gemv_packed_pair_half_fn gemv_packed_pair_half[NM_FMT_COUNT];
    const char *gemv_packed_pair_half_name[NM_FMT_COUNT];
    nm_gemv_packed_factored_pair_fn gemv_packed_factored_pair[NM_FMT_COUNT];
    const char *gemv_packed_factored_pair_name[NM_FMT_COUNT];
    /* optional (NULL: none): Q8_0, Q4_0, Q4_1 and Q5_1 on the avx2 row */
    nm_gemv4_packed_half_fn gemv4_packed_half[NM_FMT_COUNT];
    const char *gemv4_packed_half_name[NM_FMT_COUNT];
    /* optional (NULL: none): Q8_0, Q4_1 and Q5_1 on the avx2 row, for factored grids */
    nm_gemv4_packed_fn gemv4_packed[NM_FMT_COUNT];
    const char *gemv4_packed_name[NM_FMT_COUNT];
    nm_pack_fn pack[NM_PACK_SLOTS];
    const char *pack_name[NM_PACK_SLOTS];
    nm_ukernel_fn ukernel;
    const char *ukernel_name;
    nm_ukernel_pack_fn ukernel_pack[NM_PACK_SLOTS];
    const char *ukernel_pack_name[NM_PACK_SLOTS];
    /* codecs: the 16-bit formats' in decode/encode, the 8-bit ones' in decode8/encode8
     * (f32 needs none) */
    nm_decode_fn decode[NM_FMT_COUNT];
    const char *decode_name[NM_FMT_COUNT];
    nm_encode_fn encode[NM_FMT_COUNT];
    const char *encode_name[NM_FMT_COUNT];
    nm_decode8_fn decode8[NM_FMT_COUNT];
    const char *decode8_name[NM_FMT_COUNT];
    nm_encode8_fn encode8[NM_FMT_COUNT];
    const char *encode8_name[NM_FMT_COUNT];
    nm_probe_fma_fn probe_fma;
    int64_t probe_fma_flops;
    nm_probe_read_fn probe_read;
    /* SiLU over n floats for ops/rowops.c: ops/exact_math.h's operations on the row's widest
     * double vectors (NM_DEFINE_SILU_ARRAY), so the same bits on every row */
    nm_silu_fn silu;
    const char *silu_name;
    /* attention's softmax exps, the same way (NM_DEFINE_EXPF_ARRAY) */
    nm_expf_fn expf;
    const char *expf_name;
    nm_widen_factored_fn widen_factored;
    const char *widen_factored_name;
} nm_isa_kernels;

/* The distance nm_set_packed_gemv_ahead (narrowmm.h) forces on every row built with the
 * packed walks' hint, -1 for each row's own (nm_isa_kernels.packed_gemv_ahead); defined by
 * the frame, read by each walk when it starts (relaxed: a setting, not a handshake) */
extern _Atomic int64_t nm_packed_gemv_ahead_forced;
static inline int64_t nm_packed_gemv_ahead(int64_t row_default) {
    const int64_t forced = atomic_load_explicit(&nm_packed_gemv_ahead_forced, memory_order_relaxed);
    return forced >= 0 ? forced : row_default;
}

/* The packed 4-bit walks' decodes (nm_set_nibble_decode, narrowmm.h) */
enum { NM_NIBBLE_DECODE_IN_PLACE = 0, NM_NIBBLE_DECODE_PERMUTE = 1 };
/* The decode nm_set_nibble_decode forces on the rows with a choice, -1 for each row's own
 * (nm_isa_kernels.nibble_decode); defined by the frame, read by each walk when it starts */
extern _Atomic int nm_nibble_decode_forced;
static inline int nm_nibble_decode(int row_default) {
    const int forced = atomic_load_explicit(&nm_nibble_decode_forced, memory_order_relaxed);
    return forced >= 0 ? forced : row_default;
}

/* The groups nm_set_gemv_streams (narrowmm.h) forces the m == 1 walks of the rows with pair
 * walks to take at once (1 or 2), -1 for each row's own (nm_isa_kernels.gemv_streams);
 * defined by the frame, read once a call */
extern _Atomic int nm_gemv_streams_forced;
static inline int nm_gemv_streams(int row_default) {
    const int forced = atomic_load_explicit(&nm_gemv_streams_forced, memory_order_relaxed);
    return forced > 0 ? forced : row_default;
}

/* Set a slot of a row and the C name it is reported by: NM_SET_SLOT(row, gemv, fmt, fn). */
#define NM_SET_SLOT(row, slot, fmt, fn) ((row)->slot[fmt] = (fn), (row)->slot##_name[fmt] = #fn)

/* Every format of a matmul slot from functions named <slot>_<format>_<isa>, e.g.
 * NM_SET_MATMUL_SLOTS(row, gemv, avx2) sets gemv_f32_avx2, gemv_fp16_avx2, gemv_bf16_avx2,
 * gemv_e4m3fn_avx2, gemv_e5m2_avx2, gemv_q8_0_avx2, gemv_q4_0_avx2, gemv_q4_1_avx2 and
 * gemv_q5_1_avx2. */
#define NM_SET_MATMUL_SLOTS(row, slot, isa)                                                  \
    (NM_SET_SLOT(row, slot, NM_FMT_F32, slot##_f32_##isa),                                   \
     NM_SET_SLOT(row, slot, NM_FMT_FP16, slot##_fp16_##isa),                                 \
     NM_SET_SLOT(row, slot, NM_FMT_BF16, slot##_bf16_##isa),                                 \
     NM_SET_SLOT(row, slot, NM_FMT_E4M3FN, slot##_e4m3fn_##isa),                             \
     NM_SET_SLOT(row, slot, NM_FMT_E5M2, slot##_e5m2_##isa),                                 \
     NM_SET_SLOT(row, slot, NM_FMT_Q8_0, slot##_q8_0_##isa),                                 \
     NM_SET_SLOT(row, slot, NM_FMT_Q4_0, slot##_q4_0_##isa),                                 \
     NM_SET_SLOT(row, slot, NM_FMT_Q4_1, slot##_q4_1_##isa),                                 \
     NM_SET_SLOT(row, slot, NM_FMT_Q5_1, slot##_q5_1_##isa))

/* The binary16-scale packed gemvs of the GGUF formats, named <slot>_<format>_half_<isa>. */
#define NM_SET_HALF_SCALE_SLOTS(row, isa)                                                    \
    (NM_SET_SLOT(row, gemv_packed_half, NM_FMT_Q8_0, gemv_packed_q8_0_half_##isa),           \
     NM_SET_SLOT(row, gemv2_packed_half, NM_FMT_Q8_0, gemv2_packed_q8_0_half_##isa),         \
     NM_SET_SLOT(row, gemv_packed_half, NM_FMT_Q4_0, gemv_packed_q4_0_half_##isa),           \
     NM_SET_SLOT(row, gemv_packed_half, NM_FMT_Q4_1, gemv_packed_q4_1_half_##isa),           \
     NM_SET_SLOT(row, gemv2_packed_half, NM_FMT_Q4_0, gemv2_packed_q4_0_half_##isa),         \
     NM_SET_SLOT(row, gemv2_packed_half, NM_FMT_Q4_1, gemv2_packed_q4_1_half_##isa),         \
     NM_SET_SLOT(row, gemv_packed_half, NM_FMT_Q5_1, gemv_packed_q5_1_half_##isa),           \
     NM_SET_SLOT(row, gemv2_packed_half, NM_FMT_Q5_1, gemv2_packed_q5_1_half_##isa))

/* The packing slots of Q4_0's packed codes (NM_SLOT_Q4_0_PACKED), named
 * pack_q4_0_packed_<isa> and ukernel_pack_q4_0_packed_<isa>. */
#define NM_SET_PACKED_CODE_SLOTS(row, isa)                                                   \
    (NM_SET_SLOT(row, pack, NM_SLOT_Q4_0_PACKED, pack_q4_0_packed_##isa),                    \
     NM_SET_SLOT(row, ukernel_pack, NM_SLOT_Q4_0_PACKED, ukernel_pack_q4_0_packed_##isa))

/* The finite-weights slots (NM_SLOT_*_FINITE) from <slot>_<format>_finite_<isa>. */
#define NM_SET_FINITE_SLOTS(row, slot, isa)                                                  \
    (NM_SET_SLOT(row, slot, NM_SLOT_E4M3FN_FINITE, slot##_e4m3fn_finite_##isa),              \
     NM_SET_SLOT(row, slot, NM_SLOT_E5M2_FINITE, slot##_e5m2_finite_##isa))

/* Every finite-weights slot of a SIMD row that has its own for each matmul slot. */
#define NM_SET_ALL_FINITE_SLOTS(row, isa)                                                    \
    (NM_SET_FINITE_SLOTS(row, gemv, isa), NM_SET_FINITE_SLOTS(row, gemv2, isa),              \
     NM_SET_FINITE_SLOTS(row, gemv_packed, isa), NM_SET_FINITE_SLOTS(row, gemv2_packed, isa), \
     NM_SET_FINITE_SLOTS(row, pack, isa), NM_SET_FINITE_SLOTS(row, ukernel_pack, isa))

/* The 16-bit formats' array codecs, named decode_<format>_<isa> and encode_<format>_<isa>. */
#define NM_SET_CODEC_SLOTS(row, isa)                                                         \
    (NM_SET_SLOT(row, decode, NM_FMT_FP16, decode_fp16_##isa),                               \
     NM_SET_SLOT(row, decode, NM_FMT_BF16, decode_bf16_##isa),                               \
     NM_SET_SLOT(row, encode, NM_FMT_FP16, encode_fp16_##isa),                               \
     NM_SET_SLOT(row, encode, NM_FMT_BF16, encode_bf16_##isa))

/* Each ISA folder provides one function filling a row; a SIMD row starts as a copy of the
 * scalar row and overrides the slots it implements, so no slot is ever empty.
 * Every row is filled at import, on every CPU, whether it runs the row or not, so a fill is
 * compiled for its architecture's baseline (NM_ROW_FILL): with its file's flags, GCC merges
 * the pointer stores into that row's widest vectors (AVX-512 stores killed the import on an
 * AVX2-only Zen 3). tests/test_portable_import.py runs the import on a CPU without AVX-512. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define NM_ROW_FILL __attribute__((target("arch=x86-64")))
#else
#define NM_ROW_FILL
#endif
void nm_fill_row_scalar(nm_isa_kernels *row);
#if defined(NM_HAVE_AVX2)
void nm_fill_row_avx2(nm_isa_kernels *row);
#endif
#if defined(NM_HAVE_AVX512)
void nm_fill_row_avx512(nm_isa_kernels *row);
#endif
#if defined(NM_HAVE_NEON)
void nm_fill_row_neon(nm_isa_kernels *row);
#endif

#endif
