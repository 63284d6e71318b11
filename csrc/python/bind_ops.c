/* narrowmm._core: the model ops: attention, RMS norm, SiLU. */
#include "binding.h" /* first: Python.h sets the feature macros */

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../frame/threads.h"

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
PyObject *py_attention(PyObject *self, PyObject *args) {
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
    status = nm_attention(current_row, batch, heads, kv_heads, lq, lk, lk, d, q.buf, k.buf,
                          v.buf, 0, have_m ? m.buf : NULL, mask_heads, scale, o.buf);
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
        int status;
        Py_BEGIN_ALLOW_THREADS
        status = norm ? nm_rms_norm(rows, n, x.buf, n, eps, o.buf, n)
                      : nm_silu(current_row, rows, n, x.buf, n, o.buf, n);
        Py_END_ALLOW_THREADS
        if (status == NM_ENOMEM)
            PyErr_NoMemory();
        else if (status != NM_OK)
            PyErr_Format(PyExc_ValueError, "invalid %s arguments", norm ? "rms_norm" : "silu");
        else
            result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&o);
    return result;
}

PyObject *py_rms_norm(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *oo;
    float eps;
    if (!PyArg_ParseTuple(args, "OfO:rms_norm", &xo, &eps, &oo)) return NULL;
    return rows_call(xo, oo, 1, eps);
}

PyObject *py_silu(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *oo;
    if (!PyArg_ParseTuple(args, "OO:silu", &xo, &oo)) return NULL;
    return rows_call(xo, oo, 0, 0.0f);
}
