"""The public operations: matmul, encode, decode. Validation lives here, once, before any
provider runs, so every provider sees the same well-formed arguments and a bad call leaves
``out`` untouched."""

from __future__ import annotations

import numpy as np

from ._arrays import F32, check_float32, flat_aligned
from ._codecs import decode, encode
from ._weights import PackedWeights, Weights
from .providers import resolve

__all__ = ["decode", "encode", "matmul"]


def _kernel_friendly(a: np.ndarray) -> bool:
    """What the native binding reads in place: float-aligned, and 1-D contiguous or 2-D with
    contiguous rows a non-negative multiple of 4 bytes apart."""
    flags = a.flags
    if flags.c_contiguous:  # the common case, decided without looking at the strides
        return bool(flags.aligned)
    if a.ndim == 1:
        return False
    rows, cols = a.shape
    if rows == 0 or cols == 0:
        return True
    s0, s1 = a.strides
    return (flags.aligned and (cols == 1 or s1 == 4)
            and (rows == 1 or (s0 >= 0 and s0 % 4 == 0)))


def _activations(x: object, k: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """x as the caller's float32 array, as a (m, k) or (k,) array the kernels accept (a
    copy when they cannot read the caller's), and whether it is 1-D."""
    # the common case first: a float32 ndarray skips the checks that explain other inputs
    a = x if type(x) is np.ndarray and x.dtype == F32 else check_float32(x, "x")
    if a.ndim not in (1, 2):
        raise ValueError(f"x must be 1-D (k,) or 2-D (m, k), got shape {a.shape}")
    if a.shape[-1] != k:
        raise ValueError(f"x has {a.shape[-1]} columns but the weights have k={k} rows "
                         f"(x shape {a.shape})")
    # activations are small next to weights: copy (aligned) what the kernels cannot read
    return a, (a if _kernel_friendly(a) else a.copy(order="C")), a.ndim == 1


def matmul(
    x: np.ndarray,
    w: Weights | PackedWeights | np.ndarray,
    out: np.ndarray | None = None,
    *,
    accumulate: bool = False,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    """``x @ w`` with float32 activations and narrow weights, bit-reproducibly.

    Every output element is the chain ``c = fma(x[i, p], w[p, j], c)`` over p ascending,
    starting from +0.0, from ``bias[j]`` when a bias is given, or from ``out``'s value when
    ``accumulate=True``; every provider, ISA and thread count gives the same bits. For FP8
    weights ``w[p, j]`` is ``fl32(decode(q[p, j]) * scale)`` (see :class:`Scales`).

    Args:
        x: float32 activations, shape (m, k) or (k,): a NumPy array or any DLPack producer
            (a PyTorch tensor, imported without a copy).
        w: :class:`Weights` of shape (k, n), :class:`PackedWeights` (``Weights.pack()``:
            same bits, faster), or an array ``Weights(...)`` accepts.
        out: optional float32 array of shape (m, n) (or (n,) for 1-D ``x``) to write into.
        accumulate: add into ``out`` (``out += x @ w``, fused per step) instead of
            overwriting it. Requires ``out``.
        bias: optional float32 ``(n,)`` vector each output column's chain starts from
            (``x @ w + bias`` with a single rounding per step). Not with ``accumulate``.

    Returns:
        ``out`` if given, else a new float32 array of shape (m, n) or (n,).

    Raises:
        TypeError: wrong dtypes or non-array arguments.
        ValueError: mismatched shapes, a read-only ``out``, ``out`` sharing memory with
            ``x``, the weights or the bias, ``accumulate`` without ``out``, ``bias`` with
            ``accumulate``, packed weights used under an ISA row with another sliver
            width.
    """
    if not isinstance(w, (Weights, PackedWeights)):
        w = Weights(w)
    k, n = w.shape
    x_given, xa, vector = _activations(x, k)
    out_shape = (n,) if vector else (xa.shape[0], n)
    provider, kernel = resolve("matmul", w.format)
    if bias is not None:
        if accumulate:
            raise ValueError("bias and accumulate=True cannot be combined")
        bias = check_float32(bias, "bias")
        if bias.shape != (n,):
            raise ValueError(f"bias must have shape ({n},), got {bias.shape}")
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs an out array to accumulate into")
        target = kernel_out = np.empty(out_shape, F32)
    else:
        target = check_float32(out, "out")
        if target.shape != out_shape:
            raise ValueError(f"out must have shape {out_shape}, got {target.shape}")
        if not target.flags.writeable:
            raise ValueError("out is read-only")
        kernel_out = target if _kernel_friendly(target) else None
        # A provider that checks overlap itself before writing only sees what it is given:
        # check here, against the caller's arrays, whenever it would not see them (x or
        # out copied, a provider that does not check, a bias it writes into out first).
        if (kernel_out is None or xa is not x_given or not provider.checks_overlap
                or bias is not None) and (np.may_share_memory(target, x_given)
                                          or np.may_share_memory(target, w.bits)):
            raise ValueError("out shares memory with x or the weights")
        if kernel_out is None:  # compute in a scratch array and copy back: any strides
            kernel_out = (np.array(target, order="C") if accumulate
                          else np.empty(out_shape, F32))
    if bias is not None:
        if out is not None and np.may_share_memory(target, bias):
            raise ValueError("out shares memory with the bias")
        bias = flat_aligned(bias)  # contiguous, aligned
    kernel.fn(xa[None, :] if vector else xa, w, kernel_out[None, :] if vector else kernel_out,
              bool(accumulate), bias)
    if kernel_out is not target:
        target[...] = kernel_out
    return target
