/* narrowmm._core: weights' layouts, made once at load (frame/layout.c): GGUF's 4-bit codes
 * as narrowmm's, and any 2-D array into the packed layout. */
#include "binding.h" /* first: Python.h sets the feature macros */

/* pack_slivers(src, width, xor, out): the 2-D array src (items of 1, 2 or 4 bytes, any
 * non-negative strides: a transposed view too) into out, a C-contiguous buffer of exactly
 * ceil(n / width) * k * width items (nm_pack_slivers). */
PyObject *py_pack_slivers(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *so, *oo;
    long long width;
    int xor_byte;
    if (!PyArg_ParseTuple(args, "OLiO:pack_slivers", &so, &width, &xor_byte, &oo)) return NULL;
    Py_buffer s, o;
    if (PyObject_GetBuffer(so, &s, PyBUF_RECORDS_RO) < 0) return NULL;
    if (get_vector(oo, "out", 1, &o) < 0) {
        PyBuffer_Release(&s);
        return NULL;
    }
    PyObject *result = NULL;
    if (s.ndim != 2 || (s.itemsize != 1 && s.itemsize != 2 && s.itemsize != 4)) {
        PyErr_Format(PyExc_ValueError,
                     "pack_slivers: src must be 2-D with items of 1, 2 or 4 bytes, got %d-D "
                     "with %zd-byte items", s.ndim, s.itemsize);
        goto done;
    }
    const int64_t k = s.shape[0], n = s.shape[1], item = s.itemsize;
    if (s.strides[0] < 0 || s.strides[1] < 0) {
        PyErr_Format(PyExc_ValueError, "pack_slivers: src has a negative stride (%zd, %zd)",
                     s.strides[0], s.strides[1]);
        goto done;
    }
    if (width < 1 || width > (1 << 20)) {
        PyErr_Format(PyExc_ValueError, "pack_slivers: width must be 1 to 2**20, got %lld",
                     width);
        goto done;
    }
    if (xor_byte < 0 || xor_byte > 255 || (xor_byte && item != 1)) {
        PyErr_Format(PyExc_ValueError,
                     "pack_slivers: xor must be a byte, and 0 for %zd-byte items, got %d",
                     s.itemsize, xor_byte);
        goto done;
    }
    const int64_t padded = (n + width - 1) / width * width;
    if (k && padded > INT64_MAX / 4 / k) { /* zero strides can claim any shape */
        PyErr_Format(PyExc_ValueError, "pack_slivers: a (%lld, %lld) src is too large",
                     (long long)k, (long long)n);
        goto done;
    }
    const int64_t need = padded * k * item;
    if ((int64_t)o.len != need) {
        PyErr_Format(PyExc_ValueError,
                     "pack_slivers: out holds %zd bytes, the (%lld, %lld) src packed %lld "
                     "wide takes %lld", o.len, (long long)k, (long long)n, width,
                     (long long)need);
        goto done;
    }
    /* the bytes src's items span, against out's */
    const uintptr_t sl = (uintptr_t)s.buf, ol = (uintptr_t)o.buf, oh = ol + (uintptr_t)o.len;
    const uintptr_t sh = k && n ? sl + (uintptr_t)((k - 1) * s.strides[0] +
                                                  (n - 1) * s.strides[1] + item)
                                : sl;
    if (sl < oh && ol < sh) {
        PyErr_SetString(PyExc_ValueError, "pack_slivers: out overlaps src");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    nm_pack_slivers(k, n, item, (const uint8_t *)s.buf, s.strides[0], s.strides[1], width,
                    (uint8_t)xor_byte, (uint8_t *)o.buf);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&s);
    PyBuffer_Release(&o);
    return result;
}

/* nibble_pairs(blocks, block_bytes, offset, run, runs, out): a C-contiguous buffer of
 * whole GGUF blocks into out, C-contiguous, exactly runs * run bytes a block
 * (nm_nibble_pairs). */
PyObject *py_nibble_pairs(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *so, *oo;
    long long block_bytes, offset, run, runs;
    if (!PyArg_ParseTuple(args, "OLLLLO:nibble_pairs", &so, &block_bytes, &offset, &run, &runs,
                          &oo))
        return NULL;
    Py_buffer s, o;
    if (get_vector(so, "blocks", 0, &s) < 0) return NULL;
    if (get_vector(oo, "out", 1, &o) < 0) {
        PyBuffer_Release(&s);
        return NULL;
    }
    PyObject *result = NULL;
    if (block_bytes < 1 || run < 2 || run % 2 || runs < 1 || offset < 0 ||
        offset > block_bytes || run > block_bytes - offset ||
        runs > (block_bytes - offset) / run) { /* divided: no product overflows */
        PyErr_Format(PyExc_ValueError,
                     "nibble_pairs: %lld runs of %lld bytes (even) from byte %lld do not fit "
                     "a %lld-byte block", runs, run, offset, block_bytes);
        goto done;
    }
    const int64_t blocks = (int64_t)s.len / block_bytes;
    if ((int64_t)s.len % block_bytes || (int64_t)o.len != blocks * run * runs) {
        PyErr_Format(PyExc_ValueError,
                     "nibble_pairs: %zd bytes of blocks (%lld bytes each) into %zd bytes of out "
                     "(%lld a block expected)", s.len, block_bytes, o.len, run * runs);
        goto done;
    }
    const uintptr_t sl = (uintptr_t)s.buf, ol = (uintptr_t)o.buf;
    if (sl < ol + (uintptr_t)o.len && ol < sl + (uintptr_t)s.len) {
        PyErr_SetString(PyExc_ValueError, "nibble_pairs: out overlaps blocks");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    nm_nibble_pairs(blocks, block_bytes, offset, run, runs, (const uint8_t *)s.buf,
                    (uint8_t *)o.buf);
    Py_END_ALLOW_THREADS
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&s);
    PyBuffer_Release(&o);
    return result;
}
