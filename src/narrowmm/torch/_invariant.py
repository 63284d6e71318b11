"""Batch invariance for whole ``transformers`` models (``narrowmm.torch``).

narrowmm's linear layers already give a row the same bits whatever else is in the batch.
This module replaces the other ops of a model that can change a row's bits with the batch,
the padding, the thread count or the ISA row (found by experiment; docs/invariance.md):

- attention (``AttentionInterface`` entry ``"narrowmm"``): PyTorch's sdpa and eager matmuls
  block by the batch's shape; narrowmm's fixed chains skip hidden keys entirely;
- RMSNorm: the reduction over the hidden size in a fixed order (C, ``narrowmm.ops``);
- SiLU: PyTorch computes it with a vector exp and a scalar tail, and which elements fall in
  the tail depends on the tensor's size and the thread count (3 threads gave other bits
  than 1 on a (29, 5632) input here);
- the rotary embedding's cos / sin: computed once per block of 256 positions in a fixed
  shape on one thread, then looked up, so a position's value never depends on the call.

What stays PyTorch's: embedding lookups, residual adds and the other elementwise products,
each a single correctly rounded operation per element, the same on every path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from .. import ops
from ..providers.native import checked_core

ATTENTION_NAME = "narrowmm"
_ROTARY_BLOCK = 256
# Architectures whose every op is covered here, each tested: llama; qwen2 (Llama's layers
# with biases on q, k and v); qwen3 (RMS norms on each head's query and key, before the
# rotation). Sliding-window layers are refused.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
_NORM_CLASSES = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm")
_ROTARY_CLASSES = ("LlamaRotaryEmbedding", "Qwen2RotaryEmbedding", "Qwen3RotaryEmbedding")
_ROPE_TYPES = ("default", "linear", "llama3")


def _allowed_from_mask(mask: torch.Tensor | None, module: torch.nn.Module, batch: int,
                       lq: int, lk: int) -> np.ndarray | None:
    """The bool (batch, 1 or heads, lq, lk) visibility the C op reads."""
    if mask is None:
        if not getattr(module, "is_causal", False) or lq == 1:
            return None
        # causal, aligned at the end: query i sits at key position lk - lq + i
        i = np.arange(lq)[:, None] + (lk - lq)
        return np.ascontiguousarray(
            np.broadcast_to(np.arange(lk)[None, :] <= i, (batch, 1, lq, lk)))
    if mask.dim() != 4:
        raise ValueError(f"narrowmm attention takes a 4-D mask, got shape {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        allowed = mask
    else:  # an additive mask: 0 where visible, the dtype's minimum (or -inf) where hidden
        hidden = mask <= torch.finfo(mask.dtype).min / 2
        if not bool(torch.all(hidden | (mask == 0))):
            raise ValueError("narrowmm attention supports visibility masks only (an additive "
                             "mask must hold 0 or the dtype's minimum), not score biases")
        allowed = ~hidden
    if allowed.shape[0] not in (1, batch) or allowed.shape[2] not in (1, lq) \
            or allowed.shape[3] != lk:
        raise ValueError(f"the attention mask has shape {tuple(mask.shape)}; queries and "
                         f"keys are ({batch}, {lq}) and {lk}")
    return np.ascontiguousarray(allowed.expand(batch, allowed.shape[1], lq, lk).numpy())


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      scaling: float | None = None, dropout: float = 0.0,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """The ``transformers`` attention function ``"narrowmm"``: query ``(batch, heads, lq,
    d)``, key and value ``(batch, kv_heads, lk, d)``; returns ``(batch, lq, heads, d)`` in
    the query's dtype. Computed in float32 by :func:`narrowmm.ops.attention`."""
    if dropout:
        raise ValueError("narrowmm attention is inference-only: dropout must be 0")
    for name in ("sliding_window", "softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"narrowmm attention does not support {name}")
    batch, _, lq, d = query.shape
    lk = key.shape[2]
    scale = d ** -0.5 if scaling is None else scaling
    allowed = _allowed_from_mask(attention_mask, module, batch, lq, lk)
    q = query.detach().float().contiguous().numpy()
    k = key.detach().float().contiguous().numpy()
    v = value.detach().float().contiguous().numpy()
    out = ops.attention(q, k, v, allowed, scale=scale)
    y = torch.from_numpy(out)
    return (y if query.dtype == torch.float32 else y.to(query.dtype)), None


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def mask(*args, **kwargs):
        # a bool mask always: never None for "plainly causal", never a float bias
        kwargs["allow_is_causal_skip"] = False
        kwargs["allow_is_bidirectional_skip"] = False
        kwargs.pop("dtype", None)
        return sdpa_mask(*args, **kwargs)

    AttentionInterface.register(ATTENTION_NAME, attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, mask)


class RMSNorm(torch.nn.Module):
    """``weight * (x / sqrt(mean(x**2) + eps))`` as Llama's RMSNorm rounds it (float32
    normalisation, rounded to the input's dtype, then times the weight), with the reduction
    in narrowmm's fixed order (:func:`narrowmm.ops.rms_norm`)."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight.detach(), requires_grad=False)
        self.eps = float(eps)

    @classmethod
    def from_module(cls, module: torch.nn.Module) -> RMSNorm:
        eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
        if eps is None:
            raise TypeError(f"{type(module).__name__} has no eps")
        return cls(module.weight, eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.detach().float().contiguous()
        y = torch.from_numpy(ops.rms_norm(x32.numpy(), self.eps))
        return self.weight * y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"


class SiLU(torch.nn.Module):
    """SiLU with narrowmm's exp (:func:`narrowmm.ops.silu`), computed in float32 and rounded
    to the input's dtype as PyTorch rounds its own."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.detach().float().contiguous()
        y = torch.from_numpy(ops.silu(x32.numpy()))
        return y if x.dtype == torch.float32 else y.to(x.dtype)


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class RotaryTable(torch.nn.Module):
    """The rotary embedding's (cos, sin) looked up in a table built by the model's own
    rotary module, one block of 256 positions at a time, each block in the same shape on
    one thread: a position's value is computed once and never depends on the call."""

    def __init__(self, rotary: torch.nn.Module) -> None:
        super().__init__()
        self.rotary = rotary
        self._cos = torch.empty(0)
        self._sin = torch.empty(0)

    def _extend(self, positions: int) -> None:
        have = self._cos.shape[0]
        blocks_cos, blocks_sin = [self._cos], [self._sin]
        with _torch_threads(1), torch.inference_mode():
            for start in range(have, positions, _ROTARY_BLOCK):
                ids = torch.arange(start, start + _ROTARY_BLOCK)[None]
                cos, sin = self.rotary(torch.empty(0, dtype=torch.float32), ids)
                blocks_cos.append(cos[0].float())
                blocks_sin.append(sin[0].float())
        self._cos = torch.cat(blocks_cos)
        self._sin = torch.cat(blocks_sin)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if position_ids.numel() and int(position_ids.min()) < 0:
            raise ValueError("position ids must be >= 0")
        top = int(position_ids.max()) + 1 if position_ids.numel() else 0
        if top > self._cos.shape[0]:
            self._extend(top)
        cos, sin = self._cos[position_ids], self._sin[position_ids]
        return cos.to(x.dtype), sin.to(x.dtype)


def check_supported(model: torch.nn.Module, *, linears_pending: bool = False) -> None:
    """Raise ``NotImplementedError`` naming everything in ``model`` that
    :func:`make_batch_invariant` cannot cover (``linears_pending``: its ``nn.Linear`` layers
    are about to be converted, as :func:`narrowmm.torch.convert` does first)."""
    problems = _unsupported(model, linears_pending)
    if problems:
        raise NotImplementedError("batch_invariant=True cannot cover this model: "
                                  + "; ".join(problems))


def _unsupported(model: torch.nn.Module, linears_pending: bool) -> list[str]:
    """What in ``model`` this module cannot make invariant, as readable reasons."""

    problems = []
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        problems.append(f"model type {model_type!r} (supported: "
                        f"{', '.join(SUPPORTED_MODEL_TYPES)})")
    if config is not None and getattr(config, "hidden_act", "silu") != "silu":
        problems.append(f"activation {config.hidden_act!r} (supported: 'silu')")
    sliding = [i for i, kind in enumerate(getattr(config, "layer_types", None) or ())
               if kind != "full_attention"]
    if sliding:
        problems.append(f"layers {sliding[:5]}{' ...' if len(sliding) > 5 else ''} of type "
                        f"{config.layer_types[sliding[0]]!r} (supported: 'full_attention')")
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and not linears_pending:
            problems.append(f"{name}: a torch.nn.Linear not converted (leave it out of skip)")
        if type(m).__name__ in _ROTARY_CLASSES and \
                getattr(m, "rope_type", "default") not in _ROPE_TYPES:
            problems.append(f"{name}: rope type {m.rope_type!r} (supported: "
                            f"{', '.join(_ROPE_TYPES)})")
    return problems


def make_batch_invariant(model: torch.nn.Module) -> torch.nn.Module:
    """Make a converted ``transformers`` model batch-invariant, in place: see the module
    docstring for what is replaced. Raises ``NotImplementedError`` naming what it cannot
    cover, before changing anything."""
    checked_core()
    check_supported(model)
    _register_attention()
    model.set_attn_implementation(ATTENTION_NAME)
    swaps = []
    for name, m in model.named_modules():
        kind = type(m).__name__
        if kind in _NORM_CLASSES:
            swaps.append((name, RMSNorm.from_module(m)))
        elif kind in _ROTARY_CLASSES:
            swaps.append((name, RotaryTable(m)))
        elif name.endswith("act_fn") and isinstance(m, torch.nn.Module) and \
                kind in ("SiLU", "SiLUActivation"):
            swaps.append((name, SiLU()))
    for name, new in swaps:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, new)
    model._narrowmm_batch_invariant = True
    return model


def is_batch_invariant(model: torch.nn.Module) -> bool:
    """Whether :func:`make_batch_invariant` has run on ``model``."""
    return bool(getattr(model, "_narrowmm_batch_invariant", False))
