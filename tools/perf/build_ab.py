"""narrowmm perf harness: an A/B of two builds of the C core inside one process, call by call.

``walk_ab.py`` takes turns between the values of a runtime setting; a change compiled into
the kernels (a prefetch hint, a constant) has no setting to turn. This harness loads two
builds' extensions side by side instead, each under a copy of this checkout's Python package
(``narrowmm_a`` and ``narrowmm_b``: the package imports its modules relatively, so each copy
drives its own ``_core``), and times ``matmul(x, w, out=out)`` on each build's own weights,
the builds by turns call by call, the order turned each round. On a shared VM a run per
build times the hour as much as the build (docs/kernels.md, "On this VM a setting's A/B");
here both meet the same machine. Each format's products are compared bit for bit before
anything is timed: two builds of the contract give the same bits.

Cold: ``--shape`` in copies of about ``--copies-mib`` a build, used in rotation, packed as a
load packs them (an arena on huge pages), and ``--evict-mib`` of another buffer read before
each call, then 16 KiB on each of the called build's threads (its pool's workers woken, as
walk_ab does). Threads: ``NARROWMM_NUM_THREADS`` (both builds' pools). It backs figures in
docs/results/; it is not part of the library (tests/test_tools.py checks its arguments and
output), and its times are not the bench's claims.

    cmake -S . -B /tmp/nm-a -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/nm-a -t _core
    # the change, then the same into /tmp/nm-b
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE NARROWMM_NUM_THREADS=1 \\
        python3 tools/perf/build_ab.py --a /tmp/nm-a --b /tmp/nm-b --rows 16 --format q8_0
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness_args import check_run, shape_of

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "narrowmm"
DEFAULT_FORMATS = ("q8_0", "bf16")


def core_file(build: Path) -> Path:
    """The one ``_core`` extension in ``build`` (a CMake build directory), or ``build``
    itself if it names one."""
    if build.is_file():
        return build
    found = sorted(build.glob("_core*.so")) + sorted(build.glob("_core*.pyd"))
    if len(found) != 1:
        raise ValueError(f"{build} holds {len(found)} _core extensions, not one "
                         f"(build one with: cmake --build {build} -t _core)")
    return found[0]


def load_build(label: str, core: Path, into: Path) -> ModuleType:
    """This checkout's package as ``narrowmm_<label>`` with ``core`` as its extension."""
    name = f"narrowmm_{label}"
    shutil.copytree(PACKAGE, into / name,
                    ignore=shutil.ignore_patterns("_core*", "__pycache__"))
    shutil.copy2(core, into / name / core.name)
    sys.path.insert(0, str(into))
    return importlib.import_module(name)


def weights(nm: ModuleType, fmt: str, k: int, n: int, seed: int) -> object:
    """(k, n) weights of ``fmt`` as the kernel bench makes them, from ``seed``: the same
    values under either build. walk_rates.weights with the package as an argument: that
    module imports the installed ``narrowmm``, which this process must not load."""
    kernels = importlib.import_module(f"{nm.__name__}.bench.kernels")
    results = importlib.import_module(f"{nm.__name__}.bench.results")
    rng = np.random.default_rng(seed)
    if fmt in results.GGUF_CONVERTED_FORMATS:
        return kernels.gguf_converted_weights(k, n, fmt, rng)
    raw = ((rng.random((k, n), dtype=np.float32) - 0.5) * 0.1).astype(np.float32)
    if fmt in results.QUANTIZED_FORMATS:
        return nm.Weights.quantize(raw, fmt)
    return nm.Weights.encode(raw, fmt)


def copies(nm: ModuleType, fmt: str, k: int, n: int, count: int, layout: str) -> list[object]:
    """``count`` weights (seeds 0..count-1), packed in an arena as a load packs them, their
    kernels' scales made, or row-major."""
    arena = importlib.import_module(f"{nm.__name__}._arena")
    made = []
    with arena.weight_arena():
        for seed in range(count):
            w = weights(nm, fmt, k, n, seed)
            if layout == "packed":
                w = w.pack()
                w.kernel_scales()
            made.append(w)
    return made


def stored_bytes(w: object) -> int:
    scales = getattr(w, "scales", None)
    return w.bits.nbytes + (scales.values.nbytes if scales is not None else 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, type=Path,
                        help="build A: a CMake build directory holding _core, or the file")
    parser.add_argument("--b", required=True, type=Path, help="build B, the same")
    parser.add_argument("--format", action="append", default=[], dest="formats",
                        help=f"repeatable; default {', '.join(DEFAULT_FORMATS)}")
    parser.add_argument("--shape", default="4096x4096", help="k x n")
    parser.add_argument("--rows", type=int, default=16, help="m: rows of x (1..256)")
    parser.add_argument("--layout", choices=("packed", "rows"), default="packed")
    parser.add_argument("--rounds", type=int, default=16, help="rounds; each times A and B")
    parser.add_argument("--copies-mib", type=int, default=300,
                        help="weight copies in rotation, MiB in all per format and build")
    parser.add_argument("--evict-mib", type=int, default=256,
                        help="a buffer read before each call (0: none)")
    args = parser.parse_args()
    try:
        cores = {"a": core_file(args.a), "b": core_file(args.b)}
    except (OSError, ValueError) as e:
        parser.error(str(e))
    if cores["a"].resolve() == cores["b"].resolve():
        parser.error(f"--a and --b are the same extension: {cores['a']}")
    need_mib = 2 * 2 * args.copies_mib + args.evict_mib  # both builds, a format's freed late
    try:
        k, n = shape_of(args.shape, "4096x4096")
        check_run(args.rows, 256, args.rounds, args.copies_mib, args.evict_mib, need_mib)
    except ValueError as e:
        parser.error(str(e))
    with tempfile.TemporaryDirectory(prefix="build_ab_") as tmp:
        builds = {label: load_build(label, core, Path(tmp)) for label, core in cores.items()}
        for fmt in args.formats:
            try:  # the shape's k, a few columns: a K type's blocks need k a multiple of 256
                weights(builds["a"], fmt, k, 32, 0)
            except (KeyError, ValueError) as e:
                parser.error(f"--format {fmt}: {e}")
        run(builds, args.formats or list(DEFAULT_FORMATS), k, n, args)


def run(builds: dict[str, ModuleType], formats: list[str], k: int, n: int,
        args: argparse.Namespace) -> None:
    a, b = builds["a"], builds["b"]
    rng = np.random.default_rng(0)
    x = ((rng.random((args.rows, k), dtype=np.float32) - 0.5) * 0.1).astype(np.float32)
    out = np.empty((args.rows, n), np.float32)
    arrays = importlib.import_module(f"{a.__name__}._arrays")
    evict = None
    if args.evict_mib:
        evict = arrays.aligned_empty((args.evict_mib << 20) // 4, np.float32)
        evict.fill(1.0)
    threads = a.get_num_threads()
    wake = arrays.aligned_empty(4096 * threads, np.float32)  # 16 KiB a thread
    wake.fill(1.0)
    print(f"A {a.providers.native.core().isa()} ({a.__name__}), "
          f"B {b.providers.native.core().isa()} ({b.__name__}); m = {args.rows}, "
          f"{threads} thread(s), {k} x {n} {args.layout}, by turns, "
          f"{args.rounds} rounds, {args.evict_mib} MiB read before each call", flush=True)
    for fmt in formats:
        first = copies(a, fmt, k, n, 1, args.layout)[0]
        count = max(2, (args.copies_mib << 20) // stored_bytes(first))
        mats = {label: copies(nm, fmt, k, n, count, args.layout) for label, nm in builds.items()}
        results = {}
        for label, nm in builds.items():  # each copy's first call, untimed, and the bits
            results[label] = np.empty_like(out)
            for w in mats[label]:
                nm.matmul(x, w, out=results[label])
        if not np.array_equal(results["a"].view(np.uint32), results["b"].view(np.uint32)):
            raise SystemExit(f"{fmt}: the builds' products differ: not two builds of the "
                             f"same contract")
        times: dict[str, list[float]] = {"a": [], "b": []}
        for r in range(args.rounds):
            for label in ("a", "b") if r % 2 == 0 else ("b", "a"):
                core = builds[label].providers.native.core()
                if evict is not None:
                    core.probe_read(1, evict)
                if threads > 1:  # the build's workers woken, as a model's last layer leaves them
                    core.probe_read(threads, wake)
                w = mats[label][r % count]
                start = time.perf_counter()
                builds[label].matmul(x, w, out=out)
                times[label].append(time.perf_counter() - start)
        ta, tb = statistics.median(times["a"]), statistics.median(times["b"])
        print(f"{fmt:7} {count} copies  A {ta * 1e3:.3f} ms  B {tb * 1e3:.3f} ms  "
              f"B {ta / tb:.3f}x the speed of A", flush=True)


if __name__ == "__main__":
    main()
