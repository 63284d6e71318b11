/* narrowmm._core: the CPython binding of the C core.
 *
 * Arrays arrive through the buffer protocol (no NumPy C API). The Python layer
 * (narrowmm/_api.py) validates first and gives the friendly messages; this file checks
 * everything again, because a call that reaches C with a bad shape or stride must raise,
 * never read or write out of bounds. The GIL is released while kernels run. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if defined(__linux__)
#include <dlfcn.h> /* dladdr: set_omp_team checks what its address is */
#endif

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../include/narrowmm.h"
#include "../frame/threads.h"

/* Plain C symbols for threadpoolctl's controller (narrowmm/_threads.py), which finds this
 * library among the loaded ones and calls these through ctypes. */
#if defined(_WIN32)
#define NM_EXPORT __declspec(dllexport)
#else
#define NM_EXPORT __attribute__((visibility("default")))
#endif
NM_EXPORT int narrowmm_get_num_threads(void) { return nm_get_num_threads(); }
NM_EXPORT void narrowmm_set_num_threads(int n) { nm_set_num_threads(n); }

static nm_kernel_row rows[16];
static int row_supported[16];
static const nm_kernel_row *current_row;
static unsigned cpu_features;

/* ---- buffer checks ------------------------------------------------------------------ */

/* A native-order, single-item format whose code is one of `accept`: "f", "<f", "=f", ...
 * (the library only builds for little-endian targets; see CMakeLists.txt). */
static int format_ok(const char *fmt, const char *accept) {
    if (!fmt) fmt = "B";
    if (*fmt == '@' || *fmt == '=' || *fmt == '<') ++fmt;
    if (fmt[0] == '\0' || fmt[1] != '\0') return 0;
    return strchr(accept, fmt[0]) != NULL;
}

typedef struct matrix {
    Py_buffer view;
    int held;
    int64_t rows, cols, ld; /* ld in bytes */
} matrix;

static void release(matrix *m) {
    if (m->held) PyBuffer_Release(&m->view);
    m->held = 0;
}

/* Get a 2-D buffer whose rows are contiguous runs of `itemsize`-byte items; with
 * `vector_ok`, a contiguous 1-D buffer too, as one row (x and out of an m = 1 product, so
 * the Python layer need not make (1, k) views of them). */
static int get_matrix(PyObject *obj, const char *what, int writable, int vector_ok,
                      int itemsize, const char *accept, matrix *m) {
    int flags = PyBUF_RECORDS_RO | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &m->view, flags) < 0) {
        PyErr_Clear();
        if (writable && PyObject_CheckBuffer(obj))
            PyErr_Format(PyExc_ValueError, "%s must be a writable array", what);
        else
            PyErr_Format(PyExc_TypeError, "%s must support the buffer protocol, got %.100s",
                         what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    m->held = 1;
    Py_buffer *v = &m->view;
    if (v->ndim != 2 && !(vector_ok && v->ndim == 1)) {
        PyErr_Format(PyExc_ValueError, "%s must be %s, got %d-D", what,
                     vector_ok ? "1-D or 2-D" : "2-D", v->ndim);
        return -1;
    }
    if (v->itemsize != itemsize || !format_ok(v->format, accept)) {
        PyErr_Format(PyExc_TypeError,
                     "%s has item format '%s' (%zd bytes), expected %d-byte items of '%s'",
                     what, v->format ? v->format : "B", v->itemsize, itemsize, accept);
        return -1;
    }
    if (v->ndim == 1) {
        m->rows = 1;
        m->cols = v->shape[0];
        m->ld = m->cols * itemsize;
        if (m->cols > 1 && v->strides[0] != itemsize) {
            PyErr_Format(PyExc_ValueError, "%s must be contiguous (stride %zd)", what,
                         v->strides[0]);
            return -1;
        }
        return 0;
    }
    m->rows = v->shape[0];
    m->cols = v->shape[1];
    if (m->rows == 0 || m->cols == 0) { /* nothing is addressed */
        m->ld = m->cols * itemsize;
        return 0;
    }
    if (m->cols > 1 && v->strides[1] != itemsize) {
        PyErr_Format(PyExc_ValueError, "%s must have contiguous rows (inner stride %zd)",
                     what, v->strides[1]);
        return -1;
    }
    m->ld = v->strides[0];
    if (m->rows > 1 && m->ld < 0) {
        PyErr_Format(PyExc_ValueError, "%s has a negative row stride", what);
        return -1;
    }
    if (m->rows <= 1) m->ld = m->cols * itemsize;
    return 0;
}

/* [lo, hi) byte range a matrix's elements occupy */
static void extent(const matrix *m, int itemsize, uintptr_t *lo, uintptr_t *hi) {
    uintptr_t base = (uintptr_t)m->view.buf;
    *lo = base;
    *hi = m->rows == 0 || m->cols == 0
              ? base
              : base + (uintptr_t)((m->rows - 1) * m->ld + m->cols * itemsize);
}

static int overlaps(const matrix *x, int xs, const matrix *y, int ys) {
    uintptr_t xl, xh, yl, yh;
    extent(x, xs, &xl, &xh);
    extent(y, ys, &yl, &yh);
    return xl < yh && yl < xh;
}

/* out against a contiguous buffer (the scales) */
static int overlaps_buffer(const matrix *out, const Py_buffer *v) {
    uintptr_t lo, hi;
    extent(out, 4, &lo, &hi);
    const uintptr_t vl = (uintptr_t)v->buf, vh = vl + (uintptr_t)v->len;
    return lo < vh && vl < hi;
}

static int parse_format(int fmt) {
    if (fmt < 0 || fmt >= NM_FMT_COUNT) {
        PyErr_Format(PyExc_ValueError, "unknown format code %d", fmt);
        return -1;
    }
    return 0;
}

/* ---- matmul ------------------------------------------------------------------------- */

/* A long call runs as column chunks, and between chunks the calling thread takes the GIL
 * back and looks for signals, so Ctrl-C stops a call of any size within about a chunk's
 * time (an interrupted call leaves `out` partly written: whole columns done, the rest as
 * they were). Each output column is its own fma chain, so chunking changes no bit. A call
 * of at most NM_CHUNK_MIN_TOTAL multiply-adds (a gemv weight counting NM_CHUNK_GEMV_WEIGHT,
 * as it costs bandwidth, not arithmetic: ~10-20 ms on avx2) runs whole: splitting the Llama
 * layer shapes at m <= 16 cost up to 1.4x. A longer one starts with a chunk of about
 * NM_CHUNK_FIRST_WORK; the next ones are sized from its time to last about NM_CHUNK_SECONDS
 * on this row and thread count. Chunks are whole slivers of packed weights, and multiples
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
    const nm_kernel_row *row = current_row;
    const int64_t m = a->rows, k = a->cols;
    /* Column chunks, with a look for signals (Ctrl-C) between them: see NM_CHUNK_SECONDS. */
    const int64_t align = packed ? row->nr : NM_CHUNK_ALIGN;
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
        if (scales) { /* the scales of the chunk's columns */
            chunk_scales = *scales;
            chunk_scales.s += j0;
            cs = &chunk_scales;
        }
        const float *cb = bias ? bias + j0 : NULL; /* the chunk's columns of the bias */
        status = packed ? nm_matmul_packed(row, fmt, m, w, k, ap, a->ld / 4,
                                           bp + (j0 / align) * k * align * bsize, cp + j0,
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
static const char *weights_accept(int fmt) {
    const int size = nm_format_table[fmt].itemsize;
    return size == 4 ? "f" : size == 2 ? "Hhe" : "Bb";
}

/* The scales argument of a matmul: None for a format without scales; for a scaled one a
 * (ceil(k / bk), ld) C-contiguous float32 array with ld >= min_ld in the kernels' form, bk
 * > 0, and whether the weights are known to hold no NaN/Inf code (nm_scales). On success
 * *have says whether `sc` was filled (and `view` must be released). */
static int get_scales(int fmt, PyObject *so, long long bk, int finite, int64_t k,
                      int64_t min_ld, Py_buffer *view, nm_scales *sc, int *have) {
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
    if (view->ndim != 2 || view->itemsize != 4 || !format_ok(view->format, "f") ||
        ((uintptr_t)view->buf % sizeof(float))) {
        PyErr_SetString(PyExc_TypeError, "scales must be a 2-D aligned float32 array");
        PyBuffer_Release(view);
        return -1;
    }
    if (view->shape[0] < blocks || view->shape[1] < min_ld) {
        PyErr_Format(PyExc_ValueError,
                     "scales of shape (%lld, %lld) do not cover k=%lld in blocks of %lld rows "
                     "and %lld columns",
                     (long long)view->shape[0], (long long)view->shape[1], (long long)k, bk,
                     (long long)min_ld);
        PyBuffer_Release(view);
        return -1;
    }
    sc->s = (const float *)view->buf;
    sc->ld = view->shape[1];
    sc->bk = bk;
    sc->finite = finite;
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

static char *matmul_keywords[] = {"fmt", "x", "weights", "out", "accumulate", "scales", "block",
                                  "finite", "bias", NULL};
static char *matmul_packed_keywords[] = {"fmt", "x", "slivers", "n", "out", "accumulate",
                                         "scales", "block", "finite", "bias", NULL};

static PyObject *py_matmul(PyObject *self, PyObject *args, PyObject *kwargs) {
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
    if (a.cols != b.rows || c.rows != a.rows || c.cols != b.cols) {
        PyErr_Format(PyExc_ValueError,
                     "shapes do not match: x (%lld, %lld) @ weights (%lld, %lld) -> out "
                     "(%lld, %lld)",
                     (long long)a.rows, (long long)a.cols, (long long)b.rows,
                     (long long)b.cols, (long long)c.rows, (long long)c.cols);
        goto done;
    }
    Py_buffer sv;
    nm_scales sc;
    int have;
    if (get_scales(fmt, so, bk, finite, b.rows, b.cols, &sv, &sc, &have) < 0) goto done;
    Py_buffer bv;
    int have_bias = 0;
    if (have && overlaps_buffer(&c, &sv)) {
        PyErr_SetString(PyExc_ValueError, "out shares memory with the scales");
    } else if (get_bias(biaso, b.cols, accumulate, &c, &bv, &have_bias) == 0) {
        result = run_matmul(fmt, &a, &b, &c, b.cols, 0, accumulate,
                            have_bias ? (const float *)bv.buf : NULL, have ? &sc : NULL);
    }
    if (have_bias) PyBuffer_Release(&bv);
    if (have) PyBuffer_Release(&sv);
done:
    release(&a);
    release(&b);
    release(&c);
    return result;
}

/* matmul_packed(fmt, x, slivers, n, out, accumulate): the weights as the current row's
 * layout (nm_matmul_packed), passed as a (ceil(n / NR) * k, NR) C-contiguous array. */
static PyObject *py_matmul_packed(PyObject *self, PyObject *args, PyObject *kwargs) {
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
    const int64_t nr = current_row->nr;
    matrix a = {0}, b = {0}, c = {0};
    PyObject *result = NULL;
    if (get_matrix(ao, "x", 0, 1, 4, "f", &a) < 0) goto done;
    if (get_matrix(bo, "packed weights", 0, 0, bsize, weights_accept(fmt), &b) < 0) goto done;
    if (get_matrix(co, "out", 1, 1, 4, "f", &c) < 0) goto done;
    if (b.cols != nr) {
        PyErr_Format(PyExc_ValueError,
                     "the weights were packed into %lld-column slivers, but the %s row reads "
                     "%lld: pack them again under this row",
                     (long long)b.cols, current_row->isa, (long long)nr);
        goto done;
    }
    if (n < 0 || b.rows != (n + nr - 1) / nr * a.cols || (b.rows > 1 && b.ld != nr * bsize) ||
        c.rows != a.rows || c.cols != n) {
        PyErr_Format(PyExc_ValueError,
                     "shapes do not match: x (%lld, %lld) @ packed weights (%lld rows of %lld, "
                     "contiguous) for n=%lld -> out (%lld, %lld)",
                     (long long)a.rows, (long long)a.cols, (long long)b.rows,
                     (long long)b.cols, n, (long long)c.rows, (long long)c.cols);
        goto done;
    }
    Py_buffer sv;
    nm_scales sc;
    int have;
    if (get_scales(fmt, so, bk, finite, a.cols, (n + nr - 1) / nr * nr, &sv, &sc, &have) < 0)
        goto done;
    Py_buffer bv;
    int have_bias = 0;
    if (have && overlaps_buffer(&c, &sv)) {
        PyErr_SetString(PyExc_ValueError, "out shares memory with the scales");
    } else if (get_bias(biaso, n, accumulate, &c, &bv, &have_bias) == 0) {
        result = run_matmul(fmt, &a, &b, &c, n, 1, accumulate,
                            have_bias ? (const float *)bv.buf : NULL, have ? &sc : NULL);
    }
    if (have_bias) PyBuffer_Release(&bv);
    if (have) PyBuffer_Release(&sv);
done:
    release(&a);
    release(&b);
    release(&c);
    return result;
}

/* ---- codecs ------------------------------------------------------------------------- */

static int get_vector(PyObject *obj, const char *what, int writable, Py_buffer *v) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a%s C-contiguous buffer", what,
                     writable ? " writable" : "");
        return -1;
    }
    return 0;
}

static int find_row(const char *name);

static PyObject *codec_call(PyObject *args, int encode) {
    int fmt, saturate = 0;
    PyObject *so, *dobj;
    const char *isa = NULL;
    if (!PyArg_ParseTuple(args, "iOO|zp", &fmt, &so, &dobj, &isa, &saturate)) return NULL;
    if (parse_format(fmt) < 0) return NULL;
    const nm_kernel_row *row = current_row;
    if (isa) { /* a named row's codec, for tests that compare rows */
        int i = find_row(isa);
        if (i < 0 || !row_supported[i]) {
            PyErr_Format(PyExc_ValueError, "ISA row '%s' is not available here", isa);
            return NULL;
        }
        row = &rows[i];
    }
    const int item = nm_format_table[fmt].itemsize;
    if (item == 4) {
        PyErr_Format(PyExc_ValueError, "format '%s' has no codec", nm_format_table[fmt].name);
        return NULL;
    }
    if (saturate && item != 1) {
        PyErr_Format(PyExc_ValueError, "saturate applies to the 8-bit formats, not '%s'",
                     nm_format_table[fmt].name);
        return NULL;
    }
    Py_buffer s, d;
    if (get_vector(so, "source", 0, &s) < 0) return NULL;
    if (get_vector(dobj, "destination", 1, &d) < 0) {
        PyBuffer_Release(&s);
        return NULL;
    }
    const Py_ssize_t in_size = encode ? 4 : item, out_size = encode ? item : 4;
    PyObject *result = NULL;
    if (s.len % in_size || d.len % out_size || s.len / in_size != d.len / out_size) {
        PyErr_SetString(PyExc_ValueError, "source and destination sizes do not match");
    } else if (((uintptr_t)s.buf % in_size) || ((uintptr_t)d.buf % out_size)) {
        PyErr_SetString(PyExc_ValueError, "codec buffers must be aligned to their item size");
    } else {
        const int64_t n = s.len / in_size;
        Py_BEGIN_ALLOW_THREADS
        if (encode && item == 1)
            row->encode8[fmt]((const float *)s.buf, (uint8_t *)d.buf, n, saturate);
        else if (item == 1)
            row->decode8[fmt]((const uint8_t *)s.buf, (float *)d.buf, n);
        else if (encode)
            row->encode[fmt]((const float *)s.buf, (uint16_t *)d.buf, n);
        else
            row->decode[fmt]((const uint16_t *)s.buf, (float *)d.buf, n);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&s);
    PyBuffer_Release(&d);
    return result;
}

static PyObject *py_encode(PyObject *self, PyObject *args) {
    (void)self;
    return codec_call(args, 1);
}
static PyObject *py_decode(PyObject *self, PyObject *args) {
    (void)self;
    return codec_call(args, 0);
}

/* ---- introspection ------------------------------------------------------------------ */

static PyObject *feature_list(unsigned bits) {
    PyObject *list = PyList_New(0);
    if (!list) return NULL;
    for (int i = 0; i < nm_feature_count; ++i) {
        if (!(bits & nm_feature_names[i].bit)) continue;
        PyObject *s = PyUnicode_FromString(nm_feature_names[i].name);
        if (!s || PyList_Append(list, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(s);
    }
    return list;
}

static PyObject *py_cpu_features(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return feature_list(cpu_features);
}

static PyObject *py_pack_width(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyLong_FromLong(current_row->nr);
}

static PyObject *py_isa(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyUnicode_FromString(current_row->isa);
}

/* [(name, supported, [missing features]), ...] best first */
static PyObject *py_isa_rows(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    PyObject *list = PyList_New(nm_isa_count);
    if (!list) return NULL;
    for (int i = 0; i < nm_isa_count; ++i) {
        PyObject *missing = feature_list(nm_isa_table[i].required & ~cpu_features);
        if (!missing) {
            Py_DECREF(list);
            return NULL;
        }
        PyObject *t = Py_BuildValue("(sON)", nm_isa_table[i].name,
                                    row_supported[i] ? Py_True : Py_False, missing);
        if (!t) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, t);
    }
    return list;
}

static int find_row(const char *name) {
    for (int i = 0; i < nm_isa_count; ++i)
        if (strcmp(nm_isa_table[i].name, name) == 0) return i;
    return -1;
}

/* Select a row by name; raises if unknown or unsupported. */
static int select_row(const char *name, const char *origin) {
    int i = find_row(name);
    if (i < 0) {
        char names[256] = "";
        for (int j = 0; j < nm_isa_count; ++j) {
            if (j) strncat(names, ", ", sizeof names - strlen(names) - 1);
            strncat(names, nm_isa_table[j].name, sizeof names - strlen(names) - 1);
        }
        PyErr_Format(PyExc_ValueError, "%s: unknown ISA row '%s' (this build has: %s)", origin,
                     name, names);
        return -1;
    }
    if (!row_supported[i]) {
        PyObject *missing = feature_list(nm_isa_table[i].required & ~cpu_features);
        if (missing)
            PyErr_Format(PyExc_RuntimeError, "%s: this CPU cannot run the '%s' row (missing %R)",
                         origin, name, missing);
        Py_XDECREF(missing);
        return -1;
    }
    current_row = &rows[i];
    return 0;
}

static PyObject *py_set_isa(PyObject *self, PyObject *arg) {
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    if (select_row(name, "set_isa") < 0) return NULL;
    Py_RETURN_NONE;
}

/* kernel_names(op, fmt) -> list of C kernel names serving it in the current row */
static PyObject *py_kernel_names(PyObject *self, PyObject *args) {
    (void)self;
    const char *op;
    int fmt;
    if (!PyArg_ParseTuple(args, "si", &op, &fmt)) return NULL;
    if (parse_format(fmt) < 0) return NULL;
    const nm_kernel_row *r = current_row;
    /* the finite-weights slot of a scaled format (nm_kernels.h) */
    if (strcmp(op, "matmul_finite") == 0 || strcmp(op, "matmul_packed_finite") == 0) {
        if (!nm_format_table[fmt].scaled) return PyList_New(0);
        fmt = fmt == NM_FMT_E4M3FN ? NM_SLOT_E4M3FN_FINITE : NM_SLOT_E5M2_FINITE;
        op = strcmp(op, "matmul_finite") == 0 ? "matmul" : "matmul_packed";
    }
    if (strcmp(op, "matmul") == 0) {
        if (!r->gemv[fmt] || !r->gemv2[fmt] || !r->ukernel_pack[fmt] || !r->ukernel ||
            !r->pack[fmt])
            return PyList_New(0);
        return Py_BuildValue("[sssss]", r->gemv_name[fmt], r->gemv2_name[fmt],
                             r->ukernel_pack_name[fmt], r->ukernel_name, r->pack_name[fmt]);
    }
    if (strcmp(op, "matmul_packed") == 0) {
        if (!r->gemv_packed[fmt] || !r->gemv2_packed[fmt] || !r->ukernel_pack[fmt] ||
            !r->ukernel || !r->pack[fmt])
            return PyList_New(0);
        return Py_BuildValue("[sssss]", r->gemv_packed_name[fmt], r->gemv2_packed_name[fmt],
                             r->ukernel_pack_name[fmt], r->ukernel_name, r->pack_name[fmt]);
    }
    if (strcmp(op, "encode") == 0) {
        if (r->encode8[fmt]) return Py_BuildValue("[s]", r->encode8_name[fmt]);
        return r->encode[fmt] ? Py_BuildValue("[s]", r->encode_name[fmt]) : PyList_New(0);
    }
    if (strcmp(op, "decode") == 0) {
        if (r->decode8[fmt]) return Py_BuildValue("[s]", r->decode8_name[fmt]);
        return r->decode[fmt] ? Py_BuildValue("[s]", r->decode_name[fmt]) : PyList_New(0);
    }
    PyErr_Format(PyExc_ValueError, "unknown operation '%s'", op);
    return NULL;
}

static PyObject *py_set_num_threads(PyObject *self, PyObject *arg) {
    (void)self;
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1 || n > NM_MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "thread count must be in [1, %d], got %ld",
                     NM_MAX_THREADS, n);
        return NULL;
    }
    nm_set_num_threads((int)n);
    Py_RETURN_NONE;
}

static PyObject *py_get_num_threads(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyLong_FromLong(nm_get_num_threads());
}

static int check_threads(int threads) {
    if (threads < 1 || threads > NM_MAX_THREADS) {
        PyErr_Format(PyExc_ValueError, "threads must be in [1, %d], got %d", NM_MAX_THREADS,
                     threads);
        return -1;
    }
    return 0;
}

/* probe_fma(threads, iters) -> (flops, seconds) on the current row */
static PyObject *py_probe_fma(PyObject *self, PyObject *args) {
    (void)self;
    int threads;
    long long iters;
    if (!PyArg_ParseTuple(args, "iL", &threads, &iters)) return NULL;
    if (check_threads(threads) < 0) return NULL;
    if (iters < 1) {
        PyErr_SetString(PyExc_ValueError, "iters must be positive");
        return NULL;
    }
    double flops, seconds;
    Py_BEGIN_ALLOW_THREADS
    seconds = nm_probe_fma(current_row, threads, iters, &flops);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(dd)", flops, seconds);
}

/* probe_read(threads, buffer) -> seconds to read the whole float32 buffer once */
static PyObject *py_probe_read(PyObject *self, PyObject *args) {
    (void)self;
    int threads;
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "iO", &threads, &obj)) return NULL;
    if (check_threads(threads) < 0) return NULL;
    Py_buffer v;
    if (get_vector(obj, "buffer", 0, &v) < 0) return NULL;
    PyObject *result = NULL;
    const int64_t n = v.len / 4;
    if ((uintptr_t)v.buf % 64 || n % (64 * (int64_t)threads) || n == 0) {
        PyErr_SetString(PyExc_ValueError,
                        "buffer must be 64-byte aligned, non-empty, a multiple of 256*threads bytes");
    } else {
        double seconds;
        Py_BEGIN_ALLOW_THREADS
        seconds = nm_probe_read(current_row, threads, (const float *)v.buf, n);
        Py_END_ALLOW_THREADS
        result = PyFloat_FromDouble(seconds);
    }
    PyBuffer_Release(&v);
    return result;
}

/* set_wake_min_work(n): the cost below which a call leaves sleeping workers asleep */
static PyObject *py_set_wake_min_work(PyObject *self, PyObject *arg) {
    (void)self;
    const long long work = PyLong_AsLongLong(arg);
    if (work == -1 && PyErr_Occurred()) return NULL;
    if (work < 0) {
        PyErr_SetString(PyExc_ValueError, "wake_min_work must be >= 0");
        return NULL;
    }
    nm_set_wake_min_work((int64_t)work);
    Py_RETURN_NONE;
}

static PyObject *py_get_wake_min_work(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyLong_FromLongLong((long long)nm_get_wake_min_work());
}

static PyObject *py_set_spin_ns(PyObject *self, PyObject *arg) {
    (void)self;
    const long long ns = PyLong_AsLongLong(arg);
    if (ns == -1 && PyErr_Occurred()) return NULL;
    if (ns < 0) {
        PyErr_SetString(PyExc_ValueError, "the spin time must be >= 0 ns");
        return NULL;
    }
    nm_set_spin_ns((int64_t)ns);
    return Py_NewRef(Py_None);
}

static PyObject *py_get_spin_ns(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyLong_FromLongLong((long long)nm_get_spin_ns());
}

/* set_omp_team(address): run parallel jobs on the OpenMP team whose GOMP_parallel is at
 * `address` (0: narrowmm's own pool). A wrong address would crash the next parallel call,
 * so it must be a loaded library's symbol of that name (Linux: dladdr says which). */
static PyObject *py_set_omp_team(PyObject *self, PyObject *arg) {
    (void)self;
    void *address = PyLong_AsVoidPtr(arg);
    if (!address && PyErr_Occurred()) return NULL;
    if (address) {
#if defined(__linux__)
        Dl_info info;
        if (!dladdr(address, &info) || !info.dli_sname || info.dli_saddr != address ||
            strcmp(info.dli_sname, "GOMP_parallel") != 0) {
            PyErr_SetString(PyExc_ValueError,
                            "the address is not GOMP_parallel of a loaded libgomp");
            return NULL;
        }
#else
        PyErr_SetString(PyExc_ValueError, "an OpenMP team can be shared on Linux only");
        return NULL;
#endif
    }
    nm_set_omp_team(address);
    Py_RETURN_NONE;
}

static PyObject *py_omp_team(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyBool_FromLong(nm_omp_team());
}

static PyObject *py_parallel_jobs(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyLong_FromLong(nm_parallel_jobs());
}

static PyObject *py_formats(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    PyObject *list = PyList_New(NM_FMT_COUNT);
    if (!list) return NULL;
    for (int i = 0; i < NM_FMT_COUNT; ++i) {
        PyObject *t = Py_BuildValue("(isiii)", i, nm_format_table[i].name,
                                    nm_format_table[i].itemsize, nm_format_table[i].scaled,
                                    nm_format_table[i].scale_exponent);
        if (!t) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, t);
    }
    return list;
}

/* ---- model ops (ops/) ------------------------------------------------------------------ */

/* A C-contiguous buffer of `ndim` dimensions of itemsize-byte items of `accept` */
static int get_tensor(PyObject *obj, const char *what, int writable, int ndim, int itemsize,
                      const char *accept, Py_buffer *v) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a%s C-contiguous array, got %.100s", what,
                     writable ? " writable" : "", Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (v->ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s must be %d-D, got %d-D", what, ndim, v->ndim);
        PyBuffer_Release(v);
        return -1;
    }
    if (v->itemsize != itemsize || !format_ok(v->format, accept)) {
        PyErr_Format(PyExc_TypeError, "%s has item format '%s', expected '%s'", what,
                     v->format ? v->format : "B", accept);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

static int buffers_overlap(const Py_buffer *x, const Py_buffer *y) {
    const uintptr_t xl = (uintptr_t)x->buf, yl = (uintptr_t)y->buf;
    return x->len > 0 && y->len > 0 && xl < yl + (uintptr_t)y->len &&
           yl < xl + (uintptr_t)x->len;
}

/* attention(q, k, v, allowed or None, scale, out): nm_attention on the current row. */
static PyObject *py_attention(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *qo, *ko, *vo, *mo, *oo;
    float scale;
    if (!PyArg_ParseTuple(args, "OOOOfO:attention", &qo, &ko, &vo, &mo, &scale, &oo))
        return NULL;
    Py_buffer q = {0}, k = {0}, v = {0}, m = {0}, o = {0};
    int have_m = 0;
    PyObject *result = NULL;
    if (get_tensor(qo, "q", 0, 4, 4, "f", &q) < 0) return NULL;
    if (get_tensor(ko, "k", 0, 4, 4, "f", &k) < 0) goto done_q;
    if (get_tensor(vo, "v", 0, 4, 4, "f", &v) < 0) goto done_k;
    if (get_tensor(oo, "out", 1, 4, 4, "f", &o) < 0) goto done_v;
    if (mo != Py_None) {
        if (get_tensor(mo, "allowed", 0, 4, 1, "?Bb", &m) < 0) goto done_o;
        have_m = 1;
    }
    const Py_ssize_t *qs = q.shape, *ks = k.shape, *vs = v.shape, *os = o.shape;
    const int64_t batch = qs[0], heads = qs[1], lq = qs[2], d = qs[3];
    const int64_t kv_heads = ks[1], lk = ks[2];
    int64_t mask_heads = 1;
    if (ks[0] != batch || ks[3] != d || vs[0] != ks[0] || vs[1] != ks[1] || vs[2] != ks[2] ||
        vs[3] != ks[3] || os[0] != batch || os[1] != lq || os[2] != heads || os[3] != d ||
        kv_heads < 1 || heads % kv_heads != 0 || d < 1) {
        PyErr_Format(PyExc_ValueError,
                     "shapes do not match: q (%zd, %zd, %zd, %zd), k (%zd, %zd, %zd, %zd), "
                     "v (%zd, %zd, %zd, %zd) -> out (%zd, %zd, %zd, %zd); q is (batch, heads, "
                     "lq, d), k and v (batch, kv_heads, lk, d) with heads a multiple of "
                     "kv_heads, out (batch, lq, heads, d)",
                     qs[0], qs[1], qs[2], qs[3], ks[0], ks[1], ks[2], ks[3], vs[0], vs[1],
                     vs[2], vs[3], os[0], os[1], os[2], os[3]);
        goto done;
    }
    if (have_m) {
        const Py_ssize_t *ms = m.shape;
        mask_heads = ms[1];
        if (ms[0] != batch || (ms[1] != 1 && ms[1] != heads) || ms[2] != lq || ms[3] != lk) {
            PyErr_Format(PyExc_ValueError,
                         "allowed must have shape (batch, 1 or heads, lq, lk) = (%lld, 1 or "
                         "%lld, %lld, %lld), got (%zd, %zd, %zd, %zd)",
                         (long long)batch, (long long)heads, (long long)lq, (long long)lk,
                         ms[0], ms[1], ms[2], ms[3]);
            goto done;
        }
    }
    if (buffers_overlap(&o, &q) || buffers_overlap(&o, &k) || buffers_overlap(&o, &v) ||
        (have_m && buffers_overlap(&o, &m))) {
        PyErr_SetString(PyExc_ValueError, "out shares memory with an input");
        goto done;
    }
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = nm_attention(current_row, batch, heads, kv_heads, lq, lk, d, q.buf, k.buf, v.buf,
                          have_m ? m.buf : NULL, mask_heads, scale, o.buf);
    Py_END_ALLOW_THREADS
    if (status == NM_ENOMEM)
        PyErr_NoMemory();
    else if (status != NM_OK)
        PyErr_SetString(PyExc_ValueError, "invalid attention arguments");
    else
        result = Py_NewRef(Py_None);
done:
    if (have_m) PyBuffer_Release(&m);
done_o:
    PyBuffer_Release(&o);
done_v:
    PyBuffer_Release(&v);
done_k:
    PyBuffer_Release(&k);
done_q:
    PyBuffer_Release(&q);
    return result;
}

/* rms_norm(x, eps, out) and silu(x, out): rows of a 2-D C-contiguous float32 array; out may
 * be x itself, but must not partly overlap it. */
static PyObject *rows_call(PyObject *xo, PyObject *oo, int norm, float eps) {
    Py_buffer x = {0}, o = {0};
    if (get_tensor(xo, "x", 0, 2, 4, "f", &x) < 0) return NULL;
    if (get_tensor(oo, "out", 1, 2, 4, "f", &o) < 0) {
        PyBuffer_Release(&x);
        return NULL;
    }
    PyObject *result = NULL;
    const int64_t rows = x.shape[0], n = x.shape[1];
    if (o.shape[0] != rows || o.shape[1] != n) {
        PyErr_Format(PyExc_ValueError, "out has shape (%zd, %zd), x (%zd, %zd)", o.shape[0],
                     o.shape[1], x.shape[0], x.shape[1]);
    } else if (buffers_overlap(&x, &o) && x.buf != o.buf) {
        PyErr_SetString(PyExc_ValueError, "out partly overlaps x (it may be x itself)");
    } else {
        Py_BEGIN_ALLOW_THREADS
        if (norm)
            nm_rms_norm(rows, n, x.buf, n, eps, o.buf, n);
        else
            nm_silu(rows, n, x.buf, n, o.buf, n);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&o);
    return result;
}

static PyObject *py_rms_norm(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *oo;
    float eps;
    if (!PyArg_ParseTuple(args, "OfO:rms_norm", &xo, &eps, &oo)) return NULL;
    return rows_call(xo, oo, 1, eps);
}

static PyObject *py_silu(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *oo;
    if (!PyArg_ParseTuple(args, "OO:silu", &xo, &oo)) return NULL;
    return rows_call(xo, oo, 0, 0.0f);
}

static PyMethodDef methods[] = {
    {"attention", py_attention, METH_VARARGS,
     "attention(q, k, v, allowed or None, scale, out): ops/attention.c."},
    {"rms_norm", py_rms_norm, METH_VARARGS, "rms_norm(x, eps, out): rows of x, no weight."},
    {"silu", py_silu, METH_VARARGS, "silu(x, out): x / (1 + exp(-x)), elementwise."},
    {"matmul_packed", (PyCFunction)(void (*)(void))py_matmul_packed,
     METH_VARARGS | METH_KEYWORDS,
     "matmul_packed(fmt, x, slivers, n, out, accumulate[, scales, block, finite], *, "
     "bias=None): the row's packed layout; x and out (m, k) and (m, n), or (k,) and (n,)."},
    {"matmul", (PyCFunction)(void (*)(void))py_matmul, METH_VARARGS | METH_KEYWORDS,
     "matmul(fmt, x, weights, out, accumulate[, scales, block, finite], *, bias=None): out "
     "(+)= x @ decode(weights), each chain from bias[j] when given; x and out (m, k) and "
     "(m, n), or (k,) and (n,)."},
    {"encode", py_encode, METH_VARARGS, "encode(fmt, float32 src, uint16 dst[, isa])."},
    {"decode", py_decode, METH_VARARGS, "decode(fmt, uint16 src, float32 dst[, isa])."},
    {"cpu_features", py_cpu_features, METH_NOARGS, "Usable CPU features."},
    {"isa", py_isa, METH_NOARGS, "Name of the ISA row in use."},
    {"pack_width", py_pack_width, METH_NOARGS, "Sliver width of the row's packed layout."},
    {"isa_rows", py_isa_rows, METH_NOARGS, "Compiled rows: (name, supported, missing)."},
    {"set_isa", py_set_isa, METH_O, "Switch the ISA row (tests and benchmarks)."},
    {"kernel_names", py_kernel_names, METH_VARARGS, "C kernels serving (op, fmt)."},
    {"formats", py_formats, METH_NOARGS, "The C format table: (code, name, itemsize, scaled, scale_exponent)."},
    {"set_num_threads", py_set_num_threads, METH_O, "Threads a call may use."},
    {"probe_fma", py_probe_fma, METH_VARARGS, "probe_fma(threads, iters) -> (flops, s)."},
    {"probe_read", py_probe_read, METH_VARARGS, "probe_read(threads, f32 buffer) -> s."},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "Threads a call may use."},
    {"set_wake_min_work", py_set_wake_min_work, METH_O,
     "Cost (multiply-adds) below which a call does not wake sleeping workers."},
    {"get_wake_min_work", py_get_wake_min_work, METH_NOARGS, "See set_wake_min_work."},
    {"parallel_jobs", py_parallel_jobs, METH_NOARGS, "Jobs split across threads so far."},
    {"set_omp_team", py_set_omp_team, METH_O,
     "Run parallel jobs on the OpenMP team of this GOMP_parallel address (0: the pool)."},
    {"omp_team", py_omp_team, METH_NOARGS, "Whether jobs run on an OpenMP team."},
    {"set_spin_ns", py_set_spin_ns, METH_O, "How long a worker spins after a job (ns)."},
    {"get_spin_ns", py_get_spin_ns, METH_NOARGS, "See set_spin_ns."},
    {NULL, NULL, 0, NULL},
};

static int core_exec(PyObject *module) {
    (void)module;
    cpu_features = nm_cpu_features();
    if (nm_isa_count > (int)(sizeof rows / sizeof rows[0])) {
        PyErr_SetString(PyExc_RuntimeError, "too many ISA rows");
        return -1;
    }
    current_row = NULL;
    for (int i = 0; i < nm_isa_count; ++i) {
        nm_isa_table[i].fill(&rows[i]);
        row_supported[i] = (nm_isa_table[i].required & ~cpu_features) == 0;
        if (row_supported[i] && !current_row) current_row = &rows[i];
    }
    /* NARROWMM_ISA is applied from Python (providers/native.py), where a bad value is
     * recorded and reported instead of failing the import. */
    if (!current_row) {
        PyErr_SetString(PyExc_RuntimeError, "no ISA row can run on this CPU");
        return -1;
    }
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, core_exec},
    {0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "narrowmm._core", "narrowmm's C core.", 0, methods, slots,
    NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__core(void) { return PyModuleDef_Init(&moduledef); }
