/* narrowmm: the loops around the microkernels. This file decides zeroing, the m == 1
 * streaming path, cache blocking, packing and how work is split across threads; it never
 * touches intrinsics.
 *
 * Bit-exactness: every C element is carried through k in ascending order, either by one
 * gemv call over all k or by consecutive kc blocks whose microkernel calls load C, extend
 * its fma chain and store it back. Storing a float32 partial result and reloading it is
 * exact, so blocking never changes a bit. Threads split the output columns, and the rows
 * when the output is narrow (disjoint C elements either way), never k, so the thread count
 * never changes a bit either.
 *
 * Scales: a scaled format's pack and gemv slots take the scales of one block of rows of B
 * (nm_scales), so every k range handed to them stays inside one such block; cutting a chain
 * at a block's end changes no bit, as above. The packed gemvs and the first tile
 * (ukernel_pack) take the block length and the grid's row stride and walk several. */
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "../include/narrowmm.h"
#include "threads.h"

const nm_format_info nm_format_table[NM_FMT_COUNT] = {
    [NM_FMT_F32] = {"f32", 4, 0, 0, 1, 0, 0, 0},
    [NM_FMT_FP16] = {"fp16", 2, 0, 0, 1, 0, 0, 0},
    [NM_FMT_BF16] = {"bf16", 2, 0, 0, 1, 0, 0, 0},
    /* e4m3fn's r: 15 - 7, binary16's bias against e4m3fn's */
    [NM_FMT_E4M3FN] = {"e4m3fn", 1, 1, 8, 1, 0, 0, 0},
    [NM_FMT_E5M2] = {"e5m2", 1, 1, 0, 1, 0, 0, 0},  /* e5m2 is a binary16's top byte */
    [NM_FMT_Q8_0] = {"q8_0", 1, 1, 0, 1, 0, 1, 0},  /* raw() is the int8 code itself */
    [NM_FMT_Q4_0] = {"q4_0", 1, 1, 0, 2, 0, 1, 0x88}, /* raw() is q - 8 */
    [NM_FMT_Q4_1] = {"q4_1", 1, 1, 0, 2, 1, 1, 0},  /* raw() is q, then fma with d and m */
    [NM_FMT_Q5_1] = {"q5_1", 1, 1, 0, 1, 1, 1, 0},  /* raw() is q, then fma with d and m */
};

/* Column ranges handed to threads are multiples of this many columns on row-major weights: a
 * whole number of 64-byte lines of B for every format (32 fp16/bf16, 16 f32 weights a line)
 * and of slivers for every row (NR 8, 24 or 32), so only the last range can end in a partial
 * sliver. On packed weights at m <= 2 they are whole groups (nm_pack_width, job_grain): a
 * group split between two threads is walked a sliver at a time by both, and SmolLM2's
 * decoder at 2 threads measured 1.04x faster with whole groups (docs/kernels.md, "Groups of
 * slivers"). */
#define NM_COLUMN_GRAIN 96
/* At most this many rows of A are packed at once (2 MiB with kc = 256). Up to this m each
 * weight is decoded once per call; beyond it, once per block of this many rows. */
#define NM_A_BLOCK_ROWS 2048
/* Packed weights with at most this many rows per part, whose A for all of k fits
 * nm_get_sliver_outer_a_bytes(), run the slivers outside the k blocks (matmul_tiled).
 * Measured on avx2 (2 builds in one process, cold weights): m = 4 1.12-1.29x, m = 8
 * 1.07-1.13x, m = 16 0.98-1.07x, but m = 32 0.95-1.05x and m = 16 with k = 14336 (896 KiB
 * of A, past a Zen 3's 512 KiB L2) 0.97-0.99x. */
#define NM_SLIVER_OUTER_ROWS 16
/* The default limit on that A: the core's L2 (nm_l2_cache_bytes), held within the sizes
 * measured, from a Zen 3's 512 KiB (also the limit where the OS does not say) to a Zen 4's
 * 1 MiB. */
#define NM_SLIVER_OUTER_A_MIN ((int64_t)512 << 10)
#define NM_SLIVER_OUTER_A_MAX ((int64_t)1 << 20)
/* Packed byte formats in groups of slivers (paired_rows) run up to this many rows a part as
 * pairs through the m <= 2 walks, not as tiles, which read a sliver's quarter of each stored
 * row of its group. On an AMD EPYC Zen 4 (avx512 row, cold, 896 x 4864, one thread, against
 * the tiles): Q8_0 m = 3 1.44x, 4 1.32x, 6 1.25x, but 8 0.94x; Q4_0 / Q4_1 m = 3 1.27x /
 * 1.48x, 4 1.11x / 1.20x, 6 1.18x / 1.19x, 8 0.86x / 0.89x, Q4_1 m = 7 1.01x; at two threads
 * Q8_0 m = 6 1.4x, Q4_1 m = 4 1.5x (docs/kernels.md, "Pairs of rows"). */
#define NM_PAIRED_ROWS 6
/* A row with an m == 4 walk for the job (nm_isa_kernels.gemv4_packed_half: Q8_0, Q4_0 and
 * Q4_1 on avx2) runs up to this many rows a part through the walks, four at a time (three as
 * a four, three_rows_in), then a pair, then one. On an AMD EPYC Zen 3 (avx2 row, cold,
 * packed, one thread, by process against pairs up to 6 rows and tiles beyond): Q4_0 / Q4_1 /
 * Q8_0 m = 4 1.33-1.38x / 1.29-1.32x / 1.05-1.13x, 6 1.21-1.23x / 1.18-1.20x / 1.04-1.08x, 8
 * 1.09-1.12x / 1.05-1.13x / 1.01-1.10x; at m = 16 fours ran 0.89-0.91x the tiles
 * (docs/kernels.md, "The block formats' speed"). */
#define NM_QUAD_ROWS 8
/* The m <= 2 packed path under short blocks of scales walks chunks of slivers, each chunk
 * (never past its group's end) through all of k in one call, a group's slivers (and its part
 * of the group-major grid, nm_scales.lsl) one stream. At m = 1 chunks of
 * NM_GEMV_SLIVERS, fewer streams at once (measured before the groups, each sliver then its
 * own stream, on an AMD Zen 5: in process, cold, Q4_0 / Q4_1 / Q8_0, k of 2048 to 8192,
 * 1.02-1.28x at 2 threads and 0.89-1.29x at 1 against chunks of 8, the avx2 row
 * 0.99-1.23x); at m = 2 on 4-bit slivers it was mixed (0.80-1.27x), so two rows keep
 * NM_BLOCKED_GEMV_SLIVERS, both cut at the group's end. Short slivers of the 8-bit formats
 * went one at a time while each sliver was one stream (Zen 5, k of 576 and 768: Q8_0
 * 1.07-1.26x); in groups one sliver a call reads a quarter of each group row (0.4-0.7x on
 * the Zen 4), so they take a group too ("Groups of slivers" in docs/kernels.md). Short 4-bit
 * slivers used to walk a block of scales at a time with a prefetch two blocks ahead
 * (1.10-1.76x on the Zen 5 with row-major grids); with sliver-major grids that walk was the
 * slowest (Zen 4, docs/kernels.md), so it went. */
#define NM_BLOCKED_GEMV_SLIVERS 8
#define NM_GEMV_SLIVERS 4
/* Packed weights under a factored grid (nm_scales.c8) run the m <= 2 walks this many rows of
 * k a call, their blocks of scales multiplied out first into a buffer the walk then reads
 * from L1 (at most 2 x 16 blocks x 8 slivers of 32 columns, 32 KiB, at bk = 32). From 256 to
 * 4096 rows the Q4_K gemv's time moved by 1-3 % on a Zen 3 (docs/kernels.md). */
#define NM_FACTORED_CHUNK_ROWS 512
/* Below this many multiply-adds a call runs on the calling thread: waking workers would
 * cost more than it saves. */
#define NM_PARALLEL_MIN_WORK ((int64_t)1 << 18)

static int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }

typedef struct matmul_job {
    const nm_isa_kernels *isa; /* the ISA row's kernel table */
    int fmt;
    int slot; /* the row's matmul slot: fmt, or its finite-weights variant */
    int pack_slot; /* its packing slot: slot, or the one of fmt's packed codes (nm_pack_slot) */
    int64_t m, n, k;
    const float *a;
    int64_t lda;
    const uint8_t *b;
    int64_t ldb;
    float *c;
    int64_t ldc;
    int accumulate;
    const float *bias; /* NULL, or the n values the chains start from (not with accumulate) */
    int packed; /* B is in the row's packed layout (nm_matmul_packed); ldb unused */
    const nm_scales *scales; /* NULL for a format without scales */
    int long_k_blocks; /* the tiled path's k blocks span several blocks of scales (k_block_end) */
    int col_parts, row_parts; /* the parts form a row_parts x col_parts grid of C blocks */
    atomic_int failed;        /* a part could not allocate its buffer */
} matmul_job;

/* Rows p.. of the weights of columns j.. (j a multiple of NR when packed; p a multiple of
 * the format's kpack), and the stride between stored rows: the only place that knows the
 * two layouts apart. */
static const uint8_t *weights_at(const matmul_job *job, int64_t p, int64_t j, int64_t *ldb) {
    const int64_t itemsize = nm_format_table[job->fmt].itemsize;
    const int64_t kpack = nm_format_table[job->fmt].kpack;
    if (!job->packed) {
        *ldb = job->ldb;
        return job->b + p / kpack * job->ldb + j * itemsize;
    }
    const int64_t width = nm_pack_width(job->isa, job->fmt);
    *ldb = width * itemsize;
    return job->b + nm_packed_offset(job->k / kpack, width, itemsize, p / kpack, j);
}

/* Where the scales (offsets: 1) of columns j.. for rows in the block of row p are, in the
 * grid's width (nm_scales.s, s16, or a factored grid's codes), or NULL: for the prefetch
 * hints. */
static const void *grid_at(const matmul_job *job, int offsets, int64_t p, int64_t j) {
    const nm_scales *sc = job->scales;
    const int64_t at = nm_grid_offset(sc, p / sc->bk, j);
    if (nm_factored(sc)) {
        const int8_t *g = offsets ? sc->oc8 : sc->c8;
        return g ? g + at : NULL;
    }
    if (sc->s16) {
        const uint16_t *g = offsets ? sc->o16 : sc->s16;
        return g ? g + at : NULL;
    }
    const float *g = offsets ? sc->o : sc->s;
    return g ? g + at : NULL;
}

/* Whether the slots that take float32 scales need the job's grid widened first (a binary16
 * or a factored grid; the packed gemvs read a binary16 one as it is). */
static int widened_grid(const nm_scales *sc) { return sc && (sc->s16 || nm_factored(sc)); }

/* Columns j.. (w wide, in one group if group-major) of `blocks` blocks from block q0 of a
 * factored grid's codes c and factors f, as float32 rows w apart in out: each code times its
 * super-block's factor (one rounding, none for the grids the Python side makes), by the row's
 * widen_factored. Block q + 1's codes are ld after block q's in either layout, and so are a
 * super-block's factors after the one before. */
static void widen_factored(const matmul_job *job, const int8_t *c, const float *f, int64_t q0,
                           int64_t blocks, int64_t j, int64_t w, float *out) {
    const nm_scales *sc = job->scales;
    c += nm_grid_offset(sc, q0, j);
    f += nm_factor_offset(sc, q0 / sc->per_super, j);
    /* a super-block's blocks (the first and last perhaps in part) a call */
    for (int64_t q = 0, rows; q < blocks; q += rows, f += sc->ld) {
        rows = min64(blocks - q, sc->per_super - (q0 + q) % sc->per_super);
        job->isa->widen_factored(c + q * sc->ld, sc->ld, f, rows, w, out + q * w);
    }
}

/* The float32 scales and offsets of columns j.. (w wide) for the blocks of rows [p, pe), as
 * the slots that take float32 read them: *s and *o at the block of row p (NULL without
 * scales, or offsets), *lds from one block to the next. Those of a float32 grid are the
 * grid's own; a binary16 grid's rows are widened (exactly) into buf, a factored grid's
 * multiplied out there (widened_grid); buf holds 2 * scale_blocks(job, pe - p) * w
 * floats. */
static void float_scales(const matmul_job *job, int64_t p, int64_t pe, int64_t j, int64_t w,
                         float *buf, const float **s, const float **o, int64_t *lds) {
    const nm_scales *sc = job->scales;
    *s = *o = NULL;
    *lds = 0;
    if (!sc) return;
    if (!widened_grid(sc)) {
        *s = grid_at(job, 0, p, j);
        *o = grid_at(job, 1, p, j);
        *lds = sc->ld;
        return;
    }
    const int64_t q0 = p / sc->bk, blocks = (pe - 1) / sc->bk - q0 + 1;
    const int offsets = sc->o16 || sc->oc8;
    if (nm_factored(sc)) {
        widen_factored(job, sc->c8, sc->fs, q0, blocks, j, w, buf);
        if (offsets) widen_factored(job, sc->oc8, sc->ofs, q0, blocks, j, w, buf + blocks * w);
    } else {
        const nm_decode_fn widen = job->isa->decode[NM_FMT_FP16];
        for (int64_t q = 0; q < blocks; ++q) { /* w columns in one group if group-major */
            widen(sc->s16 + nm_grid_offset(sc, q0 + q, j), buf + q * w, w);
            if (offsets)
                widen(sc->o16 + nm_grid_offset(sc, q0 + q, j), buf + (blocks + q) * w, w);
        }
    }
    *s = buf;
    *o = offsets ? buf + blocks * w : NULL;
    *lds = w;
}

/* The most blocks of scales `rows` consecutive rows starting at a block's start span (the
 * k ranges of float_scales' callers do start at one, or stay inside one), for its buffer. */
static int64_t scale_blocks(const matmul_job *job, int64_t rows) {
    const int64_t bk = job->scales->bk;
    return bk >= rows ? 1 : (rows + bk - 1) / bk;
}

/* Where a k range starting at row p must end: at most `len` rows on, and at the end of p's
 * block of scales. */
static int64_t k_range_end(const matmul_job *job, int64_t p, int64_t len) {
    int64_t end = min64(job->k, p + len);
    if (job->scales) end = min64(end, (p / job->scales->bk + 1) * job->scales->bk);
    return end;
}

/* Where the tiled path's k block starting at row p ends: kc_max rows on, cut where p's block
 * of scales ends; or, with long_k_blocks, as many whole blocks of scales shorter than kc_max
 * (GGUF's 32 rows) as fit: the first tile decodes the sliver through them in one call
 * (sliver_block) and the tiles below run down kc_max rows, not 32, C reloaded less often. */
static int64_t k_block_end(const matmul_job *job, int64_t p, int64_t kc_max) {
    if (job->long_k_blocks)
        return min64(job->k, p + kc_max / job->scales->bk * job->scales->bk);
    return k_range_end(job, p, kc_max);
}

/* Whether k_block_end takes several blocks of scales at once: for scales in blocks shorter
 * than the row's kc, always for the 4-bit formats; for the others (Q8_0, block-scaled FP8)
 * on packed weights, and on row-major ones past NM_SLIVER_OUTER_ROWS rows. Measured on an
 * AMD Zen 5 (Q8_0, cold, docs/kernels.md): packed m = 4 to 128 1.02-1.56x (m = 16 1.5x);
 * row-major m = 64 1.19-1.35x but m = 4 and 8 0.77-0.91x, m = 16 even. */
static int long_k_blocks(const nm_isa_kernels *isa, int fmt, int64_t m, int packed,
                         const nm_scales *scales) {
    if (!scales || scales->bk >= isa->kc) return 0;
    return nm_format_table[fmt].kpack > 1 || packed || m > NM_SLIVER_OUTER_ROWS;
}

static void zero_block(int64_t m, int64_t n, float *c, int64_t ldc) {
    for (int64_t i = 0; i < m; ++i) memset(c + i * ldc, 0, (size_t)n * sizeof(float));
}

/* Every row of the block set to bias[0..n): the chains then start from the bias. Done by the
 * part that computes the block, so the first touch of a freshly allocated C (a page fault a
 * page in some VMs) is shared by the threads and the block is in cache when its first tile
 * loads it. */
static void bias_block(int64_t m, int64_t n, const float *bias, float *c, int64_t ldc) {
    for (int64_t i = 0; i < m; ++i) memcpy(c + i * ldc, bias, (size_t)n * sizeof(float));
}

/* One whole micro-panel of `mr` rows: dst[p * mr + i] = a[i * lda + p]. Inlined with a
 * constant mr, the compiler turns each p's mr loads into one vector store (a transpose);
 * the rows' loop outside, with strided single stores, ran 5-6x slower (448 x 1536 floats:
 * 1.1 ms against 0.16-0.2 ms on Zen 3), and every column part packs all of A. */
static inline void pack_panel(int64_t mr, int64_t kc, const float *a, int64_t lda, float *dst) {
    for (int64_t p = 0; p < kc; ++p)
        for (int64_t i = 0; i < mr; ++i) dst[p * mr + i] = a[i * lda + p];
}

/* Pack rows [0, m) of a k block of A (kc columns from a, leading dimension lda) into MR-row
 * micro-panels: dst[(i / mr) * kc * mr + p * mr + i % mr] = a[i][p], rows past m zero. */
static void pack_a(int64_t m, int64_t kc, const float *a, int64_t lda, int64_t mr, float *dst) {
    for (int64_t i0 = 0; i0 < m; i0 += mr) {
        float *panel = dst + i0 * kc;
        const float *src = a + i0 * lda;
        const int64_t rows = min64(mr, m - i0);
        if (rows == 4 && mr == 4) { /* the MRs of the rows (avx2 4, avx512 and neon 8) */
            pack_panel(4, kc, src, lda, panel);
        } else if (rows == 8 && mr == 8) {
            pack_panel(8, kc, src, lda, panel);
        } else { /* another MR, or the last, ragged panel */
            for (int64_t p = 0; p < kc; ++p)
                for (int64_t i = 0; i < mr; ++i)
                    panel[p * mr + i] = i < rows ? src[i * lda + p] : 0.0f;
        }
    }
}

/* A hint (a prefetch never faults) for the scales and offsets of columns j.. (w wide) in the
 * block of scales of row p: a line per 64 bytes of the grid's row, or of each sliver's part
 * of it (a group-major grid). */
static void prefetch_block_scales(const matmul_job *job, int64_t p, int64_t j, int64_t w) {
    const nm_scales *sc = job->scales;
    const int64_t item = nm_factored(sc) ? 1 : sc->s16 ? 2 : 4;
    for (int64_t t = j, run; t < j + w; t += run) {
        /* contiguous columns: to the end of t's group in a group-major grid */
        run = sc->lsl ? min64(j + w - t, sc->ld - t % sc->ld) : j + w - t;
        const char *s = grid_at(job, 0, p, t), *o = grid_at(job, 1, p, t);
        for (int64_t x = 0; x < run * item; x += 64) {
            __builtin_prefetch(s + x);
            if (o) __builtin_prefetch(o + x);
        }
    }
}

/* Hints for what sliver_block reads of the k block starting at row p of the sliver at
 * column j: its weights and its blocks of scales and offsets. For a sliver decoded a block
 * of scales at a time, whose `pack` has no arithmetic to hide its misses behind. */
static void prefetch_sliver_block(const matmul_job *job, int64_t p, int64_t j) {
    const int64_t nr = job->isa->nr, kpack = nm_format_table[job->fmt].kpack;
    const int64_t row_bytes = nr * nm_format_table[job->fmt].itemsize;
    const int64_t pe = k_block_end(job, p, job->isa->kc);
    int64_t ldb;
    const char *b = (const char *)weights_at(job, p, j, &ldb);
    for (int64_t r = 0; r < (pe - p) / kpack; ++r)
        for (int64_t x = 0; x < row_bytes; x += 64) __builtin_prefetch(b + r * ldb + x);
    for (int64_t q = p; q < pe; q += job->scales->bk) prefetch_block_scales(job, q, j, nr);
}

/* Pack a sliver narrower than NR (the range's last), kc rows from row pc, a block of scales
 * at a time (the pack slots take one block's scales): s and o (float_scales) are those of
 * pc's block, lds apart. */
static void pack_narrow_sliver(const matmul_job *job, int64_t pc, int64_t kc, int64_t jr,
                               int64_t w, float *sliver, const float *s, const float *o,
                               int64_t lds) {
    const int64_t nr = job->isa->nr;
    for (int64_t p = pc, pe; p < pc + kc; p = pe) {
        pe = k_range_end(job, p, pc + kc - p);
        const int64_t t = job->scales ? p / job->scales->bk - pc / job->scales->bk : 0;
        int64_t ldb;
        const uint8_t *b = weights_at(job, p, jr, &ldb);
        job->isa->pack[job->pack_slot](pe - p, w, b, ldb, (int)nr, sliver + (p - pc) * nr,
                                       s ? s + t * lds : NULL, o ? o + t * lds : NULL);
    }
}

/* The tiles of one kc-row block of one sliver (columns jr.., w <= NR wide) down mc rows:
 * the first tile decodes the sliver from the weights while computing (ukernel_pack, through
 * every block of scales the k block spans, C in registers), the tiles below reuse the decoded
 * sliver from L1. A sliver narrower than NR is packed first. c_after is the tile computed
 * after the last one here (a prefetch hint); (p_next, j_next) the k block and sliver decoded
 * after this one (p_next < 0: none), prefetched when the k block spans several blocks of
 * scales. */
static void sliver_block(const matmul_job *job, int64_t pc, int64_t kc, int64_t jr, int64_t w,
                         const float *a_block, int64_t mc, float *c_block, float *sliver,
                         float *scale_buf, const float *c_after, int64_t p_next,
                         int64_t j_next) {
    const nm_isa_kernels *isa = job->isa;
    const int64_t mr = isa->mr, nr = isa->nr, ldc = job->ldc;
    const nm_scales *sc = job->scales;
    const int many_scales = sc && sc->bk < kc;
    const float *s, *o;
    int64_t lds;
    float_scales(job, pc, pc + kc, jr, w, scale_buf, &s, &o, &lds);
    for (int64_t ic = 0; ic < mc; ic += mr) {
        float *c_tile = c_block + ic * ldc + jr;
        const float *c_next = ic + mr < mc ? c_tile + mr * ldc : c_after;
        const float *ap = a_block + ic * kc;
        const int64_t rows = min64(mr, mc - ic);
        if (ic == 0 && w == nr) {
            int64_t ldb;
            const uint8_t *b = weights_at(job, pc, jr, &ldb);
            isa->ukernel_pack[job->pack_slot](kc, rows, ap, b, ldb, sliver, c_tile, ldc, c_next,
                                             s, o, sc ? sc->bk : kc, lds);
        } else {
            if (ic == 0) pack_narrow_sliver(job, pc, kc, jr, w, sliver, s, o, lds);
            isa->ukernel(kc, rows, w, ap, sliver, c_tile, ldc, c_next);
        }
        if (ic == 0 && many_scales && p_next >= 0) prefetch_sliver_block(job, p_next, j_next);
    }
}

/* m > 1 on rows [i_begin, i_end) and columns [j_begin, j_end), one NR-wide sliver at a time.
 * Each C element meets the k blocks in ascending order either way; only the loop order
 * differs.
 *
 * Row-major weights (and many rows): k blocks outside, slivers inside. Each k block of A is
 * packed once and reused from L2 by every sliver, and a sliver's rows, 8 KB apart in a 4096-
 * column matrix, share their cache lines with the next sliver's, which reads them while they
 * are still cached.
 *
 * Packed weights and few rows (NM_SLIVER_OUTER_ROWS): slivers outside, k blocks inside (a
 * group of slivers outside, its slivers inside each k block). A group's rows are then one
 * contiguous stream from its first k block to its last, which the hardware prefetchers
 * follow from block to block, and its few C tiles stay in L1 across the k blocks. A is
 * packed once for all of k and read from L2. The formats under blocks of scales shorter
 * than kc (long_k_blocks) take it up to the row's byte_outer_rows, the 4-bit formats up to
 * its nibble_outer_rows: on a Zen 5 the 4-bit formats ran faster with the k blocks outside
 * at m = 4 to 16 and Q8_0 at m = 16 (docs/kernels.md, "The block formats' speed"); on a
 * Zen 4 since, the avx512 row ran both faster with slivers outside at m = 7 to 16, so that
 * row takes it for two tiles' rows of either; the others keep it for one tile's rows of a
 * byte format and never for the 4-bit ones (nm_fill_row_*). */
static int matmul_tiled(const matmul_job *job, int64_t i_begin, int64_t i_end,
                        int64_t j_begin, int64_t j_end) {
    const nm_isa_kernels *isa = job->isa;
    const int64_t mr = isa->mr, nr = isa->nr, kc_max = isa->kc, k = job->k;
    const int64_t mc_max = min64(i_end - i_begin, NM_A_BLOCK_ROWS / mr * mr);
    const int64_t mc_pad = (mc_max + mr - 1) / mr * mr;
    const int64_t a_all_floats = mc_pad * ((k + kc_max - 1) / kc_max * kc_max);
    const int64_t outer_rows = nm_format_table[job->fmt].kpack > 1 ? isa->nibble_outer_rows
                               : job->long_k_blocks ? isa->byte_outer_rows
                                                    : NM_SLIVER_OUTER_ROWS;
    const int sliver_outer =
        job->packed && i_end - i_begin <= outer_rows &&
        a_all_floats * (int64_t)sizeof(float) <= nm_get_sliver_outer_a_bytes();
    const int64_t a_floats = sliver_outer ? a_all_floats : mc_pad * kc_max;
    const size_t a_bytes = (size_t)a_floats * sizeof(float);
    const size_t b_bytes = (size_t)(kc_max * nr) * sizeof(float);
    float *a_panel = aligned_alloc(64, (a_bytes + 63) / 64 * 64);
    float *sliver = aligned_alloc(64, (b_bytes + 63) / 64 * 64);
    /* a binary16 or factored grid's blocks of a k block, widened for ukernel_pack and pack */
    const size_t s_bytes = widened_grid(job->scales)
                               ? (size_t)(2 * scale_blocks(job, kc_max) * nr) * sizeof(float)
                               : 0;
    float *scale_buf = s_bytes ? aligned_alloc(64, (s_bytes + 63) / 64 * 64) : NULL;
    if (!a_panel || !sliver || (s_bytes && !scale_buf)) {
        free(a_panel);
        free(sliver);
        free(scale_buf);
        return NM_ENOMEM;
    }
    if (sliver_outer) {
        /* one row block (mc_max = all the rows); k block pc's panels start at pc * mc_pad */
        float *c_block = job->c + i_begin * job->ldc;
        for (int64_t pc = 0, pe; pc < k; pc = pe) {
            pe = k_block_end(job, pc, kc_max);
            pack_a(mc_max, pe - pc, job->a + i_begin * job->lda + pc, job->lda, mr,
                   a_panel + pc * mc_pad);
        }
        /* a group of packed slivers at a time (their stored rows side by side), its slivers
         * inside each k block: the group's rows are then one stream from its first k block
         * to its last, where a sliver at a time through all of k reads a part of each of
         * its rows, then comes back for the rest (bf16 in groups of four ran 0.52x so at
         * m = 16 in the kernel bench, 0.73x in this order, and keeps a sliver a group; Q8_0
         * in groups at m = 8 ran 0.91x so, and 0.86x with the k blocks outside: docs/results/
         * pairs-of-rows-zen4-2026-12-05.txt, section 1) */
        const int64_t group = nm_pack_width(isa, job->fmt);
        for (int64_t jg = j_begin, g_end; jg < j_end; jg = g_end) {
            g_end = min64(j_end, (jg / group + 1) * group);
            for (int64_t pc = 0, pe; pc < k; pc = pe) {
                pe = k_block_end(job, pc, kc_max);
                for (int64_t jr = jg; jr < g_end; jr += nr) {
                    /* after the bottom tile: the group's next sliver, its first in the next
                     * k block, or the next group's first */
                    const float *c_after = jr + nr < g_end ? c_block + jr + nr
                                           : pe < k        ? c_block + jg
                                           : g_end < j_end ? c_block + g_end
                                                           : NULL;
                    /* no next block to prefetch: the group's next k block follows in the same
                     * stream, for the hardware's prefetch to follow */
                    sliver_block(job, pc, pe - pc, jr, min64(nr, j_end - jr),
                                 a_panel + pc * mc_pad, mc_max, c_block, sliver, scale_buf,
                                 c_after, -1, 0);
                }
            }
        }
    } else {
        /* The next sliver's k block is prefetched while this one computes, but on packed
         * weights only where a group ends: the slivers of a group share the cache lines of
         * its stored rows, which its first sliver has brought in. Without the prefetches
         * for the rest, m = 12 to 32 ran 1.02-1.09x faster (Q8_0, Q4_0, Q4_1, packed, on a
         * Zen 3: docs/kernels.md, "The block formats' speed"). */
        const int64_t group = job->packed ? nm_pack_width(isa, job->fmt) : nr;
        for (int64_t pc = 0, pe; pc < k; pc = pe) {
            pe = k_block_end(job, pc, kc_max);
            const int64_t kc = pe - pc;
            for (int64_t ic0 = i_begin; ic0 < i_end; ic0 += mc_max) {
                const int64_t mc = min64(mc_max, i_end - ic0);
                pack_a(mc, kc, job->a + ic0 * job->lda + pc, job->lda, mr, a_panel);
                float *c_block = job->c + ic0 * job->ldc;
                for (int64_t jr = j_begin; jr < j_end; jr += nr) {
                    const int64_t j_next = jr + nr;
                    const float *c_after = j_next < j_end ? c_block + j_next : NULL;
                    const int prefetch = j_next < j_end && (!job->packed || j_next % group == 0);
                    sliver_block(job, pc, kc, jr, min64(nr, j_end - jr), a_panel, mc, c_block,
                                 sliver, scale_buf, c_after, prefetch ? pc : -1, j_next);
                }
            }
        }
    }
    free(a_panel);
    free(sliver);
    free(scale_buf);
    return NM_OK;
}

/* Whether the job's packed weights come in groups of several slivers side by side
 * (nm_pack_width > NR: the byte formats). */
static int packed_in_groups(const matmul_job *job) {
    return job->packed && nm_pack_width(job->isa, job->fmt) > job->isa->nr;
}

/* The row's m == 4 walk for the job, or NULL: packed weights under a binary16 grid. */
static nm_gemv4_packed_half_fn quad_walk(const matmul_job *job) {
    return job->packed && job->scales && job->scales->s16
               ? job->isa->gemv4_packed_half[job->fmt]
               : NULL;
}

/* Whether a part of `rows` rows runs as pairs of rows (or fours, quad_walk) through the
 * m <= 2 walks (matmul_block): packed groups (packed_in_groups), up to NM_PAIRED_ROWS rows,
 * NM_QUAD_ROWS with an m == 4 walk on a binary16 grid. Q5_1's fours there, and a factored
 * grid's (factored_quad), keep NM_PAIRED_ROWS: at m = 7 and 8 they ran 0.96-1.02x and
 * 0.90-1.01x the tiles on the Zen 3 (docs/results/factored-quads-zen3-2026-12-06.txt). */
static int paired_rows(const matmul_job *job, int64_t rows) {
    const int64_t most =
        quad_walk(job) && job->fmt != NM_FMT_Q5_1 ? NM_QUAD_ROWS : NM_PAIRED_ROWS;
    return packed_in_groups(job) && rows <= most;
}

/* The columns of one grain of a job's column ranges (NM_COLUMN_GRAIN): whole groups for the
 * m <= 2 walks on packed weights and paired_rows' pairs; the tiled path takes a sliver at a
 * time anyway, and its ranges in whole groups (128 columns on avx512) split SmolLM2's
 * 576-column layers 256 | 320 at 2 threads: its decoder at batch 8 ran 0.82x. */
static int64_t job_grain(const matmul_job *job) {
    return job->packed && (job->m <= 2 || paired_rows(job, job->m))
               ? nm_pack_width(job->isa, job->fmt)
               : NM_COLUMN_GRAIN;
}

static void column_range(int64_t n, int64_t grain, int part, int parts, int64_t *begin,
                         int64_t *end) {
    const int64_t grains = (n + grain - 1) / grain;
    *begin = min64(n, grains * part / parts * grain);
    *end = min64(n, grains * (part + 1) / parts * grain);
}

/* Rows [begin, end) of part `part` of `parts`: whole MR-row tiles, the last range ragged. */
static void row_range(int64_t m, int64_t mr, int part, int parts, int64_t *begin,
                      int64_t *end) {
    const int64_t tiles = (m + mr - 1) / mr;
    *begin = min64(m, tiles * part / parts * mr);
    *end = min64(m, tiles * (part + 1) / parts * mr);
}

/* The row's m == 4 walk on float32 scales for the job, or NULL: packed weights under a
 * factored grid, which factored_chunks multiplies out (the K types' forms, q4_1, q8_0 and
 * q5_1).
 * Against pairs, on a Zen 3 (cold, one thread, k and n of 576 to 8192): Q4_K m = 4
 * 1.20-1.28x, m = 6 1.15-1.17x; Q6_K 1.10-1.15x and 1.06-1.09x. */
static nm_gemv4_packed_fn factored_quad(const matmul_job *job) {
    return job->packed && job->scales && nm_factored(job->scales) && job->slot == job->fmt
               ? job->isa->gemv4_packed[job->fmt]
               : NULL;
}

/* Three rows of C (ldc apart, w columns) run through an m == 4 walk as a four: A's rows and
 * a zero one in a_pad (k floats apart, made once a part), C's through c_pad, a copy (w
 * apart) whose fourth row is dropped. The three chains are the walk's, so the same bits as
 * a pair and a row; one decode for three rows instead of two: on a Zen 3 (cold, one thread)
 * Q4 at m = 3 ran 1.14-1.21x, at m = 7 1.07-1.15x; Q8_0, whose decode is cheaper,
 * 0.95-1.00x and 1.03-1.12x. */
/* the widest chunk of columns a call of the m <= 2 path takes: 8 slivers of the widest NR */
#define NM_QUAD_PAD_COLUMNS (NM_BLOCKED_GEMV_SLIVERS * 32)
static void three_rows_in(float *c_pad, const float *c, int64_t ldc, int64_t w) {
    for (int r = 0; r < 3; ++r) memcpy(c_pad + r * w, c + r * ldc, (size_t)w * sizeof(float));
    memset(c_pad + 3 * w, 0, (size_t)w * sizeof(float));
}
static void three_rows_out(float *c, int64_t ldc, const float *c_pad, int64_t w) {
    for (int r = 0; r < 3; ++r) memcpy(c + r * ldc, c_pad + r * w, (size_t)w * sizeof(float));
}

/* Rows [i0, i1) of C's columns jc.. (w wide, inside one group) on packed weights under a
 * factored grid. On a row with walks of its own for such grids (walks_factored_grid): a call
 * through all of k for each pair of rows and the one left. Else through the packed m <= 2 walks,
 * k_chunk rows of k at a time, each chunk's blocks of scales multiplied out once (into
 * scale_buf) for every pair of rows (four with factored_quad, three as a four on a_pad's
 * copies), which then reads the chunk's weights in turn (the pairs after the first from L1
 * or L2), C going to memory between chunks: on a Zen 3 the Q4_K gemv
 * at m = 1 ran 0.85-0.87x the float32 grid's so, 0.97-0.99x on the avx2 walk (a prefetch of
 * the next chunk's grid lines changed nothing: a group-major grid's runs are long enough
 * for the hardware's). */
/* Whether the row walks `rows` rows of packed weights under a factored grid itself: one row
 * with gemv_packed_factored; more in pairs (gemv2_packed_factored), then one, where it has
 * both and no m == 4 walk for the grid (factored_quad, whose fours run on the grid
 * multiplied out). Else factored_chunks multiplies the grid out into its buffer. */
static int walks_factored_grid(const matmul_job *job, int64_t rows) {
    const nm_isa_kernels *isa = job->isa;
    if (!isa->gemv_packed_factored[job->fmt]) return 0;
    return rows == 1 || (isa->gemv2_packed_factored[job->fmt] && !factored_quad(job));
}

static void factored_chunks(const matmul_job *job, int64_t i0, int64_t i1, int64_t jc,
                            int64_t w, int64_t k_chunk, int64_t slb, float *scale_buf,
                            const float *a_pad) {
    const nm_isa_kernels *isa = job->isa;
    const nm_scales *sc = job->scales;
    const int64_t bk = sc->bk;
    if (walks_factored_grid(job, i1 - i0)) { /* the row's own walks: no buffer, all of k */
        int64_t ldb;
        const uint8_t *b = weights_at(job, 0, jc, &ldb);
        const int64_t f_at = nm_factor_offset(sc, 0, jc), c_at = nm_grid_offset(sc, 0, jc);
        const int8_t *cs = sc->c8 + c_at, *co = sc->oc8 ? sc->oc8 + c_at : NULL;
        const float *fs = sc->fs + f_at, *fo = sc->ofs ? sc->ofs + f_at : NULL;
        for (int64_t ir = i0, pair; ir < i1; ir += pair) {
            pair = min64(2, i1 - ir);
            const float *a = job->a + ir * job->lda;
            float *c = job->c + ir * job->ldc + jc;
            if (pair == 1)
                isa->gemv_packed_factored[job->fmt](job->k, ldb, slb, w, a, b, c, cs, co, fs, fo,
                                                    bk, sc->ld, sc->per_super);
            else
                isa->gemv2_packed_factored[job->fmt](job->k, ldb, slb, w, a, job->lda, b, c,
                                                     job->ldc, cs, co, fs, fo, bk, sc->ld,
                                                     sc->per_super);
        }
        return;
    }
    /* the walks read whole slivers' scales, the last one's padding too (ld covers them) */
    const int64_t sw = (w + isa->nr - 1) / isa->nr * isa->nr;
    const nm_gemv4_packed_fn quad = factored_quad(job); /* four rows at a time, if any */
    for (int64_t p0 = 0, p1; p0 < job->k; p0 = p1) {
        p1 = min64(job->k, p0 + k_chunk);
        const float *s, *o;
        int64_t lds;
        float_scales(job, p0, p1, jc, sw, scale_buf, &s, &o, &lds);
        int64_t ldb;
        const uint8_t *b = weights_at(job, p0, jc, &ldb);
        for (int64_t ir = i0, pair; ir < i1; ir += pair) {
            pair = min64(2, i1 - ir);
            if (quad && i1 - ir >= 4)
                pair = 4;
            else if (quad && a_pad && i1 - ir == 3 && w <= NM_QUAD_PAD_COLUMNS)
                pair = 3;
            const float *a = job->a + ir * job->lda + p0;
            float *c = job->c + ir * job->ldc + jc;
            if (pair == 1) {
                isa->gemv_packed[job->slot](p1 - p0, ldb, slb, w, a, b, c, s, o, bk, lds);
            } else if (pair == 4) {
                quad(p1 - p0, ldb, slb, w, a, job->lda, b, c, job->ldc, s, o, bk, lds);
            } else if (pair == 3) {
                float c_pad[4 * NM_QUAD_PAD_COLUMNS];
                three_rows_in(c_pad, c, job->ldc, w);
                quad(p1 - p0, ldb, slb, w, a_pad + p0, job->k, b, c_pad, w, s, o, bk, lds);
                three_rows_out(c, job->ldc, c_pad, w);
            } else
                isa->gemv2_packed[job->slot](p1 - p0, ldb, slb, w, a, job->lda, b, c,
                                             job->ldc, s, o, bk, lds);
        }
    }
}

/* Row i0 of C's columns [jc, jc + 2 * group) on packed weights: two whole groups, all of
 * k, through the row's pair walk (matmul_block has checked that it has one for the grid:
 * float32, binary16 or factored) */
static void pair_of_groups(const matmul_job *job, int64_t i0, int64_t jc, int64_t group,
                           float *scale_buf) {
    const nm_isa_kernels *isa = job->isa;
    const nm_scales *sc = job->scales;
    int64_t ldb;
    const uint8_t *b0 = weights_at(job, 0, jc, &ldb);
    const uint8_t *b1 = weights_at(job, 0, jc + group, &ldb);
    const float *a = job->a + i0 * job->lda;
    float *c = job->c + i0 * job->ldc + jc;
    if (nm_factored(sc)) {
        const int64_t g0 = nm_grid_offset(sc, 0, jc), g1 = nm_grid_offset(sc, 0, jc + group);
        const int64_t f0 = nm_factor_offset(sc, 0, jc);
        const int64_t f1 = nm_factor_offset(sc, 0, jc + group);
        isa->gemv_packed_factored_pair[job->fmt](
            job->k, ldb, a, b0, b1, c, c + group, sc->c8 + g0, sc->c8 + g1,
            sc->oc8 ? sc->oc8 + g0 : NULL, sc->oc8 ? sc->oc8 + g1 : NULL, sc->fs + f0,
            sc->fs + f1, sc->ofs ? sc->ofs + f0 : NULL, sc->ofs ? sc->ofs + f1 : NULL, sc->bk,
            sc->ld, sc->per_super);
        return;
    }
    if (sc->s16) {
        isa->gemv_packed_pair_half[job->fmt](
            job->k, ldb, a, b0, b1, c, c + group, grid_at(job, 0, 0, jc),
            grid_at(job, 0, 0, jc + group), grid_at(job, 1, 0, jc),
            grid_at(job, 1, 0, jc + group), sc->bk, sc->ld);
        return;
    }
    const float *s0, *o0, *s1, *o1; /* a float32 grid's own: never widened into scale_buf */
    int64_t lds;
    float_scales(job, 0, job->k, jc, group, scale_buf, &s0, &o0, &lds);
    float_scales(job, 0, job->k, jc + group, group, scale_buf, &s1, &o1, &lds);
    isa->gemv_packed_pair[job->fmt](job->k, ldb, a, b0, b1, c, c + group, s0, s1, o0, o1,
                                    sc->bk, lds);
}

/* The block of C of rows [i0, i1) and columns [j0, j1) (j0 a multiple of job_grain),
 * on the calling thread. */
static void matmul_block(matmul_job *job, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    if (j0 >= j1 || i0 >= i1) return;
    if (job->bias)
        bias_block(i1 - i0, j1 - j0, job->bias + j0, job->c + i0 * job->ldc + j0, job->ldc);
    else if (!job->accumulate)
        zero_block(i1 - i0, j1 - j0, job->c + i0 * job->ldc + j0, job->ldc);
    if (job->k == 0) return;
    const int64_t rows = i1 - i0;
    if (job->m == 1 || rows == 2 || paired_rows(job, rows)) {
        /* one or two rows: nothing to amortise, so stream B once, straight, for them all; a
         * tile would leave half its rows empty and read B as one stream of short runs. A few
         * more rows on packed groups (paired_rows): two at a time (four with quad_walk),
         * each chunk of B read by every pair in turn, the pairs after the first finding it
         * in L2. */
        const nm_isa_kernels *isa = job->isa;
        const int slot = job->slot;
        /* Packed weights whose scales come in blocks shorter than k (GGUF's 32 rows): a call
         * per block over every column would read each group 32 rows at a time, hopping from
         * group to group; chunks of a few slivers (never past their group's end) taken
         * through all of k keep the group one stream, and one packed gemv call per chunk
         * keeps its C in registers. */
        const int64_t chunk_slivers = rows > 1 ? NM_BLOCKED_GEMV_SLIVERS : NM_GEMV_SLIVERS;
        const int64_t chunk = job->packed && job->scales && job->scales->bk < job->k
                                  ? chunk_slivers * isa->nr
                                  : j1 - j0;
        /* a binary16 grid's block, widened for the row-major gemvs (the packed ones read it
         * as it is); a factored grid's blocks, multiplied out for either, on packed weights
         * NM_FACTORED_CHUNK_ROWS rows of k at a time (factored_chunks) */
        const nm_scales *sc = job->scales;
        const int widen = widened_grid(sc) && !(job->packed && sc->s16);
        int64_t k_chunk = 0; /* whole blocks, at least one */
        if (widen && job->packed)
            k_chunk = sc->bk < NM_FACTORED_CHUNK_ROWS ? NM_FACTORED_CHUNK_ROWS / sc->bk * sc->bk
                                                      : sc->bk;
        const int64_t call_blocks = k_chunk ? scale_blocks(job, k_chunk) : 1;
        /* the packed walks read whole slivers' scales, the last one's padding too */
        const int64_t chunk_pad = (chunk + isa->nr - 1) / isa->nr * isa->nr;
        const size_t s_bytes = (size_t)(2 * call_blocks * chunk_pad) * sizeof(float);
        const int buffered = widen && !(k_chunk && walks_factored_grid(job, rows));
        float *scale_buf = buffered ? aligned_alloc(64, (s_bytes + 63) / 64 * 64) : NULL;
        if (buffered && !scale_buf) {
            atomic_store(&job->failed, 1);
            return;
        }
        /* packed weights: slb bytes from a sliver to the next (the layout's own offset:
         * side by side in a group of several, a whole sliver apart in a group of one); a
         * call's columns lie in one group when it has several */
        const int64_t group = nm_pack_width(isa, job->fmt);
        const int64_t slb = nm_packed_offset(job->k / nm_format_table[job->fmt].kpack, group,
                                             nm_format_table[job->fmt].itemsize, 0, isa->nr);
        const int cut = packed_in_groups(job);
        const nm_gemv4_packed_half_fn quad = quad_walk(job);
        /* with an m == 4 walk, the three rows left after the fours (m = 3, 7) run as a four
         * too, on copies: their A with a zero fourth row, and their C tile (c_pad) */
        float *a_pad = NULL;
        if ((quad || (k_chunk && factored_quad(job))) && rows % 4 == 3) {
            const size_t a_bytes = (size_t)(4 * job->k) * sizeof(float);
            a_pad = aligned_alloc(64, (a_bytes + 63) / 64 * 64);
            if (!a_pad) {
                free(scale_buf);
                atomic_store(&job->failed, 1);
                return;
            }
            for (int64_t r = 0; r < 3; ++r)
                memcpy(a_pad + r * job->k, job->a + (i1 - 3 + r) * job->lda,
                       (size_t)job->k * sizeof(float));
            memset(a_pad + 3 * job->k, 0, (size_t)job->k * sizeof(float));
        }
        /* one row on two whole groups at a time, where the row has pair walks for the
         * format and its grid and takes two streams on this CPU (nm_gemv_packed_pair_fn; a
         * factored grid's where the row walks it itself, walks_factored_grid) */
        const int pairs =
            rows == 1 && cut && sc && chunk >= group && nm_gemv_streams(isa->gemv_streams) == 2 &&
            (k_chunk ? nm_factored(sc) && walks_factored_grid(job, 1) &&
                           isa->gemv_packed_factored_pair[job->fmt] != NULL
             : sc->s16 ? isa->gemv_packed_pair_half[job->fmt] != NULL
                       : isa->gemv_packed_pair[job->fmt] != NULL);
        for (int64_t jc = j0, w; jc < j1; jc += w) {
            const int64_t to_group_end = cut ? group - jc % group : j1 - jc;
            w = min64(min64(chunk, j1 - jc), to_group_end);
            if (pairs && w == group && j1 - jc >= 2 * group) {
                pair_of_groups(job, i0, jc, group, scale_buf);
                w = 2 * group;
                continue;
            }
            if (k_chunk) { /* a factored grid on packed weights */
                factored_chunks(job, i0, i1, jc, w, k_chunk, slb, scale_buf, a_pad);
                continue;
            }
            for (int64_t ir = i0, pair; ir < i1; ir += pair) {
                pair = quad && i1 - ir >= 4                                   ? 4
                       : a_pad && i1 - ir == 3 && w <= NM_QUAD_PAD_COLUMNS ? 3
                                                                           : min64(2, i1 - ir);
                const float *a = job->a + ir * job->lda;
                float *c = job->c + ir * job->ldc + jc;
                /* packed weights: one call through all of k, the kernel stepping through
                 * the blocks of scales with C in registers (nm_gemv_packed_fn); row-major
                 * ones: a call per block of scales */
                for (int64_t p0 = 0, p1; p0 < job->k; p0 = p1) {
                    p1 = job->packed ? job->k : k_range_end(job, p0, job->k);
                    int64_t ldb;
                    const uint8_t *b = weights_at(job, p0, jc, &ldb);
                    const int64_t bk = job->packed && sc ? sc->bk : p1 - p0;
                    if (job->packed && sc && sc->s16) {
                        const int64_t lds = sc->ld;
                        const uint16_t *s = grid_at(job, 0, p0, jc);
                        const uint16_t *o = grid_at(job, 1, p0, jc);
                        if (pair == 1)
                            isa->gemv_packed_half[job->fmt](p1 - p0, ldb, slb, w, a + p0, b, c,
                                                            s, o, bk, lds);
                        else if (pair == 4)
                            quad(p1 - p0, ldb, slb, w, a + p0, job->lda, b, c, job->ldc, s, o,
                                 bk, lds);
                        else if (pair == 3) {
                            float c_pad[4 * NM_QUAD_PAD_COLUMNS];
                            three_rows_in(c_pad, c, job->ldc, w);
                            quad(p1 - p0, ldb, slb, w, a_pad + p0, job->k, b, c_pad, w, s, o,
                                 bk, lds);
                            three_rows_out(c, job->ldc, c_pad, w);
                        }
                        else
                            isa->gemv2_packed_half[job->fmt](p1 - p0, ldb, slb, w, a + p0,
                                                             job->lda, b, c, job->ldc, s, o,
                                                             bk, lds);
                        continue;
                    }
                    const float *s, *o;
                    int64_t lds;
                    float_scales(job, p0, p1, jc, w, scale_buf, &s, &o, &lds);
                    if (pair == 1 && job->packed)
                        isa->gemv_packed[slot](p1 - p0, ldb, slb, w, a + p0, b, c, s, o, bk, lds);
                    else if (pair == 1)
                        isa->gemv[slot](p1 - p0, w, a + p0, b, ldb, c, s, o);
                    else if (job->packed)
                        isa->gemv2_packed[slot](p1 - p0, ldb, slb, w, a + p0, job->lda, b, c,
                                                job->ldc, s, o, bk, lds);
                    else
                        isa->gemv2[slot](p1 - p0, w, a + p0, job->lda, b, ldb, c, job->ldc, s, o);
                }
            }
        }
        free(scale_buf);
        free(a_pad);
    } else if (matmul_tiled(job, i0, i1, j0, j1) != NM_OK) {
        atomic_store(&job->failed, 1);
    }
}

static void matmul_part(void *ctx, int part, int parts) {
    (void)parts; /* = row_parts x col_parts */
    matmul_job *job = ctx;
    int64_t i0, i1, j0, j1;
    column_range(job->n, job_grain(job), part % job->col_parts, job->col_parts, &j0, &j1);
    row_range(job->m, job->isa->mr, part / job->col_parts, job->row_parts, &i0, &i1);
    matmul_block(job, i0, i1, j0, j1);
}

/* Jobs below this cost (in tile multiply-adds) do not wake sleeping workers: in a model,
 * framework code between layers outlasts the workers' spin, and waking a sleeping worker
 * cost 100-200 us in the VM narrowmm was tuned on (a 384 x 384 bf16 layer at m = 12 took
 * 56 us on one thread, 100 us on two with the worker asleep, 46 us with it spinning). */
#define NM_WAKE_MIN_WORK ((int64_t)1 << 24)
/* A weight streamed by a gemv (m <= 2, bandwidth-bound) costs about this many tile
 * multiply-adds of time. */
#define NM_GEMV_WEIGHT_COST 4

static _Atomic int64_t wake_min_work = NM_WAKE_MIN_WORK;

void nm_set_wake_min_work(int64_t work) { atomic_store(&wake_min_work, work < 0 ? 0 : work); }

int64_t nm_get_wake_min_work(void) { return atomic_load(&wake_min_work); }

/* -1: each row's own distance (nm_isa_kernels.packed_gemv_ahead); the walks read it */
_Atomic int64_t nm_packed_gemv_ahead_forced = -1;

void nm_set_packed_gemv_ahead(int64_t bytes) {
    atomic_store_explicit(&nm_packed_gemv_ahead_forced, bytes < 0 ? -1 : bytes,
                          memory_order_relaxed);
}

int64_t nm_get_packed_gemv_ahead(void) {
    return atomic_load_explicit(&nm_packed_gemv_ahead_forced, memory_order_relaxed);
}

/* -1: each row's own decode (nm_isa_kernels.nibble_decode); the walks read it */
_Atomic int nm_nibble_decode_forced = -1;

void nm_set_nibble_decode(int decode) {
    atomic_store_explicit(&nm_nibble_decode_forced,
                          decode < 0 ? -1 : decode ? NM_NIBBLE_DECODE_PERMUTE
                                                   : NM_NIBBLE_DECODE_IN_PLACE,
                          memory_order_relaxed);
}

int nm_get_nibble_decode(void) {
    return atomic_load_explicit(&nm_nibble_decode_forced, memory_order_relaxed);
}

/* -1: each row's own (nm_isa_kernels.gemv_streams); matmul_block reads it once a call */
_Atomic int nm_gemv_streams_forced = -1;

void nm_set_gemv_streams(int streams) {
    atomic_store_explicit(&nm_gemv_streams_forced, streams == 1 || streams == 2 ? streams : -1,
                          memory_order_relaxed);
}

int nm_get_gemv_streams(void) {
    return atomic_load_explicit(&nm_gemv_streams_forced, memory_order_relaxed);
}

/* -1 until the first read or a reset: the default, from the L2 the OS reports */
static _Atomic int64_t sliver_outer_a_bytes = -1;

int64_t nm_sliver_outer_a_default(void) {
    const int64_t l2 = nm_l2_cache_bytes();
    return l2 < NM_SLIVER_OUTER_A_MIN ? NM_SLIVER_OUTER_A_MIN
           : l2 > NM_SLIVER_OUTER_A_MAX ? NM_SLIVER_OUTER_A_MAX
                                        : l2;
}

void nm_set_sliver_outer_a_bytes(int64_t bytes) {
    atomic_store(&sliver_outer_a_bytes, bytes < 0 ? -1 : bytes); /* -1: the next read's default */
}

int64_t nm_get_sliver_outer_a_bytes(void) {
    int64_t bytes = atomic_load(&sliver_outer_a_bytes);
    if (bytes < 0) {
        /* a set() between the load and here wins: the exchange fails and returns its value */
        int64_t unset = -1;
        bytes = nm_sliver_outer_a_default();
        if (!atomic_compare_exchange_strong(&sliver_outer_a_bytes, &unset, bytes)) bytes = unset;
    }
    return bytes;
}

/* Split a job across threads only if the workers are awake or the job pays for waking them.
 * Where a part runs never changes a bit. */
int nm_worth_waking(double cost) {
    return cost >= (double)atomic_load(&wake_min_work) || nm_pool_awake();
}

double nm_matmul_cost(int64_t m, int64_t n, int64_t k) {
    return (m <= 2 ? (double)NM_GEMV_WEIGHT_COST : (double)m) * (double)n * (double)k;
}

static int worth_waking(int64_t m, int64_t n, int64_t k) {
    return nm_worth_waking(nm_matmul_cost(m, n, k));
}

/* The bytes one group of a group-major factored grid takes: its factors (ld floats a
 * super-block), then its codes (ld bytes a block). */
static int64_t factored_group_bytes(const nm_scales *sc, int64_t k) {
    const int64_t blocks = k == 0 ? 1 : (k + sc->bk - 1) / sc->bk;
    const int64_t supers = (blocks + sc->per_super - 1) / sc->per_super;
    return (4 * supers + blocks) * sc->ld;
}

/* A job's fields, checked: NM_EINVAL for arguments the contract refuses. */
static int matmul_setup(matmul_job *job, const nm_isa_kernels *isa, int fmt, int64_t m,
                        int64_t n, int64_t k, const float *a, int64_t lda, const uint8_t *b,
                        int64_t ldb, int packed, float *c, int64_t ldc, int accumulate,
                        const float *bias, const nm_scales *scales) {
    if (fmt < 0 || fmt >= NM_FMT_COUNT || m < 0 || n < 0 || k < 0) return NM_EINVAL;
    if (bias && accumulate) return NM_EINVAL; /* a chain starts from one value */
    /* a scaled format needs its scales, and only it takes them */
    if ((nm_format_table[fmt].scaled != 0) != (scales != NULL)) return NM_EINVAL;
    if (scales && scales->bk <= 0) return NM_EINVAL;
    /* a row-major grid covers n columns; a group-major one (packed weights only) is a
     * group's nm_pack_width columns a block, each group's blocks clear of the next group's */
    if (scales && !scales->lsl && scales->ld < n) return NM_EINVAL;
    if (scales && scales->lsl &&
        (!packed || scales->ld != nm_pack_width(isa, fmt) ||
         scales->lsl < (k == 0 ? 1 : (k + scales->bk - 1) / scales->bk) * scales->ld))
        return NM_EINVAL;
    /* one grid: float32 (s, o), binary16 (s16, o16) for a format that takes it, on a row
     * with its binary16 gemvs, or factored (c8 and fs, oc8 and ofs: super-blocks of
     * per_super >= 1 blocks; group-major, each group's factors and codes in lsl bytes) */
    if (scales && ((!!scales->s + !!scales->s16 + !!scales->c8) != 1 ||
                   (scales->s16 && (scales->o || scales->oc8)) ||
                   (scales->s && (scales->o16 || scales->oc8)) ||
                   (scales->c8 && (scales->o || scales->o16))))
        return NM_EINVAL;
    if (scales && scales->c8 &&
        (!scales->fs || scales->per_super < 1 || !scales->oc8 != !scales->ofs ||
         scales->lsl % 4 || (scales->lsl && scales->lsl < factored_group_bytes(scales, k))))
        return NM_EINVAL;
    if (scales && scales->s16 && (!nm_format_table[fmt].half_scales ||
                                  !isa->gemv_packed_half[fmt] || !isa->gemv2_packed_half[fmt]))
        return NM_EINVAL;
    /* offsets exactly for the formats that have them */
    if (scales && (nm_format_table[fmt].offset != 0) != (scales->o || scales->o16 || scales->oc8))
        return NM_EINVAL;
    /* two rows a byte: whole bytes of k, and blocks of scales that end on one */
    const int64_t kpack = nm_format_table[fmt].kpack;
    if (k % kpack || (scales && scales->bk < k && scales->bk % kpack)) return NM_EINVAL;
    const int slot = scales && scales->finite ? nm_finite_slot(fmt) : fmt;
    *job = (matmul_job){.isa = isa, .fmt = fmt, .slot = slot,
                        .pack_slot = nm_pack_slot(slot, fmt, packed), .m = m, .n = n, .k = k,
                        .a = a, .lda = lda, .b = b, .ldb = ldb, .c = c, .ldc = ldc,
                        .accumulate = accumulate, .bias = bias, .packed = packed,
                        .scales = scales,
                        .long_k_blocks = long_k_blocks(isa, fmt, m, packed, scales),
                        .col_parts = 1, .row_parts = 1};
    return NM_OK;
}

static int matmul_run(const nm_isa_kernels *isa, int fmt, int64_t m, int64_t n, int64_t k,
                      const float *a, int64_t lda, const uint8_t *b, int64_t ldb, int packed,
                      float *c, int64_t ldc, int accumulate, const float *bias,
                      const nm_scales *scales) {
    matmul_job job;
    const int st = matmul_setup(&job, isa, fmt, m, n, k, a, lda, b, ldb, packed, c, ldc,
                                accumulate, bias, scales);
    if (st != NM_OK) return st;
    if (m == 0 || n == 0) return NM_OK;
    if ((double)m * (double)n * (double)k >= (double)NM_PARALLEL_MIN_WORK &&
        worth_waking(m, n, k)) {
        /* Columns first: each weight is then decoded by one thread only. When there are
         * fewer column grains than threads (narrow outputs), the rest split the rows, each
         * row part decoding its columns' weights again: fine for the narrow n that asks
         * for it. */
        const int threads = nm_get_num_threads();
        const int64_t grains = (n + job_grain(&job) - 1) / job_grain(&job);
        job.col_parts = (int)min64(threads, grains);
        const int64_t tiles = m / isa->mr;
        if (job.col_parts < threads && tiles >= 2)
            job.row_parts = (int)min64(threads / job.col_parts, tiles);
    }
    nm_parallel_run(matmul_part, &job, job.col_parts * job.row_parts);
    return atomic_load(&job.failed) ? NM_ENOMEM : NM_OK;
}

int nm_matmul(const nm_isa_kernels *isa, int fmt, int64_t m, int64_t n, int64_t k,
              const float *a, int64_t lda, const uint8_t *b, int64_t ldb, float *c,
              int64_t ldc, int accumulate, const float *bias, const nm_scales *scales) {
    return matmul_run(isa, fmt, m, n, k, a, lda, b, ldb, 0, c, ldc, accumulate, bias, scales);
}

int nm_matmul_packed(const nm_isa_kernels *isa, int fmt, int64_t m, int64_t n, int64_t k,
                     const float *a, int64_t lda, const uint8_t *b, float *c, int64_t ldc,
                     int accumulate, const float *bias, const nm_scales *scales) {
    return matmul_run(isa, fmt, m, n, k, a, lda, b, 0, 1, c, ldc, accumulate, bias, scales);
}

int nm_linear_run(const nm_isa_kernels *isa, const nm_linear *layer, int64_t m, const float *a,
                  int64_t lda, float *c, int64_t ldc) {
    return matmul_run(isa, layer->fmt, m, layer->n, layer->k, a, lda, layer->b, layer->ldb,
                      layer->packed, c, ldc, 0, layer->bias,
                      layer->has_scales ? &layer->scales : NULL);
}

/* Several layers on one A, run as one job: their output columns, counted in grains, are
 * split over the threads together, so one wake-up serves all of them and a narrow layer
 * (a key or value projection) shares the threads with the others instead of running
 * alone. Each column is still its own chain, computed by one thread: no bit changes. */
typedef struct matmul_many_job {
    int count;
    matmul_job jobs[NM_LINEAR_MANY_MAX];
    int64_t grains[NM_LINEAR_MANY_MAX + 1]; /* running sum of each layer's column grains */
} matmul_many_job;

static void matmul_many_part(void *ctx, int part, int parts) {
    matmul_many_job *mj = ctx;
    const int64_t total = mj->grains[mj->count];
    const int64_t g0 = total * part / parts, g1 = total * (part + 1) / parts;
    for (int i = 0; i < mj->count; ++i) {
        const int64_t lo = g0 > mj->grains[i] ? g0 : mj->grains[i];
        const int64_t hi = min64(g1, mj->grains[i + 1]);
        matmul_job *job = &mj->jobs[i];
        if (lo < hi)
            matmul_block(job, 0, job->m, (lo - mj->grains[i]) * job_grain(job),
                         min64(job->n, (hi - mj->grains[i]) * job_grain(job)));
    }
}

int nm_linear_run_many(const nm_isa_kernels *isa, int count, const nm_linear *const layers[],
                       int64_t m, const float *a, int64_t lda, float *const c[],
                       const int64_t ldc[]) {
    if (count < 1 || count > NM_LINEAR_MANY_MAX) return NM_EINVAL;
    matmul_many_job mj = {.count = count};
    double cost = 0;
    for (int i = 0; i < count; ++i) {
        const nm_linear *L = layers[i];
        const int st = matmul_setup(&mj.jobs[i], isa, L->fmt, m, L->n, L->k, a, lda, L->b,
                                    L->ldb, L->packed, c[i], ldc[i], 0, L->bias,
                                    L->has_scales ? &L->scales : NULL);
        if (st != NM_OK) return st;
        const int64_t grain = job_grain(&mj.jobs[i]);
        mj.grains[i + 1] = mj.grains[i] + (L->n + grain - 1) / grain;
        cost += nm_matmul_cost(m, L->n, L->k);
    }
    if (m == 0) return NM_OK;
    int parts = 1;
    if (cost >= (double)NM_PARALLEL_MIN_WORK && nm_worth_waking(cost))
        parts = (int)min64(nm_get_num_threads(), mj.grains[count]);
    nm_parallel_run(matmul_many_part, &mj, parts);
    for (int i = 0; i < count; ++i)
        if (atomic_load(&mj.jobs[i].failed)) return NM_ENOMEM;
    return NM_OK;
}
