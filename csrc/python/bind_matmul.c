/* narrowmm._core: matmul and matmul_packed: arguments, scales, bias, and the column chunks. */
#include "binding.h" /* first: Python.h sets the feature macros */

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../frame/threads.h"

/* ---- matmul ------------------------------------------------------------------------- */

/* A long call runs as column chunks, and between chunks the calling thread takes the GIL
 * back and looks for signals, so Ctrl-C stops a call of any size within about a chunk's
 * time (an interrupted call leaves `out` partly written: whole columns done, the rest as
 * they were). Each output column is its own fma chain, so chunking changes no bit. A call
 * of at most NM_CHUNK_MIN_TOTAL multiply-adds (a gemv weight counting NM_CHUNK_GEMV_WEIGHT,
 * as it costs bandwidth, not arithmetic: ~10-20 ms on avx2) runs whole: splitting the Llama
 * layer shapes at m <= 16 cost up to 1.4x. A longer one starts with a chunk of about
 * NM_CHUNK_FIRST_WORK; the next ones are sized from its time to last about NM_CHUNK_SECONDS
 * on this row and thread count. Chunks are whole groups of packed weights, and multiples
 * of NM_CHUNK_ALIGN columns of row-major ones. */
#define NM_CHUNK_MIN_TOTAL ((double)(1LL << 30))
#define NM_CHUNK_FIRST_WORK ((double)(1 << 28))
#define NM_CHUNK_GEMV_WEIGHT 4
#define NM_CHUNK_SECONDS 0.025
#define NM_CHUNK_ALIGN 64

static double now_seconds(void) {
#if defined(_WIN32)
    return (double)clock() / CLOCKS_PER_SEC;
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
#endif
}

/* `want` columns rounded down to a multiple of `align` (at least one), at most n. */
static int64_t chunk_columns(double want, int64_t align, int64_t n) {
    if (want >= (double)n) return n;
    int64_t cols = (int64_t)want / align * align;
    return cols < align ? align : cols;
}

/* The checks both layouts share, then the call: x and out float-aligned, out's rows
 * apart, out clear of x and the weights; n is the number of output columns. */
static PyObject *run_matmul(int fmt, const matrix *a, const matrix *b, const matrix *c,
                            int64_t n, int packed, int accumulate, const float *bias,
                            const nm_scales *scales) {
    const int bsize = nm_format_table[fmt].itemsize;
    if (((uintptr_t)a->view.buf | (uintptr_t)a->ld | (uintptr_t)c->view.buf |
         (uintptr_t)c->ld) % sizeof(float)) {
        PyErr_SetString(PyExc_ValueError, "x and out must be float32-aligned");
        return NULL;
    }
    if (c->rows > 1 && c->ld < c->cols * 4) {
        PyErr_SetString(PyExc_ValueError, "out has overlapping rows");
        return NULL;
    }
    if (overlaps(c, 4, a, 4) || overlaps(c, 4, b, bsize)) {
        PyErr_SetString(PyExc_ValueError, "out shares memory with x or the weights");
        return NULL;
    }
    const float *ap = (const float *)a->view.buf;
    const uint8_t *bp = (const uint8_t *)b->view.buf;
    float *cp = (float *)c->view.buf;
    const nm_isa_kernels *row = current_row;
    const int64_t m = a->rows, k = a->cols;
    /* Column chunks, with a look for signals (Ctrl-C) between them: see NM_CHUNK_SECONDS. */
    const int64_t align = packed ? nm_pack_width(row, fmt) : NM_CHUNK_ALIGN;
    const double per_column = (double)k * (double)(m + NM_CHUNK_GEMV_WEIGHT);
    int64_t cols = per_column * (double)n <= NM_CHUNK_MIN_TOTAL
                       ? n
                       : chunk_columns(NM_CHUNK_FIRST_WORK / per_column, align, n);
    for (int64_t j0 = 0; j0 < n;) {
        const int64_t w = cols < n - j0 ? cols : n - j0;
        int status;
        double seconds;
        Py_BEGIN_ALLOW_THREADS
        const double t0 = now_seconds();
        nm_scales chunk_scales, *cs = NULL;
        if (scales) { /* the scales (and offsets) of the chunk's columns */
            chunk_scales = nm_scales_from_column(scales, j0);
            cs = &chunk_scales;
        }
        const float *cb = bias ? bias + j0 : NULL; /* the chunk's columns of the bias */
        status = packed ? nm_matmul_packed(row, fmt, m, w, k, ap, a->ld / 4,
                                           bp + nm_packed_offset(k / nm_format_table[fmt].kpack,
                                                                 align, bsize, 0, j0),
                                           cp + j0,
                                           c->ld / 4, accumulate, cb, cs)
                        : nm_matmul(row, fmt, m, w, k, ap, a->ld / 4, bp + j0 * bsize, b->ld,
                                    cp + j0, c->ld / 4, accumulate, cb, cs);
        seconds = now_seconds() - t0;
        Py_END_ALLOW_THREADS
        if (status == NM_ENOMEM) return PyErr_NoMemory();
        if (status != NM_OK) {
            PyErr_SetString(PyExc_ValueError, "invalid matmul arguments");
            return NULL;
        }
        j0 += w;
        if (j0 < n) {
            if (PyErr_CheckSignals() < 0) return NULL; /* out is partly written */
            /* the next chunks last about NM_CHUNK_SECONDS, whatever the row and threads */
            const double scale = seconds > 0 ? NM_CHUNK_SECONDS / seconds : 16.0;
            cols = chunk_columns((double)w * (scale < 16.0 ? scale : 16.0), align, n);
        }
    }
    return Py_NewRef(Py_None);
}

/* 16-bit weights arrive as raw bits (uint16/int16) or as NumPy float16 ('e'); 8-bit ones
 * as bytes */
const char *weights_accept(int fmt) {
    const int size = nm_format_table[fmt].itemsize;
    return size == 4 ? "f" : size == 2 ? "Hhe" : "Bb";
}

/* A factored grid (get_scales), checked, into sc: row-major (2-D) or, for packed weights
 * (sliver: their group width), group-major (3-D). */
static int get_factored_scales(int fmt, const Py_buffer *view, long long bk, int finite,
                               int64_t blocks, int64_t min_ld, int64_t sliver, nm_scales *sc) {
    const int64_t grids = nm_format_table[fmt].offset ? 2 : 1;
    const int group_major = view->ndim == 3 && sliver > 0;
    /* rows: a grid's (2-D) or a group's (3-D) factors and codes, in int8 rows */
    const int64_t rows = group_major ? view->shape[1]
                         : view->ndim == 2 ? view->shape[0] / grids : 0;
    const int64_t cols = group_major ? view->shape[0] / grids * sliver
                         : view->ndim == 2 ? view->shape[1] : 0;
    const int64_t supers = rows > blocks ? (rows - blocks) / 4 : 0;
    if ((view->ndim != 2 && !group_major) || (uintptr_t)view->buf % sizeof(float) ||
        view->shape[0] % grids || supers < 1 || 4 * supers + blocks != rows || /* 2-D, 3-D */
        blocks % supers || cols < min_ld || (group_major && view->shape[2] != sliver)) {
        char packed[96] = "";
        if (sliver > 0)
            snprintf(packed, sizeof packed, " or, packed, 3-D (%lld * groups, 4 * supers + %lld, "
                     "%lld)", (long long)grids, (long long)blocks, (long long)sliver);
        PyErr_Format(PyExc_ValueError,
                     "a factored (int8) grid must be float-aligned, 2-D (%lld * (4 * supers + "
                     "%lld), >= %lld)%s, with %lld blocks a multiple of supers, for k in blocks "
                     "of %lld rows; got %d-D, shape (%lld, %lld, ...)",
                     (long long)grids, (long long)blocks, (long long)min_ld, packed,
                     (long long)blocks, bk, view->ndim,
                     (long long)(view->ndim >= 1 ? view->shape[0] : -1),
                     (long long)(view->ndim >= 2 ? view->shape[1] : -1));
        return -1;
    }
    const int64_t ld = group_major ? sliver : view->shape[1];
    const int64_t lsl = group_major ? rows * sliver : 0;
    /* from one grid's factors (and codes) to the next grid's */
    const int64_t next = group_major ? view->shape[0] / grids * lsl : supers * ld;
    const float *factors = (const float *)view->buf;
    *sc = (nm_scales){.ld = ld, .bk = bk, .finite = finite, .per_super = blocks / supers,
                      .lsl = lsl, .fs = factors,
                      .c8 = (const int8_t *)view->buf + (group_major ? 4 * supers * ld
                                                                     : grids * 4 * supers * ld)};
    if (grids == 2) {
        sc->ofs = factors + (group_major ? next / 4 : next);
        sc->oc8 = sc->c8 + (group_major ? next : blocks * ld);
    }
    return 0;
}

/* The scales argument of a matmul: None for a format without scales; for a scaled one a
 * (ceil(k / bk), ld) C-contiguous float32 array with ld >= min_ld in the kernels' form, bk
 * > 0, and whether the weights are known to hold no NaN/Inf code (nm_scales). A format
 * with offsets (Q4_1) has them below the scales, as many rows: its array is twice as tall
 * and its lower half is the offsets. A format with half_scales (the GGUF ones) may give a
 * float16 array instead (nm_scales.s16). Packed weights (group: their nm_pack_width, else
 * 0) may give their grid group-major instead, a (groups, blocks, width) array with groups *
 * width >= min_ld (twice the groups with offsets, theirs the lower half): nm_scales.lsl. Or
 * a factored grid (nm_scales.c8), an int8 array (grids * (4 * supers + blocks), ld), blocks
 * = ceil(k / bk) a multiple of supers: first each grid's float32 factors (supers, ld), four
 * int8 rows to a float row, then each grid's int8 codes (blocks, ld); per_super is blocks /
 * supers; packed weights' group-major, (grids * groups, 4 * supers + blocks, width), each
 * group's factors then its codes. On success *have says whether `sc` was filled (and
 * `view` must be released). */
int get_scales(int fmt, PyObject *so, long long bk, int finite, int64_t k, int64_t min_ld,
               int64_t sliver, Py_buffer *view, nm_scales *sc, int *have) {
    *have = 0;
    const int scaled = nm_format_table[fmt].scaled;
    if (so == Py_None) {
        if (!scaled) return 0;
        PyErr_Format(PyExc_ValueError, "format '%s' needs its scales", nm_format_table[fmt].name);
        return -1;
    }
    if (!scaled) {
        PyErr_Format(PyExc_ValueError, "format '%s' takes no scales", nm_format_table[fmt].name);
        return -1;
    }
    if (bk <= 0) {
        PyErr_Format(PyExc_ValueError, "the scales' block must be at least 1 row, got %lld", bk);
        return -1;
    }
    if (PyObject_GetBuffer(so, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "scales must be a C-contiguous float32 array");
        return -1;
    }
    const int64_t blocks = k == 0 ? 0 : (k + bk - 1) / bk;
    if (view->itemsize == 1 && format_ok(view->format, "b") && blocks > 0) {
        if (get_factored_scales(fmt, view, bk, finite, blocks, min_ld, sliver, sc) < 0) {
            PyBuffer_Release(view);
            return -1;
        }
        *have = 1;
        return 0;
    }
    const int half = view->itemsize == 2 && format_ok(view->format, "e");
    if (half && !nm_format_table[fmt].half_scales) {
        PyErr_Format(PyExc_TypeError, "format '%s' takes float32 scales, not float16",
                     nm_format_table[fmt].name);
        PyBuffer_Release(view);
        return -1;
    }
    const int ndim_ok = view->ndim == 2 || (view->ndim == 3 && sliver > 0);
    if (!ndim_ok || (!half && (view->itemsize != 4 || !format_ok(view->format, "f"))) ||
        ((uintptr_t)view->buf % view->itemsize)) {
        PyErr_Format(PyExc_TypeError, "scales must be a %s aligned %s array",
                     sliver > 0 ? "2-D (or group-major 3-D)" : "2-D",
                     nm_format_table[fmt].half_scales ? "float32 or float16" : "float32");
        PyBuffer_Release(view);
        return -1;
    }
    const int64_t grids = nm_format_table[fmt].offset ? 2 : 1; /* scales, then offsets */
    const int group_major = view->ndim == 3;
    /* group-major: (grids * groups, blocks, width), each group's blocks in a row */
    const int64_t rows = group_major ? view->shape[1] : view->shape[0] / grids;
    const int64_t cols = group_major ? view->shape[0] / grids * sliver : view->shape[1];
    if (view->shape[0] % grids || rows < blocks || cols < min_ld ||
        (group_major && view->shape[2] != sliver)) {
        PyErr_Format(PyExc_ValueError,
                     "scales of shape %s do not cover k=%lld in blocks of %lld rows and %lld "
                     "columns%s",
                     group_major ? "(groups, blocks, width)" : "(blocks, columns)",
                     (long long)k, bk, (long long)min_ld,
                     group_major && view->shape[2] != sliver ? " in this row's groups" : "");
        PyBuffer_Release(view);
        return -1;
    }
    /* lsl > 0 marks the layout, even with no block (k = 0, nothing read) */
    const int64_t lsl = group_major ? (view->shape[1] > 0 ? view->shape[1] : 1) * sliver : 0;
    *sc = (nm_scales){.ld = group_major ? sliver : view->shape[1], .bk = bk, .finite = finite,
                      .lsl = lsl};
    /* the offsets: the lower half */
    const int64_t lower = view->shape[0] / 2 * (group_major ? view->shape[1] * sliver
                                                             : view->shape[1]);
    if (half) {
        sc->s16 = (const uint16_t *)view->buf;
        sc->o16 = grids == 2 ? sc->s16 + lower : NULL;
    } else {
        sc->s = (const float *)view->buf;
        sc->o = grids == 2 ? sc->s + lower : NULL;
    }
    *have = 1;
    return 0;
}

/* The bias argument of a matmul: None, or a C-contiguous, aligned float32 vector of n values
 * clear of out, not with accumulate. On success *have says whether `view` holds it (and must
 * be released). */
static int get_bias(PyObject *bo, int64_t n, int accumulate, const matrix *out, Py_buffer *view,
                    int *have) {
    *have = 0;
    if (bo == Py_None) return 0;
    if (accumulate) {
        PyErr_SetString(PyExc_ValueError, "a bias and accumulate cannot be combined: a chain "
                                          "starts from one value");
        return -1;
    }
    if (PyObject_GetBuffer(bo, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "bias must be a C-contiguous float32 vector");
        return -1;
    }
    if (view->ndim != 1 || view->itemsize != 4 || !format_ok(view->format, "f") ||
        ((uintptr_t)view->buf % sizeof(float))) {
        PyErr_SetString(PyExc_TypeError, "bias must be a 1-D aligned float32 vector");
        PyBuffer_Release(view);
        return -1;
    }
    if (view->shape[0] != n) {
        PyErr_Format(PyExc_ValueError, "bias must have shape (%lld,) = (out_features,), got "
                     "(%lld,)", (long long)n, (long long)view->shape[0]);
        PyBuffer_Release(view);
        return -1;
    }
    if (overlaps_buffer(out, view)) {
        PyErr_SetString(PyExc_ValueError, "out shares memory with the bias");
        PyBuffer_Release(view);
        return -1;
    }
    *have = 1;
    return 0;
}

/* What both matmul methods do once their matrices are checked: take the scales (k rows,
 * ld columns in the kernels' form) and the bias, refuse an out that overlaps the scales,
 * run, and release what they took. */
static PyObject *run_with_scales_and_bias(int fmt, const matrix *a, const matrix *b,
                                          const matrix *c, int64_t n, int packed,
                                          int accumulate, PyObject *so, long long bk,
                                          int finite, int64_t k, int64_t ld,
                                          int64_t sliver, PyObject *biaso) {
    Py_buffer sv, bv;
    nm_scales sc;
    int have, have_bias = 0;
    PyObject *result = NULL;
    if (get_scales(fmt, so, bk, finite, k, ld, sliver, &sv, &sc, &have) < 0) return NULL;
    if (have && overlaps_buffer(c, &sv)) {
        PyErr_SetString(PyExc_ValueError, "out shares memory with the scales");
    } else if (get_bias(biaso, n, accumulate, c, &bv, &have_bias) == 0) {
        result = run_matmul(fmt, a, b, c, n, packed, accumulate,
                            have_bias ? (const float *)bv.buf : NULL, have ? &sc : NULL);
    }
    if (have_bias) PyBuffer_Release(&bv);
    if (have) PyBuffer_Release(&sv);
    return result;
}

static char *matmul_keywords[] = {"fmt", "x", "weights", "out", "accumulate", "scales", "block",
                                  "finite", "bias", NULL};
static char *matmul_packed_keywords[] = {"fmt", "x", "slivers", "n", "out", "accumulate",
                                         "scales", "block", "finite", "bias", NULL};

PyObject *py_matmul(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    int fmt, accumulate;
    PyObject *ao, *bo, *co, *so = Py_None, *biaso = Py_None;
    long long bk = 0;
    int finite = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iOOOp|OLp$O:matmul", matmul_keywords, &fmt,
                                     &ao, &bo, &co, &accumulate, &so, &bk, &finite, &biaso))
        return NULL;
    if (parse_format(fmt) < 0) return NULL;
    const int bsize = nm_format_table[fmt].itemsize;
    matrix a = {0}, b = {0}, c = {0};
    PyObject *result = NULL;
    if (get_matrix(ao, "x", 0, 1, 4, "f", &a) < 0) goto done;
    if (get_matrix(bo, "weights", 0, 0, bsize, weights_accept(fmt), &b) < 0) goto done;
    if (get_matrix(co, "out", 1, 1, 4, "f", &c) < 0) goto done;
    /* a 4-bit format's stored row holds kpack rows of the matrix */
    const int64_t kpack = nm_format_table[fmt].kpack;
    if (a.cols != b.rows * kpack || c.rows != a.rows || c.cols != b.cols) {
        PyErr_Format(PyExc_ValueError,
                     "shapes do not match: x (%lld, %lld) @ weights (%lld, %lld) -> out "
                     "(%lld, %lld)",
                     (long long)a.rows, (long long)a.cols, (long long)(b.rows * kpack),
                     (long long)b.cols, (long long)c.rows, (long long)c.cols);
        goto done;
    }
    result = run_with_scales_and_bias(fmt, &a, &b, &c, b.cols, 0, accumulate, so, bk, finite,
                                      a.cols, b.cols, 0, biaso);
done:
    release(&a);
    release(&b);
    release(&c);
    return result;
}

/* matmul_packed(fmt, x, slivers, n, out, accumulate): the weights as the current row's
 * layout (nm_matmul_packed), passed as a (ceil(n / W) * k, W) C-contiguous array, W the
 * format's nm_pack_width on the row. */
PyObject *py_matmul_packed(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    int fmt, accumulate;
    long long n, bk = 0;
    int finite = 0;
    PyObject *ao, *bo, *co, *so = Py_None, *biaso = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iOOLOp|OLp$O:matmul_packed",
                                     matmul_packed_keywords, &fmt, &ao, &bo, &n, &co,
                                     &accumulate, &so, &bk, &finite, &biaso))
        return NULL;
    if (parse_format(fmt) < 0) return NULL;
    const int bsize = nm_format_table[fmt].itemsize;
    const int64_t nr = current_row->nr, width = nm_pack_width(current_row, fmt);
    matrix a = {0}, b = {0}, c = {0};
    PyObject *result = NULL;
    if (get_matrix(ao, "x", 0, 1, 4, "f", &a) < 0) goto done;
    if (get_matrix(bo, "packed weights", 0, 0, bsize, weights_accept(fmt), &b) < 0) goto done;
    if (get_matrix(co, "out", 1, 1, 4, "f", &c) < 0) goto done;
    if (b.cols != width) {
        PyErr_Format(PyExc_ValueError,
                     "the weights were packed into %lld-column slivers, but the %s row reads "
                     "%lld: pack them again under this row",
                     (long long)b.cols, current_row->isa, (long long)width);
        goto done;
    }
    const int64_t kpack = nm_format_table[fmt].kpack;
    if (n < 0 || a.cols % kpack || b.rows != (n + width - 1) / width * (a.cols / kpack) ||
        (b.rows > 1 && b.ld != width * bsize) || c.rows != a.rows || c.cols != n) {
        PyErr_Format(PyExc_ValueError,
                     "shapes do not match: x (%lld, %lld) @ packed weights (%lld rows of %lld, "
                     "contiguous) for n=%lld -> out (%lld, %lld)",
                     (long long)a.rows, (long long)a.cols, (long long)b.rows,
                     (long long)b.cols, n, (long long)c.rows, (long long)c.cols);
        goto done;
    }
    result = run_with_scales_and_bias(fmt, &a, &b, &c, n, 1, accumulate, so, bk, finite, a.cols,
                                      (n + nr - 1) / nr * nr, width, biaso);
done:
    release(&a);
    release(&b);
    release(&c);
    return result;
}
