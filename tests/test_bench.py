"""The benchmark's timing helpers (the command itself is exercised in test_cli.py)."""
import time

from narrowmm.bench.timing import time_calls, time_interleaved


def _recorder(log: list[tuple[int, int]], system: int):
    def call(i: int) -> None:
        log.append((system, i))
    return call


def test_interleaved_systems_take_turns_and_count_their_own_calls():
    log: list[tuple[int, int]] = []
    calls = [_recorder(log, s) for s in range(3)]
    out = time_interleaved(calls, min_calls=4, budget_s=0.0)
    # a zero budget: one call per system per round, four rounds, each round starting one
    # system further along
    assert len(log) == 12
    for r in range(4):
        turn = [s for s, _ in log[3 * r:3 * r + 3]]
        assert turn == [(r + j) % 3 for j in range(3)]
    for s in range(3):
        assert [i for t, i in log if t == s] == [0, 1, 2, 3]
        times, between = out[s]
        assert len(times) == 4 and all(t >= 0 for t in times)
        assert between == []


def test_interleaved_budget_is_spread_over_the_rounds():
    log: list[tuple[int, int]] = []
    slow_log: list[tuple[int, int]] = []

    def fast(i: int) -> None:
        log.append((0, i))
        time.sleep(0.001)  # about 20 calls a slice, below the cap of 500 // 3

    def slow(i: int) -> None:
        slow_log.append((1, i))
        time.sleep(0.004)

    probed: list[int] = []

    def probe(i: int) -> float:
        probed.append(i)
        return 0.001

    t0 = time.perf_counter()
    out = time_interleaved([fast, slow], min_calls=3, budget_s=0.06,
                           between=[probe, None])
    elapsed = time.perf_counter() - t0
    fast_times, fast_between = out[0]
    slow_times, slow_between = out[1]
    # every system gets its whole budget, in three slices of 20 ms
    assert elapsed >= 2 * 0.06
    assert len(fast_times) == len(log) > len(slow_times) >= 3
    assert [i for _, i in log] == list(range(len(log)))
    assert [i for _, i in slow_log] == list(range(len(slow_log)))
    assert len(slow_times) == len(slow_log) and all(t >= 4.0 for t in slow_times)
    # the probe runs after each call of its own system, with the same index, in ms
    assert probed == list(range(len(log)))
    assert fast_between == [1.0] * len(log) and slow_between == []


def test_calls_are_capped():
    times, _ = time_calls(lambda i: None, min_calls=1, budget_s=10.0, max_calls=7)
    assert len(times) == 7
    out = time_interleaved([lambda i: None], min_calls=5, budget_s=10.0)
    assert len(out[0][0]) == 500
