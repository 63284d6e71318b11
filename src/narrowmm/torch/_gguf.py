"""A ``transformers`` model straight from a GGUF file, its linear layers narrowmm layers
holding the file's blocks (:func:`from_gguf`)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from .._scales import Scales
from .._weights import TorchWeights
from ..checkpoints.gguf import LOADABLE_TYPES, GGUFError, GGUFFile, load_gguf
from ._invariant import make_batch_invariant
from ._layer import Linear
from ._team import set_num_threads


def _transformers() -> Any:
    try:
        import transformers
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError as exc:  # pragma: no cover - the models extra installs them
        raise ImportError("from_gguf builds a transformers model: pip install transformers "
                          f"gguf ({exc})") from None
    return transformers, gguf_utils


def _rows(w: TorchWeights, order: np.ndarray) -> TorchWeights:
    """The output features of ``w`` in ``order`` (rows of PyTorch's layout): the codes,
    scales and offsets move together, so every weight keeps its bits."""
    def take(s: Scales | None) -> Scales | None:
        if s is None:
            return None
        per_row = s.take_rows(0, w.out_features)  # one row of the grid per output feature
        return per_row if per_row.block[0] == 0 else Scales(per_row.values[order],
                                                            per_row.block)

    return TorchWeights(np.ascontiguousarray(w.bits[order]), w.format, take(w.scales),
                        take(w.offsets))


def _row_order(processor: Any, gguf_name: str, out_features: int) -> np.ndarray | None:
    """The row permutation ``transformers`` applies to a GGUF tensor (llama.cpp stores the
    query and key projections of rotary models with their rows permuted), found by letting
    its processor permute the row indices; None when it keeps the order."""
    index = np.arange(out_features, dtype=np.int64)[:, None]
    order = processor.process(weights=index, name=gguf_name).weights[:, 0]
    return None if np.array_equal(order, index[:, 0]) else np.asarray(order)


def _float_tensor(f: GGUFFile, name: str) -> torch.Tensor:
    """A tensor that stays float32 in the model (norms, the embedding table): its exact
    values, decoded."""
    info = f.info[name]
    if info.type.format is None:  # as GGUFFile refuses such weights, 1-D ones too
        raise GGUFError(f"{f.path}: tensor {name!r} has ggml type {info.type.name}; narrowmm "
                        f"decodes {LOADABLE_TYPES}")
    if len(info.ne) == 2:
        values = f[name].decode()
    else:
        values = np.asarray(f.array(name), dtype=np.float32)
    return torch.from_numpy(np.array(values, dtype=np.float32))  # its own, writable


def _gguf_names(model: torch.nn.Module, arch: str, layers: int, path: str) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, from gguf-py's table of the
    architecture's names (as transformers maps them, without its walk into every submodule,
    which rebuilt the table 400 times for a 30-layer model)."""
    import gguf

    codes = [code for code, name in gguf.MODEL_ARCH_NAMES.items() if name == arch]
    if not codes:
        raise ValueError(f"{path}: architecture {arch!r} is not one gguf-py names")
    table = gguf.get_tensor_name_map(codes[0], layers)
    names: dict[str, str] = {}
    for hf_name, _ in model.named_parameters():
        stem, _, suffix = hf_name.rpartition(".")
        gguf_name = table.get_name(stem)
        if gguf_name is not None:
            names[f"{gguf_name}.{suffix}"] = hf_name
    return names


def from_gguf(path: str | os.PathLike[str], *, batch_invariant: bool = False,
              threads: bool | int = True, pack: bool = True) -> torch.nn.Module:
    """A ``transformers`` causal language model built from a GGUF file, every linear layer
    a :class:`Linear` holding the file's own blocks (Q8_0, Q4_0, Q4_1 as they are; Q5_1 as
    q5_1, a code a byte; Q5_0, the K types, IQ4_NL and IQ4_XS as the exact q8_0 / q4_1 /
    q5_1 weights of :func:`narrowmm.load_gguf`; F16 / BF16 / F32 weights as they are): the
    linear weights are never materialised in float32.

    The configuration comes from the file's metadata, as ``transformers`` reads it
    (``AutoConfig.from_pretrained(folder, gguf_file=name)``); so does the tokenizer, which
    ``transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)`` builds. Norms and
    the token embedding table are float32 (their exact values). A tied output layer shares
    the embedding's narrow blocks. The query and key projections get the row order
    ``transformers`` gives them (llama.cpp permutes their rows for its rotary code): a
    permutation of output features, so every weight keeps its bits.

    Args:
        path: the ``.gguf`` file.
        batch_invariant: also replace the model's other ops (attention, RMSNorm, SiLU,
            rotary), as :func:`narrowmm.torch.convert` does.
        threads: as :func:`narrowmm.torch.convert`.
        pack: store every layer in the CPU's packed layout (True, the default) or
            row-major (False). The same bits either way; docs/decoder.md ("Packed or
            row-major block weights") has the measurements behind the default.

    Raises:
        GGUFError: a malformed file, or a tensor of a type narrowmm does not load (the IQ
            types but IQ4_NL and IQ4_XS, TQ1_0, TQ2_0, ...: the error names the tensor, its
            type and the types that load); ValueError: a model the file's architecture does
            not describe.
        TypeError: ``pack`` is not a bool (``None`` chose a per-layer rule before
        2026-12-03; every layer is packed now).
    """
    if not isinstance(pack, (bool, np.bool_)):
        raise TypeError(f"from_gguf: pack must be True or False, got {pack!r}")
    transformers, gguf_utils = _transformers()
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    f = load_gguf(path)
    config = transformers.AutoConfig.from_pretrained(folder, gguf_file=name)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    arch = f.metadata.get("general.architecture", "")
    processor = gguf_utils.TENSOR_PROCESSORS.get(arch, gguf_utils.TensorProcessor)(
        config=config.to_dict())
    hf_names = _gguf_names(model, arch, config.num_hidden_layers, path)
    modules = dict(model.named_modules())
    loaded: set[str] = set()
    for gguf_name, hf_name in hf_names.items():
        if gguf_name not in f.info:
            continue
        module_name, _, param = hf_name.rpartition(".")
        module = modules.get(module_name)
        if isinstance(module, torch.nn.Linear) and param == "weight":
            w = f[gguf_name]
            order = _row_order(processor, gguf_name, w.out_features)
            w = w if order is None else _rows(w, order)
            layer = Linear.from_weights(w, pack=pack)
            parent_name, _, child = module_name.rpartition(".")
            setattr(modules[parent_name] if parent_name else model, child, layer)
        else:
            setattr(module, param, torch.nn.Parameter(_float_tensor(f, gguf_name),
                                                      requires_grad=False))
        loaded.add(hf_name)
    lm_head = getattr(model, "lm_head", None)
    if isinstance(lm_head, torch.nn.Linear):  # tied to the embedding: its narrow blocks
        embedding = next((g for g, h in hf_names.items()
                          if h.endswith("embed_tokens.weight") and g in f.info), None)
        if embedding is None or not getattr(config, "tie_word_embeddings", False):
            raise ValueError(f"{path}: no output layer and no tied embedding to use for it")
        tied = f[embedding]
        model.lm_head = Linear.from_weights(tied, pack=pack)
    _materialise_buffers(model, config)
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"{path}: the file holds no tensor for {missing[:5]} (and "
                         f"{max(0, len(missing) - 5)} more) of the {type(model).__name__}")
    model.eval()
    if batch_invariant:
        make_batch_invariant(model)
    if threads is not False:
        set_num_threads(None if threads is True else threads)
    return model


def _materialise_buffers(model: torch.nn.Module, config: Any) -> None:
    """Buffers a model computes at construction (the rotary embedding's frequencies) were
    made on the meta device: make their modules again on the CPU."""
    for name, module in list(model.named_modules()):
        if any(b.is_meta for b in module.buffers(recurse=False)):
            try:
                fresh = type(module)(config=config)
            except TypeError as exc:
                raise ValueError(f"cannot rebuild {name} ({type(module).__name__}) of the "
                                 f"model outside the meta device: {exc}") from None
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, fresh)
