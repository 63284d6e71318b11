"""narrowmm inside PyTorch models: ``import narrowmm.torch`` (``import narrowmm`` never
imports torch).

- :class:`Linear`, a ``torch.nn.Module`` doing ``y = x @ W.T + b`` with narrowmm's exact fma
  chains, built from an ``nn.Linear`` (:meth:`Linear.from_torch`) or a checkpoint tensor
  (:meth:`Linear.from_weights`);
- :func:`convert`, which swaps every ``nn.Linear`` of a model for one, in place;
- :func:`from_gguf`, a ``transformers`` model built from a GGUF file, its linear layers
  holding the file's blocks, and its token embedding too (:class:`Embedding`, rows decoded
  as they are looked up);
- :class:`Decoder`, a batch-invariant Llama, Qwen2 or Qwen3 model's whole forward step in one C
  call, with a ``generate`` of its own;
- the operator ``torch.ops.narrowmm.linear``, registered with ``torch.library`` with a fake
  (meta) implementation, so ``torch.inference_mode``, ``torch.compile`` and
  ``torch.export`` see through it.

Inference only: a forward whose input needs a gradient raises ``RuntimeError``.

The package's rooms: ``_layer`` (the module and the operator), ``_embedding``
(:class:`Embedding`), ``_convert`` (:func:`convert`),
``_team`` (threads: PyTorch's OpenMP team), ``_decoder`` (:class:`Decoder`), ``_shard``
(sharding over ``torch.distributed``), ``_invariant`` (``batch_invariant=True``), and the public
:mod:`narrowmm.torch.invariance` (the batch-invariance proof's model, prompts and
conditions; it imports ``transformers``, so it is not imported here).
"""

from __future__ import annotations

from ._convert import convert, converted_layers
from ._decoder import STEP_PARTS, Decoder
from ._embedding import Embedding
from ._gguf import from_gguf
from ._invariant import is_batch_invariant, make_batch_invariant
from ._layer import Linear
from ._shard import ShardedLinear, column_ranges, init_process_group, load_sharded, shard
from ._team import MODEL_SPIN_NS, set_num_threads, torch_openmp_team

__all__ = ["MODEL_SPIN_NS", "STEP_PARTS", "Decoder", "Embedding", "Linear", "ShardedLinear",
           "column_ranges", "convert", "converted_layers", "from_gguf", "init_process_group",
           "is_batch_invariant", "load_sharded", "make_batch_invariant", "set_num_threads",
           "shard", "torch_openmp_team"]
