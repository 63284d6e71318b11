"""The public operations: matmul, encode, decode. Validation lives here, once, before any
provider runs, so every provider sees the same well-formed arguments and a bad call leaves
``out`` untouched."""

from __future__ import annotations

import numpy as np

from ._formats import Format, get_format
from ._interop import from_dlpack
from ._weights import PackedWeights, Weights
from .providers import resolve
from .providers.native import core

_F32 = np.dtype(np.float32)


def _check_float32(a: object, what: str) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        if what != "out" and hasattr(a, "__dlpack__"):
            a = from_dlpack(a, what)  # e.g. a PyTorch float32 tensor, zero-copy
        else:
            raise TypeError(
                f"{what} must be a numpy.ndarray of float32, got {type(a).__name__}")
    if a.dtype != _F32:
        if a.dtype.kind == "f" and a.dtype.itemsize == 4 and not a.dtype.isnative:
            raise TypeError(f"{what} is float32 of non-native byte order ({a.dtype.str}); "
                            f"use {what}.astype(numpy.float32)")
        raise TypeError(f"{what} must be float32, got {a.dtype}; convert with "
                        f"{what}.astype(numpy.float32)")
    return a


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
    a = x if type(x) is np.ndarray and x.dtype == _F32 else _check_float32(x, "x")
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
    packed = w if isinstance(w, PackedWeights) else None
    if packed is None and not isinstance(w, Weights):
        w = Weights(w)
    k, n = w.shape
    x_given, xa, vector = _activations(x, k)
    out_shape = (n,) if vector else (xa.shape[0], n)
    provider, kernel = resolve("matmul", w.format)
    native_packed = packed is not None and provider.name == "native"
    if native_packed:
        if packed.width != core().pack_width():
            raise ValueError(f"these weights were packed for the {packed.isa} row "
                             f"({packed.width}-column slivers); the {core().isa()} row in use "
                             f"reads {core().pack_width()}: pack them again under it")
    if bias is not None:
        if accumulate:
            raise ValueError("bias and accumulate=True cannot be combined")
        bias = _check_float32(bias, "bias")
        if bias.shape != (n,):
            raise ValueError(f"bias must have shape ({n},), got {bias.shape}")
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs an out array to accumulate into")
        target = kernel_out = np.empty(out_shape, _F32)
    else:
        target = _check_float32(out, "out")
        if target.shape != out_shape:
            raise ValueError(f"out must have shape {out_shape}, got {target.shape}")
        if not target.flags.writeable:
            raise ValueError("out is read-only")
        kernel_out = target if _kernel_friendly(target) else None
        # The native binding checks overlap itself before writing, but only sees what it
        # is given: check here, against the caller's arrays, whenever it would not see them
        # (x or out copied, another provider, a bias written into out first).
        if (kernel_out is None or xa is not x_given or not provider.checks_overlap
                or bias is not None) and (np.may_share_memory(target, x_given)
                                          or np.may_share_memory(target, w.bits)):
            raise ValueError("out shares memory with x or the weights")
        if kernel_out is None:  # compute in a scratch array and copy back: any strides
            kernel_out = (np.array(target, order="C") if accumulate
                          else np.empty(out_shape, _F32))
    if bias is not None:
        if out is not None and np.may_share_memory(target, bias):
            raise ValueError("out shares memory with the bias")
        bias = _flat_aligned(bias)  # what the binding reads: contiguous, aligned
    if bias is not None and provider.name != "native":
        # everything is validated: now the chains may start from it (the native parts
        # write it themselves, each its own block of out, in parallel)
        kernel_out[...] = bias
        accumulate, bias = True, None
    if native_packed:  # the binding takes 1-D x and out as one row
        scales = w.kernel_scales(-(-n // w.width) * w.width)
        extra = () if scales is None else scales
        core().matmul_packed(w.format.code, xa, w._slivers, n, kernel_out,
                             bool(accumulate), *extra, bias=bias)
    elif provider.name == "native":
        kernel.fn(xa, w.bits, kernel_out, bool(accumulate), w.kernel_scales(n), bias)
    else:  # the other providers compute on 2-D, row-major arrays, with the plain scales
        kernel.fn(xa[None, :] if vector else xa,
                  packed.unpack().bits if packed is not None else w.bits,
                  kernel_out[None, :] if vector else kernel_out, bool(accumulate),
                  w.provider_scales())
    if kernel_out is not target:
        target[...] = kernel_out
    return target


def _flat_aligned(a: np.ndarray) -> np.ndarray:
    """A contiguous, aligned 1-D view of ``a``, copying only when it is neither (a view
    at an odd offset of a memory-mapped file, say)."""
    flat = np.ascontiguousarray(a).reshape(-1)
    return flat if flat.flags.aligned else flat.copy()


def _codec_format(format: str | Format) -> Format:
    fmt = get_format(format)
    if not fmt.has_codec:
        raise ValueError(f"format {fmt.name!r} is stored as is and has no codec")
    return fmt


def encode(values: np.ndarray, format: str | Format, *, saturate: bool = False) -> np.ndarray:
    """Round float32 ``values`` to ``format`` (nearest even) and return the bits: uint16 for
    fp16/bf16, uint8 for e4m3fn/e5m2.

    Tiny values underflow gradually through subnormals. Overflow gives +-Inf, except in
    e4m3fn, which has none: there it gives NaN (ml_dtypes' rule). ``saturate=True`` (FP8
    only) clamps overflow, infinities included, to the largest finite value instead. A NaN
    stays a NaN keeping its sign (and, in the 16-bit formats, its top payload bits). Any
    shape; the result has the same shape. docs/contracts.md lists each format's rules.
    """
    fmt = _codec_format(format)
    a = _check_float32(values, "values")
    if not a.dtype.isnative:
        raise TypeError("values must have native byte order")
    if saturate and fmt.itemsize != 1:
        raise ValueError(f"saturate applies to the FP8 formats, not {fmt.name!r}")
    flat = _flat_aligned(a)
    _, kernel = resolve("encode", fmt)
    out = kernel.fn(flat, bool(saturate)) if fmt.itemsize == 1 else kernel.fn(flat)
    return out.reshape(a.shape)


def decode(bits: np.ndarray, format: str | Format) -> np.ndarray:
    """Exact float32 values of bit patterns in ``format`` (uint16 for fp16/bf16, uint8 for
    e4m3fn/e5m2); NaNs come back quiet. Scales are not applied here (see
    :meth:`Weights.decode`)."""
    fmt = _codec_format(format)
    want = "uint16 (or int16/float16)" if fmt.itemsize == 2 else "uint8 (or int8)"
    if not isinstance(bits, np.ndarray):
        raise TypeError(f"bits must be a numpy.ndarray of {want}, got {type(bits).__name__}")
    if (bits.dtype.itemsize != fmt.itemsize or not bits.dtype.isnative
            or bits.dtype.kind not in ("uif" if fmt.itemsize == 2 else "uiV")):
        raise TypeError(f"{fmt.name} bits must be {want}, got {bits.dtype}")
    flat = _flat_aligned(bits).view(fmt.storage)
    _, kernel = resolve("decode", fmt)
    return kernel.fn(flat).reshape(bits.shape)
