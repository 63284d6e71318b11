"""Arrays from elsewhere: DLPack producers (PyTorch included) and ml_dtypes, as NumPy views.

NumPy cannot import a bfloat16 DLPack tensor (it has no bfloat16 dtype), so a PyTorch
bfloat16 tensor is imported through its 16-bit integer view and comes back as ml_dtypes
bfloat16 if that is installed, else as a tagged uint16 view. Either way no data is copied.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Bf16Bits(np.ndarray):
    """uint16 bit patterns known to be bfloat16 (used when ml_dtypes is absent)."""


def from_dlpack(obj: Any, what: str) -> np.ndarray:
    """A NumPy view of a DLPack-exporting object (zero-copy where NumPy allows it)."""
    bf16 = False
    dtype = getattr(obj, "dtype", None)
    if str(dtype) == "torch.bfloat16" and hasattr(obj, "view"):
        import torch

        obj = obj.view(torch.int16)  # same bits; NumPy can import int16
        bf16 = True
    try:
        a = np.from_dlpack(obj)
    except Exception as exc:  # any failure of the producer is the caller's input problem
        raise TypeError(
            f"could not import {what} ({type(obj).__name__}) through DLPack: {exc}"
        ) from exc
    if bf16:
        a = a.view(np.uint16)
        try:  # imported here, not at import time: only bfloat16 producers need it
            import ml_dtypes
        except ImportError:  # optional
            return a.view(Bf16Bits)
        a = a.view(ml_dtypes.bfloat16)
    return a


def as_array(obj: Any, what: str) -> np.ndarray:
    """``obj`` as a NumPy array without copying: ndarrays as they are, DLPack producers
    through :func:`from_dlpack`; anything else is a TypeError."""
    if isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "__dlpack__"):
        return from_dlpack(obj, what)
    raise TypeError(f"{what} must be a numpy.ndarray or support DLPack, "
                    f"got {type(obj).__name__}")
