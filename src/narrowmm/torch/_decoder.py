"""A whole decode step of a batch-invariant Llama-family model (Llama, Qwen2, Qwen3) in one
C call (:class:`Decoder`), and a ``generate`` driving it.

The step (``csrc/model/llama.c``) runs every layer with the C core's own ops, the ones the
batch-invariant model (``convert(..., batch_invariant=True)`` or ``from_gguf(...,
batch_invariant=True)``) calls one by one from Python, in the same order: so its logits have
that model's bits, and what it saves is the Python and framework work between the ops.
docs/decoder.md says what it covers and what it measured.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..providers.native import checked_core
from ._embedding import Embedding
from ._invariant import SUPPORTED_MODEL_TYPES, RotaryTable, is_batch_invariant
from ._layer import Linear

__all__ = ["STEP_PARTS", "Decoder"]

# The parts of a step whose time Decoder.step(spent=...) adds up (model/llama.c's order)
STEP_PARTS = ("linear layers", "output layer", "attention", "RMS norms", "SiLU",
              "elementwise", "other")


def _linear_spec(layer: torch.nn.Module, name: str) -> tuple:
    """A narrowmm layer as the C plan takes it: (fmt, packed, k, n, bits, scales, block,
    finite, bias), over the layer's own buffers."""
    if not isinstance(layer, Linear):
        raise TypeError(f"{name} is a {type(layer).__name__}, not a narrowmm.torch.Linear: "
                        "convert the model first")
    w = layer.weights()
    n = layer.out_features
    bits = w.sliver_rows if w.packed else w.bits
    scales = w.kernel_scales()  # n columns, or whole slivers when packed
    grid, block, finite = scales if scales is not None else (None, 0, False)
    bias = layer._buffers["bias"]
    return (w.format.code, bool(w.packed), layer.in_features, n, bits, grid, block, finite,
            None if bias is None else bias.numpy())


def _float32_vector(t: torch.Tensor, name: str) -> np.ndarray:
    if t.dtype != torch.float32:
        raise TypeError(f"{name} is {t.dtype}; the decoder runs float32 models (call "
                        "model.float() after converting: narrowmm's weights keep their format)")
    return t.detach().contiguous().numpy()


class Decoder:
    """Runs a batch-invariant ``transformers`` Llama, Qwen2 or Qwen3 model a step per C call.

    ``Decoder(model)`` reads the model as it is now (its narrowmm layers' buffers, norms,
    embedding and rotary table; later changes to the model are not seen). The model must
    have been made batch-invariant (``narrowmm.torch.convert(model, fmt,
    batch_invariant=True)`` or ``from_gguf(path, batch_invariant=True)``) and be float32
    outside its narrowmm layers. Then for every prompt, alone or in any left-padded batch,
    the logits have the bits the model's own forward gives, on every thread count and ISA
    row.

    Use :meth:`generate` (greedy or sampled, like ``transformers``' ``generate``), or
    :meth:`reset` and :meth:`step` for a loop of your own. One decoder holds one KV cache:
    use it from one thread at a time.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self._core = checked_core()
        config = getattr(model, "config", None)
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise NotImplementedError(f"the decoder runs {', '.join(SUPPORTED_MODEL_TYPES)} "
                                      f"models, not {model_type!r}")
        if not is_batch_invariant(model):
            raise ValueError("the decoder computes the batch-invariant model's ops: convert "
                             "the model with batch_invariant=True (or from_gguf(path, "
                             "batch_invariant=True)) first")
        base = model.model
        rotary = base.rotary_emb
        if not isinstance(rotary, RotaryTable):
            raise TypeError(f"model.model.rotary_emb is a {type(rotary).__name__}, not the "
                            "batch-invariant rotary table")
        layers = list(base.layers)[:config.num_hidden_layers]
        attn0 = layers[0].self_attn if layers else None
        head_dim = int(getattr(attn0, "head_dim", 0) or config.hidden_size //
                       config.num_attention_heads)
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        head_norms = [(getattr(layer.self_attn, "q_norm", None),
                       getattr(layer.self_attn, "k_norm", None)) for layer in layers]
        eps = {float(m.eps) for layer, qk in zip(layers, head_norms, strict=True)
               for m in (layer.input_layernorm, layer.post_attention_layernorm, *qk)
               if m is not None}
        eps.add(float(base.norm.eps))
        if len(eps) != 1:
            raise ValueError(f"the model's norms use several epsilons {sorted(eps)}")
        scaling = {float(layer.self_attn.scaling) for layer in layers} or {head_dim ** -0.5}
        if len(scaling) != 1:
            raise ValueError(f"the model's attention layers scale by {sorted(scaling)}")
        specs = []
        for i, layer in enumerate(layers):
            a, m = layer.self_attn, layer.mlp
            p = f"model.layers.{i}."
            q_norm, k_norm = head_norms[i]
            if (q_norm is None) != (k_norm is None):
                raise ValueError(f"{p}self_attn has one of q_norm and k_norm, not both")
            qk = () if q_norm is None else (  # Qwen3's norms of each head's query and key
                _float32_vector(q_norm.weight, p + "self_attn.q_norm"),
                _float32_vector(k_norm.weight, p + "self_attn.k_norm"))
            specs.append((
                _float32_vector(layer.input_layernorm.weight, p + "input_layernorm"),
                _linear_spec(a.q_proj, p + "self_attn.q_proj"),
                _linear_spec(a.k_proj, p + "self_attn.k_proj"),
                _linear_spec(a.v_proj, p + "self_attn.v_proj"),
                _linear_spec(a.o_proj, p + "self_attn.o_proj"),
                _float32_vector(layer.post_attention_layernorm.weight,
                                p + "post_attention_layernorm"),
                _linear_spec(m.gate_proj, p + "mlp.gate_proj"),
                _linear_spec(m.up_proj, p + "mlp.up_proj"),
                _linear_spec(m.down_proj, p + "mlp.down_proj"), *qk))
        if isinstance(base.embed_tokens, Embedding):  # kept narrow: rows decoded in C
            tied = base.embed_tokens.tied
            if tied is not None and tied is not model.lm_head:
                raise ValueError("model.embed_tokens is tied to a layer other than the "
                                 "model's lm_head; the decoder reads a tied table from "
                                 "lm_head")
            embed = base.embed_tokens.spec()
            self.vocab_size = base.embed_tokens.num_embeddings
            self.hidden_size = base.embed_tokens.embedding_dim
        else:
            embed = _float32_vector(base.embed_tokens.weight, "model.embed_tokens")
            self.vocab_size, self.hidden_size = embed.shape
        shape = (len(layers), self.hidden_size, heads, kv_heads, head_dim,
                 config.intermediate_size, self.vocab_size, eps.pop(), scaling.pop())
        self._plan = self._core.llama_plan(
            shape, embed, _float32_vector(base.norm.weight, "model.norm"),
            _linear_spec(model.lm_head, "lm_head"), specs)
        self._rotary = rotary
        self._batch = 0
        self._capacity = 0
        self.config = config

    @property
    def length(self) -> int:
        """Positions in the cache (of every sequence) since the last :meth:`reset`."""
        return self._core.llama_length(self._plan)

    @property
    def capacity(self) -> int:
        """Positions the cache has room for since the last :meth:`reset` (0 before one)."""
        return self._capacity

    def reset(self, batch: int, capacity: int) -> None:
        """An empty cache for ``batch`` sequences of up to ``capacity`` positions each
        (prompt and new tokens; ``2 * layers * batch * kv_heads * capacity * head_dim``
        floats)."""
        batch, capacity = int(batch), int(capacity)
        if batch < 1 or capacity < 1:
            raise ValueError(f"batch and capacity must be at least 1, got {batch} and "
                             f"{capacity}")
        if self._rotary._cos.shape[0] < capacity:
            self._rotary._extend(capacity)
        cos = self._rotary._cos.contiguous().numpy()
        sin = self._rotary._sin.contiguous().numpy()
        self._core.llama_reset(self._plan, batch, capacity, cos, sin)
        self._batch, self._capacity = batch, capacity

    def step(self, tokens: Any, positions: Any, start: Any, *,
             out: np.ndarray | torch.Tensor | None = None,
             spent: dict[str, float] | None = None) -> torch.Tensor:
        """Run ``tokens`` ((batch, t) ids) at rotary ``positions`` ((batch, t)) through the
        model, appending them to the cache; token i of sequence b sees the cached slots from
        ``start[b]`` (its first real token; left padding lies before it) up to its own.
        Returns the float32 logits of each sequence's last token, ``(batch, vocab)``.

        ``out``: a C-contiguous float32 ``(batch, vocab)`` array or tensor to write the
        logits into (a step in a loop then touches no fresh memory); the result is a tensor
        over it. ``spent``: a dict to which the step adds its seconds per part
        (:data:`STEP_PARTS`), measured inside the C call."""
        if self._batch == 0:
            raise RuntimeError("reset(batch, capacity) the decoder before its first step")
        tok = np.ascontiguousarray(np.asarray(tokens), dtype=np.int64)
        pos = np.ascontiguousarray(np.asarray(positions), dtype=np.int64)
        st = np.ascontiguousarray(np.asarray(start), dtype=np.int64)
        if tok.ndim != 2 or tok.shape[0] != self._batch or pos.shape != tok.shape \
                or st.shape != (self._batch,):
            raise ValueError(f"tokens and positions must be (batch, t) = ({self._batch}, t) "
                             f"and start ({self._batch},); got {tok.shape}, {pos.shape}, "
                             f"{st.shape}")
        if out is None:
            logits = np.empty((self._batch, self.vocab_size), np.float32)
        else:
            logits = out.numpy() if isinstance(out, torch.Tensor) else out
            if not isinstance(logits, np.ndarray) or logits.dtype != np.float32 or \
                    logits.shape != (self._batch, self.vocab_size) or \
                    not logits.flags.c_contiguous or not logits.flags.writeable:
                raise ValueError(f"out must be a writable C-contiguous float32 array of shape "
                                 f"({self._batch}, {self.vocab_size})")
        if spent is None:
            self._core.llama_step(self._plan, tok.shape[1], tok, pos, st, logits)
        else:
            seconds = np.zeros(len(STEP_PARTS), np.float64)
            self._core.llama_step(self._plan, tok.shape[1], tok, pos, st, logits, seconds)
            for name, s in zip(STEP_PARTS, seconds.tolist(), strict=True):
                spent[name] = spent.get(name, 0.0) + s
        return torch.from_numpy(logits)

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 *, max_new_tokens: int = 20, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, eos_token_id: int | list[int] | None = None,
                 pad_token_id: int | None = None, generator: torch.Generator | None = None,
                 streamer: Any = None,
                 on_step: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """Continue each prompt by up to ``max_new_tokens`` tokens, as ``transformers``'
        ``generate`` does with the same options: greedy by default, or sampled
        (``do_sample``) after ``temperature``, ``top_k`` and ``top_p``, in that order.

        Args:
            input_ids: ``(batch, length)`` token ids, left-padded for a batch.
            attention_mask: ``(batch, length)``, 1 for a real token, 0 for padding, which
                must come first (left padding); None: every token is real.
            eos_token_id: a sequence that produces one of these ids stops; later columns
                of it hold ``pad_token_id`` (default: the first eos id).
            generator: the random source of sampling (``torch.Generator``).
            streamer: a ``transformers`` streamer (``put`` the prompt, then each new
                token column; ``end``).
            on_step: called with each step's ``(batch, vocab)`` logits (a buffer the next
                step overwrites: clone what you keep).

        Returns:
            ``(batch, length + new)`` int64: the prompts and what was generated; it ends
            early when every sequence has stopped.
        """
        ids = torch.as_tensor(input_ids)
        if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"input_ids must be a (batch, length) integer tensor, got "
                             f"{tuple(ids.shape)} {ids.dtype}")
        ids = ids.to(torch.int64)
        batch, length = ids.shape
        if length < 1 or batch < 1:
            raise ValueError("input_ids must hold at least one token per sequence")
        mask = (torch.ones_like(ids) if attention_mask is None
                else torch.as_tensor(attention_mask).to(torch.int64))
        if mask.shape != ids.shape:
            raise ValueError(f"attention_mask has shape {tuple(mask.shape)}, input_ids "
                             f"{tuple(ids.shape)}")
        start = (mask == 0).sum(dim=1)
        expected = (torch.arange(length)[None, :] >= start[:, None]).to(torch.int64)
        if not torch.equal(mask, expected) or bool((start == length).any()):
            raise ValueError("attention_mask must be left padding (0s, then 1s) with at "
                             "least one real token per sequence")
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        eos = ([] if eos_token_id is None else
               [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
        pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)
        if do_sample and temperature <= 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        self.reset(batch, length + max(max_new_tokens, 1))
        if streamer is not None:
            streamer.put(ids.cpu())
        out = [ids]
        done = torch.zeros(batch, dtype=torch.bool)
        buffer = np.empty((batch, self.vocab_size), np.float32)  # every step's logits
        start_np = start.numpy()
        logits = self.step(ids.numpy(), positions.numpy(), start_np, out=buffer)
        position = positions[:, -1:].numpy().copy()
        for _ in range(max_new_tokens):
            if on_step is not None:
                on_step(logits)
            token = self._choose(logits, do_sample, temperature, top_k, top_p, generator)
            token = torch.where(done, torch.full_like(token, pad), token)
            out.append(token[:, None])
            if streamer is not None:
                streamer.put(token.cpu())
            if eos:
                done |= torch.isin(token, torch.tensor(eos))
            if bool(done.all()) or len(out) - 1 == max_new_tokens:
                break
            position += 1
            logits = self.step(token[:, None].numpy(), position, start_np, out=buffer)
        if streamer is not None:
            streamer.end()
        return torch.cat(out, dim=1)

    @staticmethod
    def _choose(logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int | None,
                top_p: float | None, generator: torch.Generator | None) -> torch.Tensor:
        """The next token of each row: the argmax, or a sample as transformers' warpers
        shape the distribution (temperature, then top-k, then top-p)."""
        if not do_sample:  # NumPy's argmax: a tenth of PyTorch's time on one row here
            return torch.from_numpy(logits.numpy().argmax(axis=-1))
        scores = logits / temperature
        if top_k is not None and 0 < top_k < scores.shape[-1]:
            kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, -float("inf"))
        if top_p is not None and top_p < 1.0:
            ordered, index = torch.sort(scores, descending=False, dim=-1)
            cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
            drop = cumulative <= (1 - top_p)
            drop[:, -1] = False  # keep at least the most likely token
            scores = scores.masked_fill(drop.scatter(1, index, drop), -float("inf"))
        probs = scores.softmax(dim=-1)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]
