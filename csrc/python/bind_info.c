/* narrowmm._core: the ISA rows, threads, limit probes, the OpenMP team and the format table. */
#include "binding.h" /* first: Python.h sets the feature macros */

#if defined(__linux__)
#include <dlfcn.h> /* dladdr: set_omp_team checks what its address is */
#endif

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../frame/threads.h"

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

PyObject *py_cpu_features(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return feature_list(cpu_features);
}

PyObject *py_pack_width(PyObject *self, PyObject *args) {
    (void)self;
    int fmt;
    if (!PyArg_ParseTuple(args, "i:pack_width", &fmt) || parse_format(fmt) < 0) return NULL;
    return PyLong_FromLong((long)nm_pack_width(current_row, fmt));
}

PyObject *py_isa(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyUnicode_FromString(current_row->isa);
}

/* [(name, supported, [missing features]), ...] best first */
PyObject *py_isa_rows(PyObject *self, PyObject *noargs) {
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

int find_row(const char *name) {
    for (int i = 0; i < nm_isa_count; ++i)
        if (strcmp(nm_isa_table[i].name, name) == 0) return i;
    return -1;
}

/* Select a row by name (nm_isa_select); raises if unknown or unsupported. */
static int select_row(const char *name, const char *origin) {
    const int i = nm_isa_select(name, cpu_features);
    if (i == NM_ISA_UNKNOWN) {
        char names[256] = "";
        for (int j = 0; j < nm_isa_count; ++j) {
            if (j) strncat(names, ", ", sizeof names - strlen(names) - 1);
            strncat(names, nm_isa_table[j].name, sizeof names - strlen(names) - 1);
        }
        PyErr_Format(PyExc_ValueError, "%s: unknown ISA row '%s' (this build has: %s)", origin,
                     name, names);
        return -1;
    }
    if (i < 0) {
        PyObject *missing = feature_list(nm_isa_table[find_row(name)].required & ~cpu_features);
        if (missing)
            PyErr_Format(PyExc_RuntimeError, "%s: this CPU cannot run the '%s' row (missing %R)",
                         origin, name, missing);
        Py_XDECREF(missing);
        return -1;
    }
    current_row = &rows[i];
    return 0;
}

PyObject *py_set_isa(PyObject *self, PyObject *arg) {
    (void)self;
    const char *name = PyUnicode_AsUTF8(arg);
    if (!name) return NULL;
    if (select_row(name, "set_isa") < 0) return NULL;
    Py_RETURN_NONE;
}

/* kernel_names(op, fmt) -> list of C kernel names serving it in the current row */
PyObject *py_kernel_names(PyObject *self, PyObject *args) {
    (void)self;
    const char *op;
    int fmt;
    if (!PyArg_ParseTuple(args, "si", &op, &fmt)) return NULL;
    if (parse_format(fmt) < 0) return NULL;
    const nm_isa_kernels *r = current_row;
    /* the finite-weights slot of a scaled format (nm_kernels.h) */
    if (strcmp(op, "matmul_finite") == 0 || strcmp(op, "matmul_packed_finite") == 0) {
        if (!nm_format_table[fmt].scaled) return PyList_New(0);
        fmt = nm_finite_slot(fmt);
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
        /* the packing slots of the format's packed codes (nm_pack_slot) */
        const int ps = nm_pack_slot(fmt, fmt, 1); /* a finite slot is never Q4_0's */
        if (!r->gemv_packed[fmt] || !r->gemv2_packed[fmt] || !r->ukernel_pack[ps] ||
            !r->ukernel || !r->pack[ps])
            return PyList_New(0);
        return Py_BuildValue("[sssss]", r->gemv_packed_name[fmt], r->gemv2_packed_name[fmt],
                             r->ukernel_pack_name[ps], r->ukernel_name, r->pack_name[ps]);
    }
    /* the packed gemvs on binary16 scales of a format with half_scales (nm_kernels.h) */
    /* the m == 1 (and m == 2) packed gemvs on a factored grid, where the row has them */
    if (strcmp(op, "matmul_packed_factored") == 0) {
        if (!r->gemv_packed_factored[fmt]) return PyList_New(0);
        if (r->gemv2_packed_factored[fmt])
            return Py_BuildValue("[ss]", r->gemv_packed_factored_name[fmt],
                                 r->gemv2_packed_factored_name[fmt]);
        return Py_BuildValue("[s]", r->gemv_packed_factored_name[fmt]);
    }
    /* the m == 1 walks over two groups at once, on float32 and on binary16 grids */
    if (strcmp(op, "matmul_packed_pair") == 0) {
        if (!r->gemv_packed_pair[fmt] || !r->gemv_packed_pair_half[fmt]) return PyList_New(0);
        return Py_BuildValue("[ss]", r->gemv_packed_pair_name[fmt],
                             r->gemv_packed_pair_half_name[fmt]);
    }
    if (strcmp(op, "matmul_packed_factored_pair") == 0) {
        if (!r->gemv_packed_factored_pair[fmt]) return PyList_New(0);
        return Py_BuildValue("[s]", r->gemv_packed_factored_pair_name[fmt]);
    }
    /* the m == 4 packed walk on float32 scales (the frame's, for factored grids) */
    if (strcmp(op, "matmul_packed_quad") == 0) {
        if (!r->gemv4_packed[fmt]) return PyList_New(0);
        return Py_BuildValue("[s]", r->gemv4_packed_name[fmt]);
    }
    if (strcmp(op, "matmul_packed_half") == 0) {
        if (!r->gemv_packed_half[fmt] || !r->gemv2_packed_half[fmt]) return PyList_New(0);
        if (r->gemv4_packed_half[fmt]) /* the optional m == 4 walk */
            return Py_BuildValue("[sss]", r->gemv_packed_half_name[fmt],
                                 r->gemv2_packed_half_name[fmt], r->gemv4_packed_half_name[fmt]);
        return Py_BuildValue("[ss]", r->gemv_packed_half_name[fmt],
                             r->gemv2_packed_half_name[fmt]);
    }
    if (strcmp(op, "encode") == 0) {
        if (r->encode8[fmt]) return Py_BuildValue("[s]", r->encode8_name[fmt]);
        return r->encode[fmt] ? Py_BuildValue("[s]", r->encode_name[fmt]) : PyList_New(0);
    }
    if (strcmp(op, "decode") == 0) {
        if (r->decode8[fmt]) return Py_BuildValue("[s]", r->decode8_name[fmt]);
        return r->decode[fmt] ? Py_BuildValue("[s]", r->decode_name[fmt]) : PyList_New(0);
    }
    if (strcmp(op, "silu") == 0) /* the model ops with a kernel per row (any fmt) */
        return Py_BuildValue("[s]", r->silu_name);
    if (strcmp(op, "expf") == 0)
        return Py_BuildValue("[s]", r->expf_name);
    if (strcmp(op, "widen_factored") == 0) /* the K types' factored grids (any fmt) */
        return Py_BuildValue("[s]", r->widen_factored_name);
    PyErr_Format(PyExc_ValueError, "unknown operation '%s'", op);
    return NULL;
}

PyObject *py_set_num_threads(PyObject *self, PyObject *arg) {
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

PyObject *py_get_num_threads(PyObject *self, PyObject *noargs) {
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
PyObject *py_probe_fma(PyObject *self, PyObject *args) {
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
PyObject *py_probe_read(PyObject *self, PyObject *args) {
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
PyObject *py_set_wake_min_work(PyObject *self, PyObject *arg) {
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

PyObject *py_get_wake_min_work(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyLong_FromLongLong((long long)nm_get_wake_min_work());
}

/* A setting of bytes from Python: n >= 0, or None (-1: the core's default), passed to set;
 * a negative n or another type raises, naming the setting */
static PyObject *set_size_or_default(PyObject *arg, const char *name, void (*set)(int64_t)) {
    long long bytes = -1;
    if (arg != Py_None) {
        bytes = PyLong_AsLongLong(arg);
        if (bytes == -1 && PyErr_Occurred()) return NULL;
        if (bytes < 0) {
            PyErr_Format(PyExc_ValueError, "%s must be >= 0 (or None), got %lld", name, bytes);
            return NULL;
        }
    }
    set((int64_t)bytes);
    Py_RETURN_NONE;
}

/* set_sliver_outer_a_bytes(n or None): the most bytes of packed A with which the tiled
 * path walks packed weights' slivers outside the k blocks; None restores the default */
PyObject *py_set_sliver_outer_a_bytes(PyObject *self, PyObject *arg) {
    (void)self;
    return set_size_or_default(arg, "sliver_outer_a_bytes", nm_set_sliver_outer_a_bytes);
}

PyObject *py_get_sliver_outer_a_bytes(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyLong_FromLongLong((long long)nm_get_sliver_outer_a_bytes());
}

PyObject *py_sliver_outer_a_default(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyLong_FromLongLong((long long)nm_sliver_outer_a_default());
}

/* set_packed_gemv_ahead(n or None): the distance the packed m <= 2 walks prefetch, forced
 * on the rows built with the hint; None restores each row's default */
PyObject *py_set_packed_gemv_ahead(PyObject *self, PyObject *arg) {
    (void)self;
    return set_size_or_default(arg, "packed_gemv_ahead", nm_set_packed_gemv_ahead);
}

/* get_packed_gemv_ahead(): the forced distance, or None */
PyObject *py_get_packed_gemv_ahead(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    const int64_t forced = nm_get_packed_gemv_ahead();
    if (forced < 0) Py_RETURN_NONE;
    return PyLong_FromLongLong((long long)forced);
}

/* packed_gemv_ahead(): (the distance the row in use prefetches now, its default on this
 * CPU); (None, None) for a row without the hint */
PyObject *py_packed_gemv_ahead(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    const int64_t own = current_row->packed_gemv_ahead;
    if (own < 0) return Py_BuildValue("(OO)", Py_None, Py_None);
    return Py_BuildValue("(LL)", (long long)nm_packed_gemv_ahead(own), (long long)own);
}

/* the 4-bit decodes' names (NM_NIBBLE_DECODE_*), the only values the Python side takes */
static const char *const nibble_decode_names[] = {"in-place", "permute"};

static PyObject *nibble_decode_name(int decode) {
    if (decode < 0) Py_RETURN_NONE;
    return PyUnicode_FromString(nibble_decode_names[decode]);
}

/* set_nibble_decode("in-place" or "permute" or None): the packed 4-bit walks' decode, forced
 * on the rows with a choice; None restores each row's default */
PyObject *py_set_nibble_decode(PyObject *self, PyObject *arg) {
    (void)self;
    if (arg == Py_None) {
        nm_set_nibble_decode(-1);
        Py_RETURN_NONE;
    }
    const char *name = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    if (name)
        for (int d = 0; d < 2; ++d)
            if (strcmp(name, nibble_decode_names[d]) == 0) {
                nm_set_nibble_decode(d);
                Py_RETURN_NONE;
            }
    if (PyErr_Occurred()) return NULL;
    return PyErr_Format(PyExc_ValueError,
                        "nibble_decode must be 'in-place', 'permute' or None, not %R", arg);
}

/* get_nibble_decode(): the forced decode's name, or None */
PyObject *py_get_nibble_decode(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return nibble_decode_name(nm_get_nibble_decode());
}

/* nibble_decode(): (the decode the row in use takes now, its default on this CPU); (None,
 * None) for a row with one decode */
PyObject *py_nibble_decode(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    const int own = current_row->nibble_decode;
    if (own < 0) return Py_BuildValue("(OO)", Py_None, Py_None);
    PyObject *now = nibble_decode_name(nm_nibble_decode(own));
    PyObject *dflt = now ? nibble_decode_name(own) : NULL;
    if (!dflt) {
        Py_XDECREF(now);
        return NULL;
    }
    return Py_BuildValue("(NN)", now, dflt);
}

/* set_gemv_streams(1 or 2 or None): the groups the m == 1 walks take at once, forced on the
 * rows with pair walks; None restores each row's default */
PyObject *py_set_gemv_streams(PyObject *self, PyObject *arg) {
    (void)self;
    if (arg == Py_None) {
        nm_set_gemv_streams(-1);
        Py_RETURN_NONE;
    }
    const long streams = PyLong_Check(arg) && !PyBool_Check(arg) ? PyLong_AsLong(arg) : 0;
    if (streams == 1 || streams == 2) {
        nm_set_gemv_streams((int)streams);
        Py_RETURN_NONE;
    }
    if (PyErr_Occurred()) PyErr_Clear(); /* too large a number: the same message */
    return PyErr_Format(PyExc_ValueError, "gemv_streams must be 1, 2 or None, not %R", arg);
}

/* get_gemv_streams(): the forced count, or None */
PyObject *py_get_gemv_streams(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    const int streams = nm_get_gemv_streams();
    if (streams < 0) Py_RETURN_NONE;
    return PyLong_FromLong(streams);
}

/* gemv_streams(): (the count the row in use takes now, its default on this CPU); (None,
 * None) for a row without pair walks */
PyObject *py_gemv_streams(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    const int own = current_row->gemv_streams;
    if (own < 0) return Py_BuildValue("(OO)", Py_None, Py_None);
    return Py_BuildValue("(ii)", nm_gemv_streams(own), own);
}

PyObject *py_l2_cache_bytes(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyLong_FromLongLong((long long)nm_l2_cache_bytes());
}

/* pool_hold(on): nm_pool_hold, for tests: calls made between pool_hold(True) and the
 * matching pool_hold(False) see the workers awake, as a decode step's do */
PyObject *py_pool_hold(PyObject *self, PyObject *arg) {
    (void)self;
    const int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    nm_pool_hold(on);
    Py_RETURN_NONE;
}

PyObject *py_set_spin_ns(PyObject *self, PyObject *arg) {
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

PyObject *py_get_spin_ns(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyLong_FromLongLong((long long)nm_get_spin_ns());
}

/* set_omp_team(address): run parallel jobs on the OpenMP team whose GOMP_parallel is at
 * `address` (0: narrowmm's own pool). A wrong address would crash the next parallel call,
 * so it must be a loaded library's symbol of that name (Linux: dladdr says which). */
PyObject *py_set_omp_team(PyObject *self, PyObject *arg) {
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

PyObject *py_omp_team(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyBool_FromLong(nm_omp_team());
}

PyObject *py_parallel_jobs(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    return PyLong_FromLong(nm_parallel_jobs());
}

PyObject *py_formats(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
    PyObject *list = PyList_New(NM_FMT_COUNT);
    if (!list) return NULL;
    for (int i = 0; i < NM_FMT_COUNT; ++i) {
        PyObject *t = Py_BuildValue("(isiiiiiii)", i, nm_format_table[i].name,
                                    nm_format_table[i].itemsize, nm_format_table[i].scaled,
                                    nm_format_table[i].scale_exponent, nm_format_table[i].kpack,
                                    nm_format_table[i].offset, nm_format_table[i].half_scales,
                                    nm_format_table[i].packed_xor);
        if (!t) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, t);
    }
    return list;
}
