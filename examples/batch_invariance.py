"""Batch invariance, side by side: how many different outputs each prompt gets when it runs
alone, in a batch of 4 or in a batch of 8 (left padding, as generate() pads), on 1, 2 and 3
threads, under plain PyTorch and under narrowmm.

    python examples/batch_invariance.py              # a small random Llama, about a minute
    python examples/batch_invariance.py --size 1b    # Llama-3.2-1B shapes, random weights

Needs torch and transformers: the models extra (pip install ".[models]" in the narrowmm
source tree, after PyTorch's CPU build; README, "Install"). Nothing is downloaded: the
model is built from a LlamaConfig with random weights.
"""

from __future__ import annotations

import argparse
import time

import torch

import narrowmm.torch as nmt
from narrowmm.torch import invariance as inv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(inv.SIZES), default="small")
    parser.add_argument("--threads", default="1,2,3", help="thread counts (default 1,2,3)")
    parser.add_argument("--new-tokens", type=int, default=8,
                        help="greedy tokens generated per prompt (default 8)")
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    config = inv.llama_config(args.size)
    prompts = inv.fixed_prompts(config.vocab_size)
    conditions = 3 * len(threads)
    print(f"Llama-architecture model, random weights: hidden {config.hidden_size}, "
          f"{config.num_hidden_layers} layers, vocabulary {config.vocab_size}")
    print(f"{len(prompts)} prompts of lengths {[len(p) for p in prompts]}; "
          f"{conditions} conditions each: alone / batch of 4 / batch of 8 x threads "
          f"{threads}\n")
    print(f"{'system':<34} {'prompts whose logits differ':>28}  distinct logits per prompt"
          f"   greedy tokens: alone == batch of 8")
    systems = [
        ("PyTorch float32", torch.float32, None),
        ("PyTorch bfloat16", torch.bfloat16, None),
        ("narrowmm bf16, linear layers only", torch.bfloat16, False),
        ("narrowmm bf16, batch_invariant=True", torch.bfloat16, True),
    ]
    for name, dtype, invariant in systems:
        t0 = time.perf_counter()
        model = inv.random_llama(config, dtype)
        if invariant is not None:
            nmt.convert(model, "bf16", batch_invariant=invariant, threads=False)
        result = inv.batch_conditions(model, prompts, threads)
        inv.set_threads(threads[-1])
        alone = [inv.greedy(model, [p], args.new_tokens)[0] for p in prompts]
        batched = inv.greedy(model, prompts, args.new_tokens)
        same_tokens = sum(a == b for a, b in zip(alone, batched, strict=True))
        print(f"{name:<34} {result.differing_prompts():>20} of {len(prompts)}  "
              f"{result.distinct()!s:<28} {same_tokens} of {len(prompts)}"
              f"   ({time.perf_counter() - t0:.0f} s)", flush=True)
        del model


if __name__ == "__main__":
    main()
