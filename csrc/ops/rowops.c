/* narrowmm: the row-wise model ops with one fixed order of operations per element or row,
 * so a row's result never depends on the other rows, the thread count or the ISA row.
 * Plain C compiled once with contraction off (no intrinsics): every build computes the same
 * IEEE operations in the same order. Threads take whole rows of a norm, and SiLU's elements
 * in runs (each element is its own chain). */
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>

#include "../include/narrowmm.h"
#include "../frame/threads.h"
#include "exact_math.h"

typedef struct rows_job {
    int op; /* 0: rms_norm, 1: silu */
    const nm_isa_kernels *row; /* silu: the row's silu slot */
    int64_t rows, n;
    const float *x;
    int64_t ldx;
    float eps;
    float *out;
    int64_t ldo;
} rows_job;

/* y = x / sqrt(mean(x^2) + eps): the squares are summed in double in ascending order (each
 * float product is exact in double), the mean rounded once to float32, then
 * r = 1 / sqrtf(mean + eps) and y[p] = x[p] * r in float32, as PyTorch's RMSNorm rounds. */
static void rms_norm_row(int64_t n, const float *x, float eps, float *y) {
    double squares = 0.0;
    for (int64_t p = 0; p < n; ++p) squares += (double)x[p] * (double)x[p];
    const float mean = (float)(squares / (double)n);
    const float r = 1.0f / sqrtf(mean + eps);
    for (int64_t p = 0; p < n; ++p) y[p] = x[p] * r;
}

/* SiLU's part `part` of `parts`: a run of the elements in row order, cut at multiples of
 * NM_SILU_RUN so that a part's vectors start where they would on one thread. */
#define NM_SILU_RUN 32
static int64_t silu_runs(int64_t n) { return (n + NM_SILU_RUN - 1) / NM_SILU_RUN; }

static void silu_part(const rows_job *job, int part, int parts) {
    const int64_t runs = silu_runs(job->n); /* a row's */
    const int64_t e0 = job->rows * runs * part / parts * NM_SILU_RUN;
    const int64_t e1 = job->rows * runs * (part + 1) / parts * NM_SILU_RUN;
    const int64_t stride = runs * NM_SILU_RUN; /* a row's runs, the last one perhaps short */
    for (int64_t i = e0 / stride; i < job->rows && i * stride < e1; ++i) {
        const int64_t p0 = e0 > i * stride ? e0 - i * stride : 0;
        const int64_t p1 = e1 - i * stride < job->n ? e1 - i * stride : job->n;
        if (p1 > p0)
            job->row->silu(p1 - p0, job->x + i * job->ldx + p0, job->out + i * job->ldo + p0);
    }
}

static void rows_part(void *ctx, int part, int parts) {
    const rows_job *job = ctx;
    if (job->op == 1) {
        silu_part(job, part, parts);
        return;
    }
    const int64_t r0 = job->rows * part / parts, r1 = job->rows * (part + 1) / parts;
    for (int64_t i = r0; i < r1; ++i) {
        const float *x = job->x + i * job->ldx;
        float *y = job->out + i * job->ldo;
        if (job->op == 0)
            rms_norm_row(job->n, x, job->eps, y);
        else
            job->row->silu(job->n, x, y);
    }
}

/* A silu element costs about this many multiply-adds of time (a 13-term polynomial and a
 * division in double, two lanes at a time); a norm element two. */
#define NM_SILU_COST 8.0
#define NM_NORM_COST 2.0
/* Below this cost a row op runs on the caller alone even while the workers spin (a decode
 * step holds them awake, nm_pool_hold): handing parts over outlasts the work. On a Zen 4 at
 * two threads, workers spinning, a Qwen3 head norm (16 rows of 128, cost 4096) took 0.2-1.6
 * us less a call on the caller alone, a SiLU of 1536 0.6 us less
 * (docs/results/row-ops-min-work-zen4-2026-12-06.txt). A wake_min_work below it (0: the
 * tests' "split every call") lowers it too. */
#define NM_ROWS_MIN_WORK 16384.0

static int rows_run(rows_job *job, double cost_per_element) {
    if (job->rows < 0 || job->n < 0) return NM_EINVAL;
    if (job->rows == 0 || job->n == 0) return NM_OK;
    int parts = 1;
    const double cost = cost_per_element * (double)job->rows * (double)job->n;
    const double wake = (double)nm_get_wake_min_work();
    if (cost >= (wake < NM_ROWS_MIN_WORK ? wake : NM_ROWS_MIN_WORK) && nm_worth_waking(cost)) {
        const int threads = nm_get_num_threads();
        /* a norm's rows; SiLU's runs of elements (a decode step's one row too) */
        const int64_t pieces = job->op == 1 ? job->rows * silu_runs(job->n) : job->rows;
        parts = pieces < threads ? (int)pieces : threads;
    }
    nm_parallel_run(rows_part, job, parts);
    return NM_OK;
}

int nm_rms_norm(int64_t rows, int64_t n, const float *x, int64_t ldx, float eps, float *out,
                int64_t ldo) {
    rows_job job = {0, NULL, rows, n, x, ldx, eps, out, ldo};
    return rows_run(&job, NM_NORM_COST);
}

int nm_silu(const nm_isa_kernels *row, int64_t rows, int64_t n, const float *x, int64_t ldx,
            float *out, int64_t ldo) {
    rows_job job = {1, row, rows, n, x, ldx, 0.0f, out, ldo};
    return rows_run(&job, NM_SILU_COST);
}
