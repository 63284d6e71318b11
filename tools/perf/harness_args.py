"""Argument checks shared by the perf harnesses in this folder (walk_ab.py, build_ab.py).
No narrowmm import here: build_ab loads its two builds' packages itself."""

from __future__ import annotations

import os


def shape_of(text: str, example: str) -> tuple[int, int]:
    """``k x n`` from ``text`` as ``4096x11008``; ValueError naming it otherwise."""
    dims = text.split("x")
    if len(dims) != 2 or not all(d.isdigit() and int(d) > 0 for d in dims):
        raise ValueError(f"--shape is k x n in positive integers, as {example}; not {text!r}")
    return int(dims[0]), int(dims[1])


def check_run(rows: int, most_rows: int, rounds: int, copies_mib: int, evict_mib: int,
              need_mib: int) -> None:
    """ValueError naming what is out of range: rows of x, rounds, MiB of copies and of the
    eviction read, and ``need_mib`` against half of the memory available now."""
    if not 1 <= rows <= most_rows:
        raise ValueError(f"--rows must be in 1..{most_rows}, not {rows}")
    if rounds < 1 or copies_mib < 1 or evict_mib < 0:
        raise ValueError("--rounds and --copies-mib must be positive, --evict-mib not negative")
    available_mib = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20
    if need_mib > available_mib // 2:
        raise ValueError(f"--copies-mib {copies_mib} and --evict-mib {evict_mib} need "
                         f"{need_mib} MiB, more than half of the {available_mib} MiB available")
