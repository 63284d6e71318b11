/* narrowmm._core: what the binding's files share (one file a job: module.c the module,
 * bind_buffers.c the buffer checks, bind_matmul.c, bind_codecs.c, bind_info.c the ISA
 * rows, threads and probes, bind_ops.c the model ops, bind_model.c the decoder step).
 * Built with hidden visibility: only
 * PyInit__core and the narrowmm_* thread controls leave the library. */
#ifndef NM_BINDING_H
#define NM_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "../include/narrowmm.h"

#define NM_BIND_MAX_ROWS 16

extern nm_isa_kernels rows[NM_BIND_MAX_ROWS];
extern int row_supported[NM_BIND_MAX_ROWS];
extern const nm_isa_kernels *current_row;
extern unsigned cpu_features;

/* A 2-D view of a buffer: rows of contiguous items, ld bytes apart. */
typedef struct matrix {
    Py_buffer view;
    int held;
    int64_t rows, cols, ld; /* ld in bytes */
} matrix;

/* bind_buffers.c: the checks every file uses */
int format_ok(const char *fmt, const char *accept);
void release(matrix *m);
int get_matrix(PyObject *obj, const char *what, int writable, int vector_ok, int itemsize,
               const char *accept, matrix *m);
int overlaps(const matrix *x, int xs, const matrix *y, int ys);
int overlaps_buffer(const matrix *out, const Py_buffer *v);
int parse_format(int fmt);
int get_vector(PyObject *obj, const char *what, int writable, Py_buffer *v);

/* bind_matmul.c: the item formats a format's weights may arrive in, and a matmul's scales
 * argument checked into an nm_scales (see there) */
const char *weights_accept(int fmt);
int get_scales(int fmt, PyObject *so, long long bk, int finite, int64_t k, int64_t min_ld,
               int64_t sliver, Py_buffer *view, nm_scales *sc, int *have);

/* bind_info.c: the index of the ISA row called `name` in nm_isa_table, or -1 */
int find_row(const char *name);

/* the methods, one file a job (module.c's table lists them) */
PyObject *py_matmul(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *py_matmul_packed(PyObject *self, PyObject *args, PyObject *kwargs);
PyObject *py_pack_slivers(PyObject *self, PyObject *args);
PyObject *py_nibble_pairs(PyObject *self, PyObject *args);
PyObject *py_encode(PyObject *self, PyObject *args);
PyObject *py_decode(PyObject *self, PyObject *args);
PyObject *py_cpu_features(PyObject *self, PyObject *noargs);
PyObject *py_pack_width(PyObject *self, PyObject *args);
PyObject *py_isa(PyObject *self, PyObject *noargs);
PyObject *py_isa_rows(PyObject *self, PyObject *noargs);
PyObject *py_set_isa(PyObject *self, PyObject *arg);
PyObject *py_kernel_names(PyObject *self, PyObject *args);
PyObject *py_set_num_threads(PyObject *self, PyObject *arg);
PyObject *py_get_num_threads(PyObject *self, PyObject *noargs);
PyObject *py_probe_fma(PyObject *self, PyObject *args);
PyObject *py_probe_read(PyObject *self, PyObject *args);
PyObject *py_set_wake_min_work(PyObject *self, PyObject *arg);
PyObject *py_get_wake_min_work(PyObject *self, PyObject *noargs);
PyObject *py_set_sliver_outer_a_bytes(PyObject *self, PyObject *arg);
PyObject *py_get_sliver_outer_a_bytes(PyObject *self, PyObject *noargs);
PyObject *py_sliver_outer_a_default(PyObject *self, PyObject *noargs);
PyObject *py_set_packed_gemv_ahead(PyObject *self, PyObject *arg);
PyObject *py_get_packed_gemv_ahead(PyObject *self, PyObject *noargs);
PyObject *py_packed_gemv_ahead(PyObject *self, PyObject *noargs);
PyObject *py_set_nibble_decode(PyObject *self, PyObject *arg);
PyObject *py_get_nibble_decode(PyObject *self, PyObject *noargs);
PyObject *py_nibble_decode(PyObject *self, PyObject *noargs);
PyObject *py_set_gemv_streams(PyObject *self, PyObject *arg);
PyObject *py_get_gemv_streams(PyObject *self, PyObject *noargs);
PyObject *py_gemv_streams(PyObject *self, PyObject *noargs);
PyObject *py_l2_cache_bytes(PyObject *self, PyObject *noargs);
PyObject *py_pool_hold(PyObject *self, PyObject *arg);
PyObject *py_set_spin_ns(PyObject *self, PyObject *arg);
PyObject *py_get_spin_ns(PyObject *self, PyObject *noargs);
PyObject *py_set_omp_team(PyObject *self, PyObject *arg);
PyObject *py_omp_team(PyObject *self, PyObject *noargs);
PyObject *py_parallel_jobs(PyObject *self, PyObject *noargs);
PyObject *py_formats(PyObject *self, PyObject *noargs);
PyObject *py_attention(PyObject *self, PyObject *args);
PyObject *py_rms_norm(PyObject *self, PyObject *args);
PyObject *py_silu(PyObject *self, PyObject *args);
PyObject *py_llama_plan(PyObject *self, PyObject *args);
PyObject *py_llama_reset(PyObject *self, PyObject *args);
PyObject *py_llama_step(PyObject *self, PyObject *args);
PyObject *py_llama_length(PyObject *self, PyObject *arg);

#endif
