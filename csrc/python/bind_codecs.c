/* narrowmm._core: encode and decode over whole arrays. */
#include "binding.h" /* first: Python.h sets the feature macros */

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../frame/threads.h"

/* ---- codecs ------------------------------------------------------------------------- */


static PyObject *codec_call(PyObject *args, int encode) {
    int fmt, saturate = 0;
    PyObject *so, *dobj;
    const char *isa = NULL;
    if (!PyArg_ParseTuple(args, "iOO|zp", &fmt, &so, &dobj, &isa, &saturate)) return NULL;
    if (parse_format(fmt) < 0) return NULL;
    const nm_isa_kernels *row = current_row;
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
    /* a stored element holds kpack values (two codes a byte for the 4-bit formats) */
    const Py_ssize_t per = nm_format_table[fmt].kpack;
    const Py_ssize_t in_size = encode ? 4 : item, out_size = encode ? item : 4;
    const Py_ssize_t stored = encode ? d.len / out_size : s.len / in_size;
    const Py_ssize_t values = encode ? s.len / in_size : d.len / out_size;
    PyObject *result = NULL;
    if (s.len % in_size || d.len % out_size || values != stored * per) {
        PyErr_SetString(PyExc_ValueError, "source and destination sizes do not match");
    } else if (((uintptr_t)s.buf % in_size) || ((uintptr_t)d.buf % out_size)) {
        PyErr_SetString(PyExc_ValueError, "codec buffers must be aligned to their item size");
    } else {
        const int64_t n = stored;
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

PyObject *py_encode(PyObject *self, PyObject *args) {
    (void)self;
    return codec_call(args, 1);
}
PyObject *py_decode(PyObject *self, PyObject *args) {
    (void)self;
    return codec_call(args, 0);
}
