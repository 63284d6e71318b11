"""One line for a whole model: :func:`convert` swaps every ``nn.Linear`` for a narrowmm
:class:`~narrowmm.torch.Linear`."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .._arena import weight_arena
from .._formats import get_format
from ._invariant import check_supported, make_batch_invariant
from ._layer import Linear
from ._team import set_num_threads


def _skipped(name: str, skip: Iterable[str]) -> bool:
    """A module is skipped when ``skip`` names it in full or names its last part."""
    return any(name == s or name.rsplit(".", 1)[-1] == s for s in skip)


def convert(model: torch.nn.Module, format: str = "bf16", *, pack: bool = True,
            skip: Iterable[str] = (), threads: bool | int = True,
            batch_invariant: bool = False) -> torch.nn.Module:
    """Replace every ``torch.nn.Linear`` in ``model`` by a :class:`Linear`, in place.

    Args:
        model: any module; its ``nn.Linear`` children at any depth are replaced.
        format: ``"bf16"``, ``"fp16"``, ``"f32"``, FP8 ``"e4m3fn"`` / ``"e5m2"`` with
            one scale per output feature, or a GGUF format (``"q8_0"``, ``"q4_0"``,
            ``"q4_1"``, ``"q5_1"``: GGUF's blocks of 32 input features)
            (:meth:`Linear.from_torch`). A model already in that format
            keeps every weight bit.
        pack: store the CPU's packed layout (same bits, faster at small batches).
        skip: module names left alone: a full name (``"encoder.layer.0.output.dense"``) or
            a last part (``"lm_head"``, every module so named).

        batch_invariant: also replace the model's other ops that can change a row's bits
            with the batch, padding, threads or CPU (attention, RMSNorm, SiLU, the rotary
            embedding; :func:`make_batch_invariant`), so that every logit of a prompt is the
            same whatever runs beside it. ``transformers`` Llama, Qwen2 and Qwen3 models
            (no sliding-window layers); nothing may be skipped. docs/invariance.md lists
            what it replaces and costs.

    Returns:
        ``model``. The converted layers' float parameters are dropped from it (freed unless
        something else, a tied embedding say, still holds them).

    Threads: unless ``threads`` is False, :func:`set_num_threads` gives the model
    ``threads`` threads (every CPU for True): narrowmm runs its parts on PyTorch's OpenMP
    team where it can, or else on its own pool with PyTorch's set to 1 thread, so that two
    pools never fight over the cores (see there for figures).

    Memory: the packed layers lie side by side in mappings of 64 MiB advised for transparent
    huge pages, where the kernel has them (``NARROWMM_HUGE_PAGES=0``: NumPy's memory;
    docs/kernels.md, "Huge pages for packed weights").
    """
    skip = tuple(skip)
    fmt = get_format(format)
    if batch_invariant and skip:
        raise ValueError(f"batch_invariant=True needs every linear layer converted, but skip "
                         f"names {skip}: a torch.nn.Linear's bits change with the batch")
    if batch_invariant:  # refuse before changing anything
        check_supported(model, linears_pending=True)
    targets = [(name, module) for name, module in model.named_modules()
               if isinstance(module, torch.nn.Linear) and not _skipped(name, skip)]
    with weight_arena():  # the packed layers side by side on huge pages (_arena)
        for name, module in targets:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, Linear.from_torch(module, fmt.name, pack=pack))
            module.weight = None  # the float copy goes with the last reference to it
            module.bias = None
    if batch_invariant:
        make_batch_invariant(model)
    if threads is not False:
        set_num_threads(None if threads is True else threads)
    return model


def converted_layers(model: torch.nn.Module) -> list[tuple[str, Linear]]:
    """The narrowmm layers of ``model`` with their names."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, Linear)]
