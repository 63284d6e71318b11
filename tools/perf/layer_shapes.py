"""narrowmm perf harness: one linear layer's shape, narrowmm against PyTorch's sgemm.

Times ``nm.matmul(x, w_packed, out=out)`` (bf16 weights, packed) against ``torch.mm(x, w.T,
out=...)`` (float32 weights) at the given shape, taking turns, on ``copies`` weight
matrices used in rotation (12 by default: more than the last-level cache holds at MiniLM's
shapes, as in a model, where each layer's weights are cold). Threads: PyTorch's and
narrowmm's on PyTorch's OpenMP team (``narrowmm.torch.set_num_threads``). Prints the median
microseconds of each and the ratio. It backs figures in docs/torch.md; it is not part of the
library or its tests.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python3 tools/perf/layer_shapes.py \\
        --threads 2 --rows 448 --shape 384x384 --shape 1536x384 --shape 384x1536
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import narrowmm as nm
import narrowmm.torch as nmt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=448, help="m (MiniLM batch 32: 448)")
    parser.add_argument("--shape", action="append", default=[],
                        help="in x out features, e.g. 1536x384 (repeatable)")
    parser.add_argument("--copies", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shape] or [(384, 384)]
    nmt.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"rows {args.rows}, {args.threads} thread(s), {args.copies} weight copies, "
          f"median of {args.rounds} rounds")
    for k, n in shapes:
        w32 = [rng.standard_normal((k, n), dtype=np.float32) for _ in range(args.copies)]
        packed = [nm.Weights.encode(w, "bf16").pack() for w in w32]
        w_torch = [torch.from_numpy(np.ascontiguousarray(w.T)) for w in w32]  # (out, in)
        x = rng.standard_normal((args.rows, k), dtype=np.float32)
        x_torch = torch.from_numpy(x)
        out = np.empty((args.rows, n), np.float32)
        out_torch = torch.empty((args.rows, n))
        times: dict[str, list[float]] = {"torch": [], "narrowmm": []}
        for _ in range(args.rounds):
            for i in range(args.copies):
                t0 = time.perf_counter()
                torch.mm(x_torch, w_torch[i].T, out=out_torch)
                times["torch"].append(time.perf_counter() - t0)
            for i in range(args.copies):
                t0 = time.perf_counter()
                nm.matmul(x, packed[i], out=out)
                times["narrowmm"].append(time.perf_counter() - t0)
        t_torch = statistics.median(times["torch"]) * 1e6
        t_nm = statistics.median(times["narrowmm"]) * 1e6
        print(f"{k:5d} x {n:<5d} torch f32 {t_torch:8.0f} us   narrowmm bf16 packed "
              f"{t_nm:8.0f} us   {t_torch / t_nm:.2f}x")


if __name__ == "__main__":
    main()
