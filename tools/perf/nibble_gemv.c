/* narrowmm perf harness: how fast can an m == 1 gemv run on 4-bit GGUF blocks? (x86-64, AVX2)
 *
 * One thread, the frame's walk for row-major Q4_1 weights under 32-row blocks of scales (a
 * call per block over all columns, C reloaded per block), six ways, each the same chain
 * c = fma(a[p], fma(q, d, m), c) over p ascending, so each must give the library's bits
 * (checked before anything is timed):
 *   library   gemv_q4_1_avx2 itself (kernels_avx2.c, included below): vpmovzxbd of 8 bytes,
 *             mask / shift, vcvtdq2ps, four vectors of columns (32) a step
 *   in-lane   16 bytes broadcast to both 128-bit lanes, vpshufb to dwords (no lane-crossing
 *             widening, which llvm-mca models as 3 cycles of two pipes on Zen 3)
 *   or-2^23   the codes OR-ed into the float 2^23 + q, then 2^23 subtracted: an integer op
 *             and an add instead of the conversion
 *   8 vectors the library's walk with 64 columns a step (8 chains in flight, not 4)
 *   prefetch  the library's walk plus a prefetch of each row 512 bytes ahead
 *   tiles     another layout: per 32 columns and 32-row block, scales, offsets and codes
 *             contiguous (768 bytes), walked through all of k with C in registers (one stream)
 * Hot: one matrix, timed again and again (L2 for 512 x 1024). Cold: `copies` matrices in
 * turn, more than the L3 holds. Prints the best and mean G weights/s of each. `smollm2`: the
 * 120 Q4_1 layers of SmolLM2-135M (30 x q/k/v fused, o, gate/up fused, down), each its own
 * matrix, walked a token at a time, library against tiles (the two layouts of one token
 * alternate). It is not part of the library or its tests; it backs the 4-bit figures in
 * docs/kernels.md.
 *
 *   cc -O2 -mavx2 -mfma -mf16c -ffp-contract=off -Icsrc -Icsrc/kernels -Icsrc/include \
 *      tools/perf/nibble_gemv.c csrc/kernels/scalar/kernels_scalar.c -lm -o /tmp/nibble_gemv
 *   /tmp/nibble_gemv 512 1024 1 300      # k, n, copies, calls: hot
 *   /tmp/nibble_gemv 4096 4096 12 24     # cold (12 x 12.6 MB)
 *   /tmp/nibble_gemv smollm2 30          # tokens
 */
#define _GNU_SOURCE
#include "kernels/avx2/kernels_avx2.c"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef void (*gemv_fn)(int64_t k, int64_t n, const float *a, const uint8_t *b, int64_t ldb,
                        float *c, const float *s, const float *o);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* 16 columns of one stored row, spread to dwords inside each 128-bit lane */
static inline void nibbles16_in_lane(const uint8_t *p, __m256i m0, __m256i m1, __m256 *lo0,
                                     __m256 *hi0, __m256 *lo1, __m256 *hi1) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    const __m256i x0 = _mm256_shuffle_epi8(v, m0), x1 = _mm256_shuffle_epi8(v, m1);
    const __m256i f = _mm256_set1_epi32(15);
    *lo0 = _mm256_cvtepi32_ps(_mm256_and_si256(x0, f));
    *hi0 = _mm256_cvtepi32_ps(_mm256_srli_epi32(x0, 4));
    *lo1 = _mm256_cvtepi32_ps(_mm256_and_si256(x1, f));
    *hi1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(x1, 4));
}

#define STEP_Q4_1(acc, lo, hi, sp, op)                                                       \
    acc = _mm256_fmadd_ps(al, _mm256_fmadd_ps(lo, _mm256_loadu_ps(sp), _mm256_loadu_ps(op)), acc); \
    acc = _mm256_fmadd_ps(ah, _mm256_fmadd_ps(hi, _mm256_loadu_ps(sp), _mm256_loadu_ps(op)), acc)

static void gemv_in_lane(int64_t k, int64_t n, const float *a, const uint8_t *b, int64_t ldb,
                         float *c, const float *s, const float *o) {
    const __m256i m0 = _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1,
                                        -1, 4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7, -1,
                                        -1, -1);
    const __m256i m1 = _mm256_setr_epi8(8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11, -1,
                                        -1, -1, 12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1,
                                        15, -1, -1, -1);
    for (int64_t j = 0; j + 32 <= n; j += 32) {
        __m256 c0 = _mm256_loadu_ps(c + j), c1 = _mm256_loadu_ps(c + j + 8),
               c2 = _mm256_loadu_ps(c + j + 16), c3 = _mm256_loadu_ps(c + j + 24);
        for (int64_t r = 0; r < k / 2; ++r) {
            const uint8_t *q = b + r * ldb + j;
            const __m256 al = _mm256_set1_ps(a[2 * r]), ah = _mm256_set1_ps(a[2 * r + 1]);
            __m256 l0, h0, l1, h1;
            nibbles16_in_lane(q, m0, m1, &l0, &h0, &l1, &h1);
            STEP_Q4_1(c0, l0, h0, s + j, o + j);
            STEP_Q4_1(c1, l1, h1, s + j + 8, o + j + 8);
            nibbles16_in_lane(q + 16, m0, m1, &l0, &h0, &l1, &h1);
            STEP_Q4_1(c2, l0, h0, s + j + 16, o + j + 16);
            STEP_Q4_1(c3, l1, h1, s + j + 24, o + j + 24);
        }
        _mm256_storeu_ps(c + j, c0);
        _mm256_storeu_ps(c + j + 8, c1);
        _mm256_storeu_ps(c + j + 16, c2);
        _mm256_storeu_ps(c + j + 24, c3);
    }
}

/* the codes as 2^23 + q (exact), then q = that - 2^23 (exact) */
static inline void nibbles8_or(const uint8_t *p, __m256 *lo, __m256 *hi) {
    const __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i two23_bits = _mm256_set1_epi32(0x4B000000);
    const __m256 two23 = _mm256_set1_ps(8388608.0f);
    *lo = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(
                            _mm256_and_si256(v, _mm256_set1_epi32(15)), two23_bits)), two23);
    *hi = _mm256_sub_ps(
        _mm256_castsi256_ps(_mm256_or_si256(_mm256_srli_epi32(v, 4), two23_bits)), two23);
}
#define NIBBLES8_OR(p, lo, hi) nibbles8_or((p), &(lo), &(hi))

#define DEFINE_WALK(NAME, V, NIBBLES, PREFETCH)                                              \
    static void NAME(int64_t k, int64_t n, const float *a, const uint8_t *b, int64_t ldb,   \
                     float *c, const float *s, const float *o) {                            \
        for (int64_t j = 0; j + (V) * 8 <= n; j += (V) * 8) {                                \
            if (PREFETCH)                                                                    \
                for (int64_t r = 0; r < k / 2; ++r)                                          \
                    _mm_prefetch((const char *)(b + r * ldb + j + 512), _MM_HINT_T0);        \
            NM_NIBBLE_ROWS_(__m256, 8, V, 1, _mm256_set1_ps, _mm256_loadu_ps,                \
                            _mm256_storeu_ps, FMADD8, NIBBLES, DEQ8_Q4_1, k, a, 0, b, ldb, c, \
                            0, s, o, j);                                                     \
        }                                                                                    \
    }
DEFINE_WALK(gemv_or_two23, 4, NIBBLES8_OR, 0)
DEFINE_WALK(gemv_8_vectors, 8, NIBBLES8, 0)
DEFINE_WALK(gemv_prefetch, 4, NIBBLES8, 1)

/* tiles: per 32 columns g and 32-row block t, {s[32], o[32], codes[16][32]} at
 * t + (g * blocks + t) * 768 */
enum { TILE_BYTES = 256 + 512 };

static void make_tiles(int64_t k, int64_t n, const uint8_t *b, const float *s, const float *o,
                       uint8_t *t) {
    const int64_t blocks = k / 32;
    for (int64_t g = 0; g < n / 32; ++g)
        for (int64_t bk = 0; bk < blocks; ++bk) {
            uint8_t *tile = t + (g * blocks + bk) * TILE_BYTES;
            memcpy(tile, s + bk * n + g * 32, 128);
            memcpy(tile + 128, o + bk * n + g * 32, 128);
            for (int r = 0; r < 16; ++r) memcpy(tile + 256 + r * 32, b + (bk * 16 + r) * n + g * 32, 32);
        }
}

static void gemv_tiles(int64_t k, int64_t n, const float *a, const uint8_t *t, float *c) {
    const int64_t blocks = k / 32;
    for (int64_t g = 0; g < n / 32; ++g) {
        __m256 acc[4];
        for (int v = 0; v < 4; ++v) acc[v] = _mm256_loadu_ps(c + g * 32 + v * 8);
        for (int64_t bk = 0; bk < blocks; ++bk) {
            const uint8_t *tile = t + (g * blocks + bk) * TILE_BYTES;
            const float *s = (const float *)tile, *o = s + 32, *ab = a + bk * 32;
            const uint8_t *q = tile + 256;
            for (int r = 0; r < 16; ++r) {
                const __m256 al = _mm256_set1_ps(ab[2 * r]), ah = _mm256_set1_ps(ab[2 * r + 1]);
                _Pragma("GCC unroll 4") for (int v = 0; v < 4; ++v) {
                    __m256 lo, hi;
                    nibbles8(q + r * 32 + v * 8, &lo, &hi);
                    STEP_Q4_1(acc[v], lo, hi, s + 8 * v, o + 8 * v);
                }
            }
        }
        for (int v = 0; v < 4; ++v) _mm256_storeu_ps(c + g * 32 + v * 8, acc[v]);
    }
}

/* the frame's walk: a call per 32-row block (row-major variants) */
static void run(int variant, gemv_fn fn, int64_t k, int64_t n, const float *a,
                const uint8_t *b, const float *s, const float *o, const uint8_t *t, float *c) {
    memset(c, 0, (size_t)n * sizeof(float));
    if (variant == 5) {
        gemv_tiles(k, n, a, t, c);
        return;
    }
    for (int64_t p = 0; p < k; p += 32)
        fn(32, n, a + p, b + p / 2 * n, n, c, s + p / 32 * n, o + p / 32 * n);
}

/* the SmolLM2 walk: one matrix per layer, both layouts, a token of each in turn */
static int smollm2_walk(int tokens) {
    static const int64_t shapes[4][2] = {{576, 960}, {576, 576}, {576, 3072}, {1536, 576}};
    enum { LAYERS = 30 * 4 };
    struct { int64_t k, n; uint8_t *b, *t; float *s, *o; } layers[LAYERS];
    int64_t weights = 0;
    srand(3);
    for (int i = 0; i < LAYERS; ++i) {
        const int64_t k = shapes[i % 4][0], n = shapes[i % 4][1];
        const int64_t codes = k / 2 * n, grid = k / 32 * n;
        layers[i].k = k, layers[i].n = n;
        layers[i].b = malloc((size_t)codes);
        layers[i].s = malloc((size_t)grid * 4), layers[i].o = malloc((size_t)grid * 4);
        layers[i].t = malloc((size_t)(k / 32 * (n / 32) * TILE_BYTES));
        for (int64_t j = 0; j < codes; ++j) layers[i].b[j] = (uint8_t)rand();
        for (int64_t j = 0; j < grid; ++j)
            layers[i].s[j] = 0x1p-10f * (float)(rand() % 2048 + 1),
            layers[i].o[j] = -0x1p-8f * (float)(rand() % 512);
        make_tiles(k, n, layers[i].b, layers[i].s, layers[i].o, layers[i].t);
        weights += k * n;
    }
    float a[1536], c[3072], want[3072];
    for (int j = 0; j < 1536; ++j) a[j] = (float)(rand() % 2001 - 1000) / 997.0f;
    double best[2] = {1e30, 1e30}, total[2] = {0, 0};
    for (int tok = 0; tok < tokens; ++tok)
        for (int v = 0; v < 2; ++v) {
            const double t0 = now();
            for (int i = 0; i < LAYERS; ++i)
                run(v ? 5 : 0, gemv_q4_1_avx2, layers[i].k, layers[i].n, a, layers[i].b,
                    layers[i].s, layers[i].o, layers[i].t, v ? c : want);
            const double dt = now() - t0;
            best[v] = dt < best[v] ? dt : best[v];
            total[v] += dt;
            if (v && memcmp(c, want, sizeof c) != 0) {
                fprintf(stderr, "tiles differ from the library\n");
                return 1;
            }
        }
    printf("SmolLM2's Q4_1 layers (%lld weights a token), %d tokens each:\n", (long long)weights,
           tokens);
    for (int v = 0; v < 2; ++v)
        printf("  %-8s mean %6.2f ms (best %6.2f), %5.2f G weights/s\n", v ? "tiles" : "library",
               total[v] / tokens * 1e3, best[v] * 1e3, (double)weights / (total[v] / tokens) * 1e-9);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "smollm2") == 0)
        return smollm2_walk(argc > 2 ? atoi(argv[2]) : 30);
    const int64_t k = argc > 1 ? atol(argv[1]) : 4096, n = argc > 2 ? atol(argv[2]) : 4096;
    const int copies = argc > 3 ? atoi(argv[3]) : 1, calls = argc > 4 ? atoi(argv[4]) : 20;
    if (k % 32 || n % 64 || copies < 1 || calls < 1) {
        fprintf(stderr, "k a multiple of 32, n of 64\n");
        return 2;
    }
    const int64_t codes = k / 2 * n, grid = k / 32 * n, tiles = k / 32 * (n / 32) * TILE_BYTES;
    uint8_t *b = malloc((size_t)(codes * copies)), *t = malloc((size_t)(tiles * copies));
    float *s = malloc((size_t)(grid * copies) * 4), *o = malloc((size_t)(grid * copies) * 4);
    float *a = malloc((size_t)k * 4), *c = malloc((size_t)n * 4), *want = malloc((size_t)n * 4);
    srand(1);
    for (int64_t i = 0; i < codes * copies; ++i) b[i] = (uint8_t)rand();
    for (int64_t i = 0; i < grid * copies; ++i)
        s[i] = 0x1p-10f * (float)(rand() % 2048 + 1), o[i] = -0x1p-8f * (float)(rand() % 512);
    for (int64_t i = 0; i < k; ++i) a[i] = (float)(rand() % 2001 - 1000) / 997.0f;
    for (int cp = 0; cp < copies; ++cp)
        make_tiles(k, n, b + cp * codes, s + cp * grid, o + cp * grid, t + cp * tiles);
    static const struct { const char *name; gemv_fn fn; } variants[] = {
        {"library", gemv_q4_1_avx2}, {"in-lane", gemv_in_lane}, {"or-2^23", gemv_or_two23},
        {"8 vectors", gemv_8_vectors}, {"prefetch", gemv_prefetch}, {"tiles", NULL},
    };
    enum { VARIANTS = sizeof variants / sizeof variants[0] };
    run(0, variants[0].fn, k, n, a, b, s, o, t, want);
    for (int v = 1; v < VARIANTS; ++v) { /* the same bits, or nothing is timed */
        run(v, variants[v].fn, k, n, a, b, s, o, t, c);
        if (memcmp(c, want, (size_t)n * 4) != 0) {
            fprintf(stderr, "%s differs from the library\n", variants[v].name);
            return 1;
        }
    }
    double best[VARIANTS], total[VARIANTS];
    for (int v = 0; v < VARIANTS; ++v) best[v] = 1e30, total[v] = 0;
    for (int i = 0; i < calls; ++i) /* the variants in turn, so all see the same machine */
        for (int v = 0; v < VARIANTS; ++v) {
            const int cp = (i * VARIANTS + v) % copies;
            const double t0 = now();
            run(v, variants[v].fn, k, n, a, b + cp * codes, s + cp * grid, o + cp * grid,
                t + cp * tiles, c);
            const double dt = now() - t0;
            best[v] = dt < best[v] ? dt : best[v];
            total[v] += dt;
        }
    printf("k %lld, n %lld, %d cop%s (%.1f MB), %d calls each\n", (long long)k, (long long)n,
           copies, copies == 1 ? "y" : "ies", (double)(codes + 8 * grid) * copies / 1e6, calls);
    for (int v = 0; v < VARIANTS; ++v)
        printf("  %-10s best %6.2f  mean %6.2f  G weights/s\n", variants[v].name,
               (double)(k * n) / best[v] * 1e-9, (double)(k * n) / (total[v] / calls) * 1e-9);
    return 0;
}
