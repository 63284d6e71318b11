/* narrowmm._core: the CPython binding of the C core.
 *
 * Arrays arrive through the buffer protocol (no NumPy C API). The Python layer
 * (narrowmm/_api.py) validates first and gives the friendly messages; this file checks
 * everything again, because a call that reaches C with a bad shape or stride must raise,
 * never read or write out of bounds. The GIL is released while kernels run. */
#include "binding.h"
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

/* The ISA rows' kernel tables, filled at import, which of them this CPU runs, the one in
 * use, and the CPU's features (binding.h) */
nm_isa_kernels rows[NM_BIND_MAX_ROWS];
int row_supported[NM_BIND_MAX_ROWS];
const nm_isa_kernels *current_row;
unsigned cpu_features;

static PyMethodDef methods[] = {
    {"attention", py_attention, METH_VARARGS,
     "attention(q, k, v, allowed or None, scale, out): ops/attention.c."},
    {"rms_norm", py_rms_norm, METH_VARARGS, "rms_norm(x, eps, out): rows of x, no weight."},
    {"silu", py_silu, METH_VARARGS, "silu(x, out): x / (1 + exp(-x)), elementwise."},
    {"llama_plan", py_llama_plan, METH_VARARGS,
     "llama_plan(config, embed, final_norm, lm_head, layers): a decoder (model/llama.c)."},
    {"llama_reset", py_llama_reset, METH_VARARGS,
     "llama_reset(plan, batch, capacity, cos, sin): an empty cache and the rotary table."},
    {"llama_step", py_llama_step, METH_VARARGS,
     "llama_step(plan, tokens, positions, start, logits): one step (nm_llama_step)."},
    {"llama_length", py_llama_length, METH_O, "llama_length(plan): positions cached."},
    {"matmul_packed", (PyCFunction)(void (*)(void))py_matmul_packed,
     METH_VARARGS | METH_KEYWORDS,
     "matmul_packed(fmt, x, slivers, n, out, accumulate[, scales, block, finite], *, "
     "bias=None): the row's packed layout; x and out (m, k) and (m, n), or (k,) and (n,)."},
    {"pack_slivers", py_pack_slivers, METH_VARARGS,
     "pack_slivers(src, width, xor, out): a 2-D array into the packed layout."},
    {"nibble_pairs", py_nibble_pairs, METH_VARARGS,
     "nibble_pairs(blocks, block_bytes, offset, run, runs, out): GGUF's 4-bit codes as "
     "narrowmm's."},
    {"matmul", (PyCFunction)(void (*)(void))py_matmul, METH_VARARGS | METH_KEYWORDS,
     "matmul(fmt, x, weights, out, accumulate[, scales, block, finite], *, bias=None): out "
     "(+)= x @ decode(weights), each chain from bias[j] when given; x and out (m, k) and "
     "(m, n), or (k,) and (n,)."},
    {"encode", py_encode, METH_VARARGS, "encode(fmt, float32 src, uint16 dst[, isa])."},
    {"decode", py_decode, METH_VARARGS, "decode(fmt, uint16 src, float32 dst[, isa])."},
    {"cpu_features", py_cpu_features, METH_NOARGS, "Usable CPU features."},
    {"isa", py_isa, METH_NOARGS, "Name of the ISA row in use."},
    {"pack_width", py_pack_width, METH_VARARGS,
     "pack_width(fmt): columns of a group of the row's packed layout for that format."},
    {"isa_rows", py_isa_rows, METH_NOARGS, "Compiled rows: (name, supported, missing)."},
    {"set_isa", py_set_isa, METH_O, "Switch the ISA row (tests and benchmarks)."},
    {"kernel_names", py_kernel_names, METH_VARARGS, "C kernels serving (op, fmt)."},
    {"formats", py_formats, METH_NOARGS, "The C format table: (code, name, itemsize, scaled, scale_exponent, kpack, offset)."},
    {"set_num_threads", py_set_num_threads, METH_O, "Threads a call may use."},
    {"probe_fma", py_probe_fma, METH_VARARGS, "probe_fma(threads, iters) -> (flops, s)."},
    {"probe_read", py_probe_read, METH_VARARGS, "probe_read(threads, f32 buffer) -> s."},
    {"get_num_threads", py_get_num_threads, METH_NOARGS, "Threads a call may use."},
    {"set_wake_min_work", py_set_wake_min_work, METH_O,
     "Cost (multiply-adds) below which a call does not wake sleeping workers."},
    {"get_wake_min_work", py_get_wake_min_work, METH_NOARGS, "See set_wake_min_work."},
    {"set_sliver_outer_a_bytes", py_set_sliver_outer_a_bytes, METH_O,
     "Most bytes of packed A for slivers outside the k blocks (None: the default)."},
    {"get_sliver_outer_a_bytes", py_get_sliver_outer_a_bytes, METH_NOARGS,
     "See set_sliver_outer_a_bytes."},
    {"sliver_outer_a_default", py_sliver_outer_a_default, METH_NOARGS,
     "The default of set_sliver_outer_a_bytes: the core's L2, within 512 KiB..1 MiB."},
    {"set_packed_gemv_ahead", py_set_packed_gemv_ahead, METH_O,
     "Bytes ahead the packed m <= 2 walks prefetch on the rows with the hint (None: each "
     "row's default)."},
    {"get_packed_gemv_ahead", py_get_packed_gemv_ahead, METH_NOARGS,
     "The distance set_packed_gemv_ahead forces, or None."},
    {"packed_gemv_ahead", py_packed_gemv_ahead, METH_NOARGS,
     "(distance in force, the row's default on this CPU) for the row in use; (None, None) "
     "for a row without the hint."},
    {"set_nibble_decode", py_set_nibble_decode, METH_O,
     "How the packed m <= 2 walks decode 4-bit codes on the rows with a choice: 'in-place' "
     "or 'permute' (None: each row's default)."},
    {"get_nibble_decode", py_get_nibble_decode, METH_NOARGS,
     "The decode set_nibble_decode forces, or None."},
    {"nibble_decode", py_nibble_decode, METH_NOARGS,
     "(decode in force, the row's default on this CPU) for the row in use; (None, None) for "
     "a row with one decode."},
    {"set_gemv_streams", py_set_gemv_streams, METH_O,
     "How many groups of packed weights the m == 1 walks take at once on the rows with pair "
     "walks: 1 or 2 (None: each row's default)."},
    {"get_gemv_streams", py_get_gemv_streams, METH_NOARGS,
     "The count set_gemv_streams forces, or None."},
    {"gemv_streams", py_gemv_streams, METH_NOARGS,
     "(groups at once in force, the row's default on this CPU) for the row in use; (None, "
     "None) for a row without pair walks."},
    {"l2_cache_bytes", py_l2_cache_bytes, METH_NOARGS,
     "One core's L2 as the OS reports it (0: unknown)."},
    {"parallel_jobs", py_parallel_jobs, METH_NOARGS, "Jobs split across threads so far."},
    {"set_omp_team", py_set_omp_team, METH_O,
     "Run parallel jobs on the OpenMP team of this GOMP_parallel address (0: the pool)."},
    {"omp_team", py_omp_team, METH_NOARGS, "Whether jobs run on an OpenMP team."},
    {"pool_hold", py_pool_hold, METH_O,
     "Hold the pool's workers awake (True) until the matching pool_hold(False)."},
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
    for (int i = 0; i < nm_isa_count; ++i) {
        nm_isa_table[i].fill(&rows[i]);
        row_supported[i] = nm_isa_runs_on(i, cpu_features);
    }
    /* NARROWMM_ISA is applied from Python (providers/native.py), where a bad value is
     * recorded and reported instead of failing the import. */
    const int best = nm_isa_select(NULL, cpu_features);
    if (best < 0) {
        PyErr_SetString(PyExc_RuntimeError, "no ISA row can run on this CPU");
        return -1;
    }
    current_row = &rows[best];
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
