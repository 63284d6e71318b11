/* narrowmm: elementary functions with the same bits on every CPU and compiler.
 *
 * The model ops (attention's softmax, SiLU) need exp. The C library's expf is not the same
 * function everywhere (glibc picks an FMA variant at load time; other libms round
 * differently) and vector libraries differ from their scalar tails. This one uses only IEEE
 * double +, -, *, floor and ldexp, each correctly rounded, with contraction off (CMake's
 * -ffp-contract=off): every build on every CPU computes the same double, and rounding it to
 * float32 gives the same float. Accuracy: relative error below 2e-16 before the final
 * rounding, so nm_expf is correctly rounded except for float results within about 2e-16 of a
 * rounding boundary (none found against a correctly rounded exp on the float32 inputs
 * tested in tests/test_invariant_ops.py). */
#ifndef NM_EXACT_MATH_H
#define NM_EXACT_MATH_H

#include <math.h>

/* e^x in double: x = k ln2 + r with |r| <= ln2 / 2, e^r by its Taylor series to r^12 (the
 * first term left out is below 2e-16 relative), then the exact scaling by 2^k. */
static inline double nm_exp_d(double x) {
    if (x != x) return x;
    if (x > 709.78) return HUGE_VAL;
    if (x < -745.2) return 0.0;
    const double k = floor(x * 1.4426950408889634 + 0.5);
    /* ln 2 split so that k * LN2_HI is exact for |k| < 2^11 (fdlibm's constants) */
    const double r = (x - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
    double p = 1.0 / 479001600.0;           /* 1/12! */
    p = p * r + 1.0 / 39916800.0;           /* 1/11! */
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    return ldexp(p, (int)k);
}

/* e^x for float32 x, rounded once from nm_exp_d. */
static inline float nm_expf(float x) { return (float)nm_exp_d((double)x); }

/* SiLU, x * sigmoid(x) = x / (1 + e^-x), computed in double and rounded once. */
static inline float nm_silu_value(float x) {
    const double xd = (double)x;
    return (float)(xd / (1.0 + nm_exp_d(-xd)));
}

#endif
