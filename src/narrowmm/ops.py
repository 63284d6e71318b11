"""The model ops around the linear layers, with one fixed order of operations per output:
attention, RMS normalisation and SiLU on float32 NumPy arrays, computed by the C core.

They make whole transformer models batch-invariant (``narrowmm.torch.convert(...,
batch_invariant=True)``): a row's result never depends on the other rows, the padding, the
thread count or the ISA row. docs/invariance.md states each op's order of operations.

Native only: these ops have no NumPy or pure-Python provider, so without the C core they
raise ``RuntimeError`` instead of running something with other bits.
"""

from __future__ import annotations

import numpy as np

from ._arrays import check_float32
from .providers.native import checked_core

__all__ = ["attention", "rms_norm", "silu"]


def _float32(name: str, a: object, ndim: int) -> np.ndarray:
    a = check_float32(a, name)
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {a.shape}")
    return np.ascontiguousarray(a)


def _out(out: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray:
    if out is None:
        return np.empty(shape, np.float32)
    if not isinstance(out, np.ndarray) or out.dtype != np.float32:
        raise TypeError("out must be a float32 NumPy array")
    if out.shape != shape:
        raise ValueError(f"out must have shape {shape}, got {out.shape}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be C-contiguous and writable")
    return out


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray | None = None,
              *, scale: float, out: np.ndarray | None = None) -> np.ndarray:
    """Scaled dot-product attention, ``softmax(q k^T * scale) v`` over the allowed keys.

    Args:
        q: ``(batch, heads, lq, d)`` float32 queries.
        k, v: ``(batch, kv_heads, lk, d)`` float32 keys and values; ``heads`` must be a
            multiple of ``kv_heads`` (grouped-query attention: query head ``h`` reads
            key/value head ``h // (heads // kv_heads)``).
        allowed: ``(batch, 1 or heads, lq, lk)`` bool, True where query ``i`` may see key
            ``j``; None lets every query see every key (pass the causal mask yourself).
        scale: the factor on the scores, e.g. ``d ** -0.5``.
        out: optional ``(batch, lq, heads, d)`` float32 result array.

    Returns:
        ``(batch, lq, heads, d)`` float32 (the layout the output projection reads). A query
        that sees no key gets zeros.

    Each output is one fixed chain (docs/invariance.md): the scores are fma chains over
    ``d``, the softmax runs over the allowed keys in ascending order with narrowmm's own
    exp, the values' sum is an fma chain over those keys; a hidden key takes part in no
    operation. So the result for a query depends on its own row, keys and values only.
    """
    q = _float32("q", q, 4)
    k = _float32("k", k, 4)
    v = _float32("v", v, 4)
    batch, heads, lq, d = q.shape
    if k.shape != v.shape or k.shape[0] != batch or k.shape[3] != d or k.shape[1] < 1 \
            or heads % k.shape[1]:
        raise ValueError(f"shapes do not match: q {q.shape} is (batch, heads, lq, d), k "
                         f"{k.shape} and v {v.shape} must be (batch, kv_heads, lk, d) with "
                         f"heads a multiple of kv_heads")
    if allowed is not None:
        if not isinstance(allowed, np.ndarray) or allowed.dtype != np.bool_:
            raise TypeError("allowed must be a bool NumPy array (True = the key is visible)")
        want = (batch, heads, lq, k.shape[2])
        if allowed.ndim != 4 or allowed.shape[0] != batch or allowed.shape[1] not in (1, heads) \
                or allowed.shape[2:] != want[2:]:
            raise ValueError(f"allowed must have shape (batch, 1 or heads, lq, lk) = "
                             f"({batch}, 1 or {heads}, {lq}, {k.shape[2]}), got {allowed.shape}")
        allowed = np.ascontiguousarray(allowed)
    out = _out(out, (batch, lq, heads, d))
    checked_core().attention(q, k, v, allowed, float(scale), out)
    return out


def rms_norm(x: np.ndarray, eps: float, out: np.ndarray | None = None) -> np.ndarray:
    """``x / sqrt(mean(x**2, axis=-1) + eps)`` for each row of a float32 array (any leading
    dimensions), without a weight. The squares are summed in double in ascending order, the
    mean rounded once to float32, and ``x * (1 / sqrtf(mean + eps))`` rounded in float32.
    ``out`` may be ``x`` itself."""
    x = check_float32(x, "x")
    if x.ndim < 1:
        raise ValueError("x must have at least one dimension")
    return _rows(lambda c, a, o: c.rms_norm(a, float(eps), o), x, out)


def silu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """SiLU, ``x / (1 + exp(-x))``, elementwise on a float32 array: computed in double with
    narrowmm's own exp and rounded once, the same bits on every CPU. ``out`` may be ``x``."""
    x = check_float32(x, "x")
    return _rows(lambda c, a, o: c.silu(a, o), x, out)


def _rows(call, x: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    in_place = out is x and x.flags.c_contiguous
    x = np.ascontiguousarray(x)
    out = x if in_place else _out(out, x.shape)
    n = x.shape[-1] if x.ndim else 1
    rows = x.size // n if n else 0
    call(checked_core(), x.reshape(rows, n), out.reshape(rows, n))
    return out
