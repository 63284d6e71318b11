"""Column-sharded layers on torch.distributed (gloo over loopback, launched with
torchrun): the logits and greedy tokens of a Llama on 2 and 3 ranks equal one process's
bit for bit; a rank killed mid-forward makes the others fail with a clear error, in
bounded time."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import require

torch = require("torch")
transformers = require("transformers")

import narrowmm as nm  # noqa: E402
import narrowmm.torch as nmt  # noqa: E402
from narrowmm.torch import invariance as inv  # noqa: E402
from narrowmm.torch._shard import _columns, _feature_rows  # noqa: E402

pytestmark = pytest.mark.usefixtures("restore_torch_threads")
RANK_SCRIPT = Path(__file__).with_name("dist_rank.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback_env() -> dict[str, str]:
    # loopback only: the rendezvous address and gloo's interface
    return dict(os.environ, MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo",
                OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    config = inv.llama_config("small")
    model = inv.random_llama(config, torch.bfloat16)
    path = tmp_path_factory.mktemp("sharded-llama")
    model.save_pretrained(path, safe_serialization=True)
    return path


def one_process(checkpoint, fmt: str) -> dict:
    """The unsharded model's logits digests and greedy tokens: float32 activations on the
    checkpoint's weights converted to ``fmt``."""
    model = transformers.LlamaForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    nmt.convert(model.eval(), fmt, batch_invariant=True, threads=1)
    prompts = inv.fixed_prompts(model.config.vocab_size)[:4]
    return {"digests": [inv.digest(x) for x in inv.prompt_logits(model, prompts)],
            "tokens": inv.greedy(model, prompts, 6)}


@pytest.fixture(scope="module")
def single_process(checkpoint):
    """The checkpoint's bf16 weights as they are."""
    return one_process(checkpoint, "bf16")


@pytest.fixture(scope="module")
def single_process_fp8(checkpoint):
    """Each output feature quantized to e4m3fn with its scale."""
    return one_process(checkpoint, "e4m3fn")


def torchrun(checkpoint, world: int, out: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
               f"--nproc-per-node={world}", "--master-addr=127.0.0.1",
               f"--master-port={free_port()}", str(RANK_SCRIPT), str(checkpoint),
               "--out", str(out), *extra]
    return subprocess.run(command, env=loopback_env(), capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.mark.parametrize(("world", "how"), [(2, "load_sharded"), (3, "load_sharded"),
                                           (2, "shard")])
def test_sharded_logits_and_tokens_equal_one_process(checkpoint, single_process, world, how,
                                                     tmp_path):
    extra = ("--via-shard",) if how == "shard" else ()
    run = torchrun(checkpoint, world, tmp_path / "out.json", *extra)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads((tmp_path / "out.json").read_text())
    assert got["world"] == world
    assert got["digests"] == single_process["digests"]
    assert got["tokens"] == single_process["tokens"]


@pytest.mark.parametrize("how", ["load_sharded", "shard"])
def test_fp8_sharded_logits_and_tokens_equal_one_process(checkpoint, single_process_fp8, how,
                                                         tmp_path):
    """FP8 layers keep their per-feature scales when split: on 3 ranks (column ranges of 96
    cut no feature's scale) the logits equal the one-process FP8 model's."""
    extra = ("--via-shard",) if how == "shard" else ()
    run = torchrun(checkpoint, 3, tmp_path / "out.json", "--format", "e4m3fn", *extra)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads((tmp_path / "out.json").read_text())
    assert got["digests"] == single_process_fp8["digests"]
    assert got["tokens"] == single_process_fp8["tokens"]


def test_scales_follow_a_slice_of_rows_or_columns():
    """Block scales cut mid-block by a shard's range: the sub-matrix's weights are the
    same numbers as the whole matrix's."""
    rng = np.random.default_rng(1)
    w = nm.Weights.quantize(rng.standard_normal((300, 200)).astype(np.float32), "e4m3fn",
                            (128, 128))
    whole = w.decode()
    for lo, hi in ((0, 96), (96, 192), (150, 200)):
        cols = _columns(w.pack(), lo, hi)
        np.testing.assert_array_equal(cols.decode(), whole[:, lo:hi])
        tw = nm.TorchWeights(np.ascontiguousarray(w.bits.T), "e4m3fn", w.scales.transpose())
        np.testing.assert_array_equal(_feature_rows(tw, lo, hi, tw.format).decode(),
                                      whole[:, lo:hi].T)


def test_a_killed_rank_makes_the_others_fail_in_bounded_time(checkpoint, tmp_path):
    """Ranks started directly (no torchrun agent to tear the group down): rank 1 kills
    itself in its 5th sharded layer call; rank 0 must exit with an error naming the
    all-gather, well within the 20 s gloo timeout given to the group, never hang."""
    env = loopback_env() | {"WORLD_SIZE": "2", "MASTER_PORT": str(free_port())}
    procs = [subprocess.Popen([sys.executable, str(RANK_SCRIPT), str(checkpoint),
                               "--timeout", "20", "--die-after", "5"],
                              env=env | {"RANK": str(r), "LOCAL_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    start = time.monotonic()
    try:
        _, err0 = procs[0].communicate(timeout=120)
        procs[1].wait(timeout=30)
    finally:
        for p in procs:
            p.kill()
    elapsed = time.monotonic() - start
    assert procs[1].returncode == -9  # the kill happened
    assert procs[0].returncode != 0
    assert "narrowmm sharded layer" in err0 and "all-gather over 2 ranks failed" in err0, \
        err0[-3000:]
    assert elapsed < 90, elapsed


def test_column_ranges_are_whole_grains_in_order():
    for n, world in [(11008, 2), (11008, 3), (4096, 8), (128, 3), (1000, 1)]:
        ranges = nmt.column_ranges(n, world)
        assert len(ranges) == world and ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        assert all(lo % 96 == 0 for lo, _ in ranges)
    assert nmt.column_ranges(128, 3) == [(0, 0), (0, 96), (96, 128)]


def test_sharding_needs_a_process_group():
    model = nmt.convert(inv.random_llama(inv.llama_config("small"), torch.bfloat16), "bf16")
    with pytest.raises(RuntimeError, match=r"initialised torch\.distributed process group"):
        nmt.shard(model)
    assert np.all([not isinstance(m, nmt.ShardedLinear) for m in model.modules()])


def test_shard_and_load_sharded_pack_into_one_arena(checkpoint, recorded_arenas, monkeypatch):
    """Both keep each rank's packed ranges side by side in one huge-page arena
    (narrowmm._arena), as convert does; a world of one rank, in this process."""
    import torch.distributed as dist

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for how in ("shard", "load_sharded"):
            recorded_arenas.clear()
            if how == "shard":
                model = transformers.LlamaForCausalLM.from_pretrained(checkpoint)
                nmt.convert(model, "bf16", threads=False)
                recorded_arenas.clear()  # convert's own
                nmt.shard(model)
            else:
                config = transformers.AutoConfig.from_pretrained(checkpoint)
                with torch.device("meta"):
                    model = transformers.LlamaForCausalLM(config)
                nmt.load_sharded(model, checkpoint / "model.safetensors", "bf16")
            assert len(recorded_arenas) == 1, how
            locals_ = [m.local for m in model.modules() if isinstance(m, nmt.ShardedLinear)]
            assert locals_ and all(m.packed for m in locals_), how
            assert all(recorded_arenas[0].holds(m.weight_bits.numpy()) for m in locals_), how
    finally:
        dist.destroy_process_group()
