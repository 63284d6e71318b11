"""narrowmm.torch: the Linear module, convert(), the registered operator, threads."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import assert_same_bits, require

torch = require("torch")  # tools/install-test-deps installs it

from torch_oracle import assert_layers_exact, oracle, recording  # noqa: E402

import narrowmm as nm  # noqa: E402
import narrowmm.torch as nmt  # noqa: E402
from narrowmm.providers.native import core  # noqa: E402

pytestmark = pytest.mark.usefixtures("restore_torch_threads")


def linear(k: int, n: int, bias: bool = True, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(k, n, bias=bias).eval()


def test_import_narrowmm_does_not_import_torch():
    code = "import sys, narrowmm; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "f32"])
@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_is_exact_against_the_oracle(fmt, pack, bias):
    lin = linear(70, 53, bias)
    layer = nmt.Linear.from_torch(lin, fmt, pack=pack)
    assert (layer.in_features, layer.out_features, layer.packed) == (70, 53, pack)
    x = torch.randn(2, 3, 70)
    with torch.inference_mode():
        y = layer(x)
    assert y.shape == (2, 3, 53) and y.dtype == torch.float32
    assert_same_bits(y.numpy(), oracle(layer, x.numpy()))
    # and the weights are the nn.Linear's, rounded to the format (nearest even)
    want = nm.Weights.encode(np.ascontiguousarray(lin.weight.detach().numpy().T), fmt)
    assert_same_bits(layer.weights().decode(), want.decode())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_narrow_activations_are_widened_exactly(dtype):
    layer = nmt.Linear.from_torch(linear(40, 24), "bf16")
    x = torch.randn(5, 40).to(dtype)
    with torch.no_grad():
        y = layer(x)
    assert y.dtype == dtype
    want = torch.from_numpy(oracle(layer, x.float().numpy())).to(dtype)
    assert torch.equal(y, want)


def test_float32_input_is_not_copied_and_output_is_narrowmms(monkeypatch):
    layer = nmt.Linear.from_torch(linear(32, 16), "bf16")
    x = torch.randn(4, 32)
    seen = {}
    from narrowmm.torch import _layer

    real = _layer._linear_arrays

    def spy(xa, *args):
        out = real(xa, *args)
        seen["x"], seen["out"] = xa, out
        return out

    monkeypatch.setattr(_layer, "_linear_arrays", spy)
    with torch.inference_mode():
        y = layer(x)
    assert np.shares_memory(seen["x"], x.numpy())
    assert np.shares_memory(seen["out"], y.numpy())


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "e4m3fn"])
@pytest.mark.parametrize("pack", [False, True])
def test_an_eager_layer_keeps_no_float32_copy_of_its_scales(fmt, pack):
    """The layer stores its scales in the kernels' form only; the weights its eager forward
    keeps (built once) read the float32 grid from it when a provider asks, so they hold no
    second copy (a third of a 4-bit GGUF model's bytes, before). The NumPy provider, which
    reads that float32 grid, still gives the native bits (e4m3fn: scales times 2^8 in the
    kernels' grid; q4_1: a binary16 grid with offsets below the scales when packed)."""
    import tracemalloc

    k, n = 2048, 512
    layer = nmt.Linear.from_torch(linear(k, n), fmt, pack=pack)
    x = torch.randn(1, k)
    # the float32 grid of scales (and offsets) a copy would take: per column, 32-row blocks
    blocks = 1 if fmt == "e4m3fn" else k // 32
    copy_bytes = blocks * n * 4 * (2 if fmt == "q4_1" else 1)
    with torch.inference_mode():
        tracemalloc.start()
        try:
            y = layer(x)  # the first eager forward: builds and keeps the layer's weights
            kept = tracemalloc.get_traced_memory()[0] - y.numel() * 4
        finally:
            tracemalloc.stop()
    if fmt != "e4m3fn":  # a per-column grid (2 KB) is too small to tell from the rest
        assert kept < copy_bytes // 4, (kept, copy_bytes)
    assert_same_bits(y.numpy(), oracle(layer, x.numpy()))


def test_bad_input():
    layer = nmt.Linear.from_torch(linear(8, 4), "bf16")
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"in_features\) = \(\.\.\., 8\), got \(2, 7\)"):
            layer(torch.ones(2, 7))
        with pytest.raises(TypeError, match=r"float32, bfloat16 or float16 input, got "
                                            r"torch\.int64"):
            layer(torch.ones(2, 8, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"takes a torch\.nn\.Linear, got Conv1d"):
        nmt.Linear.from_torch(torch.nn.Conv1d(2, 2, 1))
    with pytest.raises(ValueError, match="unknown format"):
        nmt.Linear.from_torch(linear(8, 4), "int3")


def test_a_forward_that_needs_a_gradient_raises():
    layer = nmt.Linear.from_torch(linear(8, 4), "bf16")
    x = torch.ones(2, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"inference-only.*torch\.inference_mode"):
        layer(x)
    with torch.no_grad():
        assert layer(x).shape == (2, 4)


class Net(torch.nn.Module):
    """Three Linear layers at two depths, and an lm_head that forward does not call."""

    def __init__(self, activation: torch.nn.Module) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(24, 40), activation,
            torch.nn.Sequential(torch.nn.Linear(40, 40), torch.nn.ReLU()),
            torch.nn.Linear(40, 10))
        self.lm_head = torch.nn.Linear(10, 10)

    def forward(self, x):
        return self.body(x)


def model(dtype=torch.float32, activation=None) -> torch.nn.Module:
    torch.manual_seed(1)
    return Net(activation or torch.nn.GELU()).to(dtype).eval()


def test_convert_replaces_every_linear_but_the_skipped():
    m = nmt.convert(model(), "fp16", skip=("lm_head",))
    names = [n for n, _ in nmt.converted_layers(m)]
    assert names == ["body.0", "body.2.0", "body.3"]
    assert isinstance(m.lm_head, torch.nn.Linear)
    # the float parameters of the converted layers are gone from the model
    assert sum(p.numel() for p in m.parameters()) == 10 * 10 + 10
    x = torch.randn(6, 24)
    with torch.inference_mode(), recording(m) as calls:
        m(x)
    assert assert_layers_exact(calls) == 3


@pytest.mark.parametrize("fmt", ["bf16", "q8_0"])
def test_convert_packs_the_layers_into_one_huge_page_arena(recorded_arenas, fmt):
    """convert packs every layer (codes, and a GGUF format's grid) into one arena
    (narrowmm._arena), with the bits of a layer packed alone."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(),
                                torch.nn.Linear(96, 32, bias=False))
    alone = nmt.Linear.from_torch(model[2], fmt)
    nmt.convert(model, fmt, threads=False)
    assert len(recorded_arenas) == 1
    for name, layer in nmt.converted_layers(model):
        assert arena_holds_layer(recorded_arenas[0], layer), name
    assert not arena_holds_layer(recorded_arenas[0], alone)
    x = torch.randn(5, 96)
    with torch.inference_mode():
        assert_same_bits(model[2](x).numpy(), alone(x).numpy())


def arena_holds_layer(arena, layer) -> bool:
    return arena.holds(layer.weight_bits.numpy()) and (
        layer.weight_scales is None or arena.holds(layer.weight_scales.numpy()))


def test_converting_bf16_weights_to_bf16_changes_no_bit():
    m = model(torch.bfloat16)
    bits = {n: mod.weight.detach().view(torch.int16).numpy().copy()
            for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear)}
    nmt.convert(m, "bf16", pack=False)
    for name, layer in nmt.converted_layers(m):
        got = layer.weights().bits.T.view(np.int16)  # (in, out) -> (out, in)
        assert np.array_equal(got, bits[name]), name


def test_convert_shares_pytorchs_openmp_team():
    address, where = nmt.torch_openmp_team()
    assert address is not None, where  # Linux wheels of PyTorch run on libgomp
    assert "libgomp" in where
    torch.set_num_threads(1)
    nmt.convert(model(), "bf16", threads=2)
    assert torch.get_num_threads() == 2 and nm.get_num_threads() == 2
    assert core().omp_team() and nm.runtime_info()["omp_team"]
    torch.set_num_threads(2)
    nmt.convert(model(), "bf16", threads=False)
    assert torch.get_num_threads() == 2


def test_without_the_shared_team_convert_gives_the_cores_to_narrowmms_pool():
    nmt.set_num_threads(2)
    torch.set_num_threads(2)
    nmt.set_num_threads(2, shared_team=False)
    assert torch.get_num_threads() == 1 and nm.get_num_threads() == 2
    assert not core().omp_team() and not nm.runtime_info()["omp_team"]


def test_only_gomp_parallel_can_be_the_team():
    import ctypes

    for wrong in (1, ctypes.cast(ctypes.pythonapi.Py_IncRef, ctypes.c_void_p).value):
        with pytest.raises(ValueError, match="not GOMP_parallel"):
            core().set_omp_team(wrong)
    assert not core().omp_team()
    with pytest.raises(TypeError):
        core().set_omp_team("GOMP_parallel")


def test_without_pytorchs_libgomp_set_num_threads_falls_back_to_the_pool(monkeypatch):
    from narrowmm.torch import _team

    monkeypatch.setattr(_team, "torch_openmp_team", lambda: (None, "not libgomp"))
    torch.set_num_threads(2)
    nmt.set_num_threads(2)
    assert torch.get_num_threads() == 1 and nm.get_num_threads() == 2
    assert not core().omp_team()


def test_the_shared_team_gives_the_pools_bits():
    # the same parts on PyTorch's team as on narrowmm's pool and on one thread: every op
    # that splits work (matmul in both layouts, attention, RMS norm, SiLU)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((37, 512)).astype(np.float32)  # big enough to split at m = 1
    w = nm.Weights.encode(rng.standard_normal((512, 600)).astype(np.float32), "bf16")
    q, k, v = (rng.standard_normal((3, 4, 9, 16)).astype(np.float32) for _ in range(3))

    def results():
        return [nm.matmul(x, w), nm.matmul(x[:1], w.pack()), nm.matmul(x[:2], w),
                nm.ops.attention(q, k, v, scale=0.25), nm.ops.rms_norm(x, 1e-5),
                nm.ops.silu(x)]

    nm.set_num_threads(1)
    want = results()
    jobs = core().parallel_jobs()
    for threads in (2, 3):
        for shared in (False, True):
            nmt.set_num_threads(threads, shared_team=shared)
            assert core().omp_team() == shared
            for got, ref in zip(results(), want, strict=True):
                assert_same_bits(got, ref)
    assert core().parallel_jobs() >= jobs + 4 * 6  # every op above was split each time


def test_a_forked_child_computes_on_the_pool():
    nmt.set_num_threads(2)
    assert core().omp_team()
    rng = np.random.default_rng(8)
    x = rng.standard_normal((40, 64)).astype(np.float32)
    w = nm.Weights.encode(rng.standard_normal((64, 200)).astype(np.float32), "bf16")
    want = nm.matmul(x, w)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no OpenMP team, the pool restarted, the same bits
        try:
            ok = not core().omp_team() and np.array_equal(nm.matmul(x, w).view(np.uint32),
                                                        want.view(np.uint32))
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert answer == b"1"


def test_set_num_threads_keeps_workers_spinning_and_info_shows_it(capsys):
    c = core()
    before = c.get_spin_ns()
    try:
        c.set_spin_ns(50_000)
        nmt.set_num_threads(2, shared_team=False)
        assert c.get_spin_ns() == nmt.MODEL_SPIN_NS == 2_000_000
        assert nm.runtime_info()["spin_ns"] == 2_000_000
        nm.show_runtime()
        assert "workers spin 2000 us after a call" in capsys.readouterr().out
        with pytest.raises(ValueError, match=">= 0 ns"):
            c.set_spin_ns(-1)
    finally:
        c.set_spin_ns(before)


def test_inference_mode_compile_and_export_see_the_operator():
    # ReLU only: inductor's GELU rounds differently from eager's, narrowmm's op does not
    m = nmt.convert(model(activation=torch.nn.ReLU()), "bf16", skip=("lm_head",))
    x = torch.randn(3, 24)
    with torch.inference_mode():
        eager = m(x)
    with torch.no_grad():
        compiled = torch.compile(m)(x)
        exported = torch.export.export(m, (x,))
        again = exported.module()(x)
    assert torch.equal(compiled, eager) and torch.equal(again, eager)
    ops = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert ops.count(torch.ops.narrowmm.linear.default) == 3


def test_operator_meta_implementation():
    layer = nmt.Linear.from_torch(linear(12, 7), "bf16")
    x = torch.empty(2, 5, 12, device="meta")
    y = torch.ops.narrowmm.linear(x, layer.weight_bits.to("meta"), layer.bias.to("meta"),
                                  layer.format.code, 7, layer.packed)
    assert y.shape == (2, 5, 7) and y.device.type == "meta"


def test_checkpoint_tensor_to_torch_layer(tmp_path):
    """from_weights takes load_safetensors' (out, in) tensors: x @ W.T, as nn.Linear."""
    from safetensors.torch import save_file

    lin = linear(16, 16).to(torch.bfloat16)
    save_file({"q.weight": lin.weight.detach().contiguous(),
               "q.bias": lin.bias.detach().float().contiguous()}, str(tmp_path / "m.st"))
    f = nm.load_safetensors(tmp_path / "m.st")
    layer = nmt.Linear.from_weights(f["q.weight"], f.array("q.bias"))
    x = torch.randn(3, 16)
    with torch.no_grad():
        want = torch.nn.functional.linear(x, lin.weight.float(), lin.bias.float())
        got = layer(x)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert_same_bits(got.numpy(), oracle(layer, x.numpy()))
