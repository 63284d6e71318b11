/* narrowmm: the loops around the microkernels. This file decides zeroing, the m == 1
 * streaming path, cache blocking, packing and how work is split across threads; it never
 * touches intrinsics.
 *
 * Bit-exactness: every C element is carried through k in ascending order, either by one
 * gemv call over all k or by consecutive kc blocks whose microkernel calls load C, extend
 * its fma chain and store it back. Storing a float32 partial result and reloading it is
 * exact, so blocking never changes a bit. Threads split the output columns (disjoint C
 * elements), never k, so the thread count never changes a bit either. */
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "../include/narrowmm.h"
#include "threads.h"

const nm_format_info nm_format_table[NM_FMT_COUNT] = {
    [NM_FMT_F32] = {"f32", 4},
    [NM_FMT_FP16] = {"fp16", 2},
    [NM_FMT_BF16] = {"bf16", 2},
};

/* Column ranges handed to threads are multiples of this many columns: a whole number of
 * 64-byte lines of B for every format and of slivers for every row (NR <= 64). */
#define NM_COLUMN_GRAIN 64
/* Below this many multiply-adds a call runs on the calling thread: waking workers would
 * cost more than it saves. */
#define NM_PARALLEL_MIN_WORK ((int64_t)1 << 18)

static int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }

typedef struct matmul_job {
    const nm_kernel_row *row;
    int fmt;
    int64_t m, n, k;
    const float *a;
    int64_t lda;
    const uint8_t *b;
    int64_t ldb;
    float *c;
    int64_t ldc;
    int accumulate;
    atomic_int failed; /* a part could not allocate its buffer */
} matmul_job;

static void zero_block(int64_t m, int64_t n, float *c, int64_t ldc) {
    for (int64_t i = 0; i < m; ++i) memset(c + i * ldc, 0, (size_t)n * sizeof(float));
}

/* m > 1 on columns [j_begin, j_end). For each k block (ascending), walk the column blocks:
 * decode a kc x nc block of B once into a packed panel (read row by row), then sweep its
 * NR-wide slivers over every row of A. The k block of A (m x kc) stays in L1/L2 through the
 * whole walk; the pack kernel is told which block comes next so it can prefetch it. */
static int matmul_packed(const matmul_job *job, int64_t j_begin, int64_t j_end) {
    const nm_kernel_row *row = job->row;
    const int64_t itemsize = nm_format_table[job->fmt].itemsize;
    const int64_t mr = row->mr, nr = row->nr, kc_max = row->kc;
    const int64_t nc_max = (row->nc + nr - 1) / nr * nr;
    size_t bytes = ((size_t)(kc_max * nc_max) * sizeof(float) + 63) / 64 * 64;
    float *panel = aligned_alloc(64, bytes);
    if (!panel) return NM_ENOMEM;
    for (int64_t pc = 0; pc < job->k; pc += kc_max) {
        const int64_t kc = min64(kc_max, job->k - pc);
        const uint8_t *b_block = job->b + pc * job->ldb;
        for (int64_t jc = j_begin; jc < j_end; jc += nc_max) {
            const int64_t nc = min64(nc_max, j_end - jc);
            const uint8_t *next = jc + nc_max < j_end ? b_block + (jc + nc_max) * itemsize
                                  : pc + kc_max < job->k
                                      ? b_block + kc_max * job->ldb + j_begin * itemsize
                                      : NULL;
            row->pack[job->fmt](kc, nc, b_block + jc * itemsize, job->ldb, (int)nr, panel,
                                next);
            for (int64_t jr = 0; jr < nc; jr += nr) {
                const float *sliver = panel + (jr / nr) * kc * nr;
                for (int64_t ic = 0; ic < job->m; ic += mr) {
                    row->ukernel(kc, min64(mr, job->m - ic), min64(nr, nc - jr),
                                 job->a + ic * job->lda + pc, job->lda, sliver,
                                 job->c + ic * job->ldc + jc + jr, job->ldc);
                }
            }
        }
    }
    free(panel);
    return NM_OK;
}

static void column_range(int64_t n, int part, int parts, int64_t *begin, int64_t *end) {
    const int64_t grains = (n + NM_COLUMN_GRAIN - 1) / NM_COLUMN_GRAIN;
    *begin = min64(n, grains * part / parts * NM_COLUMN_GRAIN);
    *end = min64(n, grains * (part + 1) / parts * NM_COLUMN_GRAIN);
}

static void matmul_part(void *ctx, int part, int parts) {
    matmul_job *job = ctx;
    int64_t j0, j1;
    column_range(job->n, part, parts, &j0, &j1);
    if (j0 >= j1) return;
    float *c = job->c + j0;
    if (!job->accumulate) zero_block(job->m, j1 - j0, c, job->ldc);
    if (job->k == 0) return;
    if (job->m == 1) {
        /* nothing to amortise: stream B once, straight */
        const int64_t itemsize = nm_format_table[job->fmt].itemsize;
        job->row->gemv[job->fmt](job->k, j1 - j0, job->a, job->b + j0 * itemsize, job->ldb, c);
    } else if (matmul_packed(job, j0, j1) != NM_OK) {
        atomic_store(&job->failed, 1);
    }
}

int nm_matmul(const nm_kernel_row *row, int fmt, int64_t m, int64_t n, int64_t k,
              const float *a, int64_t lda, const uint8_t *b, int64_t ldb, float *c,
              int64_t ldc, int accumulate) {
    if (fmt < 0 || fmt >= NM_FMT_COUNT || m < 0 || n < 0 || k < 0) return NM_EINVAL;
    if (m == 0 || n == 0) return NM_OK;
    matmul_job job = {row, fmt, m, n, k, a, lda, b, ldb, c, ldc, accumulate, 0};
    int parts = 1;
    if ((double)m * (double)n * (double)k >= (double)NM_PARALLEL_MIN_WORK) {
        const int64_t grains = (n + NM_COLUMN_GRAIN - 1) / NM_COLUMN_GRAIN;
        parts = (int)min64(nm_get_num_threads(), grains);
    }
    nm_parallel_run(matmul_part, &job, parts);
    return atomic_load(&job.failed) ? NM_ENOMEM : NM_OK;
}
