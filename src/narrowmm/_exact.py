"""fma in float32 from NumPy float64 operations, correctly rounded, for whole arrays.

``a * b`` of two float32 values is exact in float64 (24 + 24 significant bits at most);
``s = p + c`` in float64 with its exact error term (TwoSum, Knuth); ``s`` moved to
round-to-odd (when the sum was inexact and ``s`` has an even last bit, one ulp towards the
exact value); rounding that to float32 is then the correctly rounded ``fma(a, b, c)``,
because float64 keeps at least two more bits than float32 (Boldo & Melquiond, "When double
rounding is odd")."""

from __future__ import annotations

import numpy as np


def round_sum_to_f32(prod: np.ndarray, c64: np.ndarray) -> np.ndarray:
    """fl32(prod + c64) rounded once, as float64 values of prod's shape; ``prod`` an exact
    float64 product of two float32 values, ``c64`` float32 values in float64 (broadcast
    against it; only read)."""
    s = c64 + prod
    bb = s - c64
    err = (c64 - (s - bb)) + (prod - bb)
    fix = (err != 0) & np.isfinite(err) & ((s.view(np.int64) & 1) == 0)
    if fix.any():
        s[fix] = np.nextafter(s[fix], np.copysign(np.inf, err[fix]))
    return s.astype(np.float32).astype(np.float64)


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``fma(a, b, c)`` element by element (broadcast), as a float32 array."""
    with np.errstate(all="ignore"):
        prod = a.astype(np.float64) * b.astype(np.float64)
        return round_sum_to_f32(prod, c.astype(np.float64)).astype(np.float32)
