/* narrowmm: scalar, branch-free conversions between float32 and the 16-bit formats.
 *
 * Every function is straight-line integer/float arithmetic with masks instead of branches,
 * so a loop over an array of them vectorises. They are the definition of the codecs in C;
 * docs/contracts.md states what they do and tests/test_codecs.py checks them over every
 * input pattern. They assume the default floating-point environment (round to nearest even,
 * no flush-to-zero / denormals-are-zero), as the rest of the library does. */
#ifndef NM_CODEC_SCALAR_H
#define NM_CODEC_SCALAR_H

#include <stdint.h>
#include <string.h>

static inline uint32_t nm_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float nm_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* all-ones when cond is non-zero, else zero */
static inline uint32_t nm_mask(int cond) { return (uint32_t)0 - (uint32_t)(cond != 0); }

/* binary16 -> binary32, exact. A NaN comes back quiet (bit 22 set) with sign and payload
 * kept, as vcvtph2ps does; +-Inf stays Inf. */
static inline float nm_fp16_to_f32(uint16_t h) {
    const uint32_t exp_field = 0x0F800000u; /* binary16 exponent after << 13 */
    const uint32_t rebias = 0x38000000u;    /* (127 - 15) << 23 */
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t shifted = (uint32_t)(h & 0x7FFFu) << 13;
    uint32_t e = shifted & exp_field;
    uint32_t inf_nan = nm_mask(e == exp_field);
    uint32_t sub = nm_mask(e == 0);
    uint32_t quiet = inf_nan & nm_mask((h & 0x03FFu) != 0) & 0x00400000u;
    /* a second rebias carries an all-ones exponent to 0xFF */
    uint32_t biased = shifted + rebias + (rebias & inf_nan);
    /* zero / subnormal: 2^-14 * (1 + m/1024) - 2^-14 = m * 2^-24, exact, a float32 normal */
    float renorm = nm_bits_f32(biased + 0x00800000u) - 0x1p-14f;
    uint32_t magnitude = (sub & nm_f32_bits(renorm)) | (~sub & biased);
    return nm_bits_f32(sign | magnitude | quiet);
}

/* binary32 -> binary16, round to nearest even; overflow to +-Inf; gradual underflow; a NaN
 * becomes a quiet NaN keeping its sign and top 9 payload bits. Bit-identical to vcvtps2ph
 * with imm8 = 0 (round to nearest even). */
static inline uint16_t nm_f32_to_fp16(float f) {
    uint32_t x = nm_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7FFFFFFFu;
    /* normal result: rebias the exponent and round the 13 dropped bits to nearest even; a
     * carry out of the mantissa correctly bumps the exponent (65520 -> Inf). */
    uint32_t odd = (a >> 13) & 1u;
    uint32_t normal = (a + 0xC8000FFFu + odd) >> 13; /* 0xC8000000 = (15 - 127) << 23 */
    /* subnormal or zero result: adding 0.5 lines the value up on 2^-24 steps, and the FPU
     * rounds to nearest even for us; 1024 steps is the smallest normal, also right. */
    float aligned = nm_bits_f32(a) + 0.5f;
    uint32_t subnormal = nm_f32_bits(aligned) - 0x3F000000u;
    uint32_t is_nan = nm_mask(a > 0x7F800000u);
    uint32_t inf_nan = 0x7C00u | (is_nan & (0x0200u | ((a >> 13) & 0x03FFu)));
    uint32_t big = nm_mask(a >= 0x47800000u);   /* >= 2^16: Inf, or NaN */
    uint32_t small = nm_mask(a < 0x38800000u);  /* < 2^-14: subnormal or zero */
    uint32_t mid = ~(big | small);
    uint32_t r = (big & inf_nan) | (small & subnormal) | (mid & normal);
    return (uint16_t)(sign | (r & 0x7FFFu));
}

/* bfloat16 -> binary32, exact; NaN quieted like nm_fp16_to_f32. */
static inline float nm_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    uint32_t is_nan = nm_mask((u & 0x7FFFFFFFu) > 0x7F800000u);
    return nm_bits_f32(u | (is_nan & 0x00400000u));
}

/* binary32 -> bfloat16, round to nearest even (not truncation); subnormals kept; overflow
 * to +-Inf; a NaN becomes quiet, keeping its sign and top 6 payload bits. */
static inline uint16_t nm_f32_to_bf16(float f) {
    uint32_t x = nm_f32_bits(f);
    uint32_t is_nan = nm_mask((x & 0x7FFFFFFFu) > 0x7F800000u);
    uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
    uint32_t quiet = (x >> 16) | 0x0040u;
    return (uint16_t)((is_nan & quiet) | (~is_nan & rounded));
}

/* ---- FP8 (OCP 8-bit floating point, as ml_dtypes names them) ---------------------------
 * e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; S.1111.111 is NaN;
 *         largest finite 448, smallest subnormal 2^-9.
 * e5m2:   the top byte of a binary16: bias 15, 2 mantissa bits, infinities and NaNs;
 *         largest finite 57344, smallest subnormal 2^-16. */

/* The quiet NaN an FP8 NaN decodes to: sign kept, payload dropped (e4m3fn has none). */
#define NM_F32_QNAN 0x7FC00000u

/* e4m3fn -> binary32, exact. The 7 magnitude bits, shifted into a binary16's exponent and
 * mantissa fields, are the value / 2^8 (bias 15 against 7; subnormals included, since both
 * formats' subnormals sit at the bottom of the same field), so one exact binary16 decode and
 * one exact multiplication by 256 give it; NaN is patched in. */
static inline float nm_e4m3fn_to_f32(uint8_t q) {
    uint32_t sign = (uint32_t)(q & 0x80u) << 24;
    float magnitude = nm_fp16_to_f32((uint16_t)((q & 0x7Fu) << 7)) * 256.0f;
    uint32_t is_nan = nm_mask((q & 0x7Fu) == 0x7Fu);
    return nm_bits_f32(sign | (is_nan & NM_F32_QNAN) | (~is_nan & nm_f32_bits(magnitude)));
}

/* e5m2 -> binary32, exact: it is a binary16 with the low byte zero. A NaN comes back quiet,
 * keeping its sign and payload, as from binary16. */
static inline float nm_e5m2_to_f32(uint8_t q) { return nm_fp16_to_f32((uint16_t)(q << 8)); }

/* binary32 -> e4m3fn, round to nearest even (ties to even mantissa, so 464 -> 448). A
 * magnitude that rounds past 448, and +-Inf, give NaN (ml_dtypes' semantics: the format has
 * no infinity) or, with saturate, +-448. NaN gives the NaN with the input's sign. */
static inline uint8_t nm_f32_to_e4m3fn(float f, int saturate) {
    uint32_t x = nm_f32_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t a = x & 0x7FFFFFFFu;
    /* normal result (2^-6 <= a < 2^9): rebias (0xC4000000 = (7 - 127) << 23) and round the
     * 20 dropped bits to nearest even; a carry bumps the exponent */
    uint32_t odd = (a >> 20) & 1u;
    uint32_t normal = (a + 0xC407FFFFu + odd) >> 20;
    /* subnormal result: 2^14 has a unit in the last place of 2^-9, the format's step, so
     * adding it rounds a to a multiple of 2^-9 (nearest even); 8 steps is the smallest
     * normal, whose code is also 8 */
    uint32_t subnormal = nm_f32_bits(nm_bits_f32(a) + 16384.0f) - 0x46800000u;
    uint32_t small = nm_mask(a < 0x3C800000u); /* < 2^-6 */
    uint32_t r = (small & subnormal) | (~small & normal);
    uint32_t is_nan = nm_mask(a > 0x7F800000u);
    /* too big: >= 2^9 (Inf included), or rounded into the NaN code (> 464) */
    uint32_t over = ~is_nan & nm_mask(a >= 0x44000000u || r > 0x7Eu);
    uint32_t over_code = saturate ? 0x7Eu : 0x7Fu;
    r = (is_nan & 0x7Fu) | (over & over_code) | (~is_nan & ~over & r);
    return (uint8_t)(sign | (r & 0x7Fu));
}

/* binary32 -> e5m2, round to nearest even; overflow to +-Inf (values >= 61440) or, with
 * saturate, to +-57344 (Inf too); a NaN becomes the quiet NaN 0x7E with its sign (as in
 * ml_dtypes: no payload). */
static inline uint8_t nm_f32_to_e5m2(float f, int saturate) {
    uint32_t x = nm_f32_bits(f);
    uint32_t sign = (x >> 24) & 0x80u;
    uint32_t a = x & 0x7FFFFFFFu;
    uint32_t odd = (a >> 21) & 1u;
    uint32_t normal = (a + 0xC80FFFFFu + odd) >> 21; /* 0xC8000000 = (15 - 127) << 23 */
    /* 2^7 has a unit in the last place of 2^-16, the format's step */
    uint32_t subnormal = nm_f32_bits(nm_bits_f32(a) + 128.0f) - 0x43000000u;
    uint32_t small = nm_mask(a < 0x38800000u); /* < 2^-14 */
    uint32_t r = (small & subnormal) | (~small & normal);
    uint32_t is_nan = nm_mask(a > 0x7F800000u);
    uint32_t over = ~is_nan & nm_mask(a >= 0x47800000u || r > 0x7Bu); /* >= 2^16, or Inf */
    uint32_t over_code = saturate ? 0x7Bu : 0x7Cu;
    r = (is_nan & 0x7Eu) | (over & over_code) | (~is_nan & ~over & r);
    return (uint8_t)(sign | (r & 0x7Fu));
}

/* ---- Q8_0's codes (GGUF): int8, the weight being code * the block's scale -------------- */

/* code -> binary32, exact */
static inline float nm_q8_0_to_f32(uint8_t q) { return (float)(int8_t)q; }

/* binary32 -> code: rounded half away from zero (C's roundf, as GGUF's quantizer rounds),
 * clamped to [-128, 127]; NaN gives 0. Python's encode refuses NaN and values out of range
 * unless asked to saturate, so the clamp is what saturate means here and `saturate` only
 * keeps the 8-bit encoders' signature. Straight-line: selects, no branches. */
static inline uint8_t nm_f32_to_q8_0(float f, int saturate) {
    (void)saturate;
    const uint32_t x = nm_f32_bits(f), a = x & 0x7FFFFFFFu;
    const uint32_t neg = nm_mask(x >> 31);
    float m = nm_bits_f32(~nm_mask(a > 0x7F800000u) & a); /* |f|, NaN as 0 */
    m = m < 129.0f ? m : 129.0f;                          /* Inf too; exact int below */
    const int32_t t = (int32_t)m;
    int32_t r = t + (m - (float)t >= 0.5f); /* m - t is exact: the fraction */
    const int32_t limit = 127 + (int32_t)(neg & 1u);
    r = r < limit ? r : limit;
    return (uint8_t)(int8_t)(int32_t)(((uint32_t)r ^ neg) - neg);
}

/* ---- Q5_1's codes (GGUF's Q5_1 and Q5_K, 5 bits held one a byte) ------------------- */

/* code -> raw value, exact: q (then fma with the block's scale and offset). Every byte
 * converts (the API refuses bytes past 31, so the kernels need no mask). */
static inline float nm_q5_1_to_f32(uint8_t q) { return (float)q; }

/* raw value -> code, as GGUF's quantizer rounds: trunc(v + 0.5), the sum rounded to float32
 * first, clamped to 0..31; NaN gives 0. The API refuses NaN and, unless saturating, values
 * whose code falls outside. */
static inline uint8_t nm_f32_to_q5_1(float v, int saturate) {
    (void)saturate; /* the clamp is what saturating means here (see nm_f32_to_q8_0) */
    float f = v + 0.5f;
    f = f > 0.0f ? f : 0.0f; /* NaN too */
    f = f < 31.0f ? f : 31.0f;
    return (uint8_t)f;
}

/* ---- Q4_0 and Q4_1's codes (GGUF): 4 bits, two a byte, the low nibble first --------- */

/* code -> raw value, exact: Q4_0 stands for q - 8 (then times the block's scale), Q4_1 for
 * q (then fma with the block's scale and offset) */
static inline float nm_q4_0_to_f32(unsigned q) { return (float)(q & 15u) - 8.0f; }
static inline float nm_q4_1_to_f32(unsigned q) { return (float)(q & 15u); }

/* raw value -> code, as GGUF's quantizers round: trunc(v + 8.5) (Q4_0) or trunc(v + 0.5)
 * (Q4_1), the sum rounded to float32 first, then clamped to 0..15; NaN gives 0. The API
 * refuses NaN and, unless saturating, values whose code falls outside. */
static inline unsigned nm_nibble_code(float f) {
    f = f > 0.0f ? f : 0.0f; /* NaN too */
    f = f < 15.0f ? f : 15.0f;
    return (unsigned)f;
}
static inline unsigned nm_f32_to_q4_0(float v) { return nm_nibble_code(v + 8.5f); }
static inline unsigned nm_f32_to_q4_1(float v) { return nm_nibble_code(v + 0.5f); }

#endif
