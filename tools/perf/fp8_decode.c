/* narrowmm perf harness: how fast can an m == 1 gemv decode FP8 weights? (x86-64, AVX2)
 *
 * One thread, a 64 x 1024 e4m3fn matrix that stays in L1/L2, the gemv's walk (four rows of
 * B times four vectors of C in registers, 32 columns a step), each weight scaled and fed
 * to an FMA as the library's kernels do. Four ways to turn 8 codes into float32:
 *   sext    the finite-weights raw() before 2026-12-01: vpmovsxbd, vpslld, vpand (its
 *           subnormal codes came out as float32 subnormals: slow on Intel, see below)
 *   f16c    the finite-weights decode since: vpmovsxbw, vpsllw, vpand, vcvtph2ps (every
 *           finite code a normal float32 or zero)
 *   shift   raw() from one 32-byte load per row with shifts and masks only; the lanes then
 *           hold columns 4i+b, so C and the scales would have to be kept permuted
 *   table   a 256-entry float table through vpgatherdd
 *   bf16    the bf16 gemv's decode (vpmovzxwd, vpslld), no scale: the baseline
 * It is not part of the library or its tests; it backs the FP8 figures in docs/kernels.md.
 * The values are not checked (the bit patterns are arbitrary): only time is measured.
 *
 *   cc -O2 -mavx2 -mfma -mf16c tools/perf/fp8_decode.c -o /tmp/fp8_decode && /tmp/fp8_decode
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define N 1024
#define K 64
#define ROUNDS 2000

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float table[256];

/* The walk shared by the four: DECODE8(q, o) gives 8 weights of row p + q at column j + o
 * (already scaled where the variant scales), ROWS(...) applies four rows. */
#define WALK(NAME, ARGS, SETUP, ROW4)                                                        \
    __attribute__((noinline)) static void NAME ARGS {                                        \
        SETUP;                                                                               \
        for (int p = 0; p < K; p += 4) {                                                     \
            const __m256 a0 = _mm256_set1_ps(a[p]), a1 = _mm256_set1_ps(a[p + 1]);          \
            const __m256 a2 = _mm256_set1_ps(a[p + 2]), a3 = _mm256_set1_ps(a[p + 3]);      \
            for (int j = 0; j < N; j += 32) {                                                \
                __m256 c0 = _mm256_loadu_ps(c + j), c1 = _mm256_loadu_ps(c + j + 8);         \
                __m256 c2 = _mm256_loadu_ps(c + j + 16), c3 = _mm256_loadu_ps(c + j + 24);   \
                ROW4(0, a0) ROW4(1, a1) ROW4(2, a2) ROW4(3, a3)                              \
                _mm256_storeu_ps(c + j, c0), _mm256_storeu_ps(c + j + 8, c1);                \
                _mm256_storeu_ps(c + j + 16, c2), _mm256_storeu_ps(c + j + 24, c3);          \
            }                                                                                \
        }                                                                                    \
    }

#define LOAD8(q, o) _mm_loadl_epi64((const __m128i *)(b + (p + (q)) * N + j + (o)))
#define SCALED(w, o) _mm256_mul_ps(w, _mm256_loadu_ps(s + j + (o)))
#define FOUR(q, aq, D)                                                                       \
    c0 = _mm256_fmadd_ps(aq, D(q, 0), c0), c1 = _mm256_fmadd_ps(aq, D(q, 8), c1),           \
    c2 = _mm256_fmadd_ps(aq, D(q, 16), c2), c3 = _mm256_fmadd_ps(aq, D(q, 24), c3);

#define SEXT(q, o)                                                                           \
    SCALED(_mm256_castsi256_ps(_mm256_and_si256(                                             \
               _mm256_slli_epi32(_mm256_cvtepi8_epi32(LOAD8(q, o)), 20), mask)), o)
#define ROW_SEXT(q, aq) FOUR(q, aq, SEXT)
WALK(gemv_sext, (const uint8_t *b, const float *s, const float *a, float *c),
     const __m256i mask = _mm256_set1_epi32((int)0x87FFFFFF), ROW_SEXT)

/* sign-extended to 16 bits, << 7 puts the magnitude in a binary16's exponent and mantissa
 * and the sign in bit 15; 0xBF80 clears the copy of the sign that lands in bit 14 */
#define F16C(q, o)                                                                           \
    SCALED(_mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(LOAD8(q, o)), 7),  \
                                         _mm_set1_epi16((short)0xBF80))), o)
#define ROW_F16C(q, aq) FOUR(q, aq, F16C)
WALK(gemv_f16c, (const uint8_t *b, const float *s, const float *a, float *c), (void)0, ROW_F16C)

#define TABLE(q, o) SCALED(_mm256_i32gather_ps(table, _mm256_cvtepu8_epi32(LOAD8(q, o)), 4), o)
#define ROW_TABLE(q, aq) FOUR(q, aq, TABLE)
WALK(gemv_table, (const uint8_t *b, const float *s, const float *a, float *c), (void)0,
     ROW_TABLE)

/* byte b of every 32-bit lane to the top, then raw(): columns 4i + b in vector b */
#define RAW_TOP(v) _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(v, 4), mask))
#define ROW_SHIFT(q, aq)                                                                     \
    {                                                                                        \
        const __m256i v = _mm256_loadu_si256((const __m256i *)(b + (p + (q)) * N + j));      \
        c3 = _mm256_fmadd_ps(aq, SCALED(RAW_TOP(v), 24), c3);                                \
        c2 = _mm256_fmadd_ps(aq, SCALED(RAW_TOP(_mm256_slli_epi32(v, 8)), 16), c2);          \
        c1 = _mm256_fmadd_ps(aq, SCALED(RAW_TOP(_mm256_slli_epi32(v, 16)), 8), c1);          \
        c0 = _mm256_fmadd_ps(aq, SCALED(RAW_TOP(_mm256_slli_epi32(v, 24)), 0), c0);          \
    }
WALK(gemv_shift, (const uint8_t *b, const float *s, const float *a, float *c),
     const __m256i mask = _mm256_set1_epi32((int)0x87F00000), ROW_SHIFT)

#define BF16(q, o)                                                                           \
    _mm256_castsi256_ps(_mm256_slli_epi32(                                                   \
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + (p + (q)) * N + j + (o)))), \
        16))
#define ROW_BF16(q, aq) FOUR(q, aq, BF16)
WALK(gemv_bf16, (const uint16_t *h, const float *a, float *c), (void)0, ROW_BF16)

int main(void) {
    uint8_t *b = aligned_alloc(64, N * K);
    uint16_t *h = aligned_alloc(64, N * K * 2);
    float *s = aligned_alloc(64, N * 4), *c = aligned_alloc(64, N * 4), a[K];
    if (!b || !h || !s || !c) return 1;
    for (int i = 0; i < N * K; ++i) b[i] = (uint8_t)(rand() & 0x77), h[i] = 0x3F80;
    for (int i = 0; i < N; ++i) s[i] = 1e30f, c[i] = 0.0f;
    for (int i = 0; i < K; ++i) a[i] = 1e-3f;
    for (int i = 0; i < 256; ++i) table[i] = (float)i * 1e-30f;
    const double weights = (double)ROUNDS * N * K;
    for (int round = 0; round < 3; ++round) {
        double t = now(), ts, tf, tsh, tt, tb;
        for (int i = 0; i < ROUNDS; ++i) gemv_sext(b, s, a, c);
        ts = now() - t, t = now();
        for (int i = 0; i < ROUNDS; ++i) gemv_f16c(b, s, a, c);
        tf = now() - t, t = now();
        for (int i = 0; i < ROUNDS; ++i) gemv_shift(b, s, a, c);
        tsh = now() - t, t = now();
        for (int i = 0; i < ROUNDS; ++i) gemv_table(b, s, a, c);
        tt = now() - t, t = now();
        for (int i = 0; i < ROUNDS; ++i) gemv_bf16(h, a, c);
        tb = now() - t;
        printf("G weights/s: sext %.2f  f16c %.2f  shift %.2f  table %.2f  bf16 %.2f\n",
               weights / ts / 1e9, weights / tf / 1e9, weights / tsh / 1e9, weights / tt / 1e9,
               weights / tb / 1e9);
    }
    return c[5] > 1e30f; /* keeps the results alive */
}
