/* narrowmm: the C core's entry points, called by the Python binding.
 * docs/kernels.md describes the layers behind them. */
#ifndef NARROWMM_H
#define NARROWMM_H

#include <stdint.h>
#include "nm_formats.h"
#include "../kernels/nm_kernels.h"

enum nm_status { NM_OK = 0, NM_ENOMEM = -1, NM_EINVAL = -2 };

/* The scales of a scaled format's weights (nm_format_info.scaled), expanded to one float
 * per column and multiplied by 2^r (r = nm_format_info.scale_exponent, see nm_kernels.h):
 * weight (p, j) is fl32(decode(B[p][j]) * scale) with s[(p / bk) * ld + j] = scale * 2^r,
 * so each block of bk rows shares one row of s (bk >= k: one row for all). Every s must be
 * finite. ld >= n; for packed weights ld >= ceil(n / NR) * NR, the padding columns finite.
 * Packed weights may instead have their grid group-major, as their codes are (lsl > 0):
 * each group's blocks one after another, ld = W = nm_pack_width floats a block, lsl
 * floats from one group's grid to the next (lsl >= blocks * W):
 *     s[(j / W) * lsl + (p / bk) * W + j % W]
 * so the m <= 2 walks read a group's scales as one stream beside its codes, not a row
 * every ld floats (measured: docs/kernels.md, "Grids that follow the slivers").
 * Any float-aligned grid gives the same bits; one that starts on a 64-byte line keeps the
 * walks' loads of scales inside one line each, which cold is much faster on float32 grids
 * of short blocks (docs/kernels.md, "Pairs of rows"; the Python side allocates so).
 * finite != 0 promises that no weight is a NaN or Inf code (faster kernels; a broken
 * promise gives wrong values for those weights, nothing worse). The Python side makes this
 * form from per-tensor, per-column and 2-D block scales (narrowmm/_scales.py). */
typedef struct nm_scales {
    const float *s;
    int64_t ld;
    int64_t bk;
    int finite;
    /* a format with offsets (nm_format_info.offset: Q4_1): o[(p / bk) * ld + j], the same
     * grid as s, added once: weight (p, j) = fma(raw(B[p][j]), s, o). NULL for the others */
    const float *o;
    /* The same grids as binary16 (a format with nm_format_info.half_scales, whose values all
     * are binary16 numbers: GGUF's d and m), then s and o are NULL: the same layout, half the
     * bytes for the m <= 2 walks to stream, each value widened exactly where it is read. */
    const uint16_t *s16, *o16;
    int64_t lsl; /* 0: the grid is row-major; else group-major, lsl floats a group */
    /* Or factored (GGUF's K types, whose scales d * sc are no binary16 numbers): an int8
     * code per block, c8 at nm_grid_offset(q, j), and a float32 factor per super-block of
     * per_super blocks, fs at nm_factor_offset(q / per_super, j); the scale is fs * c8 in
     * float32 (the Python side factors a grid only where that product is the scale
     * exactly), oc8 and ofs the offsets'. Row-major (lsl 0: c8[q * ld + j], fs[t * ld + j])
     * or group-major, as packed weights give it: each group's factors (ld floats a
     * super-block) then its codes (ld bytes a block) in one run of lsl bytes, the offsets'
     * groups after the scales'. s, o, s16 and o16 are then NULL. A little over a byte a
     * block where float32 takes four: a Q4_K weight 0.59 bytes, not 0.75. */
    const int8_t *c8, *oc8;
    const float *fs, *ofs;
    int64_t per_super;
} nm_scales;

/* Whether sc's grid is factored (nm_scales.c8). */
static inline int nm_factored(const nm_scales *sc) { return sc->c8 != 0; }

/* The offset of the factor of column j in super-block t of a factored grid, in floats. */
static inline int64_t nm_factor_offset(const nm_scales *sc, int64_t t, int64_t j) {
    return sc->lsl ? j / sc->ld * (sc->lsl / 4) + t * sc->ld + j % sc->ld : t * sc->ld + j;
}

/* The offset of the scale of column j in block q (p / bk) of a grid, in elements (a
 * factored grid's codes). */
static inline int64_t nm_grid_offset(const nm_scales *sc, int64_t q, int64_t j) {
    return sc->lsl ? j / sc->ld * sc->lsl + q * sc->ld + j % sc->ld : q * sc->ld + j;
}

/* The scale (offsets: 0) or offset (1) of column j in block q of a factored grid, as
 * float32: the kernels' value, for code that reads a few (the tied rows). */
static inline float nm_factored_value(const nm_scales *sc, int offsets, int64_t q, int64_t j) {
    const int8_t *c = offsets ? sc->oc8 : sc->c8;
    const float *f = offsets ? sc->ofs : sc->fs;
    return f[nm_factor_offset(sc, q / sc->per_super, j)] * (float)c[nm_grid_offset(sc, q, j)];
}

/* The scales of columns j.. of sc (j a multiple of the group width for a group-major
 * grid): what a call on those columns alone takes. */
static inline nm_scales nm_scales_from_column(const nm_scales *sc, int64_t j) {
    nm_scales out = *sc;
    const int64_t at = nm_grid_offset(sc, 0, j);
    if (out.s) out.s += at;
    if (out.o) out.o += at;
    if (out.s16) out.s16 += at;
    if (out.o16) out.o16 += at;
    const int64_t at_factor = out.c8 ? nm_factor_offset(sc, 0, j) : 0;
    if (out.c8) out.c8 += at, out.fs += at_factor;
    if (out.oc8) out.oc8 += at, out.ofs += at_factor;
    return out;
}

/* C[m x n] (+)= A[m x k] @ W[k x n] under the fma-chain contract, W = decode(B) (times the
 * scales, for a scaled format: `scales` is NULL exactly for the others).
 * A element (i,p) = a[i*lda + p]; B element (p,j) at b + p*ldb + j*itemsize (bytes), for
 * a format whose stored element holds kpack rows (the 4-bit ones: 2) at b + (p / kpack)*ldb
 * + j*itemsize, row p's code in nibble p % kpack (nm_format_info.kpack); k and the scales'
 * blocks are then multiples of kpack. C element (i,j) = c[i*ldc + j]. Each chain starts from C's value with accumulate, from
 * bias[j] when `bias` (n floats) is not NULL, else from +0.0; bias with accumulate is
 * NM_EINVAL. Only the m x n block of C is written. A, B, C and the bias must not overlap. */
int nm_matmul(const nm_isa_kernels *row, int fmt, int64_t m, int64_t n, int64_t k,
              const float *a, int64_t lda, const uint8_t *b, int64_t ldb, float *c,
              int64_t ldc, int accumulate, const float *bias, const nm_scales *scales);

/* The same product on weights packed for this row (Weights.pack): ceil(n / W) groups of
 * W = nm_pack_width(row, fmt) columns (a few of the row's NR-column slivers side by side for
 * the formats of a byte or less a weight, one for the others), group g
 * holding columns [g*W, g*W + W) as k / kpack stored rows of W contiguous elements (stored
 * row r at byte (g*k/kpack + r) * W * itemsize from b: nm_packed_offset), the columns past n
 * zero, each byte XOR-ed with the format's packed_xor (nm_format_info: Q4_0's 0x88, so its
 * padding bytes are 0x88; nm_packed_code). Same bits as nm_matmul on the same matrix: only
 * where the weights are read from changes. Like the grids (nm_scales), b is best on a 64-byte
 * line. */
int nm_matmul_packed(const nm_isa_kernels *row, int fmt, int64_t m, int64_t n, int64_t k,
                     const float *a, int64_t lda, const uint8_t *b, float *c, int64_t ldc,
                     int accumulate, const float *bias, const nm_scales *scales);

/* The model ops (ops/; docs/invariance.md gives each one's fixed order of operations).
 *
 * Attention: q [batch][heads][lq][d], k and v [batch][kv_heads][kv_rows][d] of which the
 * first lk rows of each head are the keys (float32, contiguous; kv_rows >= lk lets a
 * preallocated cache be read in place; heads a multiple of kv_heads, query head h reading kv
 * head h / (heads / kv_heads)); with keys_transposed, k is [batch][kv_heads][d][kv_rows]
 * instead (key j of a head in column j: the layout the scores' product reads, which a cache
 * can keep, so no transpose is built; the same bits); allowed [batch][mask_heads][lq][lk]
 * bytes, nonzero where query i may see key j (mask_heads 1 or heads), or NULL for all keys;
 * out [batch][lq][heads][d]. */
int nm_attention(const nm_isa_kernels *row, int64_t batch, int64_t heads, int64_t kv_heads,
                 int64_t lq, int64_t lk, int64_t kv_rows, int64_t d, const float *q,
                 const float *k, const float *v, int keys_transposed, const uint8_t *allowed,
                 int64_t mask_heads, float scale, float *out);

/* RMS normalisation of each of `rows` rows of n floats (row i at x + i*ldx, written at
 * out + i*ldo; out may be x): y = x / sqrt(mean(x^2) + eps), without the weight. */
int nm_rms_norm(int64_t rows, int64_t n, const float *x, int64_t ldx, float eps, float *out,
                int64_t ldo);

/* SiLU, x / (1 + e^-x), elementwise over rows x n floats (out may be x), with the row's silu
 * slot (the same bits on every row). */
int nm_silu(const nm_isa_kernels *row, int64_t rows, int64_t n, const float *x, int64_t ldx,
            float *out, int64_t ldo);

/* The elementwise steps of a decoder layer (ops/elementwise.c), one IEEE operation each:
 * x[i][j] = w[j] * x[i][j] over rows of n (ldx apart); x += a; x *= a; and the rotary
 * embedding's rotate-half form out = x * cos + rotate_half(x) * sin over an even d, each
 * product and the sum rounded (out must not overlap x). */
void nm_scale_rows(int64_t rows, int64_t n, const float *w, float *x, int64_t ldx);
void nm_add_into(int64_t count, const float *a, float *x);
void nm_mul_into(int64_t count, const float *a, float *x);
void nm_rotary(int64_t d, const float *x, const float *cos, const float *sin, float *out);

/* One linear layer as the frame takes it: y = x @ W (+ bias) for W (k x n) in format fmt,
 * row-major (ldb bytes between stored rows) or packed for the row it runs on, with its
 * scales when the format has them (has_scales), bias NULL or n floats. */
typedef struct nm_linear {
    int fmt, packed, has_scales;
    int64_t k, n, ldb;
    const uint8_t *b;
    nm_scales scales;
    const float *bias;
} nm_linear;

/* c[m x n] = a[m x k] @ W (+ bias): nm_matmul or nm_matmul_packed for the layer. */
int nm_linear_run(const nm_isa_kernels *row, const nm_linear *layer, int64_t m, const float *a,
                  int64_t lda, float *c, int64_t ldc);

/* The same for up to NM_LINEAR_MANY_MAX layers on one A (a Llama layer's q, k and v, or its
 * gate and up): c[i] (ldc[i]) = a @ W_i, run as one job whose threads split the layers'
 * columns together. The same bits as a call per layer (frame/matmul.c). */
#define NM_LINEAR_MANY_MAX 4
int nm_linear_run_many(const nm_isa_kernels *row, int count, const nm_linear *const layers[],
                       int64_t m, const float *a, int64_t lda, float *const c[],
                       const int64_t ldc[]);

/* A token embedding table kept in a narrow format, vocab rows of hidden values: row t's
 * value p is decode(code p of row t) (the format's codec, as nm decode gives it), times
 * s[t * ls + p / bk], rounded once, or fma with o[t * ls + p / bk] for a format with offsets;
 * s (and o) NULL for a format without scales. Row t's codes start at bits + t * ldb. The
 * same values as the whole table decoded (Weights.decode), bit for bit. */
typedef struct nm_embedding {
    int fmt;
    const uint8_t *bits;
    int64_t ldb;
    const float *s, *o;
    int64_t ls, bk;
} nm_embedding;

/* A Llama-family decoder (model/llama.c): every layer's two RMSNorm weights and seven
 * linear layers, the token embedding (vocab x hidden: float32 in embed, or, when embed is
 * NULL, narrow in narrow_embed or tied to the output layer), the final norm, the output
 * layer, and the rotary table (positions x head_dim cos and sin). */
typedef struct nm_llama_layer {
    const float *attn_norm, *mlp_norm;
    /* Qwen3: each head's query and key RMS-normalised (weights of head_dim floats, the
     * layers' eps) before the rotation; NULL for the models without them */
    const float *q_norm, *k_norm;
    nm_linear q, k, v, o, gate, up, down;
} nm_llama_layer;

typedef struct nm_llama {
    int64_t layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, positions;
    float eps, scale; /* the norms' epsilon; attention's factor on the scores */
    const float *embed, *final_norm, *cos, *sin;
    nm_embedding narrow_embed;
    int tied_embed; /* embed NULL: the table is the output layer's weights (row t, its
                     * column t), not narrow_embed */
    const nm_llama_layer *layer;
    nm_linear lm_head;
} nm_llama;

/* Keys and values of `batch` sequences, each layer's batch*kv_heads*capacity*head_dim floats
 * apart: values as [batch][kv_heads][capacity][head_dim], keys transposed as
 * [batch][kv_heads][head_dim][capacity] (what attention's scores read); the first `length`
 * slots are filled. */
typedef struct nm_llama_cache {
    int64_t batch, capacity, length;
    float *k, *v;
} nm_llama_cache;

/* The parts of a step whose seconds nm_llama_step adds up when asked. */
enum {
    NM_LLAMA_PART_LINEAR,      /* the layers' seven linear layers */
    NM_LLAMA_PART_OUTPUT,      /* the output layer */
    NM_LLAMA_PART_ATTENTION,   /* nm_attention over the cache */
    NM_LLAMA_PART_NORM,        /* RMS norms with their weights */
    NM_LLAMA_PART_SILU,
    NM_LLAMA_PART_ELEMENTWISE, /* rotary, the cache's writes, residual sums, silu * up */
    NM_LLAMA_PART_OTHER,       /* checks, buffers, mask, embedding lookup */
    NM_LLAMA_PARTS
};

/* One forward step: t tokens (tokens[b * t + i], at rotary positions[b * t + i]) for each of
 * the cache's batch sequences, appended to the cache; query i of sequence b sees the slots
 * start[b] .. length + i. logits: batch x vocab, for each sequence's last token. spent:
 * NULL, or NM_LLAMA_PARTS doubles to which each part's seconds are added. NM_EINVAL
 * (nothing changed) for a token, position or start out of range or a full cache. */
int nm_llama_step(const nm_isa_kernels *row, const nm_llama *model, nm_llama_cache *cache,
                  int64_t batch, int64_t t, const int64_t *tokens, const int64_t *positions,
                  const int64_t *start, float *logits, double *spent);

/* Below this cost (multiply-adds; a gemv's weight counts 4) a call does not wake sleeping
 * pool workers and runs on the caller alone, unless workers are still spinning from the
 * previous call (frame/matmul.c). 0 splits every call big enough to split (tests). */
void nm_set_wake_min_work(int64_t work);
int64_t nm_get_wake_min_work(void);

/* The most bytes of packed A (all of k, the rows of a part padded to MR) with which the
 * tiled path walks packed weights' slivers outside the k blocks (frame/matmul.c,
 * matmul_tiled). Negative restores the default, nm_sliver_outer_a_default(); 0 never walks
 * them outside. The order changes no bit, only the time. */
void nm_set_sliver_outer_a_bytes(int64_t bytes);
int64_t nm_get_sliver_outer_a_bytes(void);
int64_t nm_sliver_outer_a_default(void);

/* How many bytes down their stream of weights the packed m == 1 and m == 2 walks prefetch,
 * on the rows built with that hint (avx2, avx512): 0 none, leaving the stream to the
 * hardware prefetchers. Negative restores each row's default for this CPU
 * (nm_isa_kernels.packed_gemv_ahead); nm_get_packed_gemv_ahead returns the forced distance,
 * or -1. The distance changes no bit, only the time. */
void nm_set_packed_gemv_ahead(int64_t bytes);
int64_t nm_get_packed_gemv_ahead(void);

/* How the packed m <= 2 walks of the rows that have a choice (avx512) decode the 4-bit
 * formats' codes: NM_NIBBLE_DECODE_IN_PLACE decodes Q4_1's and the K types' codes where they
 * sit (a mask and a conversion, where a block's scales allow) and the others through a
 * table permute after a shift; NM_NIBBLE_DECODE_PERMUTE takes every code through the
 * permute, read so that few need a shift. Each row has its default for this CPU
 * (nm_isa_kernels.nibble_decode); a negative value restores it, nm_get_nibble_decode returns
 * the forced one or -1 (the values: nm_kernels.h). Either gives the same bits, only the time
 * differs. */
void nm_set_nibble_decode(int decode);
int nm_get_nibble_decode(void);

/* How many groups of packed weights the m == 1 walks of the rows that have pair walks
 * (avx512: Q8_0, Q4_0, Q5_1) take at once: 1, a group a call, or 2, two groups' streams
 * read side by side. Each row has its default for this CPU (nm_isa_kernels.gemv_streams); a
 * value other than 1 or 2 restores it, nm_get_gemv_streams returns the forced one or -1.
 * Either gives the same bits, only the time differs. */
void nm_set_gemv_streams(int streams);
int nm_get_gemv_streams(void);

/* Limit probes (frame/probes.c): run the row's probe kernel on `threads` threads and
 * return the wall time in seconds; nm_probe_fma also stores the flops performed. The read
 * probe sums n floats of buf (n a multiple of 64 * threads, buf 64-byte aligned). */
double nm_probe_fma(const nm_isa_kernels *row, int threads, int64_t iters, double *flops);
double nm_probe_read(const nm_isa_kernels *row, int threads, const float *buf, int64_t n);

/* CPU features the dispatcher looks at (bit set = usable: the CPU has it and the OS saves
 * the registers it needs). */
enum nm_cpu_feature {
    NM_CPU_SSE2 = 1u << 0,
    NM_CPU_AVX = 1u << 1,
    NM_CPU_AVX2 = 1u << 2,
    NM_CPU_FMA = 1u << 3,
    NM_CPU_F16C = 1u << 4,
    NM_CPU_AVX512F = 1u << 5,
    NM_CPU_AVX512BW = 1u << 6,
    NM_CPU_AVX512VL = 1u << 7,
    NM_CPU_AVX512DQ = 1u << 8,
    NM_CPU_AVX512BF16 = 1u << 9,
    NM_CPU_NEON = 1u << 10,
};

typedef struct nm_feature_name {
    unsigned bit;
    const char *name;
} nm_feature_name;

extern const nm_feature_name nm_feature_names[];
extern const int nm_feature_count;

unsigned nm_cpu_features(void);

/* The bytes of one core's level-2 data cache as the OS reports it (Linux's sysfs, CPU 0),
 * 0 where it does not. */
int64_t nm_l2_cache_bytes(void);

/* The ISA rows compiled into this build, best first. */
typedef struct nm_isa_entry {
    const char *name;
    unsigned required;                    /* features the row needs */
    void (*fill)(nm_isa_kernels *row);
} nm_isa_entry;

extern const nm_isa_entry nm_isa_table[];
extern const int nm_isa_count;

/* Whether row `index` of nm_isa_table runs on a CPU with `features`. */
int nm_isa_runs_on(int index, unsigned features);

/* The row to use: the named one (name != NULL) or else the best this CPU runs, as an index
 * of nm_isa_table; NM_ISA_UNKNOWN for a name the build lacks, NM_ISA_UNSUPPORTED for a row
 * the CPU cannot run, NM_ISA_NONE when no row runs (never: scalar needs nothing). */
enum { NM_ISA_UNKNOWN = -1, NM_ISA_UNSUPPORTED = -2, NM_ISA_NONE = -3 };
int nm_isa_select(const char *name, unsigned features);

/* The packed layout's group width for weights of `fmt` on `row`: row->pack_width (a few
 * slivers side by side, one stream for the m <= 2 walks) for the formats of a byte or less
 * a weight; NR (a sliver a group, each sliver's rows on their own) for the 16- and 32-bit
 * ones, whose tiled path reads one sliver of a wider group's rows with L1 set conflicts:
 * bf16 at m = 16 ran 0.73x in groups of four (docs/kernels.md, "Groups of slivers"). */
static inline int64_t nm_pack_width(const nm_isa_kernels *row, int fmt) {
    return NM_PACK_WIDTH_OF(nm_format_table[fmt].itemsize, row->nr, row->pack_width);
}

/* The packed layout's address arithmetic, the one place C computes it (nm_pack_slivers
 * writes the layout a group at a time from it, and the C driver checks every byte against
 * it; Python's is narrowmm/_weights.py's pack_slivers): the byte offset of weight (p, j)
 * in weights packed as groups of `width` columns (nm_pack_width), k rows each
 * (nm_matmul_packed). */
static inline int64_t nm_packed_offset(int64_t k, int64_t width, int64_t itemsize, int64_t p,
                                       int64_t j) {
    return (((j / width) * k + p) * width + j % width) * itemsize;
}

/* The (k, n) matrix of `itemsize`-byte items at src + p * row_stride + j * col_stride (bytes,
 * both >= 0: row-major, transposed or a view) as packed weights: dst gets ceil(n / width)
 * groups of k stored rows of `width` items (nm_packed_offset), each byte XOR-ed with
 * xor_byte (a format's packed_xor; 0 for items wider than a byte), the columns past n a zero
 * item XOR-ed alike. dst must not overlap src (frame/layout.c). */
void nm_pack_slivers(int64_t k, int64_t n, int64_t itemsize, const uint8_t *src,
                     int64_t row_stride, int64_t col_stride, int64_t width, uint8_t xor_byte,
                     uint8_t *dst);

/* GGUF's 4-bit codes as narrowmm's row-major 4-bit bytes (two codes a byte, code 2j in byte
 * j's low nibble): in each of `blocks` blocks of block_bytes bytes, `runs` runs of `run`
 * bytes (even) from byte `offset`, byte i of a run holding its codes i (low nibble) and
 * i + run (high), GGUF's Q4_0 / Q4_1 (one run of 16) and Q4_K (four of 32) layout; dst gets
 * run bytes a run, in order (frame/layout.c). */
void nm_nibble_pairs(int64_t blocks, int64_t block_bytes, int64_t offset, int64_t run,
                     int64_t runs, const uint8_t *src, uint8_t *dst);

/* A byte of format fmt's row-major codes as packed weights hold it, or a packed byte as the
 * row-major code (the XOR with nm_format_info.packed_xor is its own inverse). */
static inline uint8_t nm_packed_code(int fmt, uint8_t byte) {
    return (uint8_t)(byte ^ nm_format_table[fmt].packed_xor);
}

#endif
