"""Column-sharded narrowmm layers on ``torch.distributed`` (``narrowmm.torch``).

narrowmm never splits the reduction dimension k: every output column is one fma chain over
all of k. So a layer split **by output columns** computes each column on one rank with
exactly the single-process chain, and gathering the columns gives the single-process bits
on any number of ranks. No row-parallel (k-split) layer exists here: it would need an
all-reduce, which adds partial sums in another order and changes bits. docs/scaling.md
gives the costs.

- :func:`shard` splits the layers of a converted model;
- :func:`load_sharded` builds a model's layers straight from a safetensors checkpoint, each
  rank reading only the bytes of its own output features (a contiguous range of rows of
  PyTorch's ``(out, in)`` layout).
"""

from __future__ import annotations

import datetime
import itertools
import math
import os
import time
from collections.abc import Iterable

import numpy as np
import torch
import torch.distributed as dist

from .._arena import weight_arena
from .._codecs import encode
from .._formats import Format, get_format
from .._linear import Linear as ArrayLinear
from .._weights import PackedWeights, TorchWeights, Weights
from ..checkpoints import load_safetensors
from ._layer import Linear

# Column ranges are whole multiples of this: a multiple of every ISA row's microkernel width
# (8, 24, 32), so each rank's slice packs into whole microkernel slivers wherever it runs
# (its last packed group may be padded: the same bits, a little memory).
COLUMN_GRAIN = 96


def column_ranges(n: int, world: int) -> list[tuple[int, int]]:
    """Output columns [lo, hi) of each of ``world`` ranks: contiguous, in rank order, whole
    96-column grains (the last range ends at n), as even as the grains allow."""
    grains = -(-n // COLUMN_GRAIN)
    bounds = [min(n, grains * r // world * COLUMN_GRAIN) for r in range(world + 1)]
    return list(itertools.pairwise(bounds))


def init_process_group(timeout_s: float = 60.0, backend: str = "gloo") -> None:
    """``torch.distributed.init_process_group`` from ``torchrun``'s environment (RANK,
    WORLD_SIZE, MASTER_ADDR, MASTER_PORT) with an explicit timeout: a collective that
    waits longer for a rank (dead, or stuck) raises instead of hanging."""
    if dist.is_initialized():
        return
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
               if v not in os.environ]
    if missing:
        raise RuntimeError(f"init_process_group needs {', '.join(missing)} in the environment "
                           f"(launch with torchrun, or set them)")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))


class _NoColumns(torch.nn.Module):
    """The local part of a rank that holds no column of a narrow layer."""

    def __init__(self, in_features: int) -> None:
        super().__init__()
        self.in_features = in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros((*x.shape[:-1], 0))


def _local_layer(weights: Weights | PackedWeights | None, bias: np.ndarray | None,
                 in_features: int) -> torch.nn.Module:

    return _NoColumns(in_features) if weights is None else Linear(weights, bias)


class ShardedLinear(torch.nn.Module):
    """A :class:`narrowmm.torch.Linear` split by output columns over a process group: this
    rank computes columns ``[lo, hi)`` (``local``), then an all-gather assembles the
    ``out_features`` columns on every rank. Each column is computed by one rank with the
    single-process chain, so the output has the single-process bits.

    ``gather_seconds`` and ``calls`` count the time spent in the all-gather (for the cost
    figures of docs/scaling.md)."""

    def __init__(self, local: torch.nn.Module, ranges: list[tuple[int, int]],
                 group: dist.ProcessGroup | None = None, name: str = "") -> None:
        super().__init__()
        self.local = local
        self.ranges = ranges
        self.group = group
        self.name = name
        self.in_features = local.in_features
        self.out_features = ranges[-1][1]
        self.gather_seconds = 0.0
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.local(x)
        lead = y.shape[:-1]
        rows = y.reshape(math.prod(lead), y.shape[-1]).float()  # -1 fails for 0 columns
        width = max(hi - lo for lo, hi in self.ranges)
        if rows.shape[1] != width:  # all_gather takes equal sizes: pad, then trim
            rows = torch.nn.functional.pad(rows, (0, width - rows.shape[1]))
        parts = [torch.empty(rows.shape[0], width) for _ in self.ranges]
        t0 = time.perf_counter()
        try:
            dist.all_gather(parts, rows.contiguous(), group=self.group)
        except (RuntimeError, dist.DistBackendError) as exc:
            raise RuntimeError(
                f"narrowmm sharded layer {self.name or '?'}: the all-gather over "
                f"{len(self.ranges)} ranks failed (a rank died, left, or exceeded the "
                f"process group's timeout): {exc}") from exc
        self.gather_seconds += time.perf_counter() - t0
        self.calls += 1
        out = torch.cat([p[:, :hi - lo] for p, (lo, hi) in zip(parts, self.ranges,
                                                                 strict=True)], dim=1)
        out = out.reshape(*lead, self.out_features)
        return out if y.dtype == torch.float32 else out.to(y.dtype)  # exact: y was that dtype

    def extra_repr(self) -> str:
        rank = dist.get_rank(self.group)
        lo, hi = self.ranges[rank]
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"columns=[{lo}, {hi}) on rank {rank} of {len(self.ranges)}")


def _world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("narrowmm sharding needs an initialised torch.distributed process "
                           "group (narrowmm.torch.init_process_group() under torchrun)")
    return dist.get_rank(group), dist.get_world_size(group)


def _columns(w: Weights | PackedWeights, lo: int, hi: int) -> Weights:
    """Columns [lo, hi) of narrowmm weights, with their scales and offsets."""
    rows = w.unpack() if isinstance(w, PackedWeights) else w
    scales = None if rows.scales is None else rows.scales.take_columns(lo, hi)
    offsets = None if rows.offsets is None else rows.offsets.take_columns(lo, hi)
    return Weights.from_bits(np.ascontiguousarray(rows.bits[:, lo:hi]), rows.format, scales,
                             offsets)


def _feature_rows(full: TorchWeights, lo: int, hi: int, fmt: Format) -> Weights | TorchWeights:
    """Output features [lo, hi) of a checkpoint tensor (rows of PyTorch's layout) in
    ``fmt``: the stored rows as they are when the formats agree (an FP8 checkpoint's scales
    sliced with them); otherwise their exact values, rounded to ``fmt``, or quantized per
    output feature for FP8 (what ``convert`` does to the whole matrix: per feature, so the
    same codes and scales)."""
    rows = full.bits[lo:hi]  # this rank's output features: a contiguous byte range
    scales = None if full.scales is None else full.scales.take_rows(lo, hi)
    offsets = None if full.offsets is None else full.offsets.take_rows(lo, hi)
    if full.format is fmt:
        return TorchWeights(rows, fmt, scales, offsets)
    values = TorchWeights(rows, full.format, scales, offsets).decode()
    if fmt.scaled:
        return Weights.quantize(np.ascontiguousarray(values.T), fmt)  # as convert does
    if fmt.name == "f32":
        return TorchWeights(values, fmt)

    return TorchWeights(encode(values, fmt), fmt)


def _replace(model: torch.nn.Module, name: str, new: torch.nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def shard(model: torch.nn.Module, group: dist.ProcessGroup | None = None) -> torch.nn.Module:
    """Split every :class:`narrowmm.torch.Linear` of a converted model by output columns
    over ``group`` (default: the whole world), in place; returns ``model``.

    Every rank must call it on the same model. Each keeps its 96-column-aligned range of
    every layer (packed again if the layer was packed) and drops the rest. The other ops run
    on every rank on the same inputs: on ranks with different CPUs, convert with
    ``batch_invariant=True`` so that they give the same bits everywhere."""

    rank, world = _world(group)
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, Linear)]
    with weight_arena():  # the packed ranges side by side on huge pages (_arena)
        for name, layer in layers:
            ranges = column_ranges(layer.out_features, world)
            lo, hi = ranges[rank]
            local = None
            if hi > lo:
                local = _columns(layer.weights(), lo, hi)
                local = local.pack() if layer.packed else local
            bias = None if layer.bias is None else layer.bias.numpy()[lo:hi].copy()
            local_layer = _local_layer(local, bias, layer.in_features)
            _replace(model, name, ShardedLinear(local_layer, ranges, group, name))
    return model


def load_sharded(model: torch.nn.Module, checkpoint: str | os.PathLike[str],
                 format: str = "bf16", *, pack: bool = True,
                 group: dist.ProcessGroup | None = None, skip: Iterable[str] = (),
                 ) -> torch.nn.Module:
    """Fill a model built on the meta device from a safetensors checkpoint, its
    ``nn.Linear`` layers sharded by output columns over ``group``; returns ``model``.

    ::

        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        nmt.load_sharded(model, "model.safetensors", "bf16")

    A linear layer's weight of shape ``(out, in)`` is read rows ``[lo, hi)`` only: the bytes
    of this rank's output features, a contiguous range of the file, which are packed and
    then released from the mapping. So N ranks each hold about 1/N of the linear weights.
    An FP8 checkpoint's scales are sliced with the rows; ``format="e4m3fn"`` on a 16-bit
    checkpoint quantizes each output feature as :func:`convert` would.
    Other parameters (embeddings, norms) are read whole on every rank; buffers the
    checkpoint lacks (rotary frequencies) are rebuilt by their module's constructor.
    ``skip`` names linear layers (full names) to keep as plain ``nn.Linear``, loaded whole
    on every rank like the other parameters.
    """

    rank, world = _world(group)
    fmt = get_format(format)
    f = load_safetensors(checkpoint)
    skip = tuple(skip)
    tied = _tied_names(model)
    linears = [(n, m) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and n not in skip]
    with weight_arena():  # the packed ranges side by side on huge pages (_arena)
        for name, module in linears:
            key = _checkpoint_name(f, f"{name}.weight", tied)
            full = f[key]
            if full.shape != (module.out_features, module.in_features):
                raise ValueError(f"{key} has shape {full.shape}, the model's {name} is "
                                 f"({module.out_features}, {module.in_features})")
            ranges = column_ranges(module.out_features, world)
            lo, hi = ranges[rank]
            local = _NoColumns(module.in_features)
            if hi > lo:
                layer = ArrayLinear(_feature_rows(full, lo, hi, fmt), _bias(f, name, lo, hi),
                                     pack=pack)
                local = Linear(layer.weights, layer.bias)
            f.release(key)
            _replace(model, name, ShardedLinear(local, ranges, group, name))
    _load_rest(model, f, tied)
    return model


def _bias(f, name: str, lo: int, hi: int) -> np.ndarray | None:
    key = f"{name}.bias"
    if key not in f.info:
        return None
    return np.array(f.array(key)[lo:hi], dtype=np.float32)


def _tied_names(model: torch.nn.Module) -> dict[str, str]:
    """Output embedding weight name -> input embedding weight name, for tied models whose
    checkpoint stores the input one only."""
    config = getattr(model, "config", None)
    if not getattr(config, "tie_word_embeddings", False):
        return {}
    names = {id(m): n for n, m in model.named_modules()}
    out, inp = model.get_output_embeddings(), model.get_input_embeddings()
    if out is None or inp is None:
        return {}
    return {f"{names[id(out)]}.weight": f"{names[id(inp)]}.weight"}


def _checkpoint_name(f, key: str, tied: dict[str, str]) -> str:
    if key in f.info:
        return key
    return tied.get(key, key)  # a missing name raises f's KeyError with close matches


def _load_rest(model: torch.nn.Module, f, tied: dict[str, str]) -> None:
    """Materialise the parameters and buffers still on the meta device."""
    meta = [m for m in model.modules()
            if any(t.is_meta for t in (*m.parameters(recurse=False),
                                       *m.buffers(recurse=False)))]
    for module in meta:
        module.to_empty(device="cpu", recurse=False)
    names = {id(m): n for n, m in model.named_modules()}
    for module in meta:
        prefix = names[id(module)]
        persistent = set(module._buffers) - module._non_persistent_buffers_set
        for pname in (*module._parameters, *persistent):
            if module._parameters.get(pname) is None and module._buffers.get(pname) is None:
                continue
            key = _checkpoint_name(f, f"{prefix}.{pname}" if prefix else pname, tied)
            value = torch.from_numpy(np.array(f.array(key)))
            target = getattr(module, pname)
            if f.info[key].dtype == "BF16":
                value = value.view(torch.bfloat16)
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"{key} has shape {tuple(value.shape)}, the model expects "
                                 f"{tuple(target.shape)}")
            with torch.no_grad():
                target.copy_(value.to(target.dtype))
        if module._non_persistent_buffers_set:
            _rebuild_buffers(model, module, prefix)


def _rebuild_buffers(model: torch.nn.Module, module: torch.nn.Module, name: str) -> None:
    """Non-persistent buffers (rotary frequencies) are not in checkpoints: construct the
    module again from the model's config, which computes them."""
    config = getattr(model, "config", None)
    try:
        fresh = type(module)(config=config)
    except TypeError as exc:
        raise NotImplementedError(f"{name}: cannot rebuild its buffers "
                                  f"{sorted(module._non_persistent_buffers_set)} "
                                  f"(its constructor does not take the model's config)") from exc
    _replace(model, name, fresh)
