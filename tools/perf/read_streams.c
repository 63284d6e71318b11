/* narrowmm perf harness: does one core read memory faster as several streams than as one,
 * while a decode keeps its vector pipes busy?
 *
 * It reads 1 GiB of 64-byte lines as S streams side by side (the buffer's S parts, a line of
 * each in turn, or `--run` bytes of each in turn), prefetching 2048 bytes down each stream
 * as the packed walks do, and spends K shift + permute + FMA triples of AVX-512 work on every
 * line (a 4-bit walk's decode costs about 12 such operations a line, a byte walk's about 15
 * of its own). It prints GB/s for S = 1, 2 and 4 at each K, and the rate of the same work on
 * 256 KiB in L2 (no memory). It backs docs/results/gemv-streams-xeon-2026-12-07.txt and the
 * pair walks (nm_gemv_packed_pair_fn); it is not part of the library or its tests.
 *
 *     cc -O2 -mavx512f -o /tmp/read_streams tools/perf/read_streams.c
 *     taskset -c 0 /tmp/read_streams [--run BYTES]
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BUFFER_BYTES ((int64_t)1 << 30)
#define HOT_BYTES ((int64_t)256 << 10)
#define AHEAD 2048

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* one triple of work on the line's vector v into accumulator j */
#define WORK(j)                                                                              \
    acc[(j) & 7] = _mm512_fmadd_ps(                                                          \
        _mm512_permutexvar_ps(_mm512_srli_epi32(v, (j) & 7), table), scale, acc[(j) & 7])

/* `bytes` of b as `streams` parts read `run` bytes of each in turn, `triples` (0, 4, 8, 12
 * or 16) of work a line; the sum keeps the work alive */
static __attribute__((noinline)) float walk(const uint8_t *b, int64_t bytes, int streams,
                                            int triples, int64_t run, int ahead) {
    __m512 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm512_setzero_ps();
    const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 scale = _mm512_set1_ps(1.0001f);
    const int64_t part = bytes / streams;
    for (int64_t at = 0; at < part; at += run)
        for (int s = 0; s < streams; ++s)
            for (int64_t off = at; off < at + run && off < part; off += 64) {
                const uint8_t *line = b + s * part + off;
                if (ahead) _mm_prefetch((const char *)line + ahead, _MM_HINT_T0);
                const __m512i v = _mm512_load_si512((const void *)line);
                switch (triples) { /* falls through: 16, 12, 8 or 4 triples */
                case 16: WORK(8); WORK(9); WORK(10); WORK(11); /* fall through */
                case 12: WORK(12); WORK(13); WORK(14); WORK(15); /* fall through */
                case 8: WORK(4); WORK(5); WORK(6); WORK(7); /* fall through */
                case 4: WORK(0); WORK(1); WORK(2); WORK(3); break;
                default: acc[0] = _mm512_add_ps(acc[0], _mm512_castsi512_ps(v));
                }
            }
    __m512 t = acc[0];
    for (int i = 1; i < 8; ++i) t = _mm512_add_ps(t, acc[i]);
    return _mm512_reduce_add_ps(t);
}

volatile float sink;

int main(int argc, char **argv) {
    int64_t run = 64;
    if (argc == 3 && strcmp(argv[1], "--run") == 0) run = atoll(argv[2]);
    if (argc != 1 && argc != 3) {
        fprintf(stderr, "usage: %s [--run BYTES]\n", argv[0]);
        return 2;
    }
    if (run < 64 || run % 64) {
        fprintf(stderr, "--run must be a positive multiple of 64, not %lld\n", (long long)run);
        return 2;
    }
    uint8_t *b = aligned_alloc(64, BUFFER_BYTES);
    if (!b) {
        fprintf(stderr, "cannot allocate %lld bytes\n", (long long)BUFFER_BYTES);
        return 1;
    }
    memset(b, 1, BUFFER_BYTES);
    printf("1 GiB as 1, 2, 4 streams, %lld bytes of each in turn, prefetch %d bytes ahead; "
           "best of 3\n", (long long)run, AHEAD);
    static const int triples[] = {0, 4, 8, 12, 16};
    for (size_t t = 0; t < sizeof triples / sizeof triples[0]; ++t) {
        printf("work %2d triples a line:", triples[t]);
        static const int streams[] = {1, 2, 4};
        for (size_t s = 0; s < 3; ++s) {
            double best = 1e30;
            for (int r = 0; r < 3; ++r) {
                const double t0 = seconds();
                sink += walk(b, BUFFER_BYTES, streams[s], triples[t], run, AHEAD);
                const double dt = seconds() - t0;
                best = dt < best ? dt : best;
            }
            printf("  %d: %5.1f GB/s", streams[s], (double)BUFFER_BYTES / best / 1e9);
        }
        double best = 1e30;
        for (int r = 0; r < 5; ++r) {
            const double t0 = seconds();
            for (int i = 0; i < 400; ++i) sink += walk(b, HOT_BYTES, 1, triples[t], 64, 0);
            const double dt = seconds() - t0;
            best = dt < best ? dt : best;
        }
        printf("  L2: %5.1f GB/s\n", 400.0 * (double)HOT_BYTES / best / 1e9);
    }
    free(b);
    return 0;
}
