/* narrowmm: scaled dot-product attention whose every output is one fixed chain of operations,
 * whatever the batch, the padding, the thread count or the ISA row (docs/invariance.md).
 *
 * For one query row q (head h of batch entry b) and the keys its mask allows, in ascending
 * key order j1 < j2 < ... < jn:
 *   s_j  = fma chain over d ascending of q[d] * k_j[d], from +0.0   (the row's f32 gemv)
 *   t_j  = s_j * scale;  mx = max_j t_j
 *   e_j  = nm_expf(t_j - mx)                                          (ops/exact_math.h)
 *   sum  = ((0 + e_j1) + e_j2) + ... + e_jn                            (float32, in key order)
 *   acc  = fma chain over the allowed keys ascending of e_j * v_j[d], from +0.0 (f32 gemv)
 *   out  = acc[d] / sum
 * A key the mask hides takes no part in any step: not a zero weight, no operation at all. So
 * padding (in front of the keys, as left padding puts it, or anywhere), the keys of other
 * batch entries and a query's position in the batch cannot change its result; a query with
 * no visible key gets zeros.
 *
 * The two products are the kernel row's f32 gemv, whose chains every row computes with the
 * same bits, two heads of a key/value group at once through its two-row form where they
 * share a mask row (the same chains, the cache read once for both); threads take whole
 * (batch entry, key/value head) tasks. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../include/narrowmm.h"
#include "../frame/threads.h"
#include "exact_math.h"

typedef struct attention_job {
    const nm_isa_kernels *row;
    int64_t batch, heads, kv_heads, lq, lk, kv_rows, d, mask_heads;
    int keys_transposed; /* k is [batch][kv_heads][d][kv_rows]: no transpose to build */
    const float *q, *k, *v;
    const uint8_t *allowed;
    float scale;
    float *out;
    atomic_int failed;
} attention_job;

/* One query row, or two of the same KV head under the same mask row (rows = 2: the second
 * row's query ldq floats after the first's, its output ldo floats after), against the keys
 * of their (batch entry, kv head), transposed: kt (d rows of ldkt floats, key j in column
 * j). Two rows take the kernel row's two-row gemv, which reads the keys and the values once
 * for both and computes each row's chains as the one-row gemv does (nm_gemv2_fn): the same
 * bits. Buffers: s and e of rows x lk floats, gather of lk * d floats, acc of rows x d. */
static void attend_rows(const attention_job *job, int rows, const float *qi, int64_t ldq,
                        const float *kt, int64_t ldkt, const float *vb,
                        const uint8_t *mask_row, float *s, float *e, float *gather, float *acc,
                        float *o, int64_t ldo) {
    const int64_t lk = job->lk, d = job->d;
    int64_t lo = 0, hi = lk, count = lk;
    if (mask_row) {
        while (lo < lk && !mask_row[lo]) ++lo;
        while (hi > lo && !mask_row[hi - 1]) --hi;
        count = 0;
        for (int64_t j = lo; j < hi; ++j) count += mask_row[j] != 0;
    }
    if (count == 0) {
        for (int r = 0; r < rows; ++r) memset(o + r * ldo, 0, (size_t)d * sizeof(float));
        return;
    }
    const int64_t span = hi - lo;
    for (int r = 0; r < rows; ++r) memset(s + r * lk, 0, (size_t)span * sizeof(float));
    if (rows == 2)
        job->row->gemv2[NM_FMT_F32](d, span, qi, ldq, (const uint8_t *)(kt + lo), ldkt * 4, s,
                                    lk, NULL, NULL);
    else
        job->row->gemv[NM_FMT_F32](d, span, qi, (const uint8_t *)(kt + lo), ldkt * 4, s, NULL,
                                   NULL);
    const int holes = count != span;
    float sum[2];
    for (int r = 0; r < rows; ++r) {
        float *sr = s + r * lk, *er = e + r * lk;
        float mx = -INFINITY;
        for (int64_t j = 0; j < span; ++j) {
            if (mask_row && !mask_row[lo + j]) continue;
            sr[j] = sr[j] * job->scale;
            if (sr[j] > mx) mx = sr[j];
        }
        int64_t c = 0;
        for (int64_t j = 0; j < span; ++j) { /* the allowed keys' t_j - mx, in key order */
            if (mask_row && !mask_row[lo + j]) continue;
            er[c] = sr[j] - mx;
            if (holes && r == 0) /* the values of the allowed keys, once for the rows */
                memcpy(gather + c * d, vb + (lo + j) * d, (size_t)d * sizeof(float));
            ++c;
        }
        job->row->expf(count, er, er); /* nm_expf of each, on the row's widest vectors */
        sum[r] = 0.0f;
        for (int64_t j = 0; j < count; ++j) sum[r] += er[j];
    }
    memset(acc, 0, (size_t)(rows * d) * sizeof(float));
    const uint8_t *values = (const uint8_t *)(holes ? gather : vb + lo * d);
    if (rows == 2)
        job->row->gemv2[NM_FMT_F32](count, d, e, lk, values, d * 4, acc, d, NULL, NULL);
    else
        job->row->gemv[NM_FMT_F32](count, d, e, values, d * 4, acc, NULL, NULL);
    for (int r = 0; r < rows; ++r)
        for (int64_t x = 0; x < d; ++x) o[r * ldo + x] = acc[r * d + x] / sum[r];
}

static void attention_part(void *ctx, int part, int parts) {
    attention_job *job = ctx;
    const int64_t tasks = job->batch * job->kv_heads;
    const int64_t t0 = tasks * part / parts, t1 = tasks * (part + 1) / parts;
    if (t0 == t1) return;
    const int64_t lk = job->lk, d = job->d, lq = job->lq;
    const int64_t group = job->heads / job->kv_heads;
    /* kt (d x lk, unless the keys come transposed), s and e (2 x lk each), gather (lk x d),
     * acc (2 x d) */
    const int64_t kt_floats = job->keys_transposed ? 0 : d * lk;
    float *buf = malloc((size_t)(kt_floats + d * lk + 4 * lk + 2 * d) * sizeof(float));
    if (!buf) {
        atomic_store(&job->failed, 1);
        return;
    }
    float *kt = buf, *s = kt + kt_floats, *e = s + 2 * lk, *gather = e + 2 * lk;
    float *acc = gather + lk * d;
    /* two heads of a group share a mask row unless the mask has one per head */
    const int pairs = !job->allowed || job->mask_heads == 1;
    for (int64_t t = t0; t < t1; ++t) {
        const int64_t b = t / job->kv_heads, g = t % job->kv_heads;
        const float *kb = job->k + (b * job->kv_heads + g) * job->kv_rows * d;
        const float *vb = job->v + (b * job->kv_heads + g) * job->kv_rows * d;
        const float *keys = kb;
        int64_t ldkt = job->kv_rows;
        if (!job->keys_transposed) {
            for (int64_t j = 0; j < lk; ++j)
                for (int64_t x = 0; x < d; ++x) kt[x * lk + j] = kb[j * d + x];
            keys = kt, ldkt = lk;
        }
        for (int64_t i = 0; i < lq; ++i) {
            for (int64_t r = 0; r < group;) {
                const int64_t h = g * group + r;
                const int rows = pairs && r + 1 < group ? 2 : 1;
                const float *qi = job->q + ((b * job->heads + h) * lq + i) * d;
                const uint8_t *mask_row = NULL;
                if (job->allowed) {
                    const int64_t mh = job->mask_heads > 1 ? h : 0;
                    mask_row = job->allowed + ((b * job->mask_heads + mh) * lq + i) * lk;
                }
                float *o = job->out + ((b * lq + i) * job->heads + h) * d;
                attend_rows(job, rows, qi, lq * d, keys, ldkt, vb, mask_row, s, e, gather, acc,
                            o, d);
                r += rows;
            }
        }
    }
    free(buf);
}

int nm_attention(const nm_isa_kernels *row, int64_t batch, int64_t heads, int64_t kv_heads,
                 int64_t lq, int64_t lk, int64_t kv_rows, int64_t d, const float *q,
                 const float *k, const float *v, int keys_transposed, const uint8_t *allowed,
                 int64_t mask_heads, float scale, float *out) {
    if (batch < 0 || heads < 1 || kv_heads < 1 || heads % kv_heads || lq < 0 || lk < 0 ||
        kv_rows < lk || d < 1 || (allowed && mask_heads != 1 && mask_heads != heads))
        return NM_EINVAL;
    if (batch == 0 || lq == 0) return NM_OK;
    attention_job job = {row,     batch, heads, kv_heads, lq, lk,    kv_rows, d,
                         mask_heads, keys_transposed != 0, q, k,  v,       allowed,
                         scale,   out,   0};
    const int64_t tasks = batch * kv_heads;
    const double cost = 2.0 * (double)batch * (double)heads * (double)lq * (double)lk * (double)d;
    int parts = 1;
    if (nm_worth_waking(cost)) {
        const int threads = nm_get_num_threads();
        parts = tasks < threads ? (int)tasks : threads;
    }
    nm_parallel_run(attention_part, &job, parts);
    return atomic_load(&job.failed) ? NM_ENOMEM : NM_OK;
}
