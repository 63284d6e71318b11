"""Timing calls: one system, or several in turns over the same stretch of time."""

from __future__ import annotations

import time
from collections.abc import Callable

# ---- timing ---------------------------------------------------------------------------

def time_calls(fn: Callable[[int], object], min_calls: int, budget_s: float,
               between: Callable[[int], float] | None = None,
               max_calls: int = 500) -> tuple[list[float], list[float]]:
    """Call ``fn(i)`` (i counts calls, for rotating weight copies) until ``min_calls`` calls
    and ``budget_s`` seconds have both passed, or ``max_calls`` calls; each call's time in
    ms. With ``between``, it is called after each call too and its return values (seconds)
    are kept, in ms: the second list, empty otherwise."""
    times: list[float] = []
    others: list[float] = []
    start = time.perf_counter()
    i = 0
    while len(times) < min_calls or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn(i)
        times.append((time.perf_counter() - t0) * 1e3)
        if between is not None:
            others.append(between(i) * 1e3)
        i += 1
        if len(times) >= max_calls:
            break
    return times, others


def time_interleaved(calls: list[Callable[[int], object]], min_calls: int, budget_s: float,
                     between: list[Callable[[int], float] | None] | None = None,
                     ) -> list[tuple[list[float], list[float]]]:
    """Time several systems on the same case in turns, as :func:`time_calls` times one.

    There are ``min_calls`` rounds; in each, every system runs for at least one call and
    ``budget_s / min_calls`` seconds, starting one system further along the list each round.
    So every system gets at least ``min_calls`` calls and ``budget_s`` seconds, as with
    :func:`time_calls`, but spread over the same stretch of time as the others': on a
    shared machine the memory bandwidth drifts by tens of percent within a minute, and
    systems timed one after another would see different machines. ``calls[s](i)`` gets
    i = 0, 1, 2, ... per system, for rotating weight copies. At most 500 calls a system, as
    there. Returns, per system, the call times and the ``between`` times in ms, as
    :func:`time_calls` does."""
    rounds = max(1, min_calls)
    between = between if between is not None else [None] * len(calls)
    out: list[tuple[list[float], list[float]]] = [([], []) for _ in calls]
    for r in range(rounds):
        for j in range(len(calls)):
            s = (r + j) % len(calls)
            times, others = out[s]
            start = len(times)
            more, more_others = time_calls(lambda i, s=s, start=start: calls[s](start + i), 1,
                                           budget_s / rounds,
                                           None if between[s] is None else
                                           (lambda i, s=s, start=start: between[s](start + i)),
                                           max_calls=max(1, 500 // rounds))
            times.extend(more)
            others.extend(more_others)
    return out
