"""narrowmm.ops: attention, RMS norm and SiLU against independent oracles written from
docs/invariance.md (the fma chains through the pure-Python reference provider, the exp and
the float32 roundings in Python), and their invariance: threads, ISA rows, padding."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import ISAS, assert_same_bits

import narrowmm as nm
from narrowmm import ops
from narrowmm.providers.native import use_isa

F32 = np.float32


# ---- oracles --------------------------------------------------------------------------------

def exp_oracle(x: float) -> float:
    """ops/exact_math.h's nm_exp_d, step by step in Python floats (IEEE double, no fusing):
    clamp, k the nearest integer to x / ln2 (ties to even, through 1.5 * 2^52), r, the
    Taylor polynomial, and 2^k applied as two powers of two."""
    if x != x:
        return x
    xc = min(max(x, -746.0), 710.0)
    shifter = 6755399441055744.0
    t = xc * 1.4426950408889634 + shifter
    k = t - shifter
    kk = int(k) + 2048
    k1 = kk >> 1
    k2 = kk - k1
    r = (xc - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10
    p = 1.0 / 479001600.0
    for c in (1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0, 1.0 / 40320.0,
              1.0 / 5040.0, 1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0):
        p = p * r + c
    try:
        return (p * 2.0 ** (k1 - 1024)) * 2.0 ** (k2 - 1024)
    except OverflowError:  # Python raises where C gives inf
        return math.inf


def silu_oracle(x: np.ndarray) -> np.ndarray:
    flat = [F32(float(v) / (1.0 + exp_oracle(-float(v)))) for v in x.ravel()]
    return np.array(flat, F32).reshape(x.shape)


def chain(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """fma chains over the rows of w from +0.0 (the reference provider: pure Python)."""
    with nm.use_provider("reference"):
        return nm.matmul(np.ascontiguousarray(a, F32)[None],
                         nm.Weights.from_bits(np.ascontiguousarray(w, F32), "f32"))[0]


def attention_oracle(q, k, v, allowed, scale) -> np.ndarray:
    batch, heads, lq, d = q.shape
    group = heads // k.shape[1]
    out = np.zeros((batch, lq, heads, d), F32)
    for b in range(batch):
        for h in range(heads):
            kv = h // group
            for i in range(lq):
                mask = (np.ones(k.shape[2], bool) if allowed is None
                        else allowed[b, h if allowed.shape[1] > 1 else 0, i])
                keys = np.flatnonzero(mask)
                if keys.size == 0:
                    continue
                s = chain(q[b, h, i], k[b, kv, keys].T)
                t = [F32(x) * F32(scale) for x in s]
                mx = max(t)
                e = np.array([F32(exp_oracle(float(F32(x - mx)))) for x in t], F32)
                total = F32(0)
                for x in e:
                    total = F32(total + x)
                acc = chain(e, v[b, kv, keys])
                out[b, i, h] = acc / total
    return out


def causal(batch: int, lq: int, lk: int, pads: list[int]) -> np.ndarray:
    """Left padding (pads[b] hidden keys in front) and causal visibility, as generate()."""
    allowed = np.zeros((batch, 1, lq, lk), bool)
    for b in range(batch):
        for i in range(lq):
            allowed[b, 0, i, pads[b]:lk - lq + i + 1] = True
    return allowed


# ---- attention ------------------------------------------------------------------------------

@pytest.mark.parametrize("mask_kind", ["none", "causal", "holes", "per-head"])
@pytest.mark.parametrize("heads", [4, 6, 2])  # groups of 2, 3 (a pair and one), 1 head
def test_attention_matches_oracle_on_every_row(rng, mask_kind, heads):
    batch, kv_heads, lq, lk, d = 2, 2, 5, 7, 8
    group = heads // kv_heads
    q = rng.standard_normal((batch, heads, lq, d)).astype(F32)
    k = rng.standard_normal((batch, kv_heads, lk, d)).astype(F32)
    v = rng.standard_normal((batch, kv_heads, lk, d)).astype(F32)
    allowed = {
        "none": None,
        "causal": causal(batch, lq, lk, [0, 2]),
        "holes": rng.random((batch, 1, lq, lk)) < 0.6,
        "per-head": rng.random((batch, heads, lq, lk)) < 0.6,
    }[mask_kind]
    want = attention_oracle(q, k, v, allowed, 0.35)
    for isa in ISAS:
        with use_isa(isa):
            assert_same_bits(ops.attention(q, k, v, allowed, scale=0.35), want)
    # and it is attention: close to the float64 softmax
    scores = np.einsum("bhid,bhjd->bhij", q.astype(np.float64),
                       np.repeat(k, group, axis=1).astype(np.float64)) * 0.35
    if allowed is not None:
        scores = np.where(allowed, scores, -np.inf)
    with np.errstate(invalid="ignore"):
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p = np.nan_to_num(p / p.sum(-1, keepdims=True))
    ref = np.einsum("bhij,bhjd->bihd", p, np.repeat(v, group, axis=1).astype(np.float64))
    np.testing.assert_allclose(want, ref, rtol=1e-5, atol=1e-6)


def test_long_softmax_matches_oracle_on_every_row(rng):
    """Enough keys that the softmax's exps run through each row's vectors (32 a step on
    avx512, nm_isa_kernels.expf) and its tail, the scores spread so that exps underflow to
    subnormals and zero as well: every row gives the oracle's bits."""
    batch, heads, kv_heads, lq, lk, d = 1, 2, 1, 2, 150, 4
    q = (rng.standard_normal((batch, heads, lq, d)) * 6).astype(F32)
    k = (rng.standard_normal((batch, kv_heads, lk, d)) * 6).astype(F32)
    v = rng.standard_normal((batch, kv_heads, lk, d)).astype(F32)
    allowed = causal(batch, lq, lk, [3])
    want = attention_oracle(q, k, v, allowed, 0.9)
    for isa in ISAS:
        with use_isa(isa):
            assert_same_bits(ops.attention(q, k, v, allowed, scale=0.9), want)


def test_hidden_keys_take_part_in_nothing(rng):
    """A query's result is the same whatever the hidden keys hold (NaN, inf, huge) and
    however many there are: they take part in no operation."""
    heads, lq, d, real = 2, 4, 16, 9
    q = rng.standard_normal((1, heads, lq, d)).astype(F32)
    k = rng.standard_normal((1, 1, real, d)).astype(F32)
    v = rng.standard_normal((1, 1, real, d)).astype(F32)
    alone = ops.attention(q, k, v, causal(1, lq, real, [0]), scale=0.25)
    for pad in (1, 5, 37):
        kp = np.full((3, 1, pad + real, d), np.nan, F32)
        vp = np.full((3, 1, pad + real, d), np.inf, F32)
        kp[1, :, pad:], vp[1, :, pad:] = k[0], v[0]
        kp[0], vp[0] = 1e30, -1e30
        qb = np.repeat(q, 3, axis=0)
        got = ops.attention(qb, kp, vp, causal(3, lq, pad + real, [0, pad, 0]), scale=0.25)
        assert_same_bits(got[1], alone[0])


def test_attention_threads_and_rows_agree(rng):
    batch, heads, kv_heads, lq, lk, d = 3, 8, 2, 17, 40, 64
    q = rng.standard_normal((batch, heads, lq, d)).astype(F32)
    k = rng.standard_normal((batch, kv_heads, lk, d)).astype(F32)
    v = rng.standard_normal((batch, kv_heads, lk, d)).astype(F32)
    allowed = causal(batch, lq, lk, [0, 11, 30])
    before = nm.get_num_threads()
    results = []
    try:
        for isa in ISAS:
            with use_isa(isa):
                for threads in (1, 2, 3, 5):
                    nm.set_num_threads(threads)
                    results.append(ops.attention(q, k, v, allowed, scale=0.125))
    finally:
        nm.set_num_threads(before)
    for r in results[1:]:
        assert_same_bits(r, results[0])


def test_query_without_visible_keys_gets_zeros(rng):
    q = rng.standard_normal((1, 1, 2, 4)).astype(F32)
    k = rng.standard_normal((1, 1, 3, 4)).astype(F32)
    allowed = np.zeros((1, 1, 2, 3), bool)
    allowed[0, 0, 1, 2] = True
    out = ops.attention(q, k, k, allowed, scale=1.0)
    assert np.array_equal(out[0, 0, 0], np.zeros(4, F32))
    assert_same_bits(out[0, 1, 0], k[0, 0, 2])  # one visible key: its value exactly


def test_attention_bad_input_is_named():
    q = np.zeros((1, 4, 2, 8), F32)
    k = np.zeros((1, 3, 5, 8), F32)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        ops.attention(q, k, k, scale=1.0)
    k = np.zeros((1, 2, 5, 8), F32)
    with pytest.raises(TypeError, match="float32"):
        ops.attention(q.astype(np.float64), k, k, scale=1.0)
    with pytest.raises(ValueError, match=r"allowed must have shape \(batch, 1 or heads"):
        ops.attention(q, k, k, np.ones((1, 1, 2, 4), bool), scale=1.0)
    with pytest.raises(TypeError, match="bool"):
        ops.attention(q, k, k, np.ones((1, 1, 2, 5), np.uint8), scale=1.0)
    with pytest.raises(ValueError, match="out must have shape"):
        ops.attention(q, k, k, scale=1.0, out=np.empty((1, 4, 2, 8), F32))
    # the binding checks again, for callers that skip the Python layer
    core = nm.providers.native.core()
    with pytest.raises(ValueError, match="shapes do not match"):
        core.attention(q, k, k, None, 1.0, np.empty((1, 2, 4, 9), F32))
    out = np.empty((1, 2, 4, 8), F32)
    with pytest.raises(ValueError, match="shares memory"):
        core.attention(out.reshape(1, 4, 2, 8), k, k, None, 1.0, out)


# ---- RMS norm and SiLU ----------------------------------------------------------------------

def rms_norm_oracle(x: np.ndarray, eps: float) -> np.ndarray:
    out = np.empty_like(x)
    for i, row in enumerate(x.reshape(-1, x.shape[-1])):
        squares = np.cumsum(row.astype(np.float64) ** 2)[-1]  # sequential, in order
        mean = F32(squares / row.size)
        r = F32(1) / np.sqrt(F32(mean + F32(eps)))
        out.reshape(-1, x.shape[-1])[i] = row * r
    return out


def test_rms_norm_matches_oracle_across_rows_and_threads(rng):
    x = (rng.standard_normal((37, 2048)) * 3).astype(F32)
    want = rms_norm_oracle(x, 1e-5)
    before = nm.get_num_threads()
    try:
        for isa in ISAS:
            with use_isa(isa):
                for threads in (1, 3):
                    nm.set_num_threads(threads)
                    assert_same_bits(ops.rms_norm(x, 1e-5), want)
                    assert_same_bits(ops.rms_norm(x[5:6], 1e-5), want[5:6])
    finally:
        nm.set_num_threads(before)
    y = x.copy()
    assert ops.rms_norm(y, 1e-5, out=y) is y
    assert_same_bits(y, want)


def test_silu_matches_oracle_and_specials(rng, isa):
    """On every ISA row: each has SiLU on its own vector width (nm_isa_kernels.silu)."""
    x = np.concatenate([
        (rng.standard_normal(4000) * 6).astype(F32),
        np.array([0.0, -0.0, 1e-45, -1e-45, 88.7, -88.7, 104, -104, 1e30, -1e30,
                  np.inf, np.nan], F32)])
    got = ops.silu(x)
    assert_same_bits(got, silu_oracle(x))
    assert got[-2] == np.inf and np.isnan(got[-1])
    np.testing.assert_allclose(got[:4000], x[:4000] / (1 + np.exp(-x[:4000].astype(np.float64))),
                               rtol=2e-7)
    # the vector loop and the scalar tail compute the same operations
    for i in range(0, x.size, 7):
        assert_same_bits(ops.silu(x[i:i + 1]), got[i:i + 1])
    with pytest.raises(TypeError, match="float32"):
        ops.silu(x[:8].astype(np.float16))


def test_silu_splits_a_row_across_threads_with_the_same_bits(rng):
    """SiLU's threads take runs of elements, not whole rows, so a decode step's single row
    is split too: every row and thread count gives the oracle's bits, a run's start and the
    short runs at a row's end included, in place as well."""
    from narrowmm.providers.native import core

    before = nm.get_num_threads()
    shapes = [(1, 1), (1, 31), (1, 33), (1, 65), (1, 1536), (2, 70), (3, 1), (5, 4097)]
    try:
        for isa in ISAS:
            with use_isa(isa):
                for rows, n in shapes:
                    x = (rng.standard_normal((rows, n)) * 6).astype(F32)
                    want = silu_oracle(x)
                    for threads in (1, 2, 3, 5):
                        nm.set_num_threads(threads)
                        jobs = core().parallel_jobs()
                        assert_same_bits(ops.silu(x), want)
                        # split whenever there are two runs of 32 or more and two threads
                        split = threads > 1 and rows * -(-n // 32) > 1
                        assert core().parallel_jobs() == jobs + split, (rows, n, threads)
                        y = x.copy()
                        assert ops.silu(y, out=y) is y
                        assert_same_bits(y, want)
    finally:
        nm.set_num_threads(before)


def test_exp_is_correctly_rounded_on_a_sweep():
    """nm_exp_d rounded to float32 against the C library's double exp rounded to float32,
    over the range softmax and SiLU use: no difference on 200,000 inputs; and the C code
    (through SiLU of -x, x / (1 + e^x), on both of its paths) follows the oracle."""
    xs = np.linspace(-103.0, 88.0, 200_000).astype(F32)
    diffs = sum(F32(exp_oracle(float(x))) != F32(math.exp(float(x))) for x in xs)
    assert diffs == 0
    extreme = np.array([-1e30, -800, -746.5, -745.1, -709, 709, 709.9, 710.5, 1e30,
                        -np.inf, np.inf], F32)
    assert_same_bits(ops.silu(extreme), silu_oracle(extreme))
    assert_same_bits(ops.silu(extreme[:1]), silu_oracle(extreme[:1]))
