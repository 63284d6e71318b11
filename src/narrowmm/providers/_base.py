"""What a provider is: a named, prioritised source of kernels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._formats import Format


@dataclass(frozen=True)
class Kernel:
    """A callable kernel and the name it is known by (its C name for native kernels).

    Signatures, by operation (arrays are NumPy arrays already validated by the API):
      matmul(x (m, k) float32, bits (k, n) storage dtype, out (m, n) float32, accumulate)
          writes ``out`` in place;
      encode(values float32 1-D contiguous) -> bits; decode(bits 1-D contiguous) -> float32.
    """

    name: str
    fn: Callable[..., Any]


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
