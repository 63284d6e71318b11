/* narrowmm perf harness: how fast can m == 1 read fp16 weights, by layout? (x86-64, AVX2)
 *
 * Times six ways of reading the same number of cold bytes, on 1..4 persistent threads, in
 * turn, so that every way sees the same moment of a noisy machine:
 *   sequential   each thread sums its contiguous half of the buffer (the bench's read probe)
 *   row pattern  each thread sums its columns of every row, four rows at a time, no math
 *   row gemv     the library's avx2 gemv (NM_DEFINE_GEMV_SIMD) on row-major weights
 *   sliver gemv  weights stored sliver-major (each 24-column sliver's k rows contiguous),
 *                four slivers at a time with 12 accumulators in registers: four long
 *                streams per thread. Same fma chain per column, so the same bits.
 *   panel96 gemv 96-column panels, four at a time, C in L1 (four streams, C traffic)
 *   sliver8 gemv 8-column slivers, twelve at a time in registers (twelve streams)
 * It is not part of the library or its tests; it backs the measurements in docs/kernels.md.
 *
 *   cc -O2 -mavx2 -mfma -mf16c -Icsrc/kernels tools/perf/gemv_layouts.c -o /tmp/gemv_layouts \
 *      -lpthread -lm && /tmp/gemv_layouts 4096 4032 2          # k, n (a multiple of 96), threads
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "x86_common.h"

#define MAX_THREADS 4
#define REPS 60

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline __m256 load8_fp16(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
#define FMADD8(acc, x, y) _mm256_fmadd_ps(x, y, acc)
NM_DEFINE_GEMV_SIMD(gemv_rows, 2, __m256, 8, _mm256_set1_ps, _mm256_loadu_ps, _mm256_storeu_ps,
                    load8_fp16, FMADD8, PREFETCH_T0, load1_fp16_f16c)

/* slivers [0, count) of 24 columns, each k x 48 bytes contiguous; count a multiple of 4 */
static void gemv_slivers(int64_t k, int64_t count, const float *a, const uint8_t *b, float *c) {
    const int64_t sliver = k * 48;
    for (int64_t s = 0; s < count; s += 4) {
        const uint8_t *b0 = b + s * sliver, *b1 = b0 + sliver, *b2 = b1 + sliver,
                      *b3 = b2 + sliver;
        __m256 acc[12];
        for (int i = 0; i < 12; ++i) acc[i] = _mm256_setzero_ps();
        for (int64_t p = 0; p < k; ++p) {
            const __m256 ap = _mm256_set1_ps(a[p]);
            const int64_t o = p * 48;
#pragma GCC unroll 3
            for (int v = 0; v < 3; ++v) {
                acc[v] = _mm256_fmadd_ps(ap, load8_fp16(b0 + o + 16 * v), acc[v]);
                acc[3 + v] = _mm256_fmadd_ps(ap, load8_fp16(b1 + o + 16 * v), acc[3 + v]);
                acc[6 + v] = _mm256_fmadd_ps(ap, load8_fp16(b2 + o + 16 * v), acc[6 + v]);
                acc[9 + v] = _mm256_fmadd_ps(ap, load8_fp16(b3 + o + 16 * v), acc[9 + v]);
            }
        }
        for (int i = 0; i < 12; ++i) _mm256_storeu_ps(c + s * 24 + 8 * i, acc[i]);
    }
}

/* The same four-slivers-at-a-time walk over other stream widths, for comparison:
 * 96-column panels (k x 192 bytes each), four at a time with C in L1, four rows a group;
 * 8-column slivers (k x 16 bytes each), twelve at a time with 12 accumulators. */
static void gemv_panels96(int64_t k, int64_t panels, const float *a, const uint8_t *b,
                          float *c) {
    const int64_t panel = k * 192;
    memset(c, 0, (size_t)(panels * 96) * sizeof(float));
    for (int64_t q0 = 0; q0 < panels; q0 += 4)
        for (int64_t p = 0; p + 4 <= k; p += 4)
            for (int64_t q = q0; q < q0 + 4 && q < panels; ++q)
                for (int v = 0; v < 12; v += 4) { /* four independent chains at a time */
                    const uint8_t *r = b + q * panel + p * 192 + 16 * v;
                    float *cv = c + q * 96 + 8 * v;
                    __m256 acc[4];
#pragma GCC unroll 4
                    for (int u = 0; u < 4; ++u) acc[u] = _mm256_loadu_ps(cv + 8 * u);
#pragma GCC unroll 4
                    for (int i = 0; i < 4; ++i) {
                        const __m256 ai = _mm256_set1_ps(a[p + i]);
#pragma GCC unroll 4
                        for (int u = 0; u < 4; ++u)
                            acc[u] = _mm256_fmadd_ps(ai, load8_fp16(r + 192 * i + 16 * u),
                                                     acc[u]);
                    }
#pragma GCC unroll 4
                    for (int u = 0; u < 4; ++u) _mm256_storeu_ps(cv + 8 * u, acc[u]);
                }
}

static void gemv_slivers8(int64_t k, int64_t groups, const float *a, const uint8_t *b,
                          float *c) {
    const int64_t sliver = k * 16;
    for (int64_t g = 0; g < groups; ++g) {
        const uint8_t *bg = b + g * 12 * sliver;
        __m256 acc[12];
        for (int i = 0; i < 12; ++i) acc[i] = _mm256_setzero_ps();
        for (int64_t p = 0; p < k; ++p) {
            const __m256 ap = _mm256_set1_ps(a[p]);
#pragma GCC unroll 12
            for (int i = 0; i < 12; ++i)
                acc[i] = _mm256_fmadd_ps(ap, load8_fp16(bg + i * sliver + p * 16), acc[i]);
        }
        for (int i = 0; i < 12; ++i) _mm256_storeu_ps(c + g * 96 + 8 * i, acc[i]);
    }
}

enum { SEQUENTIAL, ROW_PATTERN, ROW_GEMV, SLIVER_GEMV, PANEL96_GEMV, SLIVER8_GEMV, WAYS };
static const char *way_name[WAYS] = {"sequential", "row pattern", "row gemv",
                                     "sliver gemv", "panel96 gemv", "sliver8 gemv"};

typedef struct {
    int way, part, parts;
    const uint8_t *b;
    int64_t k, n;
    const float *a;
    float *c;
    __m256i sink;
} job;

static pthread_barrier_t start_bar, end_bar;
static job jobs[MAX_THREADS];

static void run(job *j) {
    const int64_t row_bytes = j->n * 2, total = j->k * row_bytes;
    __m256i s0 = _mm256_setzero_si256(), s1 = s0;
    if (j->way == SEQUENTIAL) {
        const int64_t begin = total / j->parts / 64 * 64 * j->part;
        const int64_t end = j->part + 1 == j->parts ? total : begin + total / j->parts / 64 * 64;
        for (int64_t o = begin; o < end; o += 64) {
            s0 = _mm256_add_epi32(s0, _mm256_load_si256((const __m256i *)(j->b + o)));
            s1 = _mm256_add_epi32(s1, _mm256_load_si256((const __m256i *)(j->b + o + 32)));
        }
    } else if (j->way == ROW_PATTERN || j->way == ROW_GEMV) {
        const int64_t grains = j->n / 96; /* whole 96-column grains, as the library splits */
        const int64_t c0 = grains * j->part / j->parts * 96;
        const int64_t c1 = grains * (j->part + 1) / j->parts * 96;
        if (j->way == ROW_GEMV) {
            memset(j->c + c0, 0, (size_t)(c1 - c0) * sizeof(float));
            gemv_rows(j->k, c1 - c0, j->a, j->b + 2 * c0, row_bytes, j->c + c0);
        } else {
            for (int64_t p = 0; p + 4 <= j->k; p += 4)
                for (int64_t o = 2 * c0; o < 2 * c1; o += 64)
                    for (int q = 0; q < 4; ++q) {
                        const uint8_t *r = j->b + (p + q) * row_bytes + o;
                        _mm_prefetch((const char *)(r + 4 * row_bytes), _MM_HINT_T0);
                        s0 = _mm256_add_epi32(s0, _mm256_loadu_si256((const __m256i *)r));
                        s1 = _mm256_add_epi32(s1, _mm256_loadu_si256((const __m256i *)(r + 32)));
                    }
        }
    } else { /* the sliver-major layouts: whole 96-column groups per thread */
        const int64_t groups = j->n / 96;
        const int64_t g0 = groups * j->part / j->parts, g1 = groups * (j->part + 1) / j->parts;
        const uint8_t *bg = j->b + g0 * j->k * 192;
        if (j->way == SLIVER_GEMV) gemv_slivers(j->k, 4 * (g1 - g0), j->a, bg, j->c + g0 * 96);
        if (j->way == PANEL96_GEMV) gemv_panels96(j->k, g1 - g0, j->a, bg, j->c + g0 * 96);
        if (j->way == SLIVER8_GEMV) gemv_slivers8(j->k, g1 - g0, j->a, bg, j->c + g0 * 96);
    }
    j->sink = _mm256_add_epi32(s0, s1);
}

static void *worker(void *arg) {
    for (;;) {
        pthread_barrier_wait(&start_bar);
        run(arg);
        pthread_barrier_wait(&end_bar);
    }
    return NULL;
}

/* the two gemvs give the same bits on one matrix stored both ways (checked before timing) */
static int same_bits_both_layouts(void) {
    enum { K = 37, N = 192 };
    static uint16_t rows[K * N], slivers[K * N];
    static float a[K], c_rows[N], c_slivers[N];
    uint32_t x = 12345;
    for (int i = 0; i < K * N; ++i) {
        x = x * 1664525u + 1013904223u;
        rows[i] = (uint16_t)(0x3000 + (x >> 20)); /* finite fp16 values of both signs */
        if (x & 0x100) rows[i] |= 0x8000;
    }
    for (int p = 0; p < K; ++p) a[p] = 0.37f * (float)(p % 5) - 0.5f;
    for (int j = 0; j < N; ++j) /* sliver j / 24 holds K rows of 24 columns */
        for (int p = 0; p < K; ++p) slivers[(j / 24) * K * 24 + p * 24 + j % 24] = rows[p * N + j];
    memset(c_rows, 0, sizeof c_rows);
    gemv_rows(K, N, a, (const uint8_t *)rows, 2 * N, c_rows);
    gemv_slivers(K, N / 24, a, (const uint8_t *)slivers, c_slivers);
    return memcmp(c_rows, c_slivers, sizeof c_rows) == 0;
}

static int by_value(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s k n threads   (n a multiple of 96, threads 1..%d)\n", argv[0],
                MAX_THREADS);
        return 2;
    }
    const int64_t k = atol(argv[1]), n = atol(argv[2]);
    const int threads = atoi(argv[3]);
    if (k < 4 || n < 96 || n % 96 || threads < 1 || threads > MAX_THREADS) {
        fprintf(stderr, "need k >= 4, n a positive multiple of 96, 1..%d threads\n", MAX_THREADS);
        return 2;
    }
    if (!same_bits_both_layouts()) {
        fprintf(stderr, "the sliver gemv does not give the row gemv's bits\n");
        return 1;
    }
    const size_t bytes = (size_t)(k * n * 2), huge = (size_t)2 << 20;
    const int copies = (int)(160e6 / (double)bytes) + WAYS; /* each way reads cold copies */
    uint8_t **b = malloc((size_t)copies * sizeof *b);
    for (int i = 0; i < copies; ++i) {
        b[i] = aligned_alloc(huge, (bytes + huge - 1) / huge * huge);
        madvise(b[i], bytes, MADV_HUGEPAGE);
        for (size_t q = 0; q < bytes / 2; ++q) ((uint16_t *)b[i])[q] = (uint16_t)(0x3c00 + (q & 255));
    }
    float *a = malloc((size_t)k * sizeof *a), *c = aligned_alloc(64, (size_t)n * sizeof *c);
    for (int64_t i = 0; i < k; ++i) a[i] = 1e-3f * (float)(i & 7);

    pthread_barrier_init(&start_bar, NULL, (unsigned)threads + 1);
    pthread_barrier_init(&end_bar, NULL, (unsigned)threads + 1);
    pthread_t tid[MAX_THREADS];
    for (int t = 0; t < threads; ++t) pthread_create(&tid[t], NULL, worker, &jobs[t]);

    static double secs[WAYS][REPS];
    for (int r = 0; r < REPS; ++r)
        for (int way = 0; way < WAYS; ++way) {
            const uint8_t *weights = b[(WAYS * r + way) % copies];
            for (int t = 0; t < threads; ++t)
                jobs[t] = (job){way, t, threads, weights, k, n, a, c, _mm256_setzero_si256()};
            const double t0 = now();
            pthread_barrier_wait(&start_bar);
            pthread_barrier_wait(&end_bar);
            secs[way][r] = now() - t0;
        }
    printf("k=%ld n=%ld (%.1f MB fp16), %d thread(s), median GB/s:", (long)k, (long)n,
           (double)bytes / 1e6, threads);
    for (int way = 0; way < WAYS; ++way) {
        qsort(secs[way], REPS, sizeof(double), by_value);
        printf("  %s %.1f", way_name[way], (double)bytes / secs[way][REPS / 2] / 1e9);
    }
    printf("\n");
    return 0;
}
