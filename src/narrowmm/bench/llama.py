"""``narrowmm bench --model llama``: greedy decode tokens/s of a Llama-architecture model
against llama.cpp and PyTorch, and where a token's time goes.

The model has Llama-3.2-1B's shapes with a 32,000-entry vocabulary and random bf16 weights
(``narrowmm.torch.invariance.SIZES["1b"]``; ``--size small`` for a quick look), built from a
``LlamaConfig``: nothing is downloaded. The systems, all in this one process:

- ``llama.cpp F16`` / ``llama.cpp BF16``: the same weights written as GGUF files with the
  ``gguf`` package, run by ``llama-cpp-python`` (which builds llama.cpp from source);
- ``torch f32`` / ``torch bf16``: the ``transformers`` model;
- ``narrowmm linear``: ``narrowmm.torch.convert(model, "bf16")`` (packed weights), the other
  ops PyTorch's;
- ``narrowmm invariant``: ``convert(model, "bf16", batch_invariant=True)``;
- ``narrowmm decoder``: the same model, each step one C call (``narrowmm.torch.Decoder``,
  the same logits bit for bit).

The narrowmm systems keep bf16 weights and run float32 activations (``model.float()``
after ``convert``: the embedding and norm weights are widened exactly, narrowmm's weights
stay bf16), as llama.cpp does with F16 / BF16 weights.

A case is (system, threads, batch). A session prefills the prompts (left-padded for a batch;
not timed; ``--context N`` makes the first N tokens long, :func:`prompt_lengths`), then
decodes ``steps`` greedy tokens, each step timed alone: one forward pass
of one token per sequence with the KV cache, and the argmax. Tokens/s = batch / median
step. Rounds of every case run in turns (the order rotating), so all systems see the same
stretch of a drifting machine. Threads: PyTorch systems ``torch.set_num_threads(t)``;
narrowmm systems ``narrowmm.torch.set_num_threads(t)`` (t threads, PyTorch's OpenMP team
shared with narrowmm);
llama.cpp ``n_threads = t``. llama.cpp runs batch 1 only (one sequence per context here).
"""

from __future__ import annotations

import copy
import gc
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .machine import run_line
from .results import PROMPT_LENGTHS

# the packages behind the decode benches' peers, whose versions the first line gives
DECODE_PEERS = ("llama-cpp-python", "torch", "transformers")
# float32 key/value caches of the longest batch alive at once in a decode bench: the two
# Decoders' (kept between cases), the transformers model's of the case running and the heap
# its prefill leaves behind; and what a llama.cpp context of n_ctx positions holds, in
# float32 caches of the same positions (its f16 cache and compute buffers: 0.67 GB at 1065
# positions on the Qwen3-shaped file, docs/results/bench-context-zen4-2026-12-07.txt)
LIVE_KV_CACHES = 4
LLAMA_CPP_KV_CACHES = 3


def prompt_lengths(context: int | None) -> tuple[int, ...]:
    """The prompts' lengths: :data:`PROMPT_LENGTHS`, or for ``--context N`` the same spread
    moved up to end at N, so that the first prompt (the one batch 1 and llama.cpp decode)
    holds N tokens and the decode steps attend to N positions and more."""
    if context is None:
        return PROMPT_LENGTHS
    top = max(PROMPT_LENGTHS)
    if context < top:
        raise ValueError(f"--context {context}: the prompts need at least {top} tokens")
    return tuple(context - top + n for n in PROMPT_LENGTHS)


def context_bytes(layers: int, kv_heads: int, head_dim: int, heads: int, vocab: int,
                  batch: int, positions: int, llama_cpp_contexts: int) -> int:
    """What a batch of ``positions``-long sequences adds to a decode bench's peak: the
    float32 key/value caches alive at once (:data:`LIVE_KV_CACHES` of the batch,
    :data:`LLAMA_CPP_KV_CACHES` of one sequence per llama.cpp context), one layer's prefill
    attention scores and their softmax (``batch * heads * positions**2`` floats each), and
    the prefill's logits, which ``transformers`` computes for every position (twice: the
    output layer's result and a copy). On the Qwen3-shaped file at 1024 positions, batch 1,
    1 and 2 threads: 3.0 GB, where the run's peak was 3.1 GB above a run with the default
    prompts (docs/results/bench-context-zen4-2026-12-07.txt)."""
    cache = 2 * layers * kv_heads * head_dim * 4 * positions  # one sequence's
    scores = 2 * 4 * batch * heads * positions * positions
    logits = 2 * 4 * batch * positions * vocab
    return ((LIVE_KV_CACHES * batch + LLAMA_CPP_KV_CACHES * llama_cpp_contexts) * cache
            + scores + logits)


def check_context(what: str, context: int, steps: int, limit: int) -> None:
    """Refuse a ``--context`` whose prompt and decode steps pass the model's context length
    (``limit`` positions), before anything is loaded."""
    if context + steps > limit:
        fits = (f"use --context {limit - steps} or less" if limit - steps >= max(PROMPT_LENGTHS)
                else f"the bench needs at least {max(PROMPT_LENGTHS) + steps}")
        raise SystemExit(f"narrowmm bench --model {what} --context {context}: {context} "
                         f"prompt tokens and {steps} decode steps pass the model's context "
                         f"length of {limit} positions; {fits}")


@dataclass
class Case:
    system: str
    threads: int
    batch: int
    step_ms: list[float] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.batch / (statistics.median(self.step_ms) * 1e-3)


# ---- llama.cpp ------------------------------------------------------------------------------

def _permute_for_gguf(w: np.ndarray, heads: int) -> np.ndarray:
    """q/k rows from Hugging Face's rotate-half order to GGUF llama's interleaved pairs, as
    llama.cpp's convert_hf_to_gguf.py permutes them."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_gguf(model: Any, path: Path, fmt: str) -> None:
    """``model``'s weights as a llama-architecture GGUF in ``fmt`` ("F16" or "BF16"), with a
    placeholder vocabulary (token ids are fed directly)."""
    import gguf
    import torch

    c = model.config
    head_dim = head_dim_of(c)
    kind = gguf.GGMLQuantizationType[fmt]

    def narrow(t: torch.Tensor) -> np.ndarray:
        t = t.detach()
        if fmt == "BF16":
            return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        return t.to(torch.float16).numpy()

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if fmt == "BF16"
                    else gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>".encode() for i in range(c.vocab_size)])
    w.add_token_scores([0.0] * c.vocab_size)
    w.add_token_types([gguf.TokenType.NORMAL] * c.vocab_size)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    sd = model.state_dict()

    def tensor(name: str, t: torch.Tensor, norm: bool = False, heads: int = 0) -> None:
        if norm:
            w.add_tensor(name, t.detach().float().numpy())
            return
        data = narrow(t)
        if heads:
            data = _permute_for_gguf(data, heads)
        w.add_tensor(name, np.ascontiguousarray(data), raw_dtype=kind)

    tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"], norm=True)
        tensor(f"blk.{i}.attn_q.weight", sd[p + "self_attn.q_proj.weight"],
               heads=c.num_attention_heads)
        tensor(f"blk.{i}.attn_k.weight", sd[p + "self_attn.k_proj.weight"],
               heads=c.num_key_value_heads)
        tensor(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        tensor(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"], norm=True)
        tensor(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        tensor(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        tensor(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    tensor("output_norm.weight", sd["model.norm.weight"], norm=True)
    tensor("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# What the child of llama_cpp_runs does: load the file and evaluate a few tokens.
_LLAMA_CPP_TRIAL = """
import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=64, n_batch=64, n_threads=1, n_threads_batch=1,
            verbose=False)
llm.eval([1, 2, 3, 4])
"""
LLAMA_CPP_TRIAL_SECONDS = 300


def llama_cpp_runs(path: Path, progress: Any = print) -> bool:
    """Whether llama.cpp loads ``path`` and evaluates a few tokens, tried in a child
    process first. A llama-cpp-python build can die on the CPU it was built on (a native
    build whose AMX kernels the VM's kernel does not let run segfaults in its first
    ``eval``); such a build is reported and left out of the bench instead of taking the
    bench's process down with it."""
    try:
        proc = subprocess.run([sys.executable, "-c", _LLAMA_CPP_TRIAL, str(path)],
                              capture_output=True, text=True,
                              timeout=LLAMA_CPP_TRIAL_SECONDS)
    except subprocess.TimeoutExpired:
        progress(f"llama.cpp not timed: a trial run on {path.name} took over "
                 f"{LLAMA_CPP_TRIAL_SECONDS} s")
        return False
    if proc.returncode == 0:
        return True
    if proc.returncode < 0:
        try:
            how = f"was killed by {signal.Signals(-proc.returncode).name}"
        except ValueError:
            how = f"was killed by signal {-proc.returncode}"
    else:
        how = f"exited with status {proc.returncode}"
    last = (proc.stderr.strip().splitlines() or [""])[-1][:200]
    progress(f"llama.cpp not timed: llama-cpp-python {how} on {path.name} in a trial run "
             f"in a child process{f' ({last})' if last else ''}; rebuild it for this CPU "
             "(docs/decoder.md, 'llama.cpp for the comparison')")
    return False


class LlamaCppSession:
    """One llama.cpp context per thread count on a GGUF file (the weights are mapped once
    by the OS and shared)."""

    def __init__(self, path: Path, threads: int, n_ctx: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=64, n_threads=threads,
                         n_threads_batch=threads, logits_all=False, verbose=False)

    def last_logits(self) -> np.ndarray:
        """The logits of the last token evaluated (a view of llama.cpp's buffer): without
        ``logits_all``, llama-cpp-python 0.3 no longer copies them into ``scores``."""
        llm = self.llm
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))

    def decode(self, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
        llm = self.llm
        llm.reset()
        llm.eval(prompt)
        token = int(np.argmax(self.last_logits()))
        tokens, times = [token], []
        for _ in range(steps):
            t0 = time.perf_counter()
            llm.eval([token])
            token = int(np.argmax(self.last_logits()))
            times.append((time.perf_counter() - t0) * 1e3)
            tokens.append(token)
        return tokens, times


# ---- PyTorch / narrowmm ---------------------------------------------------------------------

def torch_decode(model: Any, prompts: list[list[int]], steps: int,
                 before_step: Any = None) -> tuple[list[list[int]], list[float]]:
    """Prefill the left-padded prompts, then ``steps`` greedy steps, each timed
    (``before_step()`` runs before each, untimed)."""
    import torch
    import transformers

    from ..torch.invariance import left_padded

    ids, mask, positions = left_padded(prompts)
    cache = transformers.DynamicCache(config=model.config)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                    use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        tokens, times = [token], []
        position = positions[:, -1:]
        for _ in range(steps):
            if before_step is not None:
                before_step()
            t0 = time.perf_counter()
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            position = position + 1
            out = model(input_ids=token, attention_mask=mask, position_ids=position,
                        cache=cache, use_cache=True)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            times.append((time.perf_counter() - t0) * 1e3)
            tokens.append(token)
    return torch.cat(tokens, dim=1).tolist(), times


def decoder_decode(decoder: Any, prompts: list[list[int]], steps: int,
                   before_step: Any = None, spent: list[dict[str, float]] | None = None
                   ) -> tuple[list[list[int]], list[float]]:
    """:func:`torch_decode` through a :class:`narrowmm.torch.Decoder`: the same prefill
    (untimed) and greedy steps, each timed with its argmax; ``spent`` gets each step's
    seconds per part, measured inside the C call."""
    import torch

    from ..torch.invariance import left_padded

    ids, mask, positions = left_padded(prompts)
    start = (mask == 0).sum(dim=1).numpy()
    decoder.reset(len(prompts), ids.shape[1] + steps + 1)
    buffer = np.empty((len(prompts), decoder.vocab_size), np.float32)
    logits = decoder.step(ids.numpy(), positions.numpy(), start, out=buffer)
    token = logits.numpy().argmax(-1)[:, None]
    tokens, times = [token], []
    position = positions[:, -1:].numpy().copy()
    for _ in range(steps):
        if before_step is not None:
            before_step()
        parts: dict[str, float] | None = {} if spent is not None else None
        t0 = time.perf_counter()
        position += 1
        logits = decoder.step(token, position, start, out=buffer, spent=parts)
        token = logits.numpy().argmax(-1)[:, None]
        times.append((time.perf_counter() - t0) * 1e3)
        tokens.append(token)
        if spent is not None:
            spent.append(parts)
    return torch.from_numpy(np.concatenate(tokens, axis=1)).tolist(), times


def decode(system: Any, prompts: list[list[int]], steps: int
           ) -> tuple[list[list[int]], list[float]]:
    """Greedy decode on a ``transformers`` model or a Decoder."""
    from ..torch import Decoder

    if isinstance(system, Decoder):
        return decoder_decode(system, prompts, steps)
    return torch_decode(system, prompts, steps)


def profile_decoder(decoder: Any, prompts: list[list[int]], steps: int) -> dict[str, float]:
    """Median ms per decode step in each part of a Decoder's step (measured in C), the time
    outside the C call ("Python"), and the total."""
    spent: list[dict[str, float]] = []
    _, times = decoder_decode(decoder, prompts, steps, spent=spent)
    per_step = [{**{k: v * 1e3 for k, v in parts.items()}, "total": t}
                for parts, t in zip(spent, times, strict=True)]
    for row in per_step:
        row["Python"] = row["total"] - sum(v for k, v in row.items() if k != "total")
    keys = sorted({k for s in per_step for k in s})
    return {k: statistics.median(s.get(k, 0.0) for s in per_step) for k in keys}


def run_rounds(cases: list[Case], rounds: int, prompts: list[list[int]], steps: int,
               systems: dict[str, Any], llama_cpp: dict[tuple[str, int], LlamaCppSession],
               progress: Any) -> None:
    """Every case once a round, the order rotating from round to round so that all systems
    see the same stretch of a drifting machine; llama.cpp cases (``llama_cpp[(system,
    threads)]``) decode the first prompt, the others ``case.batch`` prompts."""
    for r in range(rounds):
        for j in range(len(cases)):
            case = cases[(r + j) % len(cases)]
            if (case.system, case.threads) in llama_cpp:
                tokens, times = llama_cpp[(case.system, case.threads)].decode(prompts[0],
                                                                               steps)
                tokens = [tokens]
            else:
                set_threads(case.system, case.threads)
                tokens, times = decode(systems[case.system], prompts[:case.batch], steps)
            time.sleep(0.05)  # let PyTorch's OpenMP workers stop spinning
            case.step_ms += times
            case.tokens = tokens
        progress(f"round {r + 1}/{rounds}: " + ", ".join(
            f"{c.system} t{c.threads} b{c.batch} {c.tokens_per_s:.1f}" for c in cases))


def build_torch_systems(base: Any) -> dict[str, Any]:
    import torch

    import narrowmm.torch as nmt

    systems = {"torch f32": copy.deepcopy(base).to(torch.float32), "torch bf16": base}
    # bf16 weights, float32 activations (as llama.cpp computes): .float() after convert
    # widens the embedding and norm weights exactly and leaves narrowmm's weights as they are
    systems["narrowmm linear"] = nmt.convert(copy.deepcopy(base), "bf16", threads=False).float()
    systems["narrowmm invariant"] = nmt.convert(copy.deepcopy(base), "bf16",
                                                batch_invariant=True, threads=False).float()
    systems["narrowmm decoder"] = nmt.Decoder(systems["narrowmm invariant"])
    gc.collect()
    return systems


def set_threads(system: str, threads: int) -> None:
    import torch

    import narrowmm.torch as nmt

    if system.startswith("torch"):
        torch.set_num_threads(threads)
    elif system.startswith("narrowmm"):
        nmt.set_num_threads(threads)


# ---- where a token's time goes --------------------------------------------------------------

def profile_step(model: Any, prompts: list[list[int]], steps: int) -> dict[str, float]:
    """Median ms per decode step spent in each part of a narrowmm model: the linear layers,
    attention (its function only), norms, SiLU, the rotary lookup, and the rest (embedding,
    residual adds, cache, argmax, transformers' and Python's own work)."""

    import narrowmm.torch as nmt

    from ..torch import _invariant as ti

    steps_spent: list[dict[str, float]] = [defaultdict(float)]  # [0]: the prefill
    kinds = {nmt.Linear: "linear layers", ti.RMSNorm: "RMS norms", ti.SiLU: "SiLU",
             ti.RotaryTable: "rotary table"}
    handles = []
    for module in model.modules():
        kind = kinds.get(type(module))
        if kind is None and type(module).__name__.endswith("RMSNorm"):
            kind = "RMS norms"
        if kind is None:
            continue

        def pre(mod, args, kind=kind):
            mod._nm_t0 = time.perf_counter()

        def post(mod, args, out, kind=kind):
            steps_spent[-1][kind] += time.perf_counter() - mod._nm_t0

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    from transformers import AttentionInterface

    name = model.config._attn_implementation
    original = AttentionInterface._global_mapping.get(name)
    if original is None:
        import transformers.integrations.sdpa_attention as sdpa

        original = sdpa.sdpa_attention_forward

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            steps_spent[-1]["attention"] += time.perf_counter() - t0

    AttentionInterface._global_mapping[name] = timed
    try:  # one prefill, then `steps` decode steps, each with its own tally
        _, times = torch_decode(model, prompts, steps,
                                before_step=lambda: steps_spent.append(defaultdict(float)))
    finally:
        AttentionInterface._global_mapping[name] = original
        for h in handles:
            h.remove()
    per_step = [{**{k: v * 1e3 for k, v in spent.items()}, "total": t}
                for spent, t in zip(steps_spent[1:], times, strict=True)]
    keys = sorted({k for s in per_step for k in s})
    return {k: statistics.median(s.get(k, 0.0) for s in per_step) for k in keys}


# ---- the run --------------------------------------------------------------------------------

# Peak resident bytes of a run per model parameter: seven copies of the weights in one
# process (PyTorch float32 and bfloat16, two narrowmm conversions, two GGUF files written
# and mapped by llama.cpp, the writer's buffers). Measured: 20.5 GB for the 1.10 billion
# parameters of the 1B shapes (/usr/bin/time -v, docs/results/bench-llama-1b-decoder-*).
PEAK_BYTES_PER_PARAMETER = 19


def check_memory(parameters: int, available: int, context: int | None = None,
                 context_need: int = 0) -> None:
    """Refuse a run that would not fit in ``available`` bytes, before building anything
    (``context_need``: what ``--context`` adds, :func:`context_bytes`)."""
    need = PEAK_BYTES_PER_PARAMETER * parameters + context_need
    if need > available:
        with_context = f" with --context {context}" if context is not None else ""
        fewer = " or a smaller --context or --batch" if context is not None else ""
        raise SystemExit(f"narrowmm bench --model llama: this model ({parameters / 1e9:.2f} "
                         f"billion parameters){with_context} needs about "
                         f"{need / 2**30:.1f} GiB, and {available / 2**30:.1f} GiB are "
                         f"available: use --size small{fewer}, or a machine with more memory")


def head_dim_of(config: Any) -> int:
    """A Llama config's head size: its ``head_dim``, else hidden size / heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def parameter_count(config: Any) -> int:
    """A Llama config's parameters, counted from its shapes."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    d = head_dim_of(config)
    attn = h * d * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    per_layer = attn + 3 * h * inter + 2 * h
    embeddings = config.vocab_size * h * (1 if config.tie_word_embeddings else 2)
    return layers * per_layer + embeddings + h


def run(size: str, threads: list[int], batches: list[int], rounds: int, steps: int,
        progress: Any = print, context: int | None = None
        ) -> tuple[list[Case], dict[str, Any]]:
    import torch

    from ..torch import invariance as inv
    from .machine import mem_available

    config = inv.llama_config(size)
    lengths = prompt_lengths(context)
    if context is not None:
        check_context("llama", context, steps, config.max_position_embeddings)
    check_memory(parameter_count(config), mem_available(), context, context_bytes(
        config.num_hidden_layers, config.num_key_value_heads, head_dim_of(config),
        config.num_attention_heads, config.vocab_size, max(batches), max(lengths) + steps + 8,
        2 * len(threads)) if context is not None else 0)  # F16 and BF16 files
    # batch 1 decodes the first prompt; batch 8 all of them, left-padded
    prompts = inv.fixed_prompts(config.vocab_size, lengths=lengths)
    progress(f"building the {size} model (random bf16 weights)...")
    base = inv.random_llama(config, torch.bfloat16)
    params = sum(p.numel() for p in base.parameters())
    info = {"size": size, "parameters": params, "config": config.to_dict(),
            "prompt_lengths": lengths}
    systems: dict[str, Any] = {}
    tmp = tempfile.TemporaryDirectory(prefix="narrowmm-bench-llama-")
    try:
        import gguf  # noqa: F401
        import llama_cpp  # noqa: F401
        have_llama_cpp = True
    except ImportError as exc:
        progress(f"llama.cpp not timed ({exc}): pip install llama-cpp-python gguf")
        have_llama_cpp = False
    llama_cpp_sessions: dict[tuple[str, int], LlamaCppSession] = {}
    if have_llama_cpp:
        for fmt in ("F16", "BF16"):
            path = Path(tmp.name) / f"model-{fmt.lower()}.gguf"
            progress(f"writing {path.name}...")
            write_gguf(base, path, fmt)
            if not llama_cpp_runs(path, progress):
                continue
            for t in threads:
                llama_cpp_sessions[(f"llama.cpp {fmt}", t)] = LlamaCppSession(
                    path, t, n_ctx=max(lengths) + steps + 8)
    progress("converting...")
    systems.update(build_torch_systems(base))
    names = sorted({s for s, _ in llama_cpp_sessions}) + list(systems)
    cases = [Case(name, t, b) for b in batches for t in threads for name in names
             if not (name.startswith("llama.cpp") and b != 1)]
    run_rounds(cases, rounds, prompts, steps, systems, llama_cpp_sessions, progress)
    info["profile"] = {}
    for name in ("narrowmm decoder", "narrowmm invariant", "narrowmm linear"):
        for t in threads:
            for b in batches:
                set_threads(name, t)
                profile = profile_decoder if name == "narrowmm decoder" else profile_step
                info["profile"][(name, t, b)] = profile(systems[name], prompts[:b], steps)
    tmp.cleanup()
    return cases, info


def prompts_said(lengths: tuple[int, ...], batches: list[int]) -> str:
    """The report's words for the prompts the decode steps follow."""
    said = f"after a prompt of {lengths[0]} tokens"
    if max(batches) > 1:
        batch = lengths[:max(batches)]
        said += f" (batch {max(batches)}: {min(batch)} to {max(batch)}, left-padded)"
    return said


def format_report(cases: list[Case], info: dict[str, Any]) -> str:
    lines = []
    threads = sorted({c.threads for c in cases})
    batches = sorted({c.batch for c in cases})
    names = list(dict.fromkeys(c.system for c in cases))
    by = {(c.system, c.threads, c.batch): c for c in cases}
    head = f"{'system':<22}" + "".join(f"{f'b{b} t{t}':>10}" for b in batches for t in threads)
    lines += ["greedy decode, tokens/s (batch / median step)", head, "-" * len(head)]
    for name in names:
        row = f"{name:<22}"
        for b in batches:
            for t in threads:
                c = by.get((name, t, b))
                row += f"{c.tokens_per_s:>10.2f}" if c else f"{'-':>10}"
        lines.append(row)
    lines.append("")
    for t in threads:
        lines += summary_lines(by, names, t, max(batches))
    lines += ["", "where a decode step's time goes (median ms per step)"]
    for (name, t, b), parts in info.get("profile", {}).items():
        total = parts.get("total", 0.0)
        known = sum(v for k, v in parts.items() if k != "total")
        shown = ", ".join(f"{k} {v:.2f}" for k, v in sorted(parts.items()) if k != "total")
        lines.append(f"  {name} t{t} b{b}: total {total:.2f} = {shown}, "
                     f"rest {total - known:.2f}")
    return "\n".join(lines)


def summary_lines(by: dict[tuple[str, int, int], Case], names: list[str], t: int,
                  top_batch: int) -> list[str]:
    """The ratios a reader looks for at ``t`` threads: each narrowmm system against the
    fastest llama.cpp system and against the others, and batch ``top_batch`` against 1."""
    lines = []
    dec = by.get(("narrowmm decoder", t, 1))
    inv = by.get(("narrowmm invariant", t, 1))
    lin = by.get(("narrowmm linear", t, 1))
    cpp = [by[(n, t, 1)] for n in names if n.startswith("llama.cpp") and (n, t, 1) in by]
    best = max(cpp, key=lambda c: c.tokens_per_s) if cpp else None
    for case in (dec, inv):
        if case and best:
            lines.append(f"threads {t}: {case.system} / best llama.cpp ({best.system}) = "
                         f"{case.tokens_per_s / best.tokens_per_s:.2f}x")
    for suffix in ("", " bf16"):  # each decoder against its own model through transformers
        d, i = by.get((f"narrowmm decoder{suffix}", t, 1)), by.get((f"narrowmm invariant"
                                                                     f"{suffix}", t, 1))
        if d and i:
            lines.append(f"threads {t}: {d.system} / {i.system} (the same bits) = "
                         f"{d.tokens_per_s / i.tokens_per_s:.2f}x")
    if inv and lin:
        lines.append(f"threads {t}: invariant costs "
                     f"{(1 - inv.tokens_per_s / lin.tokens_per_s) * 100:+.1f} % against "
                     f"linear-only (batch 1)")
    for case in (dec, inv):
        top = by.get((case.system, t, top_batch)) if case else None
        if case and top and top_batch > 1:
            lines.append(f"threads {t}: {case.system} batch {top_batch} / batch 1 = "
                         f"{top.tokens_per_s / case.tokens_per_s:.2f}x tokens/s")
    return lines


def main(args: Any) -> int:
    size = getattr(args, "size", None) or "1b"
    threads = args.threads or [1, 2]
    batches = args.batch or [1, 8]
    rounds, steps = (1, 4) if args.quick else (3, 16)
    print(run_line(threads, DECODE_PEERS))
    t0 = time.perf_counter()
    cases, info = run(size, threads, batches, rounds, steps, context=args.context)
    print()
    print(f"Llama-architecture model, {size} shapes ({info['parameters'] / 1e9:.2f} billion "
          f"parameters, random bf16 weights), {steps} decode steps x {rounds} rounds, "
          f"{prompts_said(info['prompt_lengths'], batches)}")
    print(format_report(cases, info))
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0
