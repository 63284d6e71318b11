"""Shared helpers for the tests."""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

import narrowmm as nm
from narrowmm.providers.native import core, supported_isas, use_isa

PROVIDERS = ["native", "numpy", "reference"]
NARROW = ["fp16", "bf16"]
ALL_FORMATS = ["f32", "fp16", "bf16"]


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """float32 arrays equal bit for bit; a NaN only has to meet a NaN (the contract leaves
    NaN payloads of matmul results open)."""
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.dtype == np.float32 and want.dtype == np.float32
    assert got.shape == want.shape
    nan_g, nan_w = np.isnan(got), np.isnan(want)
    np.testing.assert_array_equal(nan_g, nan_w, err_msg="NaN positions differ")
    g = got.view(np.uint32)[~nan_g]
    w = want.view(np.uint32)[~nan_w]
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (
        f"{bad.size} elements differ; first: got {g[bad[0]]:#010x} want {w[bad[0]]:#010x}"
    )


def assert_oracle_bits_on_every_path(x: np.ndarray, w: nm.Weights) -> None:
    """The reference oracle's bits from the NumPy provider and the native row in use, on
    row-major and packed weights."""
    with nm.use_provider("reference"):
        want = nm.matmul(x, w)
    with nm.use_provider("numpy"):
        assert_same_bits(nm.matmul(x, w), want)
    assert_same_bits(nm.matmul(x, w), want)
    assert_same_bits(nm.matmul(x, w.pack()), want)


def check_flipped_file(raw: bytes, flips: list[tuple[int, int]], path, load,
                       error: type[Exception]) -> None:
    """``raw`` with the bytes at ``flips`` (position modulo its length, xor mask) written to
    ``path``: ``load`` may refuse it only with ``error``, and what it accepts must be
    readable (read_everything)."""
    data = bytearray(raw)
    for pos, xor in flips:
        data[pos % len(data)] ^= xor
    path.write_bytes(bytes(data))
    try:
        ckpt = load(path)
    except error:
        return
    read_everything(ckpt, error)


def read_everything(ckpt, error: type[Exception]) -> None:
    """Whatever a checkpoint reader accepted must be readable within the file: every
    tensor's bytes, and the weights of each one it loads as weights (``error`` for the
    others)."""
    for name in ckpt:
        ckpt.array(name).tobytes()
        try:
            ckpt[name].decode()
        except error:
            pass


def random_weights(rng: np.random.Generator, k: int, n: int, fmt: str) -> nm.Weights:
    return nm.Weights.encode(rng.standard_normal((k, n)).astype(np.float32), fmt)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)


ISAS = supported_isas()


@pytest.fixture(params=ISAS)
def isa(request):
    """Run the test once on every ISA row this CPU supports."""
    with use_isa(request.param):
        nm.providers.clear_cache()
        yield request.param
    nm.providers.clear_cache()


@pytest.fixture(autouse=True)
def _native_loaded() -> None:
    # The suite tests the native core; a silently missing extension must fail, not skip.
    assert core() is not None, "narrowmm._core did not load"


@pytest.fixture(autouse=True, scope="session")
def _split_every_call():
    """Every call big enough to split is split across the threads, whether or not the
    pool's workers are asleep, so the tests reach the multi-threaded paths of small shapes
    too (by default a small call leaves sleeping workers asleep: tests/test_threads.py)."""
    before = core().get_wake_min_work()
    core().set_wake_min_work(0)
    yield
    core().set_wake_min_work(before)


@pytest.fixture(autouse=True)
def _own_pool_after_each_test():
    """narrowmm.torch.set_num_threads (and convert) may move narrowmm's parallel parts onto
    PyTorch's OpenMP team for the rest of the process: each test starts on the pool."""
    yield
    core().set_omp_team(0)


IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(module: str):
    """Import an optional test dependency: skip without it locally, fail in CI (where
    tools/install-test-deps and the test extra install it)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if IN_CI:
            raise
        pytest.skip(f"{module} is not installed ({exc})", allow_module_level=True)


@pytest.fixture
def restore_torch_threads():
    """narrowmm.torch changes PyTorch's and narrowmm's thread counts: put both back."""
    import torch

    torch_before, nm_before = torch.get_num_threads(), nm.get_num_threads()
    yield
    torch.set_num_threads(torch_before)
    nm.set_num_threads(nm_before)


# a block of 256 weights, in bytes, of the types whose scales are d * (a small integer)
K_BLOCK_BYTES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210,
                 "IQ4_XS": 136}


def k_type_weights(type_name: str, k: int, n: int, seed: int):
    """``n`` rows of ``k`` random GGUF ``type_name`` blocks, their fp16 fields finite (d of
    either sign), as the ``TorchWeights`` a file's tensor loads as."""
    from narrowmm.checkpoints import _gguf_blocks

    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n, k // 256, K_BLOCK_BYTES[type_name]), dtype=np.uint8)
    for at in _gguf_blocks.FP16_FIELDS[type_name]:
        d = rng.uniform(1e-3, 0.1, blocks.shape[:2]) * rng.choice([-1.0, 1.0], blocks.shape[:2])
        blocks[:, :, at:at + 2] = d.astype(np.float16)[..., None].view(np.uint8)
    return _gguf_blocks.as_torch_weights(_gguf_blocks.convert(type_name, blocks))


@pytest.fixture
def recorded_arenas(monkeypatch) -> list:
    """Every narrowmm._arena.WeightArena made while the test runs, the arena on whatever
    this machine's kernel says of huge pages (its mappings work either way)."""
    from narrowmm import _arena

    made: list = []

    class Recorded(_arena.WeightArena):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(_arena, "WeightArena", Recorded)
    monkeypatch.setattr(_arena, "transparent_huge_pages", lambda: "madvise")
    monkeypatch.setenv("NARROWMM_HUGE_PAGES", "1")
    return made
