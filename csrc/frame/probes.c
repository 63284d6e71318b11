/* narrowmm: measure the machine's limits with a row's probe kernels on the thread pool:
 * float32 FMA throughput and read bandwidth. The benchmark reports every result as a
 * fraction of these, measured in the same run. */
#define _POSIX_C_SOURCE 199309L
#include <time.h>

#include "../include/narrowmm.h"
#include "threads.h"

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct probe_job {
    const nm_isa_kernels *row;
    int64_t iters;
    const float *buf;
    int64_t n;
    volatile float sink;
} probe_job;

static void fma_part(void *ctx, int part, int parts) {
    (void)part;
    (void)parts;
    probe_job *job = ctx;
    job->sink = job->row->probe_fma(job->iters);
}

static void read_part(void *ctx, int part, int parts) {
    probe_job *job = ctx;
    const int64_t chunks = job->n / 64; /* 64-float (256-byte) units keep alignment */
    const int64_t begin = chunks * part / parts * 64, end = chunks * (part + 1) / parts * 64;
    job->sink = job->row->probe_read(job->buf + begin, end - begin);
}

double nm_probe_fma(const nm_isa_kernels *row, int threads, int64_t iters, double *flops) {
    probe_job job = {row, iters, NULL, 0, 0.0f};
    const double t0 = now_seconds();
    nm_parallel_run(fma_part, &job, threads);
    const double dt = now_seconds() - t0;
    *flops = (double)threads * (double)iters * (double)row->probe_fma_flops;
    return dt;
}

double nm_probe_read(const nm_isa_kernels *row, int threads, const float *buf, int64_t n) {
    probe_job job = {row, 0, buf, n, 0.0f};
    const double t0 = now_seconds();
    nm_parallel_run(read_part, &job, threads);
    return now_seconds() - t0;
}
