"""Threads inside PyTorch models: narrowmm's parallel parts on PyTorch's own OpenMP team,
so the two pools never fight over the cores (docs/torch.md has the figures)."""

from __future__ import annotations

import functools

import torch

from .. import _threads
from ..providers.native import core

# How long narrowmm's pool workers spin after a call once set_num_threads gave narrowmm the
# cores of a model without PyTorch's OpenMP team (the C default is 50 us).
MODEL_SPIN_NS = 2_000_000


@functools.cache
def torch_openmp_team() -> tuple[int | None, str]:
    """Where PyTorch's intra-op OpenMP team can be entered: ``(address of GOMP_parallel, the
    library's path)``, or ``(None, why not)``.

    Linux only: the libgomp that PyTorch's ops run on is found among the libraries this
    process has mapped (PyTorch's own copy first) and opened without loading anything new.
    Looked up once per process (PyTorch loads its OpenMP library when it is imported).
    """
    import ctypes
    import os

    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None, "PyTorch's intra-op backend is not OpenMP"
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            mapped = {line.split(maxsplit=5)[5].strip() for line in f
                      if len(line.split(maxsplit=5)) == 6}
    except OSError:
        return None, "no /proc/self/maps to find PyTorch's libgomp in"
    gomps = sorted(p for p in mapped if os.path.basename(p).startswith("libgomp"))
    package = os.path.dirname(torch.__file__)
    own = (os.path.join(package, "lib") + os.sep, package + ".libs" + os.sep)  # wheel, vendored
    ours = [p for p in gomps if p.startswith(own)]
    if ours:
        gomps = ours
    if len(gomps) != 1:
        return None, (f"{len(gomps)} libgomp libraries are loaded; which one PyTorch uses is "
                      "not known" if gomps else "PyTorch's OpenMP library is not libgomp")
    try:
        lib = ctypes.CDLL(gomps[0], mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        address = ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value
    except (OSError, AttributeError) as exc:
        return None, f"GOMP_parallel not found in {gomps[0]}: {exc}"
    return address, gomps[0]


def set_num_threads(n: int | None = None, *, shared_team: bool = True) -> None:
    """Give a model run through ``narrowmm.torch`` ``n`` threads (default: every CPU this
    process may use) without two thread pools fighting over the cores.

    After each op PyTorch's OpenMP workers spin for milliseconds waiting for the next one,
    on the cores narrowmm's own pool then needs for the layer that follows: two teams of
    spinning threads on the same cores take turns on them. So:

    - ``shared_team=True`` (where PyTorch runs on libgomp, as its Linux wheels do): PyTorch
      gets ``n`` intra-op threads and narrowmm runs its parallel parts on PyTorch's own
      OpenMP team (:func:`torch_openmp_team`), so the model's other ops (attention, GELU,
      norms) run on ``n`` threads too and one team serves both. The parts are the same as
      on narrowmm's pool, so no bit changes.
    - otherwise (or where the team cannot be found): narrowmm's pool gets ``n`` threads and
      PyTorch's team 1, and narrowmm's workers spin 2 ms after a call instead of 50 us
      (:data:`MODEL_SPIN_NS`) so that they are still awake when the next layer comes.

    docs/torch.md gives what each choice measured.
    ``narrowmm.runtime_info()["omp_team"]`` says which one is in use. Set
    ``torch.set_num_threads`` yourself afterwards to choose otherwise.
    """
    count = _threads.available_cpus() if n is None else n
    _threads.set_num_threads(count)
    c = core()
    address = torch_openmp_team()[0] if shared_team else None
    if c is not None:
        c.set_omp_team(address or 0)
    if address is not None:
        torch.set_num_threads(count)
        return
    torch.set_num_threads(1)
    if c is not None:
        c.set_spin_ns(MODEL_SPIN_NS)
