"""narrowmm perf harness: narrowmm on PyTorch's OpenMP team against narrowmm's own pool.

Times all-MiniLM-L6-v2's ``model.encode`` (sentence-transformers, the ``models`` extra) in
three settings, taking turns so that each sees the same stretch of a noisy machine:

    torch  the float32 model, ``torch.set_num_threads(t)``
    pool   narrowmm bf16 packed, ``narrowmm.torch.set_num_threads(t, shared_team=False)``:
           narrowmm's pool t threads, PyTorch 1
    team   narrowmm bf16 packed, ``narrowmm.torch.set_num_threads(t)``: PyTorch t threads,
           narrowmm's parts on PyTorch's OpenMP team

and checks that pool and team give the same embeddings, bit for bit. It backs the A/B in
docs/torch.md; it is not part of the library or its tests.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python3 tools/perf/shared_team_ab.py 32
"""

from __future__ import annotations

import copy
import statistics
import sys
import time

import numpy as np
import torch

import narrowmm.torch as nmt
from narrowmm.bench.minilm import SENTENCES, load_minilm

ROUNDS, CALLS = 4, 8


def main(batch: int) -> None:
    base = load_minilm()
    converted = nmt.convert(copy.deepcopy(base), "bf16", pack=True, threads=False)
    inputs = [SENTENCES[j % len(SENTENCES)] for j in range(batch)]
    settings = {
        "torch": (base, lambda t: torch.set_num_threads(t)),
        "pool": (converted, lambda t: nmt.set_num_threads(t, shared_team=False)),
        "team": (converted, lambda t: nmt.set_num_threads(t)),
    }
    medians: dict[tuple[str, int], list[float]] = {}
    embeddings: dict[str, np.ndarray] = {}
    for _ in range(ROUNDS):
        for threads in (1, 2):
            for name, (model, set_threads) in settings.items():
                set_threads(threads)
                embeddings[name] = model.encode(inputs, batch_size=batch)  # warm-up
                times = []
                for _ in range(CALLS):
                    t0 = time.perf_counter()
                    model.encode(inputs, batch_size=batch)
                    times.append((time.perf_counter() - t0) * 1e3)
                medians.setdefault((name, threads), []).append(statistics.median(times))
        assert np.array_equal(embeddings["pool"].view(np.uint32),
                              embeddings["team"].view(np.uint32)), "pool and team differ"
    print(f"all-MiniLM-L6-v2, batch {batch}: median ms of model.encode per round, "
          f"{ROUNDS} rounds of {CALLS} calls")
    for (name, threads), values in medians.items():
        rounds = " ".join(f"{v:7.1f}" for v in values)
        print(f"{name:5} {threads} thread(s): {rounds}   median {statistics.median(values):.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 32)
