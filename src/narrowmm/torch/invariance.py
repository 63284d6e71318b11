"""``narrowmm.torch.invariance``: the batch-invariance proof as a public harness, shared by
``examples/batch_invariance.py``, ``narrowmm bench --model llama`` and the tests: a
Llama-architecture ``transformers`` model (or a Qwen2 / Qwen3 one) with random weights, a fixed set
of prompts, and the logits of each prompt under every condition (batch composition,
threads, prefill or decode), compared bit for bit.

Imports torch and transformers; not imported by ``narrowmm`` or ``narrowmm.torch``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import transformers

from .. import _threads

__all__ = ["PROMPT_LENGTHS", "SIZES", "Conditions", "batch_conditions", "compositions",
           "decode_logits", "digest", "fixed_prompts", "greedy", "left_padded", "llama_config",
           "prompt_logits", "qwen2_config", "qwen3_config", "random_llama", "random_qwen",
           "set_threads"]

# Prompt lengths: different, so that a batch pads every prompt but the longest.
PROMPT_LENGTHS = (3, 7, 12, 20, 5, 31, 9, 16)

SIZES = {
    # a few layers, hidden 256: the CI test
    "small": dict(vocab_size=1000, hidden_size=256, intermediate_size=704,
                  num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4),
    # Llama-3.2-1B's shapes with a 32,000-entry vocabulary (1.1 billion parameters)
    "1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192,
               num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
               head_dim=64, rope_theta=500000.0),
}


def llama_config(size: str = "small") -> transformers.LlamaConfig:
    """The config of a named size (:data:`SIZES`), with sdpa attention (transformers'
    default on the CPU) and untied embeddings."""
    return transformers.LlamaConfig(max_position_embeddings=2048, rms_norm_eps=1e-5,
                                    tie_word_embeddings=False, attn_implementation="sdpa",
                                    **SIZES[size])


def random_llama(config: transformers.LlamaConfig, dtype: torch.dtype,
                 seed: int = 0) -> transformers.LlamaForCausalLM:
    """A model of ``config`` with random weights drawn in float32 from ``seed``, then cast:
    the same seed gives the same weights in every dtype (as rounded)."""
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config).to(dtype).eval()


def qwen2_config(size: str = "small") -> transformers.Qwen2Config:
    """A Qwen2 config of a named size (:data:`SIZES`): Llama's layers with biases on the
    query, key and value projections, full attention in every layer, sdpa, untied
    embeddings."""
    return transformers.Qwen2Config(max_position_embeddings=2048, rms_norm_eps=1e-6,
                                    tie_word_embeddings=False, attn_implementation="sdpa",
                                    **SIZES[size])


def qwen3_config(size: str = "small") -> transformers.Qwen3Config:
    """A Qwen3 config of a named size (:data:`SIZES`): Llama's layers with RMS norms on
    each head's query and key, no biases, heads of 64 (as in Qwen3's models, the heads
    together are wider than the hidden size at the small size), full attention in every
    layer, sdpa, untied embeddings."""
    return transformers.Qwen3Config(max_position_embeddings=2048, rms_norm_eps=1e-6,
                                    tie_word_embeddings=False, attn_implementation="sdpa",
                                    **{**SIZES[size], "head_dim": 64})


def random_qwen(config: transformers.Qwen2Config | transformers.Qwen3Config,
                dtype: torch.dtype, seed: int = 0) -> transformers.PreTrainedModel:
    """A Qwen2 or Qwen3 model of ``config`` drawn as :func:`random_llama` draws a Llama,
    then what ``transformers`` starts at a constant drawn too, so that it is tested: Qwen2's
    q / k / v biases from N(0, 0.5^2), Qwen3's query and key norm weights from
    N(1, 0.2^2)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                if proj.bias is not None:
                    proj.bias.normal_(0.0, 0.5)
            for head_norm in (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)):
                if head_norm is not None:
                    head_norm.weight.normal_(1.0, 0.2)
    return model.to(dtype).eval()


def fixed_prompts(vocab_size: int, lengths: Sequence[int] = PROMPT_LENGTHS,
                  seed: int = 1) -> list[list[int]]:
    """Prompts of token ids in [2, vocab), each starting with token 1 (0 is the padding)."""
    rng = np.random.default_rng(seed)
    return [[1, *rng.integers(2, vocab_size, n - 1).tolist()] for n in lengths]


def left_padded(prompts: Sequence[Sequence[int]]
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids) with left padding, as ``generate()`` pads
    and numbers positions (each prompt's first real token is position 0)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    return ids, mask, positions


def prompt_logits(model: torch.nn.Module, batch: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """One forward pass over a left-padded batch: each prompt's logits at its own positions
    (len(prompt) x vocab)."""
    ids, mask, positions = left_padded(batch)
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    width = ids.shape[1]
    return [logits[i, width - len(p):].clone() for i, p in enumerate(batch)]


def decode_logits(model: torch.nn.Module, prompt: Sequence[int]) -> torch.Tensor:
    """The prompt's logits computed one token at a time with the KV cache (the decode path):
    position t's logits come from a pass over token t alone, reading the cache of 0..t-1."""
    cache = transformers.DynamicCache(config=model.config)
    rows = []
    with torch.inference_mode():
        for t, token in enumerate(prompt):
            out = model(input_ids=torch.tensor([[token]]),
                        attention_mask=torch.ones(1, t + 1, dtype=torch.long),
                        position_ids=torch.tensor([[t]]), cache=cache, use_cache=True)
            rows.append(out.logits[0, -1].clone())
    return torch.stack(rows)


def greedy(model: torch.nn.Module, batch: Sequence[Sequence[int]],
           new_tokens: int) -> list[list[int]]:
    """Greedy ``generate()`` over a left-padded batch: each prompt's new tokens."""
    ids, mask, _ = left_padded(batch)
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=0)
    return [row[ids.shape[1]:].tolist() for row in out]


def digest(t: torch.Tensor) -> str:
    """A hash of a tensor's bits (any float dtype)."""
    t = t.detach().contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


def set_threads(n: int) -> None:
    """narrowmm's and PyTorch's thread counts both to ``n``."""
    _threads.set_num_threads(n)
    torch.set_num_threads(n)


def compositions(count: int) -> dict[str, Callable[[int], list[int]]]:
    """For ``count`` prompts (8 in the proof), the batch prompt i runs in: alone, with
    its half of the prompts (a batch of 4), with all of them (a batch of 8)."""
    half = max(1, count // 2)
    return {
        "alone": lambda i: [i],
        f"batch of {half}": lambda i: list(range(i // half * half,
                                                 min(count, i // half * half + half))),
        f"batch of {count}": lambda i: list(range(count)),
    }


@dataclass
class Conditions:
    """Digest of each prompt's logits under each named condition."""

    prompts: list[list[int]]
    digests: dict[str, list[str]] = field(default_factory=dict)

    def add(self, name: str, logits: Sequence[torch.Tensor]) -> None:
        self.digests[name] = [digest(x) for x in logits]

    def distinct(self) -> list[int]:
        """For each prompt, how many different logit tensors the conditions gave."""
        return [len({d[i] for d in self.digests.values()}) for i in range(len(self.prompts))]

    def differing_prompts(self) -> int:
        return sum(n > 1 for n in self.distinct())



def batch_conditions(model: torch.nn.Module, prompts: list[list[int]],
                     threads: Sequence[int] = (1, 2, 3)) -> Conditions:
    """Every prompt's logits alone, in a batch of 4 and in the batch of 8, at each thread
    count: ``len(threads) * 3`` conditions."""
    result = Conditions(prompts)
    before = _threads.get_num_threads(), torch.get_num_threads()
    try:
        for n in threads:
            set_threads(n)
            for name, members in compositions(len(prompts)).items():
                logits: list[torch.Tensor | None] = [None] * len(prompts)
                for i in range(len(prompts)):
                    if logits[i] is None:  # run i's batch once, for all its members
                        group = members(i)
                        for j, x in zip(group, prompt_logits(model, [prompts[j] for j in group]),
                                        strict=True):
                            logits[j] = x
                result.add(f"{name}, {n} thread{'s' if n > 1 else ''}", logits)
    finally:
        _threads.set_num_threads(before[0])
        torch.set_num_threads(before[1])
    return result
