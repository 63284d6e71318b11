"""The cost of column sharding on one machine: Llama-3 8B's ffn_up (k 4096, n 11008, bf16
weights) at m = 1 and 16, as one process on 2 threads, and as 2 ranks on 1 thread each
(torch.distributed, gloo over loopback) with the share of the time spent in the all-gather.

    python examples/sharded_linear.py                                   # one process
    torchrun --nproc-per-node 2 --master-addr 127.0.0.1 examples/sharded_linear.py

Both print median ms per call; the sharded run also checks that its output has the
single-process bits. docs/scaling.md models the same cost across machines.
"""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
import torch

import narrowmm as nm
import narrowmm.torch as nmt

K, N = 4096, 11008
CALLS = 200


def main() -> None:
    distributed = "RANK" in os.environ
    if distributed:
        nmt.init_process_group(timeout_s=60)
    rank = torch.distributed.get_rank() if distributed else 0
    world = torch.distributed.get_world_size() if distributed else 1
    rng = np.random.default_rng(0)  # the same weights on every rank
    w = nm.Weights.encode(rng.standard_normal((K, N)).astype(np.float32) * 0.02, "bf16")
    full = nmt.Linear(w.pack(), None)
    if distributed:
        nmt.set_num_threads(1)
        model = nmt.shard(torch.nn.Sequential(full))
        layer = model[0]
    else:
        nmt.set_num_threads(2)
        layer = full
    for m in (1, 16):
        x = torch.from_numpy(rng.standard_normal((m, K)).astype(np.float32))
        with torch.inference_mode():
            for _ in range(10):
                y = layer(x)
            times = []
            if distributed:
                layer.gather_seconds, layer.calls = 0.0, 0
                torch.distributed.barrier()
            for _ in range(CALLS):
                t0 = time.perf_counter()
                y = layer(x)
                times.append(time.perf_counter() - t0)
            if distributed:
                nmt.set_num_threads(2)
                want = full(x)  # one process's bits, on this rank
                nmt.set_num_threads(1)
                assert torch.equal(y.view(torch.int32), want.view(torch.int32))
        med = statistics.median(times) * 1e3
        line = f"m={m:>2}: {med:.3f} ms per call (median of {CALLS})"
        if distributed:
            share = layer.gather_seconds / sum(times) * 100
            line += f", all-gather {share:.0f} % of the time, output equal to one process's"
        if rank == 0:
            print(f"{world} process(es) x {nm.get_num_threads()} thread(s), ffn_up 8B "
                  f"(k {K}, n {N}, bf16 packed) {line}", flush=True)
    if distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
