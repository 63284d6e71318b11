"""A ``transformers`` model straight from a GGUF file, its linear layers narrowmm layers
holding the file's blocks (:func:`from_gguf`)."""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from .. import _threads
from .._arena import weight_arena
from .._scales import Scales
from .._weights import TorchWeights
from ..checkpoints.gguf import LOADABLE_TYPES, GGUFError, GGUFFile, load_gguf
from ._embedding import Embedding
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


def _row_order(processor: Any, gguf_name: str, out_features: int, path: str,
               arch: str) -> np.ndarray | None:
    """The row permutation ``transformers`` applies to a GGUF tensor (llama.cpp stores the
    query and key projections of rotary models with their rows permuted), found by letting
    its processor permute the row indices; None when it keeps the order. A processor that
    does anything else to a linear weight (transposes, reshapes, splits) is refused: the
    layer holds the file's blocks, whose rows can move but not their contents."""
    index = np.arange(out_features, dtype=np.int64)[:, None]
    result = processor.process(weights=index.copy(), name=gguf_name)
    order = np.asarray(result.weights)
    if (result.name != gguf_name or order.shape != index.shape
            or not np.array_equal(np.sort(order[:, 0]), index[:, 0])):
        raise NotImplementedError(
            f"{path}: transformers does more than reorder the rows of {gguf_name!r} for "
            f"{arch!r} models; from_gguf keeps a linear layer's GGUF blocks and cannot")
    order = order[:, 0]
    return None if np.array_equal(order, index[:, 0]) else order


def _float_tensor(f: GGUFFile, name: str, processor: Any, shape: tuple[int, ...]
                  ) -> torch.Tensor:
    """A tensor that stays float32 in the model (norms, biases, the embedding table): its
    exact values, decoded, then changed as ``transformers``' processor changes it for the
    architecture (the query and key biases of a Llama reordered as their weights' rows,
    ``w - 1`` for Gemma's norms), and checked against the parameter's ``shape``."""
    info = f.info[name]
    if info.type.format is None:  # as GGUFFile refuses such weights, 1-D ones too
        raise GGUFError(f"{f.path}: tensor {name!r} has ggml type {info.type.name}; narrowmm "
                        f"decodes {LOADABLE_TYPES}")
    if len(info.ne) == 2:
        values = f[name].decode()  # a new array: the processor may have it
    else:
        values = np.array(f.array(name), dtype=np.float32)  # a copy, off the map
    result = processor.process(weights=values, name=name)
    if result.name != name:
        raise NotImplementedError(f"{f.path}: transformers moves tensor {name!r} elsewhere "
                                  "(an expert of a mixture?); from_gguf does not")
    # its own and writable without a third copy of an embedding table (a Llama-3 one is
    # 2 GB in float32): the processor's result as it is when it is such an array
    values = np.asarray(result.weights)
    if (values.dtype != np.float32 or not values.flags.writeable or not values.flags.owndata
            or not values.flags.c_contiguous):
        values = np.array(values, dtype=np.float32)
    if values.shape != shape:
        raise ValueError(f"{f.path}: tensor {name!r} has shape {values.shape}, the model's "
                         f"parameter {shape}")
    return torch.from_numpy(values)


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


# The architectures whose configuration from_gguf reads from narrowmm's parse of the file:
# those transformers' GGUF loader (load_gguf_checkpoint) maps key by key with no case of its
# own (the Decoder's three). tests/test_from_gguf.py checks the result equals AutoConfig's.
_CONFIG_FROM_METADATA = ("llama", "qwen2", "qwen3")


def _config_from_metadata(f: GGUFFile, folder: str, transformers: Any, gguf_utils: Any
                          ) -> Any | None:
    """The configuration ``AutoConfig.from_pretrained(folder, gguf_file=name)`` builds,
    from the metadata ``load_gguf`` has already parsed, or None where that is not known to
    be the same (then from_gguf asks transformers).

    transformers' GGUF loader reads the configuration through gguf-py's reader, which makes
    NumPy views of every field, the tokenizer's 49,152 tokens and 48,900 merges included:
    3.6-4 s of SmolLM2's 6.2-6.4 s load on a Zen 3. This is its mapping (its own tables:
    the keys renamed, its defaults, the embedding tied when the file has no
    ``output.weight``, the vocabulary's size from the tokens when no key gives it), followed
    for the architectures it treats with no special case; a Llama file whose name holds
    "mistral" (transformers reads one named exactly so as Mistral) is left to it."""
    meta = f.metadata
    arch = meta.get("general.architecture")
    mapping = getattr(gguf_utils, "GGUF_TO_TRANSFORMERS_MAPPING", {}).get("config")
    defaults = getattr(gguf_utils, "GGUF_CONFIG_DEFAULTS_MAPPING", None)
    if (arch not in _CONFIG_FROM_METADATA or not isinstance(mapping, dict)
            or not isinstance(defaults, dict) or "mistral" in str(meta.get("general.name"))):
        return None
    config: dict[str, Any] = {
        "tie_word_embeddings": "output.weight" not in f.info}
    for key, value in defaults.get(arch, {}).items():
        config.setdefault(key, value)
    for key, value in meta.items():
        prefix, _, rest = key.partition(".")
        renamed = mapping.get(prefix, {}).get(rest)
        if renamed is None or renamed == -1:
            continue
        if isinstance(value, (list, tuple)):  # its reader's values: a list, one unwrapped
            value = value[0] if len(value) == 1 else list(value)
        config[renamed] = value
    if "vocab_size" not in config and "tokenizer.ggml.tokens" in meta:
        config["vocab_size"] = len(meta["tokenizer.ggml.tokens"])
    config_class = transformers.models.auto.configuration_auto.CONFIG_MAPPING[arch]
    return config_class.from_dict(config, _from_auto=True, name_or_path=folder)


def from_gguf(path: str | os.PathLike[str], *, batch_invariant: bool = False,
              threads: bool | int = True, pack: bool = True) -> torch.nn.Module:
    """A ``transformers`` causal language model built from a GGUF file, every linear layer
    a :class:`Linear` holding the file's own blocks (Q8_0, Q4_0, Q4_1 as they are; Q5_1 as
    q5_1, a code a byte; Q5_0, the K types, IQ4_NL and IQ4_XS as the exact q8_0 / q4_1 /
    q5_1 weights of :func:`narrowmm.load_gguf`; F16 / BF16 / F32 weights as they are): the
    linear weights are never materialised in float32.

    The configuration comes from the file's metadata, as ``transformers`` reads it
    (``AutoConfig.from_pretrained(folder, gguf_file=name)``; for Llama, Qwen2 and Qwen3
    files the same object built from narrowmm's parse of the metadata with ``transformers``'
    tables, without its slower reader); so does the tokenizer, which
    ``transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)`` builds. The
    token embedding keeps the file's blocks too (an :class:`Embedding`: each row looked up is
    decoded exactly, the table is never made) when it is a plain ``nn.Embedding`` whose
    tensor is narrow and which ``transformers`` takes as it is; norms, the layers' biases
    (Qwen2's on q, k and v) and any other embedding are float32 (their exact values), each
    changed as ``transformers``' processor for the architecture changes it (Gemma's norms:
    ``w - 1``). A tied output layer is built on the embedding's blocks, and the embedding
    then reads its rows from that layer (:meth:`Embedding.tied_to`). The query and key
    projections get the row order ``transformers`` gives them (llama.cpp permutes their rows
    for its rotary code): a permutation of output features, so every weight keeps its bits.
    ``batch_invariant=True`` and :class:`Decoder` take Llama, Qwen2 and Qwen3 files; the
    other architectures ``transformers`` reads build without them.

    Progress: a bar over the tensors converted (a large part of a large file's load) on
    stderr, as ``transformers``' own loads show one; ``transformers.utils.logging.
    disable_progress_bar()`` silences both. The tensors convert on up to 4 threads at once
    (as many as ``threads`` gives, narrowmm's pool size for ``False``), each tensor's result
    the same whatever the count.

    Memory: the model keeps each linear layer's blocks in the kernels' form (the file's
    bytes for Q8_0, Q4_0 and Q4_1; more for the types converted, see
    :func:`narrowmm.load_gguf`), the embedding's as well (a tied table once). While it loads,
    the file
    is mapped (its pages count in the resident set until the map closes on return) and each
    tensor is converted a few MB of blocks at a time, so the peak stays near the model's
    size plus the file's (README, "GGUF files and Q8_0 weights"). The packed layers lie side
    by side in mappings of 64 MiB advised for transparent huge pages, where the kernel has
    them (``NARROWMM_HUGE_PAGES=0``: NumPy's memory; docs/kernels.md, "Huge pages for packed
    weights").

    Args:
        path: the ``.gguf`` file.
        batch_invariant: also replace the model's other ops (attention, RMSNorm, SiLU,
            rotary), as :func:`narrowmm.torch.convert` does.
        threads: as :func:`narrowmm.torch.convert` (True, False or a count from 1); it
            also bounds the threads that convert the tensors.
        pack: store every layer in the CPU's packed layout (True, the default) or
            row-major (False). The same bits either way; docs/decoder.md ("Packed or
            row-major block weights") has the measurements behind the default.

    Raises:
        GGUFError: a malformed file, or a tensor of a type narrowmm does not load (the IQ
            types but IQ4_NL and IQ4_XS, TQ1_0, TQ2_0, ...: the error names the tensor, its
            type and the types that load); ValueError: a model the file's architecture does
            not describe, or a tensor of it (a weight, a bias) the file lacks or holds in
            another shape, named; NotImplementedError: an architecture whose linear weights
            ``transformers`` reshapes rather than reorders (GPT-2's, transposed), or whose
            tensors it loads under other names.
        TypeError: ``pack`` is not a bool (``None`` chose a per-layer rule before
        2026-12-03; every layer is packed now), or ``threads`` neither a bool nor an int;
        ValueError: a thread count below 1 (or past narrowmm's limit).
    """
    if not isinstance(pack, (bool, np.bool_)):
        raise TypeError(f"from_gguf: pack must be True or False, got {pack!r}")
    if isinstance(threads, np.bool_):
        threads = bool(threads)
    if not isinstance(threads, (bool, int)):
        raise TypeError(f"from_gguf: threads must be True, False or a thread count, got "
                        f"{threads!r}")
    if not isinstance(threads, bool):
        threads = _threads._parse_count(threads, "from_gguf: threads")
    transformers, gguf_utils = _transformers()
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    f = load_gguf(path)
    config = _config_from_metadata(f, folder, transformers, gguf_utils)
    if config is None:
        config = transformers.AutoConfig.from_pretrained(folder, gguf_file=name)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    arch = f.metadata.get("general.architecture", "")
    processor = gguf_utils.TENSOR_PROCESSORS.get(arch, gguf_utils.TensorProcessor)(
        config=config.to_dict())
    hf_names = _gguf_names(model, arch, config.num_hidden_layers, path)
    modules = dict(model.named_modules())
    linears: dict[str, dict[str, str]] = {}  # module -> {"weight"/"bias": GGUF tensor}
    embeddings: dict[str, str] = {}  # module -> GGUF tensor, for narrow embeddings
    for gguf_name, hf_name in hf_names.items():
        if gguf_name not in f.info:
            continue
        module_name, _, param = hf_name.rpartition(".")
        module = modules.get(module_name)
        if isinstance(module, torch.nn.Linear) and param in ("weight", "bias"):
            linears.setdefault(module_name, {})[param] = gguf_name
        elif param == "weight" and _narrow_embedding(f, gguf_name, module, processor):
            embeddings[module_name] = gguf_name  # made below: perhaps tied to the output
        else:
            value = _float_tensor(f, gguf_name, processor, tuple(getattr(module, param).shape))
            setattr(module, param, torch.nn.Parameter(value, requires_grad=False))
    # an output layer the file has no tensor for is tied to the embedding: its narrow blocks,
    # converted with the linear layers' tensors
    embedding = None
    if isinstance(getattr(model, "lm_head", None), torch.nn.Linear) and "lm_head" not in linears:
        embedding = next((g for g, h in hf_names.items()
                          if h.endswith("embed_tokens.weight") and g in f.info), None)
        if embedding is None or not getattr(config, "tie_word_embeddings", False):
            raise ValueError(f"{path}: no output layer and no tied embedding to use for it")
    # the conversions (about 2 s of the 1B-shaped Q4_0 file's load on a Zen 3, most of the
    # rest importing transformers' model code): on worker threads (_in_order), with a bar
    # as transformers' own loads show, silenced by the same switch
    # (transformers.utils.logging.disable_progress_bar)
    # the packed layers side by side on huge pages (_arena), the workers' copies included
    tensors = len(linears) + len(embeddings)
    with weight_arena(), transformers.utils.logging.tqdm(
            total=tensors, unit="tensor", leave=False, desc=f"narrowmm: {name}'s blocks") as bar:
        def convert(module_name: str) -> Linear:
            if module_name not in linears:  # the tied output layer
                return Linear.from_weights(f[embedding], pack=pack)
            return _linear(f, linears[module_name], modules[module_name], processor, path,
                           arch, pack)

        # the tied output layer first: the largest tensor, converted beside the others
        # rather than alone after them
        jobs = (["lm_head"] if embedding is not None else []) + list(linears)
        for module_name, layer in _in_order(convert, jobs, _converters(threads)):
            _replace(model, module_name, layer)
            if module_name in linears:
                bar.update(1)
        if embedding is not None:
            for module_name, gguf_name in list(embeddings.items()):
                if gguf_name == embedding and not (model.lm_head.format.scaled
                                                   and model.lm_head.format.scale_exponent):
                    # the table is the output layer's blocks: looked up there, not held twice
                    _replace(model, module_name, Embedding.tied_to(model.lm_head))
                    del embeddings[module_name]
                    bar.update(1)
        for module_name, gguf_name in embeddings.items():
            _replace(model, module_name, Embedding.from_weights(f[gguf_name]))
            bar.update(1)
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


# At most this many tensors convert at once: each holds its converted blocks twice while it
# is packed, so the load's peak grows with the count (README, from_gguf's memory figures).
_MOST_CONVERTERS = 4


def _converters(threads: bool | int) -> int:
    """How many threads convert the file's tensors: the count ``from_gguf`` was asked for
    (``True``: every CPU this process may use; ``False``: narrowmm's pool as it is), at most
    ``_MOST_CONVERTERS``."""
    if threads is True:
        count = _threads.available_cpus()
    elif threads is False:
        count = _threads.get_num_threads()
    else:
        count = threads
    return max(1, min(_MOST_CONVERTERS, count))


def _in_order(fn: Callable[[str], Any], keys: list[str],
              workers: int) -> Iterator[tuple[str, Any]]:
    """``(key, fn(key))`` for each key in order, ``workers`` calls running at once on
    threads (the conversions spend their time in NumPy and narrowmm's C, which release the
    GIL), each in a copy of the caller's context (its weight arena, say). The first failure
    is raised as it is, in key order; the calls not started then are cancelled, the running
    ones finish first."""
    if workers <= 1 or len(keys) <= 1:
        for key in keys:
            yield key, fn(key)
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="narrowmm-gguf") as pool:
        futures = [pool.submit(contextvars.copy_context().run, fn, key) for key in keys]
        try:
            for key, future in zip(keys, futures, strict=True):
                yield key, future.result()
        finally:
            for future in futures:
                future.cancel()


def _replace(model: torch.nn.Module, module_name: str, module: torch.nn.Module) -> None:
    parent_name, _, child = module_name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def _narrow_embedding(f: GGUFFile, name: str, module: Any, processor: Any) -> bool:
    """Whether the model's ``module`` (whose weight is GGUF tensor ``name``) becomes an
    :class:`Embedding` on the file's blocks: a plain ``nn.Embedding`` (not a subclass with a
    forward of its own, as Gemma 3's scaled one), of the tensor's shape, without max_norm,
    whose tensor is narrow (a block type, F16 or BF16) and which ``transformers``' processor
    would take as it is."""
    info = f.info[name]
    if (type(module) is not torch.nn.Embedding or module.max_norm is not None
            or info.type.format in (None, "f32") or len(info.ne) != 2
            or tuple(info.shape) != (module.num_embeddings, module.embedding_dim)):
        return False
    probe = np.zeros((2, 2), np.float32)
    result = processor.process(weights=probe, name=name)
    return result.name == name and result.weights is probe


def _linear(f: GGUFFile, names: dict[str, str], module: torch.nn.Linear, processor: Any,
            path: str, arch: str, pack: bool) -> Linear:
    """The narrowmm layer for one of the model's ``nn.Linear`` modules: the file's blocks of
    ``names["weight"]`` in ``transformers``' row order, and its float32 bias
    ``names["bias"]`` (moved as the processor moves it) when the model's layer has one."""
    if "weight" not in names:
        raise ValueError(f"{path}: the file holds a bias ({names['bias']!r}) but no weight "
                         "for its layer")
    w = f[names["weight"]]
    if (w.out_features, w.in_features) != (module.out_features, module.in_features):
        raise ValueError(f"{path}: tensor {names['weight']!r} is {w.out_features} x "
                         f"{w.in_features}, the model's layer {module.out_features} x "
                         f"{module.in_features}")
    order = _row_order(processor, names["weight"], w.out_features, path, arch)
    w = w if order is None else _rows(w, order)
    bias = None
    if module.bias is not None:
        if "bias" not in names:
            raise ValueError(f"{path}: the model's layer for {names['weight']!r} has a bias "
                             "and the file holds none")
        bias = _float_tensor(f, names["bias"], processor, (module.out_features,))
    return Linear.from_weights(w, bias, pack=pack)


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
