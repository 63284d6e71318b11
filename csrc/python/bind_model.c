/* narrowmm._core: the decoder step (model/llama.c) behind narrowmm.torch.Decoder: a plan
 * holding every weight's buffer and the KV cache, reset and stepped from Python. Every array
 * is checked once, when the plan is made; a step checks only its own few arguments. */
#include "binding.h" /* first: Python.h sets the feature macros */

#include <stdlib.h>
#include <string.h>

#define PLAN_CAPSULE "narrowmm.llama_plan"

typedef struct plan {
    nm_llama model;
    nm_llama_layer *layers;
    Py_buffer *views; /* every buffer the model points into, released with the plan */
    int64_t nviews, max_views;
    Py_buffer rotary[2];
    int have_rotary;
    nm_llama_cache cache;
    const nm_isa_kernels *row; /* packed weights are laid out for this row */
    int busy;                  /* a step is running (the GIL is released during it) */
} plan;

static void plan_free(PyObject *capsule) {
    plan *p = PyCapsule_GetPointer(capsule, PLAN_CAPSULE);
    if (!p) return;
    for (int64_t i = 0; i < p->nviews; ++i) PyBuffer_Release(&p->views[i]);
    if (p->have_rotary) {
        PyBuffer_Release(&p->rotary[0]);
        PyBuffer_Release(&p->rotary[1]);
    }
    free(p->views);
    free(p->layers);
    free(p->cache.k);
    free(p->cache.v);
    free(p);
}

static plan *get_plan(PyObject *obj) {
    plan *p = PyCapsule_GetPointer(obj, PLAN_CAPSULE);
    if (!p) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "expected a plan made by llama_plan");
    }
    return p;
}

/* A C-contiguous float32 vector of n values, kept by the plan. */
static const float *take_vector(plan *p, PyObject *obj, const char *what, int64_t n) {
    Py_buffer *v = &p->views[p->nviews];
    if (PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous float32 array", what);
        return NULL;
    }
    ++p->nviews;
    if (v->itemsize != 4 || !format_ok(v->format, "f") || (uintptr_t)v->buf % 4 ||
        v->len != n * 4) {
        PyErr_Format(PyExc_ValueError, "%s must hold %lld float32 values, got %zd bytes of '%s'",
                     what, (long long)n, v->len, v->format ? v->format : "B");
        return NULL;
    }
    return (const float *)v->buf;
}

/* A linear layer from (fmt, packed, k, n, bits, scales or None, block, finite, bias or
 * None), checked as matmul and matmul_packed check theirs; k and n must be as expected. */
static int take_linear(plan *p, PyObject *spec, const char *what, int64_t want_k,
                       int64_t want_n, nm_linear *out) {
    int fmt, packed, finite;
    long long k, n, bk;
    PyObject *bits, *scales, *bias;
    if (!PyTuple_Check(spec) ||
        !PyArg_ParseTuple(spec, "ipLLOOLpO", &fmt, &packed, &k, &n, &bits, &scales, &bk,
                          &finite, &bias)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected (fmt, packed, k, n, bits, scales, block, "
                     "finite, bias)", what);
        return -1;
    }
    if (parse_format(fmt) < 0) return -1;
    if (k != want_k || n != want_n) {
        PyErr_Format(PyExc_ValueError, "%s maps %lld features to %lld; the model needs %lld "
                     "to %lld", what, k, n, (long long)want_k, (long long)want_n);
        return -1;
    }
    const nm_format_info *info = &nm_format_table[fmt];
    const int64_t nr = p->row->nr, width = nm_pack_width(p->row, fmt), kpack = info->kpack;
    matrix b = {0};
    if (get_matrix(bits, what, 0, 0, info->itemsize, weights_accept(fmt), &b) < 0) {
        release(&b);
        return -1;
    }
    p->views[p->nviews++] = b.view; /* the plan releases it */
    const int64_t groups = (n + width - 1) / width;
    const int ok = packed ? (k % kpack == 0 && b.cols == width && b.rows == groups * (k / kpack) &&
                             (b.rows <= 1 || b.ld == width * info->itemsize))
                          : (k % kpack == 0 && b.rows * kpack == k && b.cols == n);
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "%s: %s bits of shape (%lld, %lld) do not hold a %lld x "
                     "%lld '%s' matrix%s", what, packed ? "packed" : "row-major",
                     (long long)b.rows, (long long)b.cols, k, n, info->name,
                     packed && b.cols != width ? " for this ISA row's slivers: pack it again" : "");
        return -1;
    }
    Py_buffer sv;
    int have;
    if (get_scales(fmt, scales, bk, finite, k, packed ? (n + nr - 1) / nr * nr : n,
                   packed ? width : 0, &sv, &out->scales, &have) < 0)
        return -1;
    if (have) p->views[p->nviews++] = sv;
    out->fmt = fmt;
    out->packed = packed;
    out->has_scales = have;
    out->k = k;
    out->n = n;
    out->b = (const uint8_t *)b.view.buf;
    out->ldb = b.ld;
    out->bias = NULL;
    if (bias != Py_None && !(out->bias = take_vector(p, bias, what, n))) return -1;
    return 0;
}

/* The token embedding: a float32 table (vocab x hidden values); a narrow one from (fmt,
 * bits, scales or None, offsets or None, block): bits (vocab, hidden / kpack) items of the
 * format, rows contiguous; scales, and offsets for a format with them, vocab x
 * ceil(hidden / block) float32, C-contiguous (nm_embedding); or None: the output layer's
 * weights, taken before (tied_embed). */
static int take_embedding(plan *p, PyObject *obj, int64_t vocab, int64_t hidden,
                          nm_llama *md) {
    const char *what = "the token embedding";
    if (obj == Py_None) {
        const nm_format_info *info = &nm_format_table[md->lm_head.fmt];
        if (info->scale_exponent) {
            PyErr_Format(PyExc_ValueError, "%s cannot be tied to an output layer in '%s' (its "
                         "kernels take its scales times 2^%d)", what, info->name,
                         info->scale_exponent);
            return -1;
        }
        md->embed = NULL;
        md->tied_embed = 1;
        return 0;
    }
    if (!PyTuple_Check(obj)) return (md->embed = take_vector(p, obj, what, vocab * hidden)) ? 0 : -1;
    int fmt;
    long long bk;
    PyObject *bits, *scales, *offsets;
    if (!PyArg_ParseTuple(obj, "iOOOL", &fmt, &bits, &scales, &offsets, &bk)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a float32 table or (fmt, bits, scales, "
                     "offsets, block)", what);
        return -1;
    }
    if (parse_format(fmt) < 0) return -1;
    const nm_format_info *info = &nm_format_table[fmt];
    matrix b = {0};
    if (get_matrix(bits, what, 0, 0, info->itemsize, weights_accept(fmt), &b) < 0) {
        release(&b);
        return -1;
    }
    p->views[p->nviews++] = b.view; /* the plan releases it */
    if (b.rows != vocab || b.cols * info->kpack != hidden ||
        (uintptr_t)b.view.buf % info->itemsize || b.ld % info->itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: '%s' codes of shape (%lld, %lld) do not hold %lld "
                     "aligned rows of %lld values", what, info->name, (long long)b.rows,
                     (long long)b.cols, (long long)vocab, (long long)hidden);
        return -1;
    }
    if ((scales != Py_None) != (info->scaled != 0) ||
        (offsets != Py_None) != (info->offset != 0) || (info->scaled && bk < 1)) {
        PyErr_Format(PyExc_ValueError, "%s: format '%s' takes %s and %s (a block >= 1 with "
                     "scales), got scales %s, offsets %s, block %lld", what, info->name,
                     info->scaled ? "scales" : "no scales",
                     info->offset ? "offsets" : "no offsets",
                     scales == Py_None ? "None" : "given", offsets == Py_None ? "None" : "given",
                     bk);
        return -1;
    }
    nm_embedding *e = &md->narrow_embed;
    *e = (nm_embedding){.fmt = fmt, .bits = (const uint8_t *)b.view.buf, .ldb = b.ld};
    if (info->scaled) {
        e->bk = bk;
        e->ls = (hidden + bk - 1) / bk;
        if (!(e->s = take_vector(p, scales, "the token embedding's scales", vocab * e->ls)) ||
            (info->offset &&
             !(e->o = take_vector(p, offsets, "the token embedding's offsets", vocab * e->ls))))
            return -1;
    }
    md->embed = NULL;
    return 0;
}

/* llama_plan((layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, eps, scale),
 *            embed (take_embedding; None: tied to lm_head), final_norm, lm_head,
 *            [(attn_norm, q, k, v, o, mlp_norm, gate, up, down
 *            [, q_norm, k_norm])]): q_norm and k_norm (Qwen3's per-head norms) both head_dim
 *            floats or both None */
PyObject *py_llama_plan(PyObject *self, PyObject *args) {
    (void)self;
    long long layers, hidden, heads, kv_heads, d, inter, vocab;
    double eps, scale;
    PyObject *embed, *final_norm, *lm_head, *layer_list;
    if (!PyArg_ParseTuple(args, "(LLLLLLLdd)OOOO!:llama_plan", &layers, &hidden, &heads,
                          &kv_heads, &d, &inter, &vocab, &eps, &scale, &embed, &final_norm,
                          &lm_head, &PyList_Type, &layer_list))
        return NULL;
    if (layers < 0 || hidden < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads || d < 2 ||
        d % 2 || inter < 1 || vocab < 1 || PyList_GET_SIZE(layer_list) != layers) {
        PyErr_Format(PyExc_ValueError, "not a decoder's shape: %lld layers (%zd given), hidden "
                     "%lld, %lld heads over %lld kv heads, head_dim %lld (even), intermediate "
                     "%lld, vocab %lld", layers, PyList_GET_SIZE(layer_list), hidden, heads,
                     kv_heads, d, inter, vocab);
        return NULL;
    }
    plan *p = calloc(1, sizeof *p);
    if (!p) return PyErr_NoMemory();
    p->row = current_row;
    /* the embedding's up to 3 buffers, the final norm, the output layer's 3; a layer's
     * 4 norms and each linear's bits, scales, bias */
    p->max_views = 3 + 1 + 3 + layers * (4 + 7 * 3);
    p->views = calloc((size_t)p->max_views, sizeof(Py_buffer));
    p->layers = calloc((size_t)(layers > 0 ? layers : 1), sizeof(nm_llama_layer));
    PyObject *capsule = NULL;
    if (!p->views || !p->layers) {
        free(p->views);
        free(p->layers);
        free(p);
        return PyErr_NoMemory();
    }
    capsule = PyCapsule_New(p, PLAN_CAPSULE, plan_free);
    if (!capsule) {
        free(p->views);
        free(p->layers);
        free(p);
        return NULL;
    }
    nm_llama *md = &p->model;
    *md = (nm_llama){.layers = layers, .hidden = hidden, .heads = heads, .kv_heads = kv_heads,
                     .head_dim = d, .intermediate = inter, .vocab = vocab, .positions = 0,
                     .eps = (float)eps, .scale = (float)scale, .layer = p->layers};
    const int64_t hd = heads * d, kvd = kv_heads * d;
    if (take_linear(p, lm_head, "the output layer", hidden, vocab, &md->lm_head) < 0 ||
        take_embedding(p, embed, vocab, hidden, md) < 0 ||
        !(md->final_norm = take_vector(p, final_norm, "the final norm", hidden)))
        goto fail;
    for (long long i = 0; i < layers; ++i) {
        PyObject *spec = PyList_GET_ITEM(layer_list, i);
        nm_llama_layer *L = &p->layers[i];
        PyObject *an, *q, *k, *v, *o, *mn, *g, *u, *dn, *qn = Py_None, *kn = Py_None;
        if (!PyTuple_Check(spec) || !PyArg_ParseTuple(spec, "OOOOOOOOO|OO", &an, &q, &k, &v, &o,
                                                      &mn, &g, &u, &dn, &qn, &kn) ||
            (qn == Py_None) != (kn == Py_None)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "layer %lld: expected (attn_norm, q, k, v, o, "
                         "mlp_norm, gate, up, down[, q_norm, k_norm])", i);
            goto fail;
        }
        if (qn != Py_None &&
            (!(L->q_norm = take_vector(p, qn, "a layer's query norm", d)) ||
             !(L->k_norm = take_vector(p, kn, "a layer's key norm", d))))
            goto fail;
        char what[64];
#define LINEAR(obj, name, field, kk, nn)                                           \
    (snprintf(what, sizeof what, "layer %lld's %s", i, name),                     \
     take_linear(p, obj, what, kk, nn, &L->field) < 0)
        if (!(L->attn_norm = take_vector(p, an, "a layer's input norm", hidden)) ||
            !(L->mlp_norm = take_vector(p, mn, "a layer's MLP norm", hidden)) ||
            LINEAR(q, "q_proj", q, hidden, hd) || LINEAR(k, "k_proj", k, hidden, kvd) ||
            LINEAR(v, "v_proj", v, hidden, kvd) || LINEAR(o, "o_proj", o, hd, hidden) ||
            LINEAR(g, "gate_proj", gate, hidden, inter) || LINEAR(u, "up_proj", up, hidden, inter) ||
            LINEAR(dn, "down_proj", down, inter, hidden))
            goto fail;
#undef LINEAR
    }
    return capsule;
fail:
    Py_DECREF(capsule); /* plan_free releases what was taken */
    return NULL;
}

/* llama_reset(plan, batch, capacity, cos, sin): an empty cache for `batch` sequences of up
 * to `capacity` positions, and the rotary table ((positions, head_dim) float32 each). */
PyObject *py_llama_reset(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *po, *co, *so;
    long long batch, capacity;
    if (!PyArg_ParseTuple(args, "OLLOO:llama_reset", &po, &batch, &capacity, &co, &so))
        return NULL;
    plan *p = get_plan(po);
    if (!p) return NULL;
    if (p->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the decoder is running a step in another thread");
        return NULL;
    }
    const nm_llama *md = &p->model;
    if (batch < 1 || capacity < 1) {
        PyErr_Format(PyExc_ValueError, "batch and capacity must be at least 1, got %lld and "
                     "%lld", batch, capacity);
        return NULL;
    }
    const double bytes = 2.0 * (double)md->layers * (double)batch * (double)md->kv_heads *
                         (double)capacity * (double)md->head_dim * sizeof(float);
    if (bytes > (double)PY_SSIZE_T_MAX / 2) {
        PyErr_Format(PyExc_MemoryError, "a cache of %lld sequences x %lld positions would take "
                     "%.3g bytes", batch, capacity, bytes);
        return NULL;
    }
    Py_buffer rot[2];
    PyObject *tables[2] = {co, so};
    for (int i = 0; i < 2; ++i) {
        if (PyObject_GetBuffer(tables[i], &rot[i], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
                                                       PyBUF_ND) < 0) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "cos and sin must be C-contiguous float32 arrays");
            if (i) PyBuffer_Release(&rot[0]);
            return NULL;
        }
    }
    if (rot[0].ndim != 2 || rot[1].ndim != 2 || rot[0].itemsize != 4 ||
        rot[1].itemsize != 4 || !format_ok(rot[0].format, "f") ||
        !format_ok(rot[1].format, "f") || rot[0].shape[1] != md->head_dim ||
        rot[1].shape[1] != md->head_dim || rot[0].shape[0] != rot[1].shape[0] ||
        rot[0].shape[0] < capacity) {
        PyErr_Format(PyExc_ValueError, "cos and sin must be float32 (positions >= %lld, "
                     "head_dim = %lld) arrays of one shape", capacity, (long long)md->head_dim);
        PyBuffer_Release(&rot[0]);
        PyBuffer_Release(&rot[1]);
        return NULL;
    }
    const size_t n = (size_t)(bytes / 2 / sizeof(float));
    float *k = malloc(n ? n * sizeof(float) : 1), *v = malloc(n ? n * sizeof(float) : 1);
    if (!k || !v) {
        free(k);
        free(v);
        PyBuffer_Release(&rot[0]);
        PyBuffer_Release(&rot[1]);
        return PyErr_NoMemory();
    }
    free(p->cache.k);
    free(p->cache.v);
    p->cache = (nm_llama_cache){.batch = batch, .capacity = capacity, .length = 0, .k = k,
                                .v = v};
    if (p->have_rotary) {
        PyBuffer_Release(&p->rotary[0]);
        PyBuffer_Release(&p->rotary[1]);
    }
    p->rotary[0] = rot[0];
    p->rotary[1] = rot[1];
    p->have_rotary = 1;
    p->model.cos = (const float *)rot[0].buf;
    p->model.sin = (const float *)rot[1].buf;
    p->model.positions = rot[0].shape[0];
    return Py_NewRef(Py_None);
}

/* A C-contiguous int64 array of exactly `count` items. */
static int get_int64s(PyObject *obj, const char *what, int64_t count, Py_buffer *v) {
    if (PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_ND) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous int64 array", what);
        return -1;
    }
    if (v->itemsize != 8 || !format_ok(v->format, "lq") || v->len != count * 8) {
        PyErr_Format(PyExc_ValueError, "%s must hold %lld int64 values", what,
                     (long long)count);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

/* llama_step(plan, t, tokens, positions, start, logits[, spent]): tokens and positions
 * (batch, t) int64, start (batch,) int64, logits (batch, vocab) float32, written; spent, a
 * float64 array of NM_LLAMA_PARTS to which each part's seconds are added. */
PyObject *py_llama_step(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *po, *to, *ro, *so, *lo, *spo = Py_None;
    long long t;
    if (!PyArg_ParseTuple(args, "OLOOOO|O:llama_step", &po, &t, &to, &ro, &so, &lo, &spo))
        return NULL;
    plan *p = get_plan(po);
    if (!p) return NULL;
    if (!p->have_rotary) {
        PyErr_SetString(PyExc_RuntimeError, "the decoder has no cache yet: reset it first");
        return NULL;
    }
    if (p->busy) {
        PyErr_SetString(PyExc_RuntimeError, "the decoder is running a step in another thread");
        return NULL;
    }
    if (current_row != p->row) {
        PyErr_Format(PyExc_RuntimeError, "the decoder was made for the %s row and the %s row "
                     "is in use now: make it again", p->row->isa, current_row->isa);
        return NULL;
    }
    nm_llama_cache *cache = &p->cache;
    const int64_t batch = cache->batch;
    if (t < 1 || cache->length + t > cache->capacity) {
        PyErr_Format(PyExc_ValueError, "%lld new tokens do not fit: the cache holds %lld of "
                     "%lld positions", t, (long long)cache->length, (long long)cache->capacity);
        return NULL;
    }
    Py_buffer tv, rv, sv, lv;
    PyObject *result = NULL;
    if (get_int64s(to, "tokens", batch * t, &tv) < 0) return NULL;
    if (get_int64s(ro, "positions", batch * t, &rv) < 0) goto done_t;
    if (get_int64s(so, "start", batch, &sv) < 0) goto done_r;
    if (PyObject_GetBuffer(lo, &lv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "logits must be a writable C-contiguous float32 array");
        goto done_s;
    }
    if (lv.itemsize != 4 || !format_ok(lv.format, "f") || (uintptr_t)lv.buf % 4 ||
        lv.len != batch * p->model.vocab * 4) {
        PyErr_Format(PyExc_ValueError, "logits must hold %lld x %lld float32 values",
                     (long long)batch, (long long)p->model.vocab);
        goto done_l;
    }
    Py_buffer pv;
    int have_spent = 0;
    if (spo != Py_None) {
        if (PyObject_GetBuffer(spo, &pv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "spent must be a writable float64 array");
            goto done_l;
        }
        have_spent = 1;
        if (pv.itemsize != 8 || !format_ok(pv.format, "d") || pv.len != NM_LLAMA_PARTS * 8) {
            PyErr_Format(PyExc_ValueError, "spent must hold %d float64 values", NM_LLAMA_PARTS);
            goto done_p;
        }
    }
    int status;
    p->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    status = nm_llama_step(p->row, &p->model, cache, batch, t, tv.buf, rv.buf, sv.buf, lv.buf,
                           have_spent ? pv.buf : NULL);
    Py_END_ALLOW_THREADS
    p->busy = 0;
    if (status == NM_ENOMEM)
        PyErr_NoMemory();
    else if (status != NM_OK)
        PyErr_Format(PyExc_ValueError, "a token id outside [0, %lld), a position outside [0, "
                     "%lld) or a start outside [0, %lld]: nothing was computed",
                     (long long)p->model.vocab, (long long)p->model.positions,
                     (long long)(cache->length + t));
    else
        result = Py_NewRef(Py_None);
done_p:
    if (have_spent) PyBuffer_Release(&pv);
done_l:
    PyBuffer_Release(&lv);
done_s:
    PyBuffer_Release(&sv);
done_r:
    PyBuffer_Release(&rv);
done_t:
    PyBuffer_Release(&tv);
    return result;
}

PyObject *py_llama_length(PyObject *self, PyObject *arg) {
    (void)self;
    plan *p = get_plan(arg);
    return p ? PyLong_FromLongLong(p->cache.length) : NULL;
}
