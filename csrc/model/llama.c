/* narrowmm: one forward step of a Llama-family decoder in one call, with its KV cache.
 *
 * The step is made of the C core's own ops only: nm_matmul / nm_matmul_packed for every
 * linear layer, nm_rms_norm, nm_silu, nm_attention, and ops/elementwise.c for the products,
 * sums and the rotary embedding. Each computes what the batch-invariant `transformers`
 * model (narrowmm.torch, batch_invariant=True) computes with the same ops from Python, in
 * the same order, so a step gives that model's bits (tests/test_decoder.py checks them
 * alone, batched, on 1 and 2 threads and on every ISA row). What it saves is everything
 * between the ops: Python, the framework's module calls, the cache's concatenations and the
 * mask's construction.
 *
 * A step takes T new tokens for each of B sequences. The cache holds `length` positions
 * before the step; token i of sequence b goes to slot length + i and sees the slots from
 * start[b] (its first real token: left padding hides the slots before it) to its own. */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../codecs/codec_scalar.h"
#include "../frame/threads.h"
#include "../include/narrowmm.h"

/* Where a step's time goes, when the caller asks (spent != NULL): seconds per part added to
 * spent[NM_LLAMA_PART_*]. A clock read costs ~20 ns; a step reads it ~15 times a layer. */
typedef struct part_clock {
    double *spent;
    struct timespec last;
} part_clock;

static void clock_start(part_clock *pc) {
    if (pc->spent) clock_gettime(CLOCK_MONOTONIC, &pc->last);
}

/* The time since the last mark goes to `part`. */
static void clock_mark(part_clock *pc, int part) {
    if (!pc->spent) return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    pc->spent[part] += (double)(now.tv_sec - pc->last.tv_sec) +
                       1e-9 * (double)(now.tv_nsec - pc->last.tv_nsec);
    pc->last = now;
}

/* n values of format fmt from their contiguous codes at b into x, through the format's
 * codec (the row's decode slot, what nm decode and Weights.decode use). */
static void decode_codes(const nm_isa_kernels *row, int fmt, const uint8_t *b, int64_t n,
                         float *x) {
    const nm_format_info *info = &nm_format_table[fmt];
    if (info->itemsize == 4)
        memcpy(x, b, (size_t)n * sizeof(float));
    else if (info->itemsize == 2)
        row->decode[fmt]((const uint16_t *)b, x, n);
    else
        row->decode8[fmt](b, x, n / info->kpack);
}

/* Row t of a narrow embedding table into x (hidden floats): the row's codes decoded, then
 * each value times its scale, one rounding, or fma with its offset (nm_embedding). */
static void embed_row(const nm_isa_kernels *row, const nm_embedding *e, int64_t t,
                      int64_t hidden, float *x) {
    decode_codes(row, e->fmt, e->bits + t * e->ldb, hidden, x);
    if (!e->s) return;
    const float *s = e->s + t * e->ls, *o = e->o ? e->o + t * e->ls : NULL;
    for (int64_t p = 0; p < hidden; ++p)
        x[p] = o ? fmaf(x[p], s[p / e->bk], o[p / e->bk]) : x[p] * s[p / e->bk];
}

/* Row t of a table tied to the output layer (nm_llama.tied_embed): column t of the layer's
 * weights, its codes gathered from either layout into tmp (k stored items), decoded
 * (decode_codes), then times the layer's scales, or fma with its offsets, read where the
 * kernels read them (a binary16 grid widened exactly, a factored one multiplied out). The
 * plan takes a tied table only for a format whose kernels take the scales as they are (no
 * scale exponent): the same values as the layer's weights decoded whole. */
static void tied_row(const nm_isa_kernels *row, const nm_linear *L, int64_t t, uint8_t *tmp,
                     float *x) {
    const nm_format_info *info = &nm_format_table[L->fmt];
    const int64_t item = info->itemsize, stored = L->k / info->kpack;
    const int64_t width = L->packed ? nm_pack_width(row, L->fmt) : 0;
    const uint8_t *base = L->packed ? L->b + nm_packed_offset(stored, width, item, 0, t)
                                    : L->b + t * item;
    const int64_t stride = L->packed ? width * item : L->ldb;
    for (int64_t r = 0; r < stored; ++r) memcpy(tmp + r * item, base + r * stride, (size_t)item);
    if (L->packed && info->packed_xor) /* the packed codes as the codec reads them */
        for (int64_t r = 0; r < stored; ++r) tmp[r] = nm_packed_code(L->fmt, tmp[r]);
    decode_codes(row, L->fmt, tmp, L->k, x);
    if (!L->has_scales) return;
    const nm_scales *sc = &L->scales;
    for (int64_t p0 = 0, q = 0; p0 < L->k; p0 += sc->bk, ++q) {
        const int64_t at = nm_grid_offset(sc, q, t), pe = p0 + sc->bk < L->k ? p0 + sc->bk : L->k;
        const float s = nm_factored(sc) ? nm_factored_value(sc, 0, q, t)
                        : sc->s16       ? nm_fp16_to_f32(sc->s16[at])
                                        : sc->s[at];
        if (sc->o16 || sc->o || sc->oc8) {
            const float o = nm_factored(sc) ? nm_factored_value(sc, 1, q, t)
                            : sc->o16       ? nm_fp16_to_f32(sc->o16[at])
                                            : sc->o[at];
            for (int64_t p = p0; p < pe; ++p) x[p] = fmaf(x[p], s, o);
        } else {
            for (int64_t p = p0; p < pe; ++p) x[p] = x[p] * s;
        }
    }
}

/* The step's working memory, one allocation. */
typedef struct step_buffers {
    float *x;      /* rows x hidden: the residual stream */
    float *xn;     /* rows x hidden: a normalised copy */
    float *q;      /* rows x heads*d, as the projection writes it */
    float *kv;     /* rows x kv_heads*d: the new keys, then the new values */
    float *qh;     /* batch x heads x T x d: rotated queries, head-major for attention */
    float *att;    /* rows x heads*d: attention's output */
    float *proj;   /* rows x hidden: an output projection's result */
    float *gate;   /* rows x intermediate */
    float *up;     /* rows x intermediate */
    float *turned; /* head_dim: a rotated key before it is stored as a column */
    uint8_t *mask; /* batch x T x (length + T), or unused */
} step_buffers;

static void *alloc_buffers(const nm_llama *md, int64_t batch, int64_t t, int64_t keys,
                           step_buffers *sb) {
    const int64_t rows = batch * t, hd = md->heads * md->head_dim;
    const int64_t kvd = md->kv_heads * md->head_dim;
    const int64_t floats = rows * (3 * md->hidden + 3 * hd + kvd + 2 * md->intermediate) +
                           md->head_dim;
    const int64_t bytes = floats * (int64_t)sizeof(float) + rows * keys;
    float *base = malloc((size_t)(bytes > 0 ? bytes : 1));
    if (!base) return NULL;
    float *p = base;
    sb->x = p, p += rows * md->hidden;
    sb->xn = p, p += rows * md->hidden;
    sb->q = p, p += rows * hd;
    sb->kv = p, p += rows * kvd;
    sb->qh = p, p += rows * hd;
    sb->att = p, p += rows * hd;
    sb->proj = p, p += rows * md->hidden;
    sb->gate = p, p += rows * md->intermediate;
    sb->up = p, p += rows * md->intermediate;
    sb->turned = p, p += md->head_dim;
    sb->mask = (uint8_t *)p;
    return base;
}

/* Normalise `rows` rows of x into y and scale them by the norm's weight, as Llama's RMSNorm
 * (batch-invariant) does: weight * (x / sqrt(mean(x^2) + eps)). */
static int norm(const nm_llama *md, int64_t rows, const float *x, const float *weight,
                float *y) {
    const int st = nm_rms_norm(rows, md->hidden, x, md->hidden, md->eps, y, md->hidden);
    if (st == NM_OK) nm_scale_rows(rows, md->hidden, weight, y, md->hidden);
    return st;
}

/* Each of n heads of head_dim floats at x normalised in place and scaled by weight, as the
 * q_norm / k_norm of Qwen3 (batch-invariant) do with every head's query and key. */
static int head_norm(const nm_llama *md, int64_t n, float *x, const float *weight) {
    const int64_t d = md->head_dim;
    const int st = nm_rms_norm(n, d, x, d, md->eps, x, d);
    if (st == NM_OK) nm_scale_rows(n, d, weight, x, d);
    return st;
}

/* The rotated keys (transposed: a key is a column of its head's d x capacity block) and the
 * values of the new tokens into the cache, the rotated queries into qh (head-major). k and v
 * are the projections' outputs (rows x kv_heads*d); turned is scratch of d floats. */
static void rotate_and_store(const nm_llama *md, nm_llama_cache *cache, int64_t layer,
                             int64_t batch, int64_t t, const int64_t *positions,
                             const float *q, const float *k, const float *v, float *qh,
                             float *turned) {
    const int64_t d = md->head_dim, hq = md->heads, hk = md->kv_heads, cap = cache->capacity;
    const int64_t per_layer = cache->batch * hk * cap * d;
    float *kc = cache->k + layer * per_layer, *vc = cache->v + layer * per_layer;
    for (int64_t b = 0; b < batch; ++b) {
        for (int64_t i = 0; i < t; ++i) {
            const int64_t r = b * t + i, slot = cache->length + i;
            const float *cs = md->cos + positions[r] * d, *sn = md->sin + positions[r] * d;
            for (int64_t h = 0; h < hq; ++h)
                nm_rotary(d, q + (r * hq + h) * d, cs, sn, qh + ((b * hq + h) * t + i) * d);
            for (int64_t g = 0; g < hk; ++g) {
                const int64_t head = (b * hk + g) * cap * d;
                nm_rotary(d, k + (r * hk + g) * d, cs, sn, turned);
                for (int64_t x = 0; x < d; ++x) kc[head + x * cap + slot] = turned[x];
                memcpy(vc + head + slot * d, v + (r * hk + g) * d, (size_t)d * sizeof(float));
            }
        }
    }
}

/* allowed[b][i][j] for the keys 0..keys-1: from start[b] to the query's own slot. */
static void build_mask(int64_t batch, int64_t t, int64_t length, int64_t keys,
                       const int64_t *start, uint8_t *mask) {
    for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < t; ++i) {
            uint8_t *row = mask + (b * t + i) * keys;
            for (int64_t j = 0; j < keys; ++j) row[j] = j >= start[b] && j <= length + i;
        }
}

static int layer_step(const nm_isa_kernels *row, const nm_llama *md, nm_llama_cache *cache,
                      int64_t li, int64_t batch, int64_t t, const int64_t *positions,
                      const uint8_t *mask, step_buffers *sb, part_clock *pc) {
    const nm_llama_layer *L = &md->layer[li];
    const int64_t rows = batch * t, hidden = md->hidden, d = md->head_dim;
    const int64_t hd = md->heads * d, kvd = md->kv_heads * d, inter = md->intermediate;
    const int64_t keys = cache->length + t, per_layer = cache->batch * md->kv_heads *
                                                      cache->capacity * d;
    int st;
    /* attention block */
    if ((st = norm(md, rows, sb->x, L->attn_norm, sb->xn)) != NM_OK) return st;
    clock_mark(pc, NM_LLAMA_PART_NORM);
    float *k_new = sb->kv, *v_new = sb->att; /* att is free until attention writes it */
    {   /* q, k and v as one job */
        const nm_linear *qkv[3] = {&L->q, &L->k, &L->v};
        float *const out[3] = {sb->q, k_new, v_new};
        const int64_t ld[3] = {hd, kvd, kvd};
        if ((st = nm_linear_run_many(row, 3, qkv, rows, sb->xn, hidden, out, ld)) != NM_OK)
            return st;
    }
    clock_mark(pc, NM_LLAMA_PART_LINEAR);
    if (L->q_norm) {
        if ((st = head_norm(md, rows * md->heads, sb->q, L->q_norm)) != NM_OK ||
            (st = head_norm(md, rows * md->kv_heads, k_new, L->k_norm)) != NM_OK)
            return st;
        clock_mark(pc, NM_LLAMA_PART_NORM);
    }
    rotate_and_store(md, cache, li, batch, t, positions, sb->q, k_new, v_new, sb->qh,
                     sb->turned);
    clock_mark(pc, NM_LLAMA_PART_ELEMENTWISE);
    st = nm_attention(row, batch, md->heads, md->kv_heads, t, keys, cache->capacity, d, sb->qh,
                      cache->k + li * per_layer, cache->v + li * per_layer, 1, mask, 1,
                      md->scale, sb->att);
    if (st != NM_OK) return st;
    clock_mark(pc, NM_LLAMA_PART_ATTENTION);
    if ((st = nm_linear_run(row, &L->o, rows, sb->att, hd, sb->proj, hidden)) != NM_OK)
        return st;
    clock_mark(pc, NM_LLAMA_PART_LINEAR);
    nm_add_into(rows * hidden, sb->proj, sb->x);
    clock_mark(pc, NM_LLAMA_PART_ELEMENTWISE);
    /* MLP block: down(silu(gate(x)) * up(x)) */
    if ((st = norm(md, rows, sb->x, L->mlp_norm, sb->xn)) != NM_OK) return st;
    clock_mark(pc, NM_LLAMA_PART_NORM);
    {   /* gate and up as one job */
        const nm_linear *gu[2] = {&L->gate, &L->up};
        float *const out[2] = {sb->gate, sb->up};
        const int64_t ld[2] = {inter, inter};
        if ((st = nm_linear_run_many(row, 2, gu, rows, sb->xn, hidden, out, ld)) != NM_OK)
            return st;
    }
    clock_mark(pc, NM_LLAMA_PART_LINEAR);
    if ((st = nm_silu(row, rows, inter, sb->gate, inter, sb->gate, inter)) != NM_OK) return st;
    clock_mark(pc, NM_LLAMA_PART_SILU);
    nm_mul_into(rows * inter, sb->up, sb->gate);
    clock_mark(pc, NM_LLAMA_PART_ELEMENTWISE);
    if ((st = nm_linear_run(row, &L->down, rows, sb->gate, inter, sb->proj, hidden)) != NM_OK)
        return st;
    clock_mark(pc, NM_LLAMA_PART_LINEAR);
    nm_add_into(rows * hidden, sb->proj, sb->x);
    clock_mark(pc, NM_LLAMA_PART_ELEMENTWISE);
    return NM_OK;
}

/* The step's linear layers' work in the frame's units (nm_matmul_cost). At batch 1 each
 * layer is too small to pay for waking sleeping workers on its own, so they would stay
 * asleep and the step would run on one thread; the step as a whole pays for it
 * (nm_pool_hold). */
static double step_cost(const nm_llama *md, int64_t rows, int64_t batch) {
    double cost = nm_matmul_cost(batch, md->lm_head.n, md->lm_head.k);
    for (int64_t li = 0; li < md->layers; ++li) {
        const nm_llama_layer *L = &md->layer[li];
        const nm_linear *all[7] = {&L->q, &L->k, &L->v, &L->o, &L->gate, &L->up, &L->down};
        for (int i = 0; i < 7; ++i) cost += nm_matmul_cost(rows, all[i]->n, all[i]->k);
    }
    return cost;
}

int nm_llama_step(const nm_isa_kernels *row, const nm_llama *md, nm_llama_cache *cache,
                  int64_t batch, int64_t t, const int64_t *tokens, const int64_t *positions,
                  const int64_t *start, float *logits, double *spent) {
    part_clock pc = {spent, {0, 0}};
    clock_start(&pc);
    if (batch != cache->batch || t < 1 || cache->length + t > cache->capacity)
        return NM_EINVAL;
    const int64_t rows = batch * t, keys = cache->length + t, hidden = md->hidden;
    for (int64_t r = 0; r < rows; ++r)
        if (tokens[r] < 0 || tokens[r] >= md->vocab || positions[r] < 0 ||
            positions[r] >= md->positions)
            return NM_EINVAL;
    int masked = t > 1;
    for (int64_t b = 0; b < batch; ++b) {
        if (start[b] < 0 || start[b] > keys) return NM_EINVAL;
        masked |= start[b] > 0;
    }
    step_buffers sb;
    void *base = alloc_buffers(md, batch, t, masked ? keys : 0, &sb);
    if (!base) return NM_ENOMEM;
    /* workers held awake through the step when it is worth waking them for */
    const int hold = nm_get_num_threads() > 1 && nm_worth_waking(step_cost(md, rows, batch));
    if (hold) nm_pool_hold(1);
    if (masked) build_mask(batch, t, cache->length, keys, start, sb.mask);
    for (int64_t r = 0; r < rows; ++r) {
        if (md->embed)
            memcpy(sb.x + r * hidden, md->embed + tokens[r] * hidden,
                   (size_t)hidden * sizeof(float));
        else if (md->tied_embed) /* sb.proj (free until the layers) holds the codes */
            tied_row(row, &md->lm_head, tokens[r], (uint8_t *)sb.proj, sb.x + r * hidden);
        else
            embed_row(row, &md->narrow_embed, tokens[r], hidden, sb.x + r * hidden);
    }
    clock_mark(&pc, NM_LLAMA_PART_OTHER);
    int st = NM_OK;
    for (int64_t li = 0; li < md->layers && st == NM_OK; ++li)
        st = layer_step(row, md, cache, li, batch, t, positions, masked ? sb.mask : NULL, &sb,
                        &pc);
    if (st == NM_OK) {
        /* the last token of each sequence: the final norm, then the output layer */
        for (int64_t b = 0; b < batch; ++b)
            memcpy(sb.proj + b * hidden, sb.x + (b * t + t - 1) * hidden,
                   (size_t)hidden * sizeof(float));
        st = norm(md, batch, sb.proj, md->final_norm, sb.xn);
        clock_mark(&pc, NM_LLAMA_PART_NORM);
        if (st == NM_OK) st = nm_linear_run(row, &md->lm_head, batch, sb.xn, hidden, logits,
                                            md->vocab);
        clock_mark(&pc, NM_LLAMA_PART_OUTPUT);
    }
    if (hold) nm_pool_hold(0);
    if (st == NM_OK) cache->length += t;
    free(base);
    clock_mark(&pc, NM_LLAMA_PART_OTHER);
    return st;
}
