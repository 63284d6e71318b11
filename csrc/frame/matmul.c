/* narrowmm: the loops around the microkernels. This file decides zeroing, the m == 1
 * streaming path, cache blocking and packing; it never touches intrinsics.
 *
 * Bit-exactness: every C element is carried through k in ascending order, either by one
 * gemv call over all k or by consecutive kc blocks whose microkernel calls load C, extend
 * its fma chain and store it back. Storing a float32 partial result and reloading it is
 * exact, so blocking never changes a bit. */
#include <stdlib.h>
#include <string.h>

#include "../include/narrowmm.h"

const nm_format_info nm_format_table[NM_FMT_COUNT] = {
    [NM_FMT_F32] = {"f32", 4},
    [NM_FMT_FP16] = {"fp16", 2},
    [NM_FMT_BF16] = {"bf16", 2},
};

static int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }

static void zero_block(int64_t m, int64_t n, float *c, int64_t ldc) {
    for (int64_t i = 0; i < m; ++i) memset(c + i * ldc, 0, (size_t)n * sizeof(float));
}

static int matmul_packed(const nm_kernel_row *row, int fmt, int64_t m, int64_t n, int64_t k,
                         const float *a, int64_t lda, const uint8_t *b, int64_t ldb,
                         float *c, int64_t ldc) {
    const int64_t itemsize = nm_format_table[fmt].itemsize;
    const int64_t mr = row->mr, nr = row->nr, kc_max = row->kc;
    const int64_t nc_max = (row->nc + nr - 1) / nr * nr;
    size_t bytes = (size_t)(kc_max * nc_max) * sizeof(float);
    bytes = (bytes + 63) / 64 * 64;
    float *panel = aligned_alloc(64, bytes);
    if (!panel) return NM_ENOMEM;
    for (int64_t jc = 0; jc < n; jc += nc_max) {
        const int64_t nc = min64(nc_max, n - jc);
        for (int64_t pc = 0; pc < k; pc += kc_max) {
            const int64_t kc = min64(kc_max, k - pc);
            /* decode this block of B once; every row of A reuses it */
            row->pack[fmt](kc, nc, b + pc * ldb + jc * itemsize, ldb, (int)nr, panel);
            for (int64_t ic = 0; ic < m; ic += mr) {
                const int64_t mcur = min64(mr, m - ic);
                for (int64_t jr = 0; jr < nc; jr += nr) {
                    row->ukernel(kc, mcur, min64(nr, nc - jr), a + ic * lda + pc, lda,
                                 panel + (jr / nr) * kc * nr, c + ic * ldc + jc + jr, ldc);
                }
            }
        }
    }
    free(panel);
    return NM_OK;
}

int nm_matmul(const nm_kernel_row *row, int fmt, int64_t m, int64_t n, int64_t k,
              const float *a, int64_t lda, const uint8_t *b, int64_t ldb, float *c,
              int64_t ldc, int accumulate) {
    if (fmt < 0 || fmt >= NM_FMT_COUNT || m < 0 || n < 0 || k < 0) return NM_EINVAL;
    if (m == 0 || n == 0) return NM_OK;
    if (!accumulate) zero_block(m, n, c, ldc);
    if (k == 0) return NM_OK;
    if (m == 1) {
        /* nothing to amortise: stream B once, straight */
        row->gemv[fmt](k, n, a, b, ldb, c);
        return NM_OK;
    }
    return matmul_packed(row, fmt, m, n, k, a, lda, b, ldb, c, ldc);
}
