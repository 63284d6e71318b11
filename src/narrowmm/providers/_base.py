"""What a provider is: a named, prioritised source of kernels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._formats import Format


@dataclass(frozen=True)
class Kernel:
    """A callable kernel and the name it is known by (its C name for native kernels).

    Signatures, by operation (arguments already validated by the API):
      matmul(x, w, out, accumulate, bias) -> None: ``x`` (m, k) float32, ``w`` the
          :class:`~narrowmm.Weights` or :class:`~narrowmm.PackedWeights` (k, n), ``out``
          (m, n) float32, both arrays float-aligned with contiguous rows and not overlapping
          the weights; ``bias`` None or (n,) float32, contiguous, never with
          ``accumulate``. It writes ``out`` in place: each chain starts from ``out``'s value
          with ``accumulate``, else from ``bias[j]`` or +0.0. The kernel handles the weights'
          layout (``w.packed``), their scales and the bias itself;
      encode(values float32 1-D contiguous[, saturate]) -> bits;
      decode(bits 1-D contiguous) -> float32.
    """

    name: str
    fn: Callable[..., Any]


def row_major_operands(w: Any, out: np.ndarray, accumulate: bool,
                       bias: np.ndarray | None) -> tuple[Any, Any, bool]:
    """For a provider that computes on row-major bits with plain scales: the row-major
    :class:`~narrowmm.Weights` (``w`` unpacked when ``w.packed``: its ``bits``, ``shape``,
    ``provider_offsets()``), their scales as ``Weights.provider_scales`` gives them, and
    ``accumulate``, the bias written into ``out`` first (then the chains start there)."""
    if bias is not None:
        out[...] = bias
        accumulate = True
    rows = w.unpack() if w.packed else w
    return rows, rows.provider_scales(), accumulate


class Provider:
    """Base class. Subclasses set ``name`` and ``priority`` and implement ``lookup``."""

    name: str = ""
    priority: int = 0
    #: True when the provider's matmul itself rejects an ``out`` that overlaps ``x`` or the
    #: weights, before writing (the API then skips its own, slower check)
    checks_overlap: bool = False

    def available(self) -> bool:
        """Whether this provider can run here at all."""
        return True

    def unavailable_reason(self) -> str | None:
        """Why ``available()`` is False, or None."""
        return None

    def lookup(self, op: str, fmt: Format) -> Kernel | None:
        """The kernel for ``(op, fmt)``, or None to let a lower provider serve it."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<provider {self.name} priority={self.priority}>"
