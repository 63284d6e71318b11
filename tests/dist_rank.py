"""One rank of the sharding tests (tests/test_distributed.py): loads a Llama checkpoint
sharded over the process group (narrowmm.torch.load_sharded), runs the prompts and writes
rank 0's logits digests and greedy tokens as JSON. Launched by torchrun, or directly with
RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT in the environment."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

import torch
import transformers

import narrowmm.torch as nmt
from narrowmm.torch import invariance as inv


def memory_mib() -> dict[str, float]:
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024
    return fields


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("--out")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--die-after", type=int, default=0,
                        help="rank 1 kills itself (SIGKILL) in its n-th sharded layer call")
    parser.add_argument("--new-tokens", type=int, default=6)
    parser.add_argument("--via-shard", action="store_true",
                        help="load the whole model, convert it, then narrowmm.torch.shard it")
    parser.add_argument("--format", default="bf16", help="the layers' weight format")
    args = parser.parse_args()
    nmt.init_process_group(timeout_s=args.timeout)
    rank = torch.distributed.get_rank()
    config = transformers.AutoConfig.from_pretrained(args.checkpoint)
    if args.via_shard:
        model = transformers.LlamaForCausalLM.from_pretrained(args.checkpoint,
                                                              dtype=torch.float32)
        nmt.shard(nmt.convert(model.eval(), args.format, batch_invariant=True))
    else:
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(config)
        nmt.load_sharded(model, os.path.join(args.checkpoint, "model.safetensors"),
                         args.format)
        nmt.make_batch_invariant(model.eval())
    nmt.set_num_threads(1)
    loaded = memory_mib()
    if args.die_after and rank == 1:
        calls = 0
        original = nmt.ShardedLinear.forward

        def dying(self, x):
            nonlocal calls
            calls += 1
            if calls == args.die_after:
                os.kill(os.getpid(), signal.SIGKILL)
            return original(self, x)

        nmt.ShardedLinear.forward = dying
    prompts = inv.fixed_prompts(config.vocab_size)[:4]
    logits = inv.prompt_logits(model, prompts)
    tokens = inv.greedy(model, prompts, args.new_tokens)
    if args.out:  # rank 0 the results; every rank its memory after loading
        if rank == 0:
            with open(args.out, "w") as f:
                json.dump({"world": torch.distributed.get_world_size(),
                           "digests": [inv.digest(x) for x in logits], "tokens": tokens,
                           "memory_mib": loaded}, f)
        with open(f"{args.out}.rank{rank}", "w") as f:
            json.dump(loaded, f)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    status = main()
    # Leave without the interpreter's finalisation: there, now and then (about one run in
    # five of the distributed tests on this project's 2-core machines), a thread of
    # PyTorch's gloo backend still joinable after destroy_process_group aborts the rank
    # with "terminate called without an active exception" (PyTorch's own tracker has
    # reports of it), after every result is written. The results are files, flushed here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
