"""Applying scales (``narrowmm._scales.apply``): a slice of rows at a time, the same bits as
the whole matrix at once, in bounded memory; with offsets, fma's one rounding whether or
not the products are exact in float32."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from conftest import assert_same_bits

import narrowmm as nm
from narrowmm import _scales
from narrowmm._exact import fma_f32
from narrowmm.checkpoints import _gguf_blocks


def oracle(decoded: np.ndarray, scales: nm.Scales, offsets: nm.Scales | None) -> np.ndarray:
    """Every element's scale (and offset) looked up one by one, then one rounding each."""
    k, n = decoded.shape
    grid, bk = scales.expanded((k, n), n)
    s = grid[np.arange(k) // bk, :n]
    if offsets is None:
        return decoded * s
    ogrid, obk = offsets.expanded((k, n), n)
    return fma_f32(decoded, s, ogrid[np.arange(k) // obk, :n])


KINDS = {
    "tensor": lambda rng, k, n: nm.Scales.tensor(1.7),
    "columns": lambda rng, k, n: nm.Scales.columns(rng.random(n, np.float32) + 0.5),
    "blocks": lambda rng, k, n: nm.Scales.blocks(
        rng.random((-(-k // 3), -(-n // 5)), np.float32) + 0.5, (3, 5)),
    "rows of 32": lambda rng, k, n: nm.Scales.blocks(
        rng.random((-(-k // 32), n), np.float32) + 0.5, (32, 1)),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("with_offsets", [False, True])
@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_slices_of_rows_give_the_whole_matrix_bits(monkeypatch, kind, with_offsets, chunk):
    """Slices of one row, of a few rows (cutting blocks of scales), and the whole matrix:
    the oracle's bits. The codes and scales here are arbitrary, so many products round and
    the offsets take fma_f32's path."""
    monkeypatch.setattr(_scales, "_APPLY_CHUNK", chunk)
    rng = np.random.default_rng(chunk)
    k, n = 70, 45
    decoded = rng.standard_normal((k, n)).astype(np.float32)
    scales = KINDS[kind](rng, k, n)
    offsets = KINDS[kind](rng, k, n) if with_offsets else None
    want = oracle(decoded, scales, offsets)
    assert_same_bits(_scales.apply(decoded.copy(), scales, offsets), want)


@pytest.mark.parametrize("exact", [True, False])
def test_offsets_take_one_rounding_whether_or_not_the_products_are_exact(exact):
    """Small integer codes times binary16 scales (GGUF's: every product exact, the sum
    rounds once) and the same codes times arbitrary float32 scales (products that round):
    fma's bits either way, signed zeros, subnormal and overflowing products included."""
    rng = np.random.default_rng(int(exact))
    k, n = 64, 33
    q = rng.integers(0, 16, (k, n)).astype(np.float32)
    s = rng.standard_normal((k // 32, n)).astype(np.float16 if exact else np.float32)
    o = rng.standard_normal((k // 32, n)).astype(np.float16 if exact else np.float32)
    s[0, :4] = [0.0, -0.0, 2.0 ** -24, 6e4]
    o[0, :4] = [-0.0, 0.0, 2.0 ** -20, -1.0]
    if not exact:
        s[1, :3] = [1e-40, 3.4e38, -3.4e38]  # a subnormal scale; products past float32
    scales = nm.Scales.blocks(s.astype(np.float32), (32, 1))
    offsets = nm.Scales.blocks(o.astype(np.float32), (32, 1))
    assert_same_bits(_scales.apply(q.copy(), scales, offsets), oracle(q, scales, offsets))


def test_a_large_matrix_decodes_in_bounded_memory():
    """A 4096 x 4096 Q4_K tensor (exact q4_1 weights, offsets): its decode takes the 64 MB
    of its float32 weights and a few slices' temporaries beyond them (it took 18 times the
    weights in float64 temporaries before it went a slice at a time)."""
    rng = np.random.default_rng(0)
    rows, cols = 4096, 4096
    blocks = rng.integers(0, 256, (rows, cols // 256, 144), dtype=np.uint8)
    for at in _gguf_blocks.FP16_FIELDS["Q4_K"]:
        blocks[:, :, at:at + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    w = _gguf_blocks.as_torch_weights(_gguf_blocks.convert("Q4_K", blocks))
    del blocks
    out_bytes = rows * cols * 4
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        weights = w.decode()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert weights.shape == (rows, cols) and weights.dtype == np.float32
    assert peak - before < out_bytes + (64 << 20), (peak - before) / out_bytes


def test_conversion_in_slices_keeps_its_temporaries_bounded():
    """Q6_K blocks of a 65536 x 2048 tensor (110 MB in the file) convert a slice of rows at
    a time: the peak beyond the result (codes and scales, 168 MB) stays under 64 MB (the
    whole tensor at once took about 290 MB)."""
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, (65536, 8, 210), dtype=np.uint8)
    blocks[:, :, 208:210] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        fmt, codes, scales, offsets, block_rows = _gguf_blocks.convert("Q6_K", blocks)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    kept = codes.nbytes + scales.nbytes
    assert (fmt, offsets, block_rows) == ("q8_0", None, 16)
    assert peak - before < kept + (64 << 20), (peak - before - kept) / 2 ** 20
