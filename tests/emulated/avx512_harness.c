/* narrowmm test harness: the avx512 row run inside an instruction-set emulator.
 *
 * Built freestanding (no C library, no OS) together with the real frame (frame/matmul.c)
 * and the real kernel rows, so what the emulator executes is the code narrowmm ships,
 * compiled with the row's own flags. The few C library functions the core calls are
 * provided here; threads become a serial loop over the same column parts.
 * tests/test_avx512_emulated.py builds it and drives it through tests/emulated/machine.py. */
#include <stddef.h>
#include <stdint.h>

#include "include/narrowmm.h"
#include "frame/threads.h"

/* ---- the C library, as far as the core needs it --------------------------------------- */

void *memcpy(void *dst, const void *src, size_t n) {
    unsigned char *d = dst;
    const unsigned char *s = src;
    for (size_t i = 0; i < n; ++i) d[i] = s[i];
    return dst;
}

void *memset(void *dst, int value, size_t n) {
    unsigned char *d = dst;
    for (size_t i = 0; i < n; ++i) d[i] = (unsigned char)value;
    return dst;
}

float fmaf(float a, float b, float c) { return __builtin_fmaf(a, b, c); } /* one vfmadd */

/* A bump allocator over a static heap, reset before every job. */
#define HEAP_BYTES (16u << 20)
static _Alignas(64) unsigned char heap[HEAP_BYTES];
static size_t heap_used;

void *aligned_alloc(size_t alignment, size_t size) {
    size_t start = (heap_used + alignment - 1) / alignment * alignment;
    if (start + size > HEAP_BYTES) return NULL;
    heap_used = start + size;
    return heap + start;
}

void free(void *p) { (void)p; }

/* ---- threads: the same column parts, one after another ---------------------------------- */

static int emulated_threads = 1;

void nm_parallel_run(nm_task_fn fn, void *ctx, int parts) {
    for (int i = 0; i < parts; ++i) fn(ctx, i, parts);
}

int nm_get_num_threads(void) { return emulated_threads; }

/* "awake" workers: every job big enough to split is split, small shapes included */
int nm_pool_awake(void) { return 1; }

long nm_parallel_jobs(void) { return 0; }

/* ---- the OS ------------------------------------------------------------------------------ */

/* no OS to report the L2: the frame takes its fallback limit for slivers outside (512 KiB) */
int64_t nm_l2_cache_bytes(void) { return 0; }

/* ---- the entry point ------------------------------------------------------------------------ */

enum { EMU_MATMUL = 0, EMU_DECODE = 1, EMU_ENCODE = 2, EMU_MATMUL_PACKED = 3 };

typedef struct emu_job {
    int64_t op, fmt, m, n, k, lda, ldb, ldc, accumulate, threads;
    const float *a;    /* matmul: x; encode: the floats */
    const uint8_t *b;  /* matmul: weights (packed: the row's groups); decode: 16-bit patterns */
    void *c;           /* matmul: out; decode: floats; encode: 16-bit patterns */
    const float *s;    /* matmul of a scaled format: the kernels' scales (nm_scales), or 0 */
    int64_t s_ld, s_bk, s_finite;
    int64_t s_half;    /* s is a binary16 grid (nm_scales.s16; the GGUF formats) */
    int64_t s_lsl;     /* nm_scales.lsl: 0, or s is group-major (packed weights, nm_pack_width) */
    int64_t s_per_super; /* > 0: s is a factored grid (nm_scales.c8), super-blocks this long */
    int64_t nibble_decode; /* nm_set_nibble_decode's value for the job (-1: the row's own) */
    int64_t gemv_streams;  /* nm_set_gemv_streams's value for the job (-1: the row's own) */
    int64_t status;    /* written back: nm_matmul's status, or 1 once a codec ran */
} emu_job;

void nm_emu_main(emu_job *job) {
    nm_isa_kernels row;
    nm_fill_row_avx512(&row);
    heap_used = 0;
    emulated_threads = (int)job->threads;
    nm_set_nibble_decode((int)job->nibble_decode);
    nm_set_gemv_streams((int)job->gemv_streams);
    /* a format with offsets (Q4_1) has them below its scales, as the binding takes them */
    const int64_t blocks = job->s_bk > 0 && job->k > 0 ? (job->k + job->s_bk - 1) / job->s_bk : 1;
    const int with_offsets = job->fmt >= 0 && job->fmt < NM_FMT_COUNT &&
                             nm_format_table[job->fmt].offset;
    const uint16_t *s16 = job->s_half ? (const uint16_t *)job->s : 0;
    /* the offsets' grid: after the scales' blocks (row-major), or after every group's
     * (group-major: n padded to whole groups) */
    const int64_t width = job->s_lsl ? nm_pack_width(&row, (int)job->fmt) : 1;
    const int64_t lower = job->s_lsl ? (job->n + width - 1) / width * job->s_lsl
                                     : blocks * job->s_ld;
    const nm_scales scales =
        s16 ? (nm_scales){.s16 = s16, .ld = job->s_ld, .bk = job->s_bk,
                          .finite = (int)job->s_finite, .lsl = job->s_lsl,
                          .o16 = with_offsets ? s16 + lower : 0}
            : (nm_scales){.s = job->s, .ld = job->s_ld, .bk = job->s_bk,
                          .finite = (int)job->s_finite, .lsl = job->s_lsl,
                          .o = job->s && with_offsets ? job->s + lower : 0};
    /* a factored grid: the factors, then the codes, of each grid (row-major) or of each
     * group (group-major, the offsets' groups after the scales') */
    nm_scales factored = {.ld = job->s_ld, .bk = job->s_bk, .finite = (int)job->s_finite,
                          .lsl = job->s_lsl, .per_super = job->s_per_super};
    if (job->s_per_super > 0) {
        const int64_t supers = blocks / job->s_per_super, grids = with_offsets ? 2 : 1;
        const int8_t *base = (const int8_t *)job->s;
        factored.fs = job->s;
        factored.c8 = base + (job->s_lsl ? 4 * supers * job->s_ld
                                         : grids * 4 * supers * job->s_ld);
        if (with_offsets) {
            const int64_t groups = (job->n + width - 1) / width;
            factored.ofs = job->s + (job->s_lsl ? groups * job->s_lsl / 4 : supers * job->s_ld);
            factored.oc8 = factored.c8 + (job->s_lsl ? groups * job->s_lsl : blocks * job->s_ld);
        }
    }
    const nm_scales *sc = !job->s ? 0 : job->s_per_super > 0 ? &factored : &scales;
    /* no bias here: the frame writes it (matmul_part), the same C on every row; the
     * scalar and avx2 rows test it in csrc/tests and tests/test_api.py */
    switch (job->op) {
    case EMU_MATMUL:
        job->status = nm_matmul(&row, (int)job->fmt, job->m, job->n, job->k, job->a, job->lda,
                                job->b, job->ldb, job->c, job->ldc, (int)job->accumulate, 0, sc);
        break;
    case EMU_MATMUL_PACKED:
        job->status = nm_matmul_packed(&row, (int)job->fmt, job->m, job->n, job->k, job->a,
                                       job->lda, job->b, job->c, job->ldc, (int)job->accumulate,
                                       0, sc);
        break;
    case EMU_DECODE:
        row.decode[job->fmt]((const uint16_t *)job->b, job->c, job->n);
        job->status = 1;
        break;
    case EMU_ENCODE:
        row.encode[job->fmt](job->a, job->c, job->n);
        job->status = 1;
        break;
    default:
        job->status = -100;
    }
}
