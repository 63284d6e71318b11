"""Threads and ISA rows never change a bit; the pool is safe under concurrency and fork."""

import multiprocessing
import subprocess
import sys
import threading

import numpy as np
import pytest
from conftest import ISAS, assert_same_bits

import narrowmm as nm
from narrowmm.providers.native import use_isa


@pytest.fixture(autouse=True)
def _restore_threads():
    before = nm.get_num_threads()
    yield
    nm.set_num_threads(before)


def _case(rng, m, k, n, fmt):
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = nm.Weights.encode(rng.standard_normal((k, n)).astype(np.float32), fmt)
    return x, w


def _scalar_single_thread(x, w):
    nm.set_num_threads(1)
    with use_isa("scalar"):
        return nm.matmul(x, w)


# m around the microkernels' MR (4, 6) and beyond; n around vector widths (8, 16, 32) and
# column blocks / thread grains (64, 128); k across the KC = 256 block edge. Sizes large
# enough (m*n*k >= 2^18) run split across threads.
SHAPES = ([(m, 300, 200) for m in (*range(1, 18), 31, 64, 100)]
          + [(5, 64, n) for n in (*range(1, 71), 127, 128, 129, 255, 257, 1100)]
          + [(m, k, 1100) for m in (1, 2, 7) for k in (0, 1, 2, 3, 17, 256, 1000)])


@pytest.mark.parametrize("fmt", ["f32", "fp16", "bf16"])
def test_every_row_and_thread_count_gives_the_scalar_bits(fmt):
    rng = np.random.default_rng(5)
    cases = [_case(rng, m, k, n, fmt) for m, k, n in SHAPES]
    want = [_scalar_single_thread(x, w) for x, w in cases]
    for isa in ISAS:
        with use_isa(isa):
            for threads in (1, 2, 3, 4, 7):
                nm.set_num_threads(threads)
                for (x, w), expected in zip(cases, want, strict=True):
                    got = nm.matmul(x, w)
                    assert_same_bits(got, expected)


# Shapes whose parts split columns, rows, or both, the streaming paths (m = 1, 2) and a
# ragged last sliver.
BIAS_SHAPES = [(1, 300, 1100), (2, 300, 1100), (7, 256, 1100), (37, 300, 200), (101, 300, 30),
               (448, 384, 384)]


def _bias_copied_first(x, w, bias):
    """The chains started from a bias copied into out beforehand, on the calling thread."""
    want = np.empty((x.shape[0], w.shape[1]), np.float32)
    want[...] = bias
    nm.set_num_threads(1)
    nm.matmul(x, w, out=want, accumulate=True)
    return want


@pytest.mark.parametrize("fmt", ["f32", "bf16"])
def test_a_bias_written_by_the_parts_gives_the_bits_of_a_bias_copied_first(fmt):
    """The native parts write the bias into their own blocks of out (in parallel); the
    chains must be exactly those that start from a bias copied into out beforehand, on every
    row, thread count and layout."""
    rng = np.random.default_rng(11)
    for m, k, n in BIAS_SHAPES:
        x, w = _case(rng, m, k, n, fmt)
        bias = rng.standard_normal(n).astype(np.float32)
        with use_isa("scalar"):
            want = _bias_copied_first(x, w, bias)
        for isa in ISAS:
            with use_isa(isa):
                packed = w.pack()
                for threads in (1, 2, 3):
                    nm.set_num_threads(threads)
                    assert_same_bits(nm.matmul(x, w, bias=bias), want)
                    out = np.full((m, n), np.nan, np.float32)
                    nm.matmul(x, packed, out=out, bias=bias)
                    assert_same_bits(out, want)


def test_a_bias_across_the_bindings_column_chunks():
    """A call long enough (over 2^30 multiply-adds) for the binding to run it as column
    chunks hands each chunk its own columns of the bias."""
    rng = np.random.default_rng(12)
    x, w = _case(rng, 256, 1024, 4200, "bf16")
    bias = rng.standard_normal(4200).astype(np.float32)
    want = _bias_copied_first(x, w, bias)
    nm.set_num_threads(2)
    assert_same_bits(nm.matmul(x, w, bias=bias), want)
    assert_same_bits(nm.matmul(x, w.pack(), bias=bias), want)


@pytest.mark.parametrize("isa", ISAS)
def test_strided_sub_blocks_across_threads(isa):
    rng = np.random.default_rng(8)
    parent_w = nm.encode(rng.standard_normal((700, 1300)).astype(np.float32), "fp16")
    w = nm.Weights.from_bits(parent_w[3:603, 5:1205], "fp16")    # (600, 1200) sub-block
    x = rng.standard_normal((9, 650)).astype(np.float32)[:, 7:607]  # row stride 650
    out = np.zeros((12, 1250), np.float32)[2:11, 10:1210]
    want = _scalar_single_thread(np.ascontiguousarray(x), nm.Weights.from_bits(
        np.ascontiguousarray(parent_w[3:603, 5:1205]), "fp16"))
    with use_isa(isa):
        nm.set_num_threads(3)
        nm.matmul(x, w, out=out)
    assert_same_bits(out, want)


def test_many_python_threads_at_once():
    rng = np.random.default_rng(9)
    cases = [_case(rng, m, 512, 700, "bf16") for m in (1, 3, 16, 1, 8, 2, 33, 1)]
    want = [nm.matmul(x, w) for x, w in cases]
    nm.set_num_threads(2)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for _ in range(5):
                x, w = cases[i]
                assert_same_bits(nm.matmul(x, w), want[i])
        except BaseException as exc:  # reported to the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    # change the pool size while others compute: results must not change
    for n in (1, 3, 2, 4, 2):
        nm.set_num_threads(n)
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a matmul deadlocked"
    assert not errors, errors[0]


def _child_matmul(queue) -> None:
    rng = np.random.default_rng(4)
    x, w = _case(rng, 16, 400, 900, "fp16")
    queue.put(nm.matmul(x, w).tobytes())


def test_forked_child_computes_correctly():
    nm.set_num_threads(2)
    rng = np.random.default_rng(4)
    x, w = _case(rng, 16, 400, 900, "fp16")
    want = nm.matmul(x, w)  # the pool's workers exist in the parent now
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_matmul, args=(queue,))
    child.start()
    got = np.frombuffer(queue.get(timeout=120), np.float32).reshape(want.shape)
    child.join(timeout=120)
    assert child.exitcode == 0
    assert_same_bits(got, want)


def test_set_and_get_num_threads():
    nm.set_num_threads(3)
    assert nm.get_num_threads() == 3
    with pytest.raises(ValueError, match="between 1 and 256, got 0"):
        nm.set_num_threads(0)
    with pytest.raises(TypeError, match="must be an int, got float"):
        nm.set_num_threads(2.0)
    assert nm.get_num_threads() == 3


def test_threadpoolctl_limits_narrowmm():
    from threadpoolctl import threadpool_info, threadpool_limits

    nm.set_num_threads(2)
    assert any(d["internal_api"] == "narrowmm" for d in threadpool_info())
    with threadpool_limits(1):
        assert nm.get_num_threads() == 1
    assert nm.get_num_threads() == 2
    with threadpool_limits(1, user_api="narrowmm"):
        assert nm.get_num_threads() == 1


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PATH": "", **env}, timeout=120)


def test_env_var_sets_the_default():
    out = _run("import narrowmm as nm; print(nm.get_num_threads())", NARROWMM_NUM_THREADS="3")
    assert out.stdout.strip() == "3", out.stderr
    # a bad value does not break the import; the first native call names it
    code = ("import numpy as np, narrowmm as nm; print(nm.get_num_threads());"
            "nm.matmul(np.ones((1, 2), np.float32), np.ones((2, 2), np.float32))")
    out = _run(code, NARROWMM_NUM_THREADS="lots")
    assert out.stdout.strip() and int(out.stdout) >= 1, out.stderr
    assert out.returncode != 0 and "EnvironmentVariableError" in out.stderr
    assert "NARROWMM_NUM_THREADS must be a positive integer, got 'lots'" in out.stderr


def test_default_is_the_cpus_we_may_use():
    from narrowmm._threads import available_cpus

    out = _run("import narrowmm as nm; print(nm.get_num_threads())")
    assert int(out.stdout) == available_cpus() >= 1


def test_a_small_call_leaves_sleeping_workers_asleep():
    """By default a call too small to pay for waking sleeping workers runs on the caller
    alone; a big one is split. (The suite sets the threshold to 0 elsewhere.)"""
    import time

    from narrowmm.providers.native import core

    c = core()
    before = c.get_wake_min_work()
    c.set_wake_min_work(1 << 24)
    nm.set_num_threads(2)
    try:
        rng = np.random.default_rng(0)
        small = nm.Weights.encode(rng.standard_normal((384, 384)).astype(np.float32), "bf16")
        big = nm.Weights.encode(rng.standard_normal((1024, 1024)).astype(np.float32), "bf16")
        x_small = np.ones((12, 384), np.float32)  # 1.8 M multiply-adds, >= 2^18: splittable
        x_big = np.ones((32, 1024), np.float32)  # 33.5 M: pays for waking
        nm.matmul(x_big, big)
        time.sleep(0.05)  # well past the workers' 50 us spin: they sleep
        jobs = c.parallel_jobs()
        nm.matmul(x_small, small)
        assert c.parallel_jobs() == jobs
        nm.matmul(x_big, big)
        assert c.parallel_jobs() == jobs + 1
        c.set_wake_min_work(0)
        time.sleep(0.05)
        nm.matmul(x_small, small)
        assert c.parallel_jobs() == jobs + 2
    finally:
        c.set_wake_min_work(before)


def test_row_ops_too_small_to_split_stay_on_the_caller_while_workers_spin():
    """While the workers are awake (held, as a decode step holds them), a job is split
    whatever its cost, except a row op (RMS norm, SiLU) under 16384 cost units, which runs
    on the caller alone; the same bits either way. The suite's wake_min_work of 0 splits
    those too."""
    from narrowmm import ops
    from narrowmm.providers.native import core

    c = core()
    before = c.get_wake_min_work()
    rng = np.random.default_rng(2)
    heads = rng.standard_normal((16, 128)).astype(np.float32)  # norm cost 4096
    hidden = rng.standard_normal((64, 1024)).astype(np.float32)  # 131072
    row = rng.standard_normal((1, 1536)).astype(np.float32)  # SiLU cost 12288
    wide = rng.standard_normal((1, 4096)).astype(np.float32)  # 32768
    calls = [lambda: ops.rms_norm(heads, 1e-6), lambda: ops.rms_norm(hidden, 1e-6),
             lambda: ops.silu(row), lambda: ops.silu(wide)]
    nm.set_num_threads(1)
    want = [call() for call in calls]
    nm.set_num_threads(2)
    c.pool_hold(True)
    try:
        for floor, split in ((1 << 24, [0, 1, 0, 1]), (0, [1, 1, 1, 1])):
            c.set_wake_min_work(floor)
            for call, expected, ref in zip(calls, split, want, strict=True):
                jobs = c.parallel_jobs()
                assert_same_bits(call(), ref)
                assert c.parallel_jobs() == jobs + expected, (floor, expected)
    finally:
        c.pool_hold(False)
        c.set_wake_min_work(before)
