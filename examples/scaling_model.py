"""Time per token of a column-sharded Llama on N machines, on paper (docs/scaling.md).

    python examples/scaling_model.py                        # this VM's measured figures
    python examples/scaling_model.py --bandwidth 100 --latency-us 30

Per token at batch m, with every linear layer split by output columns over N machines and
one all-gather per linear layer (narrowmm.torch.shard):

    compute  = linear weight bytes / (N x read bandwidth of one machine)
    network  = collectives x (N - 1) x latency            (gloo's ring: N - 1 steps each)
             + gathered bytes x (N - 1) / N / link bandwidth
    gathered bytes per layer = m x 4 x (3 hidden + 2 kv + 2 ffn)   (q k v o gate up down)

The attention, norms and the rest run on every machine and are left out (they are the
same on 1 and N machines).
"""

from __future__ import annotations

import argparse

MODELS = {
    # hidden, kv (kv heads x head dim), ffn, layers, vocabulary
    "Llama-3 8B": (4096, 1024, 14336, 32, 128256),
    "Llama-3 70B": (8192, 1024, 28672, 80, 128256),
}


def per_token(model: str, machines: int, gbit: float, bandwidth_gbs: float,
              latency_s: float, m: int = 1, weight_bytes: int = 2) -> dict[str, float]:
    hidden, kv, ffn, layers, vocab = MODELS[model]
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn
    weights = (layers * per_layer + hidden * vocab) * weight_bytes
    compute = weights / (machines * bandwidth_gbs * 1e9)
    collectives = 7 * layers + 1
    gathered = m * 4 * (layers * (3 * hidden + 2 * kv + 2 * ffn) + vocab)
    if machines == 1:
        latency = transfer = 0.0
    else:
        latency = collectives * (machines - 1) * latency_s
        transfer = gathered * (machines - 1) / machines / (gbit * 1e9 / 8)
    return {"weights_gb": weights / 1e9, "compute": compute, "latency": latency,
            "transfer": transfer, "total": compute + latency + transfer,
            "gathered_mb": gathered / 1e6, "collectives": collectives}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bandwidth", type=float, default=25.0,
                        help="read GB/s of one machine (default 25: this 2-core VM, measured)")
    parser.add_argument("--latency-us", type=float, default=50.0,
                        help="one message's latency on the network, us (default 50)")
    parser.add_argument("--m", type=int, default=1, help="tokens per step (batch)")
    args = parser.parse_args()
    print(f"read {args.bandwidth:g} GB/s per machine, {args.latency_us:g} us per message, "
          f"batch {args.m}; ms per token (compute + latency + transfer)")
    for model in MODELS:
        one = per_token(model, 1, 10, args.bandwidth, args.latency_us * 1e-6, args.m)
        print(f"\n{model}: {one['weights_gb']:.1f} GB of linear weights, "
              f"{one['collectives']} all-gathers and {one['gathered_mb']:.1f} MB gathered "
              f"per token; 1 machine {one['total'] * 1e3:.0f} ms")
        print(f"{'machines':>9}{'10 Gbit/s':>28}{'100 Gbit/s':>28}")
        for n in (2, 4, 8, 16):
            cells = []
            for gbit in (10, 100):
                t = per_token(model, n, gbit, args.bandwidth, args.latency_us * 1e-6, args.m)
                cells.append(f"{t['total'] * 1e3:6.0f} = {t['compute'] * 1e3:4.0f}"
                             f" + {t['latency'] * 1e3:3.0f} + {t['transfer'] * 1e3:4.1f}")
            print(f"{n:>9}{cells[0]:>28}{cells[1]:>28}")


if __name__ == "__main__":
    main()
