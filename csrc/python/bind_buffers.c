/* narrowmm._core: the buffer checks; every array the binding takes is checked here first. */
#include "binding.h" /* first: Python.h sets the feature macros */

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../frame/threads.h"

/* ---- buffer checks ------------------------------------------------------------------ */

/* A native-order, single-item format whose code is one of `accept`: "f", "<f", "=f", ...
 * (the library only builds for little-endian targets; see CMakeLists.txt). */
int format_ok(const char *fmt, const char *accept) {
    if (!fmt) fmt = "B";
    if (*fmt == '@' || *fmt == '=' || *fmt == '<') ++fmt;
    if (fmt[0] == '\0' || fmt[1] != '\0') return 0;
    return strchr(accept, fmt[0]) != NULL;
}


void release(matrix *m) {
    if (m->held) PyBuffer_Release(&m->view);
    m->held = 0;
}

/* Get a 2-D buffer whose rows are contiguous runs of `itemsize`-byte items; with
 * `vector_ok`, a contiguous 1-D buffer too, as one row (x and out of an m = 1 product, so
 * the Python layer need not make (1, k) views of them). */
int get_matrix(PyObject *obj, const char *what, int writable, int vector_ok,
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

int overlaps(const matrix *x, int xs, const matrix *y, int ys) {
    uintptr_t xl, xh, yl, yh;
    extent(x, xs, &xl, &xh);
    extent(y, ys, &yl, &yh);
    return xl < yh && yl < xh;
}

/* out against a contiguous buffer (the scales) */
int overlaps_buffer(const matrix *out, const Py_buffer *v) {
    uintptr_t lo, hi;
    extent(out, 4, &lo, &hi);
    const uintptr_t vl = (uintptr_t)v->buf, vh = vl + (uintptr_t)v->len;
    return lo < vh && vl < hi;
}

int parse_format(int fmt) {
    if (fmt < 0 || fmt >= NM_FMT_COUNT) {
        PyErr_Format(PyExc_ValueError, "unknown format code %d", fmt);
        return -1;
    }
    return 0;
}

/* A C-contiguous buffer of any item type (the codecs' arrays, the probes' buffer) */
int get_vector(PyObject *obj, const char *what, int writable, Py_buffer *v) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a%s C-contiguous buffer", what,
                     writable ? " writable" : "");
        return -1;
    }
    return 0;
}
