"""Shared by the narrowmm.torch tests: record every converted layer's input and output during
a forward pass, and recompute each with the NumPy provider (an independent implementation of
the same fma chains)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

import narrowmm as nm
import narrowmm.torch as nmt


@contextlib.contextmanager
def recording(model: torch.nn.Module) -> Iterator[list[tuple[str, nmt.Linear, np.ndarray,
                                                             np.ndarray]]]:
    """Yields a list that fills with (name, layer, input, output) per call of each
    narrowmm layer of ``model`` inside the block (float32 copies)."""
    calls: list[tuple[str, nmt.Linear, np.ndarray, np.ndarray]] = []
    handles = []
    for name, layer in nmt.converted_layers(model):
        def hook(module, args, output, name=name):
            calls.append((name, module, args[0].detach().float().numpy().copy(),
                          output.detach().float().numpy().copy()))
        handles.append(layer.register_forward_hook(hook))
    try:
        yield calls
    finally:
        for h in handles:
            h.remove()


def oracle(layer: nmt.Linear, x: np.ndarray) -> np.ndarray:
    """What ``layer`` must give for float32 ``x``, from the NumPy provider."""
    x2 = np.ascontiguousarray(x.reshape(-1, layer.in_features), np.float32)
    bias = None if layer.bias is None else layer.bias.numpy()
    with nm.use_provider("numpy"):
        y = nm.matmul(x2, layer.weights(), bias=bias)
    return y.reshape(*x.shape[:-1], layer.out_features)


def assert_layers_exact(calls) -> int:
    """Every recorded float32 call equals the oracle bit for bit; returns how many."""
    assert calls, "no narrowmm layer ran"
    for name, layer, x, y in calls:
        want = oracle(layer, x)
        assert y.shape == want.shape, name
        differ = np.flatnonzero(y.view(np.uint32) != want.view(np.uint32))
        assert differ.size == 0, f"{name}: {differ.size} of {y.size} outputs differ"
    return len(calls)
