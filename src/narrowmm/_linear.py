"""nm.Linear: a fully connected layer in PyTorch's convention, narrow weights kept narrow."""

from __future__ import annotations

import os

import numpy as np

from ._api import matmul
from ._interop import as_array
from ._weights import PackedWeights, TorchWeights, Weights
from .checkpoints import SafetensorsFile, load_safetensors


class Linear:
    """``y = x @ W.T + bias`` with ``W`` of shape ``(out_features, in_features)``.

    The layout of ``weight`` is read from its type, never guessed from its shape:

    - :class:`TorchWeights` (what a checkpoint gives, ``load_safetensors(p)[name]``), a NumPy
      float16 / float32 array, an ml_dtypes bfloat16 array, or a PyTorch tensor (any DLPack
      producer): PyTorch's ``(out_features, in_features)``;
    - :class:`Weights` or :class:`PackedWeights`: narrowmm's ``(in_features,
      out_features)``, taken as they are.

    The weights stay in their narrow format: an ``(out, in)`` matrix is transposed (or, with
    ``pack=True``, packed) once, at construction, into a narrow copy of the same size; no
    float32 copy is ever made.

    Each output starts its fma chain from the bias: ``y[i, j]`` is
    ``fma(x[i, p], w[p, j], c)`` over p ascending from ``c = bias[j]`` (or +0.0), so a layer
    with a bias is one fused chain, as exact as the rest of the library.

    Args:
        weight: the weight matrix (see above for the layouts).
        bias: optional ``(out_features,)`` vector, float32 (or float16 / bfloat16, converted
            exactly).
        pack: store the weights in the CPU's packed layout (:meth:`Weights.pack`): the same
            outputs, faster at small batches.
    """

    __slots__ = ("bias", "weights")

    def __init__(self, weight: object, bias: object = None, *, pack: bool = False) -> None:
        if isinstance(weight, Weights | PackedWeights):
            self.weights: Weights | PackedWeights = weight
        else:
            tw = weight if isinstance(weight, TorchWeights) else TorchWeights.wrap(
                _check_rank(as_array(weight, "weight")))
            self.weights = tw.pack() if pack else tw.transpose()
        if pack:
            self.pack()
        self.bias = None if bias is None else self._bias(bias)

    def _bias(self, bias: object) -> np.ndarray:
        b = as_array(bias, "bias")
        if b.ndim != 1 or b.shape[0] != self.out_features:
            raise ValueError(f"bias must have shape (out_features,) = ({self.out_features},), "
                             f"got {b.shape}")
        if b.dtype == np.float32:
            return np.array(b, dtype=np.float32)
        fmt = Weights(b[None, :])  # float16 / bfloat16: decode exactly
        return fmt.decode()[0]

    @property
    def in_features(self) -> int:
        return self.weights.shape[0]

    @property
    def out_features(self) -> int:
        return self.weights.shape[1]

    def __call__(self, x: object, out: np.ndarray | None = None) -> np.ndarray:
        """Apply the layer to float32 ``x`` of shape ``(..., in_features)``; returns float32
        ``(..., out_features)``, written into ``out`` if given."""
        xa = x if isinstance(x, np.ndarray) else as_array(x, "x")
        if xa.ndim == 0 or xa.shape[-1] != self.in_features:
            raise ValueError(f"x must have shape (..., in_features) = (..., "
                             f"{self.in_features}), got {xa.shape}")
        lead = xa.shape[:-1]
        if out is not None and not isinstance(out, np.ndarray):
            raise TypeError(f"out must be a numpy.ndarray of float32, got {type(out).__name__}")
        if out is not None and out.shape != (*lead, self.out_features):
            raise ValueError(f"out must have shape (..., out_features) = "
                             f"{(*lead, self.out_features)}, got {out.shape}")
        if xa.ndim <= 2:
            return matmul(xa, self.weights, out=out, bias=self.bias)
        if out is not None and np.may_share_memory(out, xa):  # before reshape copies x
            raise ValueError("out shares memory with x or the weights")
        x2 = xa.reshape(-1, self.in_features)  # a copy only for a non-contiguous x
        if out is None:
            y = matmul(x2, self.weights, bias=self.bias)
            return y.reshape(*lead, self.out_features)
        out2 = out.view()
        try:
            out2.shape = (-1, self.out_features)  # refuses instead of copying
        except AttributeError:
            y = matmul(x2, self.weights, bias=self.bias)
            out[...] = y.reshape(out.shape)
            return out
        matmul(x2, self.weights, out=out2, bias=self.bias)
        return out

    @classmethod
    def from_safetensors(cls, path: str | os.PathLike[str] | SafetensorsFile, name: str,
                         bias: str | None = None, *, pack: bool = False) -> Linear:
        """The layer stored under ``name`` (a ``(out, in)`` weight) in a safetensors file.

        ``path`` may be an open :class:`SafetensorsFile` (to load many layers from one
        file). ``bias`` names the bias tensor; by default ``name`` with ``.weight`` replaced
        by ``.bias`` is used when the file has it. The layer's own (transposed or packed)
        copy replaces the mapped view: the view's pages are released, so loading every
        layer of a checkpoint holds about one copy of its weights.
        """
        f = path if isinstance(path, SafetensorsFile) else load_safetensors(path)
        if bias is None and name.endswith(".weight"):
            guess = name[: -len("weight")] + "bias"
            bias = guess if guess in f.info else None
        b = None if bias is None else f.array(bias)
        if b is not None and f.info[bias].dtype == "BF16":
            b = Weights.from_bits(b[None, :], "bf16").decode()[0]
        layer = cls(f[name], b, pack=pack)
        f.release(name)
        return layer

    def pack(self) -> Linear:
        """Pack the weights for the native ISA row in use (:meth:`Weights.pack`): the same
        outputs, faster at batch 1. Returns the layer."""
        if isinstance(self.weights, Weights):
            self.weights = self.weights.pack()
        # the kernels' grid now rather than at the first call: inside a weight_arena it then
        # lies there beside the codes
        self.weights.kernel_scales()
        return self

    def __repr__(self) -> str:
        packed = isinstance(self.weights, PackedWeights)
        return (f"Linear(in_features={self.in_features}, out_features={self.out_features}, "
                f"format={self.weights.format.name!r}, bias={self.bias is not None}"
                f"{', packed=True' if packed else ''})")


def _check_rank(a: np.ndarray) -> np.ndarray:
    if a.ndim != 2:
        raise ValueError(f"weight must be 2-D (out_features, in_features), got shape {a.shape}")
    return a
