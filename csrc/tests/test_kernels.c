/* narrowmm: the C-level test driver. For every ISA row this CPU can run, every kernel's
 * output is compared bit for bit with the scalar row's (a NaN only has to meet a NaN):
 * codecs over all 65,536 16-bit patterns and a dense sample of float32 ones, the
 * 65,536-pattern kernel sweep on both paths (256 patterns x scales for FP8, on every path),
 * and random shapes across tile edges, strides, odd byte offsets, accumulate or a bias,
 * thread counts and blocks of scales, with guard cells around every output.
 * No Python involved: it runs under sanitizers and under qemu for other architectures.
 * Prints one line per problem and ends with "N passed, M failed". */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../frame/threads.h"
#include "../include/narrowmm.h"
#include "../codecs/codec_scalar.h" /* binary16 scales for the half-grid cases */
#include "../ops/exact_math.h"         /* nm_expf: the row's softmax exps element by element */

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h> /* _mm_getcsr: the denormal-operand flag */
#define NM_HAVE_MXCSR 1
#endif

static long passed, failed;

static void expect(int ok, const char *fmt, ...) {
    if (ok) {
        ++passed;
        return;
    }
    ++failed;
    if (failed <= 40) {
        va_list ap;
        va_start(ap, fmt);
        fputs("FAIL ", stdout);
        vprintf(fmt, ap);
        fputc('\n', stdout);
        va_end(ap);
    }
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t next_u64(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}
static float next_float(void) { /* roughly normal-ish values in [-2, 2) */
    return (float)((double)(next_u64() >> 11) / 9007199254740992.0 * 4.0 - 2.0);
}

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static int same(float a, float b) { return (isnan(a) && isnan(b)) || bits_of(a) == bits_of(b); }

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fputs("out of memory\n", stderr);
        exit(2);
    }
    return p;
}

/* One stored element of format fmt (item bytes at src) into packed weights at dst, as
 * nm_matmul_packed takes them: each byte XOR-ed with the format's packed_xor. */
static void pack_item(int fmt, uint8_t *dst, const uint8_t *src, int64_t item) {
    for (int64_t i = 0; i < item; ++i) dst[i] = nm_packed_code(fmt, src[i]);
}

/* ---- codecs ------------------------------------------------------------------------- */

/* The 8-bit formats: 256 codes each, with scales (and Q5_1 offsets; its API refuses the
 * bytes past 31, the kernels still take every byte exactly). */
static const int FORMATS8[] = {NM_FMT_E4M3FN, NM_FMT_E5M2, NM_FMT_Q8_0, NM_FMT_Q5_1};

/* The magnitude bits every NaN/Inf code of an 8-bit format has, or 0 for a format whose
 * codes are all finite (Q8_0's integers). */
static uint8_t special_bits(int fmt) {
    return fmt == NM_FMT_E4M3FN ? 0x7F : fmt == NM_FMT_E5M2 ? 0x7C : 0;
}

static void test_codecs(const nm_isa_kernels *row, const nm_isa_kernels *ref) {
    uint16_t *h = xmalloc(65536 * 2);
    float *got = xmalloc(65536 * 4), *want = xmalloc(65536 * 4);
    for (uint32_t i = 0; i < 65536; ++i) h[i] = (uint16_t)i;
    for (int fmt = NM_FMT_FP16; fmt <= NM_FMT_BF16; ++fmt) {
        row->decode[fmt](h, got, 65536);
        ref->decode[fmt](h, want, 65536);
        long bad = 0;
        for (int i = 0; i < 65536; ++i) bad += bits_of(got[i]) != bits_of(want[i]);
        expect(bad == 0, "%s %s: decode differs on %ld of 65536 patterns", row->isa,
               nm_format_table[fmt].name, bad);
    }
    /* encode: every 4093rd float32 pattern plus the edges of both formats */
    enum { CHUNK = 1 << 16 };
    float *x = xmalloc(CHUNK * 4);
    uint16_t *e1 = xmalloc(CHUNK * 2), *e2 = xmalloc(CHUNK * 2);
    const uint32_t edges[] = {0x00000000u, 0x33000000u, 0x387FF000u, 0x38800000u, 0x477FE000u,
                              0x47800000u, 0x7F7F0000u, 0x7F800000u, 0x7FC00000u};
    for (int fmt = NM_FMT_FP16; fmt <= NM_FMT_BF16; ++fmt) {
        long bad = 0, total = 0;
        for (uint64_t start = 0; start < (1ull << 32); start += (uint64_t)CHUNK * 4093) {
            for (int i = 0; i < CHUNK; ++i) {
                uint32_t u = (uint32_t)(start + (uint64_t)i * 4093);
                memcpy(&x[i], &u, 4);
            }
            row->encode[fmt](x, e1, CHUNK);
            ref->encode[fmt](x, e2, CHUNK);
            for (int i = 0; i < CHUNK; ++i) bad += e1[i] != e2[i];
            total += CHUNK;
        }
        for (size_t s = 0; s < sizeof edges / sizeof edges[0]; ++s) {
            for (int sign = 0; sign < 2; ++sign) {
                for (int i = 0; i < CHUNK; ++i) {
                    uint32_t u = (edges[s] - CHUNK / 2 + (uint32_t)i) ^ (sign ? 0x80000000u : 0);
                    memcpy(&x[i], &u, 4);
                }
                row->encode[fmt](x, e1, CHUNK);
                ref->encode[fmt](x, e2, CHUNK);
                for (int i = 0; i < CHUNK; ++i) bad += e1[i] != e2[i];
                total += CHUNK;
            }
        }
        expect(bad == 0, "%s %s: encode differs on %ld of %ld inputs", row->isa,
               nm_format_table[fmt].name, bad, total);
    }
    /* the 8-bit codecs: all 256 decodes, and a sample of encodes both ways of overflowing */
    uint8_t q[256], q1[CHUNK], q2[CHUNK];
    for (int i = 0; i < 256; ++i) q[i] = (uint8_t)i;
    for (size_t f8 = 0; f8 < sizeof FORMATS8 / sizeof FORMATS8[0]; ++f8) {
        const int fmt = FORMATS8[f8];
        row->decode8[fmt](q, got, 256);
        ref->decode8[fmt](q, want, 256);
        long bad = 0;
        for (int i = 0; i < 256; ++i) bad += bits_of(got[i]) != bits_of(want[i]);
        for (int sat = 0; sat < 2; ++sat)
            for (uint64_t start = 0; start < (1ull << 32); start += (uint64_t)CHUNK * 65521) {
                for (int i = 0; i < CHUNK; ++i) {
                    uint32_t u = (uint32_t)(start + (uint64_t)i * 65521);
                    memcpy(&x[i], &u, 4);
                }
                row->encode8[fmt](x, q1, CHUNK, sat);
                ref->encode8[fmt](x, q2, CHUNK, sat);
                for (int i = 0; i < CHUNK; ++i) bad += q1[i] != q2[i];
            }
        expect(bad == 0, "%s %s: 8-bit codec differs on %ld inputs", row->isa,
               nm_format_table[fmt].name, bad);
    }
    free(x), free(e1), free(e2), free(h), free(got), free(want);
}

/* ---- the kernel sweep: all patterns times 1.0 into a zeroed C ----------------------- */

/* FP8: each of the 256 patterns in every column position of a 2-row B under 4 scales
 * (columns of one scale each), so weight (p, j) is fl32(decode * s[j]) (Q5_1:
 * fma(decode, s[j], o[j]), with 4 offsets, one of them rounding off most of each weight);
 * a = (1, 1) sums
 * the two rows' weights with two fmas, the gemvs (m = 1, 2), the tiles (m = 4, a row's
 * half-height tile where it has one; m = 5) and the packed layout each checked against that
 * sum in float. */
static void test_sweep8(const nm_isa_kernels *row, const nm_isa_kernels *ref) {
    enum { N = 1024, K = 2 };
    static const float scales[4] = {1.0f, 0.0078125f, 3.3f, 1e-38f};
    static const float offsets[4] = {0.0f, -1.5f, 0.1f, 1e30f};
    uint8_t q[256], *b = xmalloc(K * N + 1), *bpk;
    float dec[256], *sc = xmalloc(4 * N + 4 * 64), *want = xmalloc(4 * N);
    float *of = xmalloc(4 * N + 4 * 64);
    const float a[5 * K] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    float *c = xmalloc(5 * 4 * N);
    /* the scales padded to whole slivers, the packed weights to whole groups */
    const int64_t nr = row->nr, ld = (N + nr - 1) / nr * nr, gw = nm_pack_width(row, NM_FMT_Q8_0);
    const int64_t ldw = (N + gw - 1) / gw * gw;
    bpk = xmalloc((size_t)(ldw * K));
    for (int i = 0; i < 256; ++i) q[i] = (uint8_t)i;
    for (size_t f8 = 0; f8 < sizeof FORMATS8 / sizeof FORMATS8[0]; ++f8) {
        const int fmt = FORMATS8[f8];
        ref->decode8[fmt](q, dec, 256);
        const float two_r = ldexpf(1.0f, nm_format_table[fmt].scale_exponent);
        const uint8_t special = special_bits(fmt);
        const int with_offsets = nm_format_table[fmt].offset;
        /* every code on the exact kernels, then the finite codes (the others replaced by
         * zero) on the finite-weights kernels */
        for (int finite = 0; finite < 2; ++finite) {
            for (int j = 0; j < N; ++j) {
                uint8_t q0 = (uint8_t)j, q1 = (uint8_t)(255 - j); /* row 1: the reverse */
                if (finite && special && (q0 & special) == special) q0 = 0;
                if (finite && special && (q1 & special) == special) q1 = 0;
                b[1 + j] = q0, b[1 + N + j] = q1;
                const float s = scales[j / 256], o = with_offsets ? offsets[j / 256] : 0.0f;
                sc[j] = s * two_r; /* the kernels' form */
                of[j] = o;
                const float w0 = with_offsets ? fmaf(dec[q0], s, o) : dec[q0] * s;
                const float w1 = with_offsets ? fmaf(dec[q1], s, o) : dec[q1] * s;
                want[j] = fmaf(1.0f, w1, fmaf(1.0f, w0, 0.0f));
            }
            for (int64_t j = N; j < ld; ++j) sc[j] = 1.0f, of[j] = 0.0f;
            memset(bpk, 0, (size_t)(ldw * K));
            for (int64_t j = 0; j < N; ++j)
                for (int p = 0; p < K; ++p)
                    bpk[nm_packed_offset(K, gw, 1, p, j)] = nm_packed_code(fmt, b[1 + p * N + j]);
            const nm_scales scl = {.s = sc, .ld = ld, .bk = K, .finite = finite,
                                   .o = with_offsets ? of : NULL};
            static const int64_t ms[] = {1, 2, 4, 5};
            for (int packed = 0; packed < 2; ++packed)
                for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; ++mi) {
                    const int64_t m = ms[mi];
                    int st = packed
                                 ? nm_matmul_packed(row, fmt, m, N, K, a, K, bpk, c, N, 0, NULL,
                                                    &scl)
                                 : nm_matmul(row, fmt, m, N, K, a, K, b + 1, N, c, N, 0, NULL, &scl);
                    long bad = 0;
                    for (int64_t i = 0; i < m; ++i)
                        for (int j = 0; j < N; ++j) bad += !same(c[i * N + j], want[j]);
                    expect(st == NM_OK && bad == 0,
                           "%s %s: sweep m=%lld packed=%d finite=%d differs on %ld", row->isa,
                           nm_format_table[fmt].name, (long long)m, packed, finite, bad);
                }
        }
    }
    free(b), free(bpk), free(sc), free(of), free(want), free(c);
}

/* The 4-bit formats: each of the 256 bytes (two codes) in every column position of one
 * stored row (k = 2) under 4 scales, with an offset per column for Q4_1, so each output is
 * fma(1, w_hi, fma(1, w_lo, 0)); the gemvs (m = 1, 2), the tiles (m = 4, 5) and the packed
 * layout each checked against it, and (x86) no subnormal operand on the way. Then again on
 * binary16 grids (nm_scales.s16: the packed gemvs' own, widened by the frame for the others)
 * of binary16 scales and offsets, a subnormal binary16 among them. The float32 grid has
 * scales below 2^-98, where the avx512 row's in-place decode would round (its guard), one
 * just below that bound and one just above it, and the largest float32. */
static void test_sweep_nibbles(const nm_isa_kernels *row) {
    enum { N = 2048, K = 2 };
    static const float scales[2][8] = {
        {1.0f, 0.0078125f, -3.3f, 0x1.3579bep-110f, 0x1.fffffep-98f, -0x1.8p-99f,
         0x1.fffffep127f, -0x1p-98f},
        {1.0f, 0.0078125f, -3.296875f, 0x1p-24f, 65504.0f, -0x1p-14f, 0x1.ff8p-15f, 0.5f}};
    const int64_t nr = row->nr, ld = (N + nr - 1) / nr * nr, gw = nm_pack_width(row, NM_FMT_Q4_0);
    const int64_t ldw = (N + gw - 1) / gw * gw; /* the packed weights: whole groups */
    uint8_t *b = xmalloc(N + 1), *bpk = xmalloc((size_t)ldw);
    float *sc = xmalloc((size_t)ld * 4), *off = xmalloc((size_t)ld * 4), *want = xmalloc(N * 4);
    uint16_t *sc16 = xmalloc((size_t)ld * 2), *off16 = xmalloc((size_t)ld * 2);
    float *c = xmalloc(5 * N * 4);
    const float a[5 * K] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    for (int fmt = NM_FMT_Q4_0; fmt <= NM_FMT_Q4_1; ++fmt)
    for (int half = 0; half < 2; ++half) {
        const int with_offsets = nm_format_table[fmt].offset;
        memset(bpk, 0, (size_t)ldw);
        for (int64_t j = 0; j < ld; ++j) sc[j] = 1.0f, off[j] = 0.0f;
        for (int j = 0; j < N; ++j) {
            const unsigned q = (unsigned)j & 255u;
            b[1 + j] = (uint8_t)q;
            bpk[nm_packed_offset(1, gw, 1, 0, j)] = nm_packed_code(fmt, (uint8_t)q); /* k = 2 */
            sc[j] = scales[half][j / 256];
            off[j] = with_offsets ? 0.25f * (float)(j % 7) - 0.5f : 0.0f;
            const float lo = (float)(q & 15u), hi = (float)(q >> 4);
            const float wl = with_offsets ? fmaf(lo, sc[j], off[j]) : (lo - 8.0f) * sc[j];
            const float wh = with_offsets ? fmaf(hi, sc[j], off[j]) : (hi - 8.0f) * sc[j];
            want[j] = fmaf(1.0f, wh, fmaf(1.0f, wl, 0.0f));
        }
        for (int64_t j = 0; j < ld; ++j) /* exact: every value above is a binary16 */
            sc16[j] = nm_f32_to_fp16(sc[j]), off16[j] = nm_f32_to_fp16(off[j]);
        const nm_scales scl = half ? (nm_scales){.s16 = sc16, .ld = ld, .bk = K, .finite = 1,
                                                 .o16 = with_offsets ? off16 : NULL}
                                   : (nm_scales){.s = sc, .ld = ld, .bk = K, .finite = 1,
                                                 .o = with_offsets ? off : NULL};
        static const int64_t ms[] = {1, 2, 4, 5};
        for (int packed = 0; packed < 2; ++packed)
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; ++mi) {
                const int64_t m = ms[mi];
#if defined(NM_HAVE_MXCSR)
                _mm_setcsr(_mm_getcsr() & ~0x3Fu);
#endif
                int st = packed ? nm_matmul_packed(row, fmt, m, N, K, a, K, bpk, c, N, 0, NULL,
                                                   &scl)
                                : nm_matmul(row, fmt, m, N, K, a, K, b + 1, N, c, N, 0, NULL, &scl);
                unsigned denormal = 0;
#if defined(NM_HAVE_MXCSR)
                denormal = _mm_getcsr() & 0x02u;
#endif
                long bad = 0;
                for (int64_t i = 0; i < m; ++i)
                    for (int j = 0; j < N; ++j) bad += !same(c[i * N + j], want[j]);
                expect(st == NM_OK && bad == 0 && !denormal,
                       "%s %s: nibble sweep m=%lld packed=%d binary16 scales=%d: %ld differ%s",
                       row->isa, nm_format_table[fmt].name, (long long)m, packed, half, bad,
                       denormal ? ", a subnormal operand on the way" : "");
            }
        /* odd k, odd blocks of scales, missing offsets and mixed grids are refused */
        const nm_scales odd = {.s = sc, .ld = ld, .bk = 1, .finite = 1,
                               .o = with_offsets ? off : NULL};
        const nm_scales no_off = {.s = sc, .ld = ld, .bk = K, .finite = 1,
                                  .o = with_offsets ? NULL : off};
        const nm_scales mixed = {.s = sc, .ld = ld, .bk = K, .finite = 1, .o16 = off16};
        const nm_scales both = {.s = sc, .s16 = sc16, .ld = ld, .bk = K, .finite = 1,
                                .o = with_offsets ? off : NULL};
        expect(nm_matmul(row, fmt, 1, N, 1, a, K, b + 1, N, c, N, 0, NULL, &scl) == NM_EINVAL &&
                   nm_matmul(row, fmt, 1, N, 4, a, K, b + 1, N, c, N, 0, NULL, &odd) == NM_EINVAL &&
                   nm_matmul(row, fmt, 1, N, K, a, K, b + 1, N, c, N, 0, NULL, &no_off) ==
                       NM_EINVAL &&
                   nm_matmul(row, fmt, 1, N, K, a, K, b + 1, N, c, N, 0, NULL, &mixed) ==
                       NM_EINVAL &&
                   nm_matmul(row, fmt, 1, N, K, a, K, b + 1, N, c, N, 0, NULL, &both) ==
                       NM_EINVAL,
               "%s %s: odd k, odd blocks, wrong offsets or mixed grids accepted", row->isa,
               nm_format_table[fmt].name);
    }
    /* binary16 grids only for the formats with half_scales */
    {
        const nm_scales fp8 = {.s16 = sc16, .ld = ld, .bk = K, .finite = 1};
        expect(nm_matmul(row, NM_FMT_E4M3FN, 1, N, K, a, K, b + 1, N, c, N, 0, NULL, &fp8) ==
                   NM_EINVAL,
               "%s e4m3fn: a binary16 grid accepted", row->isa);
    }
    free(b), free(bpk), free(sc), free(off), free(sc16), free(off16), free(want), free(c);
}

static void test_sweep(const nm_isa_kernels *row, const nm_isa_kernels *ref) {
    uint8_t *b = xmalloc(65536 * 2 + 1);
    float *c = xmalloc(2 * 65536 * 4), *dec = xmalloc(65536 * 4);
    uint16_t *h = xmalloc(65536 * 2);
    for (uint32_t i = 0; i < 65536; ++i) h[i] = (uint16_t)i;
    const float a[2] = {1.0f, 0.0f};
    for (int fmt = NM_FMT_FP16; fmt <= NM_FMT_BF16; ++fmt) {
        ref->decode[fmt](h, dec, 65536);
        memcpy(b + 1, h, 65536 * 2); /* B at an odd address */
        for (int64_t m = 1; m <= 2; ++m) {
            int st = nm_matmul(row, fmt, m, 65536, 1, a, 1, b + 1, 65536 * 2, c, 65536, 0, NULL,
                               NULL);
            long bad = 0;
            for (int j = 0; j < 65536; ++j) bad += !same(c[j], dec[j] + 0.0f);
            expect(st == NM_OK && bad == 0, "%s %s: sweep m=%lld differs on %ld patterns",
                   row->isa, nm_format_table[fmt].name, (long long)m, bad);
        }
    }
    free(b), free(c), free(dec), free(h);
    test_sweep8(row, ref);
    test_sweep_nibbles(row);
}

/* ---- no subnormal on the way ---------------------------------------------------------
 * Decoding a weight whose value is a normal float32 must not pass through a float32
 * subnormal: an Intel Xeon takes a microcode assist for each subnormal operand (FP8 weights
 * of small values ran 10-40x slower when raw() made them), while the AMD cores this code is
 * written on hardly notice, so a timing would not catch it here. The x86 MXCSR's
 * denormal-operand flag does, on every CPU: for every format, every code whose value is
 * finite and not itself a float32 subnormal goes through each path (gemv, gemv2, the tiled
 * path; row-major and packed; the FP8 exact and finite kernels) on the calling thread, and
 * the flag must stay clear. The activations are 1 and 0 and the chains start from +0.0,
 * so nothing else can raise it; the results are checked too. */
#if defined(NM_HAVE_MXCSR)
static void test_no_subnormal_operands(const nm_isa_kernels *row, const nm_isa_kernels *ref) {
    enum { K = 4 };
    const int threads = nm_get_num_threads();
    nm_set_num_threads(1); /* MXCSR is per thread: keep every part on this one */
    for (int fmt = NM_FMT_FP16; fmt < NM_FMT_COUNT; ++fmt) {
        if (nm_format_table[fmt].kpack > 1) continue; /* the nibble sweep checks those */
        const int item = nm_format_table[fmt].itemsize, scaled = nm_format_table[fmt].scaled;
        const uint32_t codes = item == 2 ? 65536u : 256u;
        uint8_t *q = xmalloc((size_t)codes * item);
        float *dec = xmalloc((size_t)codes * 4);
        int64_t n = 0;
        for (uint32_t v = 0; v < codes; ++v) { /* the codes worth decoding */
            float d;
            if (item == 2) {
                const uint16_t h = (uint16_t)v;
                ref->decode[fmt](&h, &d, 1);
            } else {
                const uint8_t b8 = (uint8_t)v;
                ref->decode8[fmt](&b8, &d, 1);
            }
            if (!isfinite(d) || (d != 0.0f && fabsf(d) < 0x1p-126f)) continue;
            memcpy(q + n * item, &v, (size_t)item); /* little-endian */
            dec[n++] = d;
        }
        const int64_t nr = row->nr, ld = (n + nr - 1) / nr * nr, gw = nm_pack_width(row, fmt);
        const int64_t ldw = (n + gw - 1) / gw * gw; /* the packed weights: whole groups */
        uint8_t *b = xmalloc((size_t)(K * n * item)), *bpk = xmalloc((size_t)(K * ldw * item));
        memset(bpk, 0, (size_t)(K * ldw * item));
        for (int p = 0; p < K; ++p) /* row p: the codes rotated by 7p */
            for (int64_t j = 0; j < n; ++j) {
                const uint8_t *src = q + ((j + 7 * p) % n) * item;
                memcpy(b + (p * n + j) * item, src, (size_t)item);
                pack_item(fmt, bpk + nm_packed_offset(K, gw, item, p, j), src, item);
            }
        float *sc = xmalloc((size_t)ld * 4), *c = xmalloc((size_t)(5 * n) * 4);
        float *of = xmalloc((size_t)ld * 4); /* zero offsets (Q5_1): fma(q, 1, 0) is q */
        for (int64_t j = 0; j < ld; ++j) sc[j] = ldexpf(1.0f, nm_format_table[fmt].scale_exponent);
        memset(of, 0, (size_t)ld * 4);
        const float a[5 * K] = {1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0};
        static const int64_t ms[] = {1, 2, 4, 5};
        for (int finite = 0; finite <= scaled; ++finite) {
            const nm_scales scl = {.s = sc, .ld = ld, .bk = K, .finite = finite,
                                   .o = nm_format_table[fmt].offset ? of : NULL};
            for (int packed = 0; packed < 2; ++packed)
                for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; ++mi) {
                    const int64_t m = ms[mi];
                    _mm_setcsr(_mm_getcsr() & ~0x3Fu); /* clear the six exception flags */
                    const int st =
                        packed ? nm_matmul_packed(row, fmt, m, n, K, a, K, bpk, c, n, 0, NULL,
                                                  scaled ? &scl : NULL)
                               : nm_matmul(row, fmt, m, n, K, a, K, b, n * item, c, n, 0, NULL,
                                           scaled ? &scl : NULL);
                    const unsigned denormal = _mm_getcsr() & 0x02u;
                    long bad = 0;
                    for (int64_t i = 0; i < m; ++i)
                        for (int64_t j = 0; j < n; ++j) bad += !same(c[i * n + j], dec[j] + 0.0f);
                    expect(st == NM_OK && bad == 0 && !denormal,
                           "%s %s: m=%lld packed=%d finite=%d: %s (%ld of %lld wrong)", row->isa,
                           nm_format_table[fmt].name, (long long)m, packed, finite,
                           denormal ? "a subnormal operand on the way" : "results", bad,
                           (long long)n);
                }
        }
        free(q), free(dec), free(b), free(bpk), free(sc), free(of), free(c);
    }
    nm_set_num_threads(threads);
}
#endif

/* ---- random shapes ------------------------------------------------------------------ */

#define GUARD 7.25f

/* How a case's chains start: from +0.0, from C's values (accumulate), or from a bias. The
 * scalar row's reference for a bias is C set to the bias and accumulated into. */
enum { START_ZERO, START_ACCUMULATE, START_BIAS };

/* Set around run_case: a scaled format's case takes a factored grid of factors near 2^-106,
 * below the 2^-98 under which the avx512 row's in-place decode must not stage them */
static int tiny_factored_case;

static void run_case(const nm_isa_kernels *row, const nm_isa_kernels *ref, int fmt, int64_t m,
                     int64_t n, int64_t k, int start, int threads) {
    const int accumulate = start == START_ACCUMULATE;
    const int64_t itemsize = nm_format_table[fmt].itemsize;
    /* the 4-bit formats: two rows a stored row, so k and the blocks of scales even */
    const int64_t kpack = nm_format_table[fmt].kpack;
    k = (k + kpack - 1) / kpack * kpack;
    const int64_t stored = k / kpack;
    /* scales for a scaled format: a block of 1, 4, 48 or 128 rows, or one for all of k
     * (48 divides no row's kc, so k blocks end at blocks of scales inside a kc); the row
     * is padded to whole slivers of every row (96 columns) for the packed layout */
    static const int64_t blocks[] = {1, 4, 48, 128, 1 << 30};
    /* k = 1100: blocks of 4 rows (275 of them: super-blocks of 5 but a quarter of the time) */
    const int64_t bk0 = k == 1100 ? 4 : blocks[next_u64() % 5], sld = (n + 95) / 96 * 96 + 3;
    const int64_t bk = bk0 % kpack ? bk0 * kpack : bk0;
    const int64_t nblocks = k ? (k + bk - 1) / bk : 1;
    float *sv = xmalloc((size_t)(nblocks * sld) * 4);
    for (int64_t i = 0; i < nblocks * sld; ++i) sv[i] = 0x1p100f * (1.0f + next_float());
    float *ov = xmalloc((size_t)(nblocks * sld) * 4); /* offsets, for a format with them */
    for (int64_t i = 0; i < nblocks * sld; ++i) ov[i] = 0x1p100f * next_float();
    /* half the cases of a format with half_scales give the row under test binary16 grids
     * (nm_scales.s16) of binary16 values, the scalar reference the same values as float32 */
    const int half =
        nm_format_table[fmt].half_scales && !tiny_factored_case && (next_u64() & 1);
    uint16_t *sv16 = xmalloc((size_t)(nblocks * sld) * 2);
    uint16_t *ov16 = xmalloc((size_t)(nblocks * sld) * 2);
    for (int64_t i = 0; half && i < nblocks * sld; ++i) {
        sv16[i] = nm_f32_to_fp16(0x1p-10f * sv[i] * 0x1p-100f), sv[i] = nm_fp16_to_f32(sv16[i]);
        ov16[i] = nm_f32_to_fp16(0x1p-10f * ov[i] * 0x1p-100f), ov[i] = nm_fp16_to_f32(ov16[i]);
    }
    /* a third of the other scaled cases, and all of k = 1100 (the packed m <= 2 walks then
     * run in chunks of 512 rows), give the row under test a factored grid (nm_scales.c8:
     * an int8 code a block, a float32 factor per super-block of per_super blocks, their
     * products exact), the scalar reference the products as float32; each part in a buffer
     * of exactly its size */
    const int factored = !half && nm_format_table[fmt].scaled && k > 0 &&
                         (tiny_factored_case || next_u64() % 3 == 0 || k == 1100);
    /* super-blocks of a small divisor of the blocks (a factor changes along k), a quarter of
     * the time one for all */
    int64_t per_super = nblocks;
    const int one_super = (next_u64() & 3) == 0;
    for (int64_t d = 2; d <= 7 && !one_super && per_super == nblocks; ++d)
        if (nblocks % d == 0) per_super = d;
    const int64_t supers = nblocks / per_super;
    int8_t *c8 = xmalloc((size_t)(nblocks * sld)), *oc8 = xmalloc((size_t)(nblocks * sld));
    float *fs = xmalloc((size_t)(supers * sld) * 4), *ofs = xmalloc((size_t)(supers * sld) * 4);
    /* factors near 2^-106 (tiny_factored_case): the products stay normal */
    const int tiny = factored && tiny_factored_case;
    for (int64_t i = 0; factored && i < supers * sld; ++i) { /* 11 significant bits, any sign */
        const float sign = (next_u64() & 1) ? -1.0f : 1.0f;
        const float f = 1.0f + (float)(next_u64() & 1023) / 1024.0f;
        const float g = 1.0f + (float)(next_u64() & 1023) / 1024.0f;
        fs[i] = sign * ldexpf(f, (int)(next_u64() % 9) - 4 - (tiny ? 106 : 0));
        ofs[i] = -sign * ldexpf(g, (int)(next_u64() % 9) - 4 - (tiny ? 106 : 0));
    }
    for (int64_t q = 0; factored && q < nblocks; ++q)
        for (int64_t j = 0; j < sld; ++j) { /* exact: 11 bits times 8 */
            c8[q * sld + j] = (int8_t)next_u64(), oc8[q * sld + j] = (int8_t)next_u64();
            sv[q * sld + j] = fs[q / per_super * sld + j] * (float)c8[q * sld + j];
            ov[q * sld + j] = ofs[q / per_super * sld + j] * (float)oc8[q * sld + j];
        }
    nm_scales scl = {.s = sv, .ld = sld, .bk = bk, .o = nm_format_table[fmt].offset ? ov : NULL};
    nm_scales scl16 = {.s16 = sv16, .ld = sld, .bk = bk,
                       .o16 = nm_format_table[fmt].offset ? ov16 : NULL};
    nm_scales sf = {.c8 = c8, .fs = fs, .ld = sld, .bk = bk, .per_super = per_super};
    if (nm_format_table[fmt].offset) sf.oc8 = oc8, sf.ofs = ofs;
    const nm_scales *scales = nm_format_table[fmt].scaled ? &scl : NULL;
    const nm_scales *tested = half ? &scl16 : factored ? &sf : scales;
    const int64_t lda = k + 3, ldb = (n + 5) * itemsize + 1, ldc = n + 4;
    float *a = xmalloc((size_t)(m * lda + 1) * 4);
    uint8_t *braw = xmalloc((size_t)(k * ldb + 2));
    uint8_t *b = braw + 1; /* odd byte offset, odd row stride */
    const size_t c_bytes = (size_t)((m + 2) * ldc) * 4;
    float *c_ref = xmalloc(c_bytes), *c_got = xmalloc(c_bytes), *c_pk = xmalloc(c_bytes);
    float *c_sm = xmalloc(c_bytes); /* packed weights, their grid group-major */
    for (int64_t i = 0; i < m * lda; ++i) a[i] = next_float();
    for (int64_t p = 0; p < k; ++p) {
        for (int64_t j = 0; j < n; ++j) {
            float v = next_float();
            if ((next_u64() & 255) == 0) v = (next_u64() & 1) ? INFINITY : 1e-40f;
            if (fmt == NM_FMT_F32) {
                memcpy(b + p * ldb + 4 * j, &v, 4);
            } else if (fmt == NM_FMT_Q8_0 || fmt == NM_FMT_Q5_1 || kpack > 1) { /* any code:
                                                   small values would round to 0, +-1 */
                if (p < stored)
                    b[p * ldb + j] = (uint8_t)(next_u64() & (fmt == NM_FMT_Q5_1 ? 31u : 255u));
            } else if (itemsize == 1) {
                ref->encode8[fmt](&v, b + p * ldb + j, 1, 0);
            } else {
                uint16_t hv;
                ref->encode[fmt](&v, &hv, 1);
                memcpy(b + p * ldb + 2 * j, &hv, 2);
            }
        }
    }
    for (int64_t i = 0; i < (m + 2) * ldc; ++i) c_ref[i] = c_got[i] = GUARD;
    for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) c_ref[(i + 1) * ldc + j] = c_got[(i + 1) * ldc + j] = next_float();
    float *bias = NULL;
    if (start == START_BIAS) { /* its own buffer, exactly n long, for the sanitizers */
        bias = xmalloc((size_t)(n ? n : 1) * 4);
        for (int64_t j = 0; j < n; ++j) bias[j] = next_float();
        for (int64_t i = 0; i < m; ++i) memcpy(c_ref + (i + 1) * ldc, bias, (size_t)n * 4);
    }
    memcpy(c_pk, c_got, c_bytes);
    memcpy(c_sm, c_got, c_bytes);
    /* weights without NaN or Inf codes (most shapes) take the finite-weights kernels */
    if (itemsize == 1) {
        const uint8_t special = special_bits(fmt);
        int finite = 1;
        for (int64_t p = 0; p < k && special; ++p)
            for (int64_t j = 0; j < n; ++j) finite &= (b[p * ldb + j] & special) != special;
        scl.finite = scl16.finite = sf.finite = finite;
    }
    /* the same weights in this row's packed layout: groups of pack_width columns, k
     * contiguous rows each, in a buffer of exactly that size (the sanitizers see any read
     * past it) */
    const int64_t gw = nm_pack_width(row, fmt), groups = (n + gw - 1) / gw;
    const size_t pk_bytes = (size_t)(groups * stored * gw * itemsize);
    uint8_t *bpk = xmalloc(pk_bytes ? pk_bytes : 1);
    memset(bpk, 0, pk_bytes);
    for (int64_t p = 0; p < stored; ++p)
        for (int64_t j = 0; j < n; ++j)
            pack_item(fmt, bpk + nm_packed_offset(stored, gw, itemsize, p, j),
                      b + p * ldb + j * itemsize, itemsize);
    /* the tested grid group-major (nm_scales.lsl), as the Python side gives packed weights:
     * each group's blocks in a row, in buffers of exactly that size (the columns past the
     * row-major grid's, never read, a finite 1) */
    const int64_t sm_count = groups * nblocks * gw;
    float *svm = xmalloc((size_t)(sm_count ? sm_count : 1) * 4);
    float *ovm = xmalloc((size_t)(sm_count ? sm_count : 1) * 4);
    uint16_t *svm16 = xmalloc((size_t)(sm_count ? sm_count : 1) * 2);
    uint16_t *ovm16 = xmalloc((size_t)(sm_count ? sm_count : 1) * 2);
    for (int64_t g = 0; g < groups; ++g)
        for (int64_t q = 0; q < nblocks; ++q)
            for (int64_t jj = 0; jj < gw; ++jj) {
                const int64_t to = (g * nblocks + q) * gw + jj, from = q * sld + g * gw + jj;
                const int inside = g * gw + jj < sld;
                svm[to] = inside ? sv[from] : 1.0f, ovm[to] = inside ? ov[from] : 0.0f;
                svm16[to] = inside ? sv16[from] : 0x3c00, ovm16[to] = inside ? ov16[from] : 0;
            }
    const int offsets = nm_format_table[fmt].offset;
    nm_scales sm = half ? (nm_scales){.s16 = svm16, .o16 = offsets ? ovm16 : NULL}
                        : (nm_scales){.s = svm, .o = offsets ? ovm : NULL};
    sm.ld = gw, sm.bk = bk, sm.finite = scl.finite, sm.lsl = nblocks * gw;
    /* a factored grid group-major too: each group's factors, then its codes, fl bytes a
     * group (the columns past the row-major grid's, never read, a factor 1 and code 0) */
    const int64_t fl = (4 * supers + nblocks) * gw, fparts = offsets ? 2 : 1;
    int8_t *fgm = xmalloc((size_t)(fparts * groups * fl > 0 ? fparts * groups * fl : 1));
    for (int64_t part = 0; factored && part < fparts; ++part)
        for (int64_t g = 0; g < groups; ++g)
            for (int64_t jj = 0; jj < gw; ++jj) {
                const int64_t col = g * gw + jj, at = (part * groups + g) * fl;
                const int inside = col < sld;
                const float *f = part ? ofs : fs;
                const int8_t *cd = part ? oc8 : c8;
                for (int64_t t = 0; t < supers; ++t) {
                    const float v = inside ? f[t * sld + col] : 1.0f;
                    memcpy(fgm + at + 4 * (t * gw + jj), &v, 4);
                }
                for (int64_t q = 0; q < nblocks; ++q)
                    fgm[at + 4 * supers * gw + q * gw + jj] = inside ? cd[q * sld + col] : 0;
            }
    nm_scales smf = {.c8 = fgm + 4 * supers * gw, .fs = (const float *)(const void *)fgm,
                     .ld = gw, .bk = bk, .per_super = per_super, .lsl = fl,
                     .finite = scl.finite};
    if (offsets) smf.oc8 = smf.c8 + groups * fl, smf.ofs = smf.fs + groups * fl / 4;
    nm_set_num_threads(1);
    int s1 = nm_matmul(ref, fmt, m, n, k, a, lda, b, ldb, c_ref + ldc, ldc, accumulate || bias,
                       NULL, scales);
    nm_set_num_threads(threads);
    int s2 = nm_matmul(row, fmt, m, n, k, a, lda, b, ldb, c_got + ldc, ldc, accumulate, bias,
                       tested);
    int s3 = nm_matmul_packed(row, fmt, m, n, k, a, lda, bpk, c_pk + ldc, ldc, accumulate, bias,
                              tested);
    int s4 = nm_matmul_packed(row, fmt, m, n, k, a, lda, bpk, c_sm + ldc, ldc, accumulate, bias,
                              !scales ? NULL : factored ? &smf : &sm);
    long bad = 0, guard = 0, bad_pk = 0, guard_pk = 0, bad_sm = 0, guard_sm = 0;
    for (int64_t r = 0; r < m + 2; ++r) {
        for (int64_t j = 0; j < ldc; ++j) {
            const int inside = r >= 1 && r <= m && j < n;
            const float g = c_got[r * ldc + j], gp = c_pk[r * ldc + j], gs = c_sm[r * ldc + j];
            if (inside) {
                bad += !same(g, c_ref[r * ldc + j]);
                bad_pk += !same(gp, c_ref[r * ldc + j]);
                bad_sm += !same(gs, c_ref[r * ldc + j]);
            } else {
                guard += bits_of(g) != bits_of(GUARD);
                guard_pk += bits_of(gp) != bits_of(GUARD);
                guard_sm += bits_of(gs) != bits_of(GUARD);
            }
        }
    }
    expect(s1 == NM_OK && s2 == NM_OK && s3 == NM_OK && s4 == NM_OK && bad == 0 && guard == 0 &&
               bad_pk == 0 && guard_pk == 0 && bad_sm == 0 && guard_sm == 0,
           "%s %s m=%lld n=%lld k=%lld start=%d threads=%d bk=%lld finite=%d binary16 scales=%d "
           "factored=%d: "
           "%ld differ, %ld guard cells written; packed weights: %ld differ, %ld guard cells "
           "written; group-major scales: %ld differ, %ld guard cells written",
           row->isa, nm_format_table[fmt].name, (long long)m, (long long)n, (long long)k,
           start, threads, (long long)bk, scl.finite, half, factored, bad, guard, bad_pk,
           guard_pk, bad_sm, guard_sm);
    free(a), free(braw), free(bpk), free(c_ref), free(c_got), free(c_pk), free(c_sm), free(sv),
        free(ov), free(sv16), free(ov16), free(svm), free(ovm), free(svm16), free(ovm16),
        free(c8), free(oc8), free(fs), free(ofs), free(fgm), free(bias);
}

static void test_shapes_of(const nm_isa_kernels *row, const nm_isa_kernels *ref, int fmt) {
    static const int64_t ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17};
    static const int64_t ns[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 65, 100, 257};
    static const int64_t ks[] = {0, 1, 2, 3, 5, 17, 256, 257, 300};
    {
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; ++i)
            for (size_t j = 0; j < sizeof ns / sizeof ns[0]; ++j) {
                /* every (m, n) pair once, with a k and flags drawn at random */
                const int64_t k = ks[next_u64() % (sizeof ks / sizeof ks[0])];
                run_case(row, ref, fmt, ms[i], ns[j], k, (int)(next_u64() % 3), 1);
            }
        /* large enough to be split across threads (m*n*k >= 2^18) */
        run_case(row, ref, fmt, 1, 1100, 300, START_ZERO, 3);
        run_case(row, ref, fmt, 1, 1100, 300, START_BIAS, 2);
        run_case(row, ref, fmt, 17, 1100, 300, START_ACCUMULATE, 2);
        run_case(row, ref, fmt, 2, 1100, 300, START_BIAS, 3);
        run_case(row, ref, fmt, 33, 700, 513, START_BIAS, 3);
        /* k past two chunks of a factored grid's packed walks (NM_FACTORED_CHUNK_ROWS) */
        run_case(row, ref, fmt, 1, 200, 1100, START_BIAS, 2);
        run_case(row, ref, fmt, 2, 130, 1100, START_ACCUMULATE, 1);
        /* two whole groups of 128 columns and a tail on one thread, for one row and two: the
         * group walks through several super-blocks of a factored grid (three draws of the
         * grid's kind each) */
        for (int draw = 0; draw < 3; ++draw) {
            run_case(row, ref, fmt, 1, 300, 1100, START_ACCUMULATE, 1);
            run_case(row, ref, fmt, 2, 290, 1100, START_ZERO, 1);
        }
        tiny_factored_case = 1; /* the same on a factored grid of tiny factors */
        run_case(row, ref, fmt, 1, 300, 1100, START_BIAS, 1);
        run_case(row, ref, fmt, 2, 290, 1100, START_ACCUMULATE, 1);
        tiny_factored_case = 0;
        /* more rows than one packed A block (2048): the block edge, on 7 threads (3 column
         * parts x 2 row parts) */
        run_case(row, ref, fmt, 2053, 200, 19, START_ACCUMULATE, 7);
        /* one column grain: the rows are split instead, in ragged MR-row ranges */
        run_case(row, ref, fmt, 101, 30, 300, START_BIAS, 3);
        /* few rows: packed weights run the slivers outside the k blocks, here with the rows
         * split into parts; then 16 rows whose A for all of k (528 KiB) passes a 512 KiB
         * limit, which sends them back to the k blocks outside, and fits a 1 MiB one; then
         * 4 rows with a limit of 0 (the k blocks outside) */
        run_case(row, ref, fmt, 12, 30, 1000, START_ACCUMULATE, 3);
        nm_set_sliver_outer_a_bytes(512 << 10);
        run_case(row, ref, fmt, 16, 40, 8448, START_ZERO, 2);
        nm_set_sliver_outer_a_bytes(1 << 20);
        run_case(row, ref, fmt, 16, 40, 8448, START_BIAS, 2);
        nm_set_sliver_outer_a_bytes(0);
        run_case(row, ref, fmt, 4, 70, 600, START_ACCUMULATE, 2);
        nm_set_sliver_outer_a_bytes(-1);
        /* the packed m <= 2 walks with their prefetch forced off, and far past the weights
         * (a hint never faults, nor do the sanitizers see it): the same bits */
        for (int far = 0; far < 2; ++far) {
            nm_set_packed_gemv_ahead(far ? 1 << 20 : 0);
            run_case(row, ref, fmt, 1, 300, 1100, START_ACCUMULATE, 2);
            run_case(row, ref, fmt, 2, 290, 1100, START_BIAS, 1);
        }
        nm_set_packed_gemv_ahead(-1);
    }
}

static void test_shapes(const nm_isa_kernels *row, const nm_isa_kernels *ref) {
    for (int fmt = 0; fmt < NM_FMT_COUNT; ++fmt) test_shapes_of(row, ref, fmt);
    /* a chain starts from one value: a bias with accumulate is refused, C untouched */
    float a1[2] = {1.0f, 2.0f}, c1[2] = {GUARD, GUARD}, bias1[2] = {3.0f, 4.0f};
    const uint8_t b1[8] = {0};
    const int st = nm_matmul(row, NM_FMT_F32, 1, 2, 1, a1, 1, b1, 8, c1, 2, 1, bias1, NULL);
    expect(st == NM_EINVAL && bits_of(c1[0]) == bits_of(GUARD) && bits_of(c1[1]) == bits_of(GUARD),
           "%s: a bias with accumulate gave status %d", row->isa, st);
}

/* A row with a choice of 4-bit decodes (nm_isa_kernels.nibble_decode): the 4-bit formats'
 * sweep and shapes again with the decode it does not take by default forced (the default's
 * ran with the rest): the same bits, read within the weights under the sanitizers */
static void test_nibble_decodes(const nm_isa_kernels *row, const nm_isa_kernels *ref) {
    if (row->nibble_decode < 0) return;
    nm_set_nibble_decode(!row->nibble_decode);
    test_sweep_nibbles(row);
    for (int fmt = 0; fmt < NM_FMT_COUNT; ++fmt)
        if (nm_format_table[fmt].kpack > 1) test_shapes_of(row, ref, fmt);
    nm_set_nibble_decode(-1);
    expect(nm_get_nibble_decode() == -1, "%s: the forced decode not restored", row->isa);
}

/* A row with pair walks (nm_isa_kernels.gemv_streams): the shapes of the formats that have
 * them again with the count it does not take by default forced (two groups at a time, or
 * one): the same bits, read within the weights under the sanitizers */
static void test_gemv_streams(const nm_isa_kernels *row, const nm_isa_kernels *ref) {
    if (row->gemv_streams < 0) return;
    nm_set_gemv_streams(row->gemv_streams == 2 ? 1 : 2);
    for (int fmt = 0; fmt < NM_FMT_COUNT; ++fmt)
        if (row->gemv_packed_pair[fmt] || row->gemv_packed_factored_pair[fmt])
            test_shapes_of(row, ref, fmt);
    nm_set_gemv_streams(-1);
    expect(nm_get_gemv_streams() == -1, "%s: the forced stream count not restored", row->isa);
}

/* The row's softmax exps (nm_isa_kernels.expf) against nm_expf one element at a time:
 * softmax's range and past the clamps, specials in every lane of a vector, lengths that end
 * in each part of the loop, out of place and in place. */
static void test_softmax_exp(const nm_isa_kernels *row) {
    const int64_t n = 1003;
    float *x = xmalloc((size_t)n * 4), *y = xmalloc((size_t)(n + 1) * 4);
    float *want = xmalloc((size_t)n * 4);
    for (int64_t i = 0; i < n; ++i) x[i] = 50.0f * next_float() - 10.0f; /* about -110..90 */
    const float specials[] = {NAN, INFINITY, -INFINITY, 800.0f, -800.0f, 1e-40f, -0.0f,
                              88.72f, -103.97f, -745.2f, 709.8f, 0.0f};
    for (int i = 0; i < 12; ++i)
        for (int64_t at = 5 + i; at < n; at += 97) x[at] = specials[i];
    for (int64_t i = 0; i < n; ++i) want[i] = nm_expf(x[i]);
    long bad = 0;
    const int64_t lengths[] = {0, 1, 7, 8, 31, 32, 33, 65, 100, n};
    for (int l = 0; l < 10; ++l) {
        const int64_t len = lengths[l];
        y[len] = GUARD;
        row->expf(len, x, y);
        for (int64_t i = 0; i < len; ++i) bad += !same(y[i], want[i]);
        bad += bits_of(y[len]) != bits_of(GUARD);
    }
    memcpy(y, x, (size_t)n * 4);
    row->expf(n, y, y);
    for (int64_t i = 0; i < n; ++i) bad += !same(y[i], want[i]);
    expect(bad == 0, "%s %s: %ld exps differ from nm_expf", row->isa, row->expf_name, bad);
    free(x), free(y), free(want);
}

/* The model ops (ops/): a row and thread count give the scalar row's one-thread bits; a
 * guard cell after each output is never written; hidden keys hold NaN and change nothing. */
static void test_model_ops(const nm_isa_kernels *row, const nm_isa_kernels *ref) {
    /* lk: the softmax's exps run through the row's vectors and its tail (32 a step on
     * avx512) */
    const int64_t batch = 3, heads = 4, kv_heads = 2, lq = 5, lk = 75, d = 40;
    const int64_t nq = batch * heads * lq * d, nk = batch * kv_heads * lk * d;
    float *q = xmalloc((size_t)nq * 4), *k = xmalloc((size_t)nk * 4), *v = xmalloc((size_t)nk * 4);
    float *o_ref = xmalloc((size_t)(nq + 1) * 4), *o_got = xmalloc((size_t)(nq + 1) * 4);
    uint8_t *allowed = xmalloc((size_t)(batch * lq * lk));
    for (int64_t i = 0; i < nq; ++i) q[i] = next_float();
    for (int64_t i = 0; i < nk; ++i) k[i] = next_float(), v[i] = next_float();
    for (int64_t b = 0; b < batch; ++b) /* left padding of 4b keys, causal, a hole at key 17 */
        for (int64_t i = 0; i < lq; ++i)
            for (int64_t j = 0; j < lk; ++j) {
                const int vis = j >= 4 * b && j <= lk - lq + i && !(b == 2 && j == 17);
                allowed[(b * lq + i) * lk + j] = (uint8_t)vis;
                if (j < 4 * b || (b == 2 && j == 17)) /* hidden from every query */
                    for (int64_t h = 0; h < kv_heads; ++h)
                        k[((b * kv_heads + h) * lk + j) * d] = NAN, v[((b * kv_heads + h) * lk + j) * d] = NAN;
            }
    o_ref[nq] = o_got[nq] = GUARD;
    nm_set_num_threads(1);
    int s1 = nm_attention(ref, batch, heads, kv_heads, lq, lk, lk, d, q, k, v, 0, allowed, 1, 0.15f, o_ref);
    nm_set_num_threads(3);
    int s2 = nm_attention(row, batch, heads, kv_heads, lq, lk, lk, d, q, k, v, 0, allowed, 1, 0.15f, o_got);
    long bad = 0, nans = 0;
    for (int64_t i = 0; i < nq; ++i) bad += !same(o_got[i], o_ref[i]), nans += isnan(o_ref[i]);
    expect(s1 == NM_OK && s2 == NM_OK && bad == 0 && nans == 0 &&
               bits_of(o_got[nq]) == bits_of(GUARD),
           "%s attention: %ld differ from the scalar row, %ld NaN", row->isa, bad, nans);
    /* the keys given transposed, in heads of lk + 3 columns (a cache's spare slots hold
     * NaN): the same bits */
    const int64_t rows_kt = lk + 3;
    float *kt = xmalloc((size_t)(batch * kv_heads * d * rows_kt) * 4);
    float *vt = xmalloc((size_t)(batch * kv_heads * rows_kt * d) * 4);
    for (int64_t i = 0; i < batch * kv_heads * d * rows_kt; ++i) kt[i] = vt[i] = NAN;
    for (int64_t hb = 0; hb < batch * kv_heads; ++hb)
        for (int64_t j = 0; j < lk; ++j)
            for (int64_t x = 0; x < d; ++x) {
                kt[(hb * d + x) * rows_kt + j] = k[(hb * lk + j) * d + x];
                vt[(hb * rows_kt + j) * d + x] = v[(hb * lk + j) * d + x];
            }
    o_got[nq] = GUARD;
    int s3 = nm_attention(row, batch, heads, kv_heads, lq, lk, rows_kt, d, q, kt, vt, 1,
                          allowed, 1, 0.15f, o_got);
    bad = 0;
    for (int64_t i = 0; i < nq; ++i) bad += !same(o_got[i], o_ref[i]);
    expect(s3 == NM_OK && bad == 0 && bits_of(o_got[nq]) == bits_of(GUARD),
           "%s attention on transposed keys: %ld differ", row->isa, bad);
    free(kt), free(vt);
    /* the row ops: 3 threads against 1, and in place */
    const int64_t rows = 7, n = 300;
    float *x = xmalloc((size_t)(rows * n) * 4), *y1 = xmalloc((size_t)(rows * n + 1) * 4),
          *y2 = xmalloc((size_t)(rows * n + 1) * 4);
    for (int64_t i = 0; i < rows * n; ++i) x[i] = 4.0f * next_float();
    /* the exp's clamps and NaN lanes, inside a vector of every row's width */
    const float specials[] = {NAN, INFINITY, -INFINITY, 800.0f, -800.0f, 1e-40f, -0.0f, 88.0f};
    for (int i = 0; i < 8; ++i) x[37 + 3 * i] = specials[i];
    for (int op = 0; op < 2; ++op) {
        y1[rows * n] = y2[rows * n] = GUARD;
        nm_set_num_threads(1);
        if (op == 0) nm_rms_norm(rows, n, x, n, 1e-5f, y1, n);
        else nm_silu(ref, rows, n, x, n, y1, n);
        memcpy(y2, x, (size_t)(rows * n) * 4);
        nm_set_num_threads(3);
        if (op == 0) nm_rms_norm(rows, n, y2, n, 1e-5f, y2, n);
        else nm_silu(row, rows, n, y2, n, y2, n);
        long diff = 0;
        for (int64_t i = 0; i < rows * n; ++i) diff += !same(y1[i], y2[i]);
        expect(diff == 0 && bits_of(y2[rows * n]) == bits_of(GUARD),
               "%s: %ld elements differ between 1 thread and 3 in place",
               op == 0 ? "rms_norm" : "silu", diff);
    }
    free(q), free(k), free(v), free(o_ref), free(o_got), free(allowed), free(x), free(y1), free(y2);
}

/* An f32 linear layer of random weights (row-major, k x n) with a random bias or none. */
static nm_linear random_linear(int64_t k, int64_t n, int with_bias, float **keep) {
    float *w = xmalloc((size_t)(k * n + n) * 4);
    for (int64_t i = 0; i < k * n + n; ++i) w[i] = 0.3f * next_float();
    *keep = w;
    return (nm_linear){.fmt = NM_FMT_F32, .k = k, .n = n, .ldb = n * 4, .b = (const uint8_t *)w,
                       .bias = with_bias ? w + k * n : NULL};
}

/* The decoder step (model/llama.c) and the fused linear job: a row on 3 threads gives the
 * scalar row's one-thread bits, guard cells after the logits stay, a bad token or a full
 * cache changes nothing. Under the sanitizers this walks every buffer of a step, the second
 * layer's head norms (Qwen3's q_norm / k_norm) too. */
static void test_decoder_step(const nm_isa_kernels *row, const nm_isa_kernels *ref) {
    enum { LAYERS = 2, HIDDEN = 64, HEADS = 4, KV = 2, D = 16, INTER = 96, VOCAB = 50,
           BATCH = 2, CAP = 9, POS = 16 };
    float *keep[LAYERS * 7 + 1];
    int kept = 0;
    nm_llama_layer layers[LAYERS];
    float *norms = xmalloc((size_t)((2 * LAYERS + 1) * HIDDEN + 2 * D) * 4);
    float *embed = xmalloc((size_t)VOCAB * HIDDEN * 4), *rot = xmalloc((size_t)2 * POS * D * 4);
    for (int64_t i = 0; i < (2 * LAYERS + 1) * HIDDEN + 2 * D; ++i)
        norms[i] = 1.0f + 0.1f * next_float();
    for (int64_t i = 0; i < VOCAB * HIDDEN; ++i) embed[i] = next_float();
    for (int64_t i = 0; i < 2 * POS * D; ++i) rot[i] = 0.5f * next_float();
    for (int l = 0; l < LAYERS; ++l) {
        nm_llama_layer *L = &layers[l];
        L->attn_norm = norms + 2 * l * HIDDEN, L->mlp_norm = norms + (2 * l + 1) * HIDDEN;
        L->q_norm = l == 1 ? norms + (2 * LAYERS + 1) * HIDDEN : NULL;
        L->k_norm = l == 1 ? norms + (2 * LAYERS + 1) * HIDDEN + D : NULL;
        L->q = random_linear(HIDDEN, HEADS * D, l == 0, &keep[kept++]);
        L->k = random_linear(HIDDEN, KV * D, l == 0, &keep[kept++]);
        L->v = random_linear(HIDDEN, KV * D, 0, &keep[kept++]);
        L->o = random_linear(HEADS * D, HIDDEN, 0, &keep[kept++]);
        L->gate = random_linear(HIDDEN, INTER, 0, &keep[kept++]);
        L->up = random_linear(HIDDEN, INTER, 0, &keep[kept++]);
        L->down = random_linear(INTER, HIDDEN, 0, &keep[kept++]);
    }
    nm_llama md = {.layers = LAYERS, .hidden = HIDDEN, .heads = HEADS, .kv_heads = KV,
                   .head_dim = D, .intermediate = INTER, .vocab = VOCAB, .positions = POS,
                   .eps = 1e-5f, .scale = 0.25f, .embed = embed,
                   .final_norm = norms + 2 * LAYERS * HIDDEN, .cos = rot, .sin = rot + POS * D,
                   .layer = layers};
    md.lm_head = random_linear(HIDDEN, VOCAB, 0, &keep[kept++]);
    const int64_t cache_floats = (int64_t)LAYERS * BATCH * KV * CAP * D;
    float *logits[2];
    long bad = 0;
    int statuses = 0;
    for (int run = 0; run < 2; ++run) { /* the scalar row on 1 thread, then `row` on 3 */
        const nm_isa_kernels *r = run ? row : ref;
        nm_set_num_threads(run ? 3 : 1);
        nm_llama_cache cache = {.batch = BATCH, .capacity = CAP, .length = 0,
                                .k = xmalloc((size_t)cache_floats * 4),
                                .v = xmalloc((size_t)cache_floats * 4)};
        logits[run] = xmalloc((size_t)(3 * BATCH * VOCAB + 1) * 4);
        logits[run][3 * BATCH * VOCAB] = GUARD;
        /* a prompt of 3 (sequence 1 left-padded by one), two decode steps; then refusals */
        const int64_t tok3[] = {1, 2, 3, 0, 4, 5}, pos3[] = {0, 1, 2, 0, 0, 1}, start[] = {0, 1};
        statuses |= nm_llama_step(r, &md, &cache, BATCH, 3, tok3, pos3, start, logits[run], NULL);
        for (int s2 = 0; s2 < 2; ++s2) {
            const int64_t tok[] = {7 + s2, 9 + s2}, pos[] = {3 + s2, 2 + s2};
            double spent[NM_LLAMA_PARTS] = {0};
            statuses |= nm_llama_step(r, &md, &cache, BATCH, 1, tok, pos, start,
                                      logits[run] + (1 + s2) * BATCH * VOCAB, spent);
        }
        const int64_t bad_tok[] = {VOCAB, 1}, pos1[] = {5, 4};
        const int64_t before = cache.length;
        const int refused = nm_llama_step(r, &md, &cache, BATCH, 1, bad_tok, pos1, start,
                                          logits[run], NULL) == NM_EINVAL &&
                            nm_llama_step(r, &md, &cache, BATCH, CAP, tok3, pos3, start,
                                          logits[run], NULL) == NM_EINVAL;
        expect(refused && cache.length == before && before == 5,
               "%s decoder step: a bad token or a full cache was not refused cleanly", r->isa);
        free(cache.k), free(cache.v);
    }
    for (int64_t i = 0; i < 3 * BATCH * VOCAB; ++i) bad += !same(logits[0][i], logits[1][i]);
    expect(statuses == NM_OK && bad == 0 && bits_of(logits[1][3 * BATCH * VOCAB]) ==
               bits_of(GUARD),
           "%s decoder step: %ld logits differ from the scalar row's", row->isa, bad);
    /* the fused job against one call per layer, m = 1 and m = 5 */
    const nm_linear *three[3] = {&layers[0].q, &layers[0].k, &layers[1].v};
    for (int64_t m = 1; m <= 5; m += 4) {
        float *a = xmalloc((size_t)(m * HIDDEN) * 4), *one = xmalloc((size_t)(m * 256) * 4),
              *many = xmalloc((size_t)(m * 256) * 4);
        for (int64_t i = 0; i < m * HIDDEN; ++i) a[i] = next_float();
        float *c1[3] = {one, one + m * HEADS * D, one + m * (HEADS + KV) * D};
        float *c2[3] = {many, many + m * HEADS * D, many + m * (HEADS + KV) * D};
        const int64_t ld[3] = {HEADS * D, KV * D, KV * D};
        int st = 0;
        nm_set_num_threads(1);
        for (int i = 0; i < 3; ++i) st |= nm_linear_run(ref, three[i], m, a, HIDDEN, c1[i], ld[i]);
        nm_set_num_threads(3);
        st |= nm_linear_run_many(row, 3, three, m, a, HIDDEN, c2, ld);
        long diff = 0;
        for (int64_t i = 0; i < m * (HEADS + 2 * KV) * D; ++i) diff += !same(one[i], many[i]);
        expect(st == NM_OK && diff == 0, "%s nm_linear_run_many m=%lld: %ld differ", row->isa,
               (long long)m, diff);
        free(a), free(one), free(many);
    }
    for (int i = 0; i < kept; ++i) free(keep[i]);
    free(norms), free(embed), free(rot), free(logits[0]), free(logits[1]);
}

/* nm_pack_slivers against nm_packed_offset, item by item: 1-, 2- and 4-byte items, the
 * source row-major, transposed (the 8 x 8 byte blocks and their edges) or strided every
 * other row and column, shapes around the blocks and NM_LAYOUT_ROWS, widths of 1 to 96 and
 * past n, Q4_0's XOR; dst allocated to its exact size (the sanitizers see any write past
 * it) with a guard byte checked after. */
static void test_pack_slivers(void) {
    static const int64_t ks[] = {0, 1, 7, 8, 9, 63, 64, 65, 130}, ns[] = {0, 1, 5, 8, 23, 97};
    long bad = 0, cases = 0;
    for (int64_t item = 1; item <= 4; item *= 2)
        for (size_t a = 0; a < sizeof ks / sizeof ks[0]; ++a)
            for (size_t b = 0; b < sizeof ns / sizeof ns[0]; ++b)
                for (int layout = 0; layout < 3; ++layout) {
                    const int64_t k = ks[a], n = ns[b];
                    /* row-major, transposed, every other row and column of a bigger one */
                    const int64_t rs = layout == 0 ? n * item : layout == 1 ? item : 4 * n * item;
                    const int64_t cs = layout == 0 ? item : layout == 1 ? k * item : 2 * item;
                    const size_t src_bytes = (size_t)(4 * (k + 1) * (n + 1) * item);
                    uint8_t *src = xmalloc(src_bytes);
                    for (size_t i = 0; i < src_bytes; ++i) src[i] = (uint8_t)next_u64();
                    const int64_t widths[] = {1, 8, 24, 96, n + 3};
                    for (int wi = 0; wi < 5; ++wi) {
                        const int64_t w = widths[wi];
                        const uint8_t x = item == 1 && wi % 2 ? 0x88 : 0;
                        const size_t bytes = (size_t)((n + w - 1) / w * w * k * item);
                        uint8_t *dst = xmalloc(bytes + 1);
                        dst[bytes] = 0xA5;
                        nm_pack_slivers(k, n, item, src, rs, cs, w, x, dst);
                        for (int64_t p = 0; p < k; ++p)
                            for (int64_t j = 0; j < (n + w - 1) / w * w; ++j)
                                for (int64_t t = 0; t < item; ++t) {
                                    const uint8_t want = j < n ? src[p * rs + j * cs + t] ^ x : x;
                                    bad += dst[nm_packed_offset(k, w, item, p, j) + t] != want;
                                }
                        bad += dst[bytes] != 0xA5;
                        ++cases;
                        free(dst);
                    }
                    free(src);
                }
    expect(bad == 0, "nm_pack_slivers: %ld bytes differ from nm_packed_offset's over %ld cases",
           bad, cases);
}

/* nm_nibble_pairs against the codes themselves: GGUF's byte i of a run holds codes i and
 * i + run; narrowmm's byte j codes 2j and 2j + 1. Q4_0's, Q4_1's and Q4_K's layouts and a
 * short run, every byte value, dst to its exact size with a guard byte after. */
static void test_nibble_pairs(void) {
    static const int64_t layouts[][4] = {{18, 2, 16, 1}, {20, 4, 16, 1}, {144, 16, 32, 4},
                                         {7, 1, 2, 3}};
    long bad = 0;
    for (int l = 0; l < 4; ++l) {
        const int64_t size = layouts[l][0], offset = layouts[l][1], run = layouts[l][2],
                      runs = layouts[l][3], blocks = 37;
        uint8_t *src = xmalloc((size_t)(blocks * size));
        for (int64_t i = 0; i < blocks * size; ++i) src[i] = (uint8_t)(i * 7 + l);
        const size_t bytes = (size_t)(blocks * runs * run);
        uint8_t *dst = xmalloc(bytes + 1);
        dst[bytes] = 0x5A;
        nm_nibble_pairs(blocks, size, offset, run, runs, src, dst);
        for (int64_t b = 0; b < blocks; ++b)
            for (int64_t t = 0; t < runs; ++t) {
                const uint8_t *q = src + b * size + offset + t * run;
                const uint8_t *got = dst + (b * runs + t) * run;
                for (int64_t j = 0; j < run; ++j) {
                    const int64_t c0 = 2 * j, c1 = 2 * j + 1; /* the codes byte j holds */
                    const unsigned lo = c0 < run ? q[c0] & 15u : q[c0 - run] >> 4;
                    const unsigned hi = c1 < run ? q[c1] & 15u : q[c1 - run] >> 4;
                    bad += got[j] != (uint8_t)(lo | hi << 4);
                }
            }
        bad += dst[bytes] != 0x5A;
        free(src), free(dst);
    }
    expect(bad == 0, "nm_nibble_pairs: %ld bytes differ from the codes' pairs", bad);
}

int main(void) {
    nm_set_wake_min_work(0); /* split every call that can be split: race the pool always */
    nm_isa_kernels ref;
    nm_fill_row_scalar(&ref);
    const unsigned features = nm_cpu_features();
    /* the selection rule: the first row this CPU runs; names resolved or refused */
    int first = 0;
    while (!nm_isa_runs_on(first, features)) ++first;
    expect(nm_isa_select(NULL, features) == first, "nm_isa_select(NULL) is not row %d", first);
    expect(nm_isa_select("scalar", 0u) == nm_isa_count - 1 && nm_isa_select("sse9", features) ==
               NM_ISA_UNKNOWN && nm_isa_select(nm_isa_table[0].name, 0u) ==
               (nm_isa_table[0].required ? NM_ISA_UNSUPPORTED : 0),
           "nm_isa_select by name");
    test_pack_slivers(); /* portable C: once, not per row */
    test_nibble_pairs();
    for (int r = 0; r < nm_isa_count; ++r) {
        const nm_isa_entry *e = &nm_isa_table[r];
        if (!nm_isa_runs_on(r, features)) {
            printf("skip row %s: this CPU lacks its features\n", e->name);
            continue;
        }
        nm_isa_kernels row;
        e->fill(&row);
        const long before = failed;
        test_codecs(&row, &ref);
        test_sweep(&row, &ref);
#if defined(NM_HAVE_MXCSR)
        test_no_subnormal_operands(&row, &ref);
#endif
        test_shapes(&row, &ref);
        test_nibble_decodes(&row, &ref);
        test_gemv_streams(&row, &ref);
        test_softmax_exp(&row);
        test_model_ops(&row, &ref);
        test_decoder_step(&row, &ref);
        printf("row %s: %s\n", row.isa, failed == before ? "ok" : "FAILED");
    }
    printf("%ld passed, %ld failed\n", passed, failed);
    return failed ? 1 : 0;
}
