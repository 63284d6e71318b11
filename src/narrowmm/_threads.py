"""Threads: how many the C core may use, and threadpoolctl integration.

The count applies per call: work is split across output columns, so results are the same
bits for any count. The default is the number of CPUs this process may run on (its affinity
mask, and a cgroup CPU quota if one is set), or ``NARROWMM_NUM_THREADS``.
"""

from __future__ import annotations

import math
import os

from . import _environ
from .providers.native import core

_MAX_THREADS = 256


def available_cpus() -> int:
    """CPUs this process may use: affinity mask, capped by a cgroup v2/v1 CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def _cgroup_quota() -> float | None:
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", encoding="ascii") as f:
            quota_us = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us", encoding="ascii") as f:
            period_us = int(f.read())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def _parse_count(value: object, origin: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(str(value).strip())
        except ValueError:
            raise ValueError(f"{origin} must be a positive integer, got {value!r}") from None
    if not 1 <= value <= _MAX_THREADS:
        raise ValueError(f"{origin} must be between 1 and {_MAX_THREADS}, got {value}")
    return value


def default_num_threads() -> int:
    """``NARROWMM_NUM_THREADS`` if set, else :func:`available_cpus`."""
    env = os.environ.get("NARROWMM_NUM_THREADS")
    if env:
        return _parse_count(env, "NARROWMM_NUM_THREADS")
    return min(available_cpus(), _MAX_THREADS)


def set_num_threads(n: int) -> None:
    """Let each narrowmm call use up to ``n`` threads (the calling thread included)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"thread count must be an int, got {type(n).__name__}")
    n = _parse_count(n, "thread count")
    c = core()
    if c is not None:
        c.set_num_threads(n)


def get_num_threads() -> int:
    """Threads each narrowmm call may use (1 without the native core)."""
    c = core()
    return c.get_num_threads() if c is not None else 1


def _register_threadpoolctl() -> None:
    """Make ``threadpoolctl.threadpool_limits`` reach narrowmm like it reaches BLAS."""
    try:
        import threadpoolctl
    except ImportError:
        return

    class NarrowmmController(threadpoolctl.LibController):
        user_api = "narrowmm"
        internal_api = "narrowmm"
        filename_prefixes = ("_core",)
        check_symbols = ("narrowmm_get_num_threads", "narrowmm_set_num_threads")

        def get_num_threads(self) -> int:
            return self.dynlib.narrowmm_get_num_threads()

        def set_num_threads(self, num_threads: int) -> None:
            self.dynlib.narrowmm_set_num_threads(int(num_threads))

        def get_version(self) -> str:
            from ._version import __version__

            return __version__

    threadpoolctl.register(NarrowmmController)


def init() -> None:
    """Called once at import: apply the default count, register with threadpoolctl.

    A bad ``NARROWMM_NUM_THREADS`` does not fail the import: the CPUs available are used,
    and the problem is recorded for ``narrowmm info`` and the first native call to raise."""
    if core() is None:
        return
    try:
        count = default_num_threads()
    except ValueError as exc:
        _environ.record("NARROWMM_NUM_THREADS", f"{exc}; unset it to use every CPU available")
        count = min(available_cpus(), _MAX_THREADS)
    set_num_threads(count)
    _register_threadpoolctl()
