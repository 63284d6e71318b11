/* narrowmm: the elementwise steps of a decoder layer, each a single IEEE float32 operation
 * per element (or, for the rotary embedding, the three a framework evaluates one after the
 * other), so they give the bits PyTorch's eager elementwise kernels give: a correctly
 * rounded product or sum does not depend on how it is vectorised. Compiled with contraction
 * off (CMakeLists.txt), so no a * b + c becomes an fma the model did not write. */
#include "../include/narrowmm.h"

void nm_scale_rows(int64_t rows, int64_t n, const float *w, float *x, int64_t ldx) {
    for (int64_t i = 0; i < rows; ++i) {
        float *xi = x + i * ldx;
        for (int64_t j = 0; j < n; ++j) xi[j] = w[j] * xi[j];
    }
}

void nm_add_into(int64_t count, const float *a, float *x) {
    for (int64_t j = 0; j < count; ++j) x[j] = x[j] + a[j];
}

void nm_mul_into(int64_t count, const float *a, float *x) {
    for (int64_t j = 0; j < count; ++j) x[j] = x[j] * a[j];
}

/* Hugging Face's rotate-half form: out = x * cos + rotate_half(x) * sin, with
 * rotate_half(x) = (-x[d/2:], x[:d/2]); each product rounded, then the sum rounded. */
void nm_rotary(int64_t d, const float *x, const float *cos, const float *sin, float *out) {
    const int64_t half = d / 2;
    for (int64_t j = 0; j < d; ++j) {
        const float turned = j < half ? -x[j + half] : x[j - half];
        const float a = x[j] * cos[j];
        const float b = turned * sin[j];
        out[j] = a + b;
    }
}
