"""narrowmm inside PyTorch models: ``import narrowmm.torch`` (``import narrowmm`` never
imports torch).

- :class:`Linear`, a ``torch.nn.Module`` doing ``y = x @ W.T + b`` with narrowmm's exact fma
  chains, built from an ``nn.Linear`` (:meth:`Linear.from_torch`) or a checkpoint tensor
  (:meth:`Linear.from_weights`);
- :func:`convert`, which swaps every ``nn.Linear`` of a model for one, in place;
- the operator ``torch.ops.narrowmm.linear``, registered with ``torch.library`` with a fake
  (meta) implementation, so ``torch.inference_mode``, ``torch.compile`` and
  ``torch.export`` see through it.

Inference only: a forward whose input needs a gradient raises ``RuntimeError``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import numpy as np
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

from . import _threads
from ._api import encode, matmul
from ._formats import FORMATS, Format, get_format
from ._linear import Linear as _NumpyLinear
from ._scales import Scales
from ._torch_invariant import check_supported, is_batch_invariant, make_batch_invariant
from ._torch_shard import (
    ShardedLinear,
    column_ranges,
    init_process_group,
    load_sharded,
    shard,
)
from ._weights import PackedWeights, TorchWeights, Weights
from .providers import resolve
from .providers.native import core

__all__ = ["Linear", "ShardedLinear", "column_ranges", "convert", "converted_layers",
           "init_process_group", "is_batch_invariant", "load_sharded", "make_batch_invariant",
           "set_num_threads", "shard", "torch_openmp_team"]

# How long narrowmm's pool workers spin after a call once set_num_threads gave narrowmm the
# cores of a model without PyTorch's OpenMP team (the C default is 50 us).
MODEL_SPIN_NS = 2_000_000

_BY_CODE: dict[int, Format] = {f.code: f for f in FORMATS.values()}
_WIDEN = {torch.bfloat16, torch.float16}


def _numpy_bits(weight: torch.Tensor, fmt: Format) -> np.ndarray:
    """The weight buffer as the NumPy bits narrowmm reads (int16 in torch, uint16 here)."""
    a = weight.numpy()
    return a.view(np.uint16) if fmt.itemsize == 2 else a


def _plain_scales(scales: tuple[np.ndarray, int, bool], fmt: Format,
                  out_features: int) -> Scales:
    """The Scales behind the kernels' form (one per column per block of rows, times 2^r)."""
    grid, bk, _ = scales
    plain = grid[:, :out_features] * np.float32(2.0 ** -fmt.scale_exponent)  # exact
    return Scales(plain, (bk, 1))


def _linear_arrays(xa: np.ndarray, bits: np.ndarray, bias: np.ndarray | None, fmt: Format,
                   out_features: int, packed: bool,
                   scales: tuple[np.ndarray, int, bool] | None = None) -> np.ndarray:
    """``xa`` (..., k) float32 through the layer's NumPy views: bits as the binding takes
    them ((k, n) rows, or (slivers * k, width) packed), and for a scaled format its scales
    in the kernels' form (``Weights.kernel_scales``). The chains start from the bias."""
    x2 = xa.reshape(-1, xa.shape[-1])
    out = np.empty((x2.shape[0], out_features), np.float32)
    provider, _ = resolve("matmul", fmt)  # honours use_provider and NARROWMM_* checks
    extra = () if scales is None else scales
    if provider.name == "native":  # the binding checks shapes, strides and the pack width;
        # its parts write the bias into their own blocks of out, in parallel
        if packed:
            core().matmul_packed(fmt.code, x2, bits, out_features, out, False, *extra,
                                 bias=bias)
        else:
            core().matmul(fmt.code, x2, bits, out, False, *extra, bias=bias)
    else:
        plain = None if scales is None else _plain_scales(scales, fmt, out_features)
        w = (PackedWeights(bits.reshape(-1, x2.shape[1], bits.shape[1]), out_features, fmt,
                           _pack_isa(bits.shape[1]), plain) if packed
             else Weights.from_bits(bits, fmt, plain))
        matmul(x2, w, out=out, bias=bias)
    return out.reshape(*xa.shape[:-1], out_features)


def _binding_bits(weight: torch.Tensor, fmt: Format) -> np.ndarray:
    """The weight buffer as the binding reads it: packed slivers flattened to 2-D."""
    bits = _numpy_bits(weight, fmt)
    return bits.reshape(-1, bits.shape[2]) if bits.ndim == 3 else bits


def _linear_numpy(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  format_code: int, out_features: int, packed: bool,
                  scales: torch.Tensor | None, scale_block: int,
                  finite: bool) -> torch.Tensor:
    """The operator's CPU implementation: the result is a tensor over narrowmm's output."""
    if x.dtype != torch.float32:
        raise TypeError(f"narrowmm.linear takes float32 input, got {x.dtype} (the module "
                        "narrowmm.torch.Linear widens bfloat16 and float16 itself)")
    fmt = _BY_CODE[format_code]
    ks = None if scales is None else (scales.numpy(), scale_block, finite)
    out = _linear_arrays(x.contiguous().numpy(), _binding_bits(weight, fmt),
                         None if bias is None else bias.numpy(), fmt, out_features, packed,
                         ks)
    return torch.from_numpy(out)


@torch.library.custom_op("narrowmm::linear", mutates_args=(), device_types="cpu")
def _linear_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               format_code: int, out_features: int, packed: bool,
               scales: torch.Tensor | None = None, scale_block: int = 0,
               finite: bool = False) -> torch.Tensor:
    """``x @ W.T + bias`` for float32 ``x`` of shape ``(..., in_features)``.

    ``weight`` holds narrowmm's bits: ``(in_features, out_features)`` row-major, or the
    packed slivers ``(slivers, in_features, width)`` when ``packed``; 16-bit formats are
    stored as int16, 8-bit ones as uint8. A scaled format (FP8) passes its scales in the
    kernels' form (``Weights.kernel_scales``): the grid, its block of rows, and whether the
    weights hold no NaN/Inf code."""
    return _linear_numpy(x, weight, bias, format_code, out_features, packed, scales,
                         scale_block, finite)


@_linear_op.register_fake
def _linear_fake(x, weight, bias, format_code, out_features, packed, scales=None,
                 scale_block=0, finite=False):
    return x.new_empty((*x.shape[:-1], out_features))


def _eager(x: torch.Tensor) -> bool:
    """True when nothing traces this call (no torch.compile, export or dispatch mode, and a
    plain tensor): the implementation can run without the dispatcher's ~40 us."""
    return (type(x) is torch.Tensor and not torch.compiler.is_compiling()
            and _current_dispatch_mode() is None)


def _pack_isa(width: int) -> str:
    """The ISA row a packed width belongs to now (matmul checks the width itself)."""
    c = core()
    return c.isa() if c is not None and c.pack_width() == width else f"width-{width}"


class Linear(torch.nn.Module):
    """``y = x @ W.T + b`` on narrowmm's kernels: every output is the fma chain over the
    input features in ascending order, from the bias (or +0.0), whatever the batch, the
    thread count or the CPU.

    float32 inputs give float32 outputs without a copy of ``x`` (when it is contiguous);
    bfloat16 / float16 inputs are widened exactly to float32 and the output is rounded back
    to the input's dtype. Any leading dimensions. The weights stay in their narrow format
    (a non-persistent buffer, ``weight_bits``), in narrowmm's layout, packed for the CPU
    when ``packed``.

    Build one with :meth:`from_torch` or :meth:`from_weights`.
    """

    def __init__(self, weights: Weights | PackedWeights, bias: np.ndarray | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weights.shape
        self.format: Format = weights.format
        self.packed = isinstance(weights, PackedWeights)
        bits = weights.bits.view(np.int16) if weights.format.itemsize == 2 else weights.bits
        self.register_buffer("weight_bits", torch.from_numpy(bits), persistent=False)
        # a scaled format's scales in the kernels' form (Weights.kernel_scales)
        self.scale_block, self.finite = 0, False
        scales = None
        if weights.format.scaled:
            n = self.out_features
            ld = -(-n // weights.width) * weights.width if self.packed else n
            grid, self.scale_block, self.finite = weights.kernel_scales(ld)
            scales = torch.from_numpy(grid)
        self.register_buffer("weight_scales", scales, persistent=False)
        self.register_buffer("bias", None if bias is None else torch.from_numpy(
            np.ascontiguousarray(bias, dtype=np.float32)), persistent=False)
        # (weight_bits, bias, weight_scales, the bits' and bias' NumPy views, the scales in
        # the kernels' form or None): rebuilt if a buffer is replaced
        self._views: tuple = (None, None, None, None, None, None)

    @classmethod
    def from_torch(cls, linear: torch.nn.Linear, format: str = "bf16", *,
                   pack: bool = True) -> Linear:
        """The layer of ``linear`` with its weights in ``format`` (``"bf16"``, ``"fp16"``,
        ``"f32"``, ``"e4m3fn"`` or ``"e5m2"``): float32 weights are rounded to nearest even,
        weights already in ``format`` are taken bit for bit. The FP8 formats get one scale
        per output feature, its largest weight magnitude over the format's largest finite
        value (:meth:`narrowmm.Weights.quantize`). ``pack`` stores the CPU's packed layout
        (the same bits, faster at small batches)."""
        if not isinstance(linear, torch.nn.Linear):
            raise TypeError(f"from_torch takes a torch.nn.Linear, got {type(linear).__name__}")
        fmt = get_format(format)
        weight = linear.weight.detach()
        if weight.device.type != "cpu":
            raise ValueError(f"narrowmm runs on the CPU; the weight is on {weight.device}")
        bias = None if linear.bias is None else linear.bias.detach().float().numpy()
        if fmt.scaled:  # per output feature = per column of narrowmm's (in, out) layout
            if weight.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise TypeError(f"weight dtype {weight.dtype} is not float32, bfloat16 or "
                                "float16")
            w = Weights.quantize(np.ascontiguousarray(weight.float().numpy().T), fmt,
                                 "columns")
            return cls(w.pack() if pack else w, bias)
        tw = _torch_weights(weight, fmt)
        return cls.from_weights(tw, bias, pack=pack)

    @classmethod
    def from_weights(cls, weight: TorchWeights, bias: object = None, *,
                     pack: bool = True) -> Linear:
        """The layer of a checkpoint tensor (``narrowmm.load_safetensors(path)[name]``,
        PyTorch's ``(out_features, in_features)``) and an optional bias."""
        layer = _NumpyLinear(weight, bias, pack=pack)
        return cls(layer.weights, layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad and torch.is_grad_enabled():
            raise RuntimeError("narrowmm.torch.Linear is inference-only and the input needs a "
                               "gradient: run the model under torch.inference_mode() or "
                               "torch.no_grad()")
        dtype = x.dtype
        if dtype in _WIDEN:
            x = x.float()  # exact: every bfloat16 / float16 value is a float32 value
        elif dtype != torch.float32:
            raise TypeError(f"narrowmm.torch.Linear takes float32, bfloat16 or float16 input, "
                            f"got {dtype}")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input must have shape (..., in_features) = (..., "
                             f"{self.in_features}), got {tuple(x.shape)}")
        if not x.is_contiguous():
            x = x.contiguous()
        if _eager(x):  # the implementation itself, on NumPy views made once per buffer
            # (read from _buffers: nn.Module's __getattr__ costs ~1 us a name on a slow VM)
            buffers = self._buffers
            weight_bits, bias = buffers["weight_bits"], buffers["bias"]
            scales = buffers["weight_scales"]
            if (self._views[0] is not weight_bits or self._views[1] is not bias
                    or self._views[2] is not scales):
                self._views = (weight_bits, bias, scales,
                               _binding_bits(weight_bits, self.format),
                               None if bias is None else bias.numpy(),
                               None if scales is None
                               else (scales.numpy(), self.scale_block, self.finite))
            y = torch.from_numpy(_linear_arrays(x.numpy(), self._views[3], self._views[4],
                                                self.format, self.out_features, self.packed,
                                                self._views[5]))
        else:  # traced: the registered operator, which torch.compile and export see
            y = torch.ops.narrowmm.linear(x, self.weight_bits, self.bias, self.format.code,
                                          self.out_features, self.packed, self.weight_scales,
                                          self.scale_block, self.finite)
        return y if dtype == torch.float32 else y.to(dtype)

    def weights(self) -> Weights | PackedWeights:
        """The narrowmm weights this layer computes with (sharing its buffer)."""
        bits = _numpy_bits(self.weight_bits, self.format)
        scales = (None if self.weight_scales is None else _plain_scales(
            (self.weight_scales.numpy(), self.scale_block, self.finite), self.format,
            self.out_features))
        if self.packed:
            return PackedWeights(bits, self.out_features, self.format, _pack_isa(bits.shape[2]),
                                 scales)
        return Weights.from_bits(bits, self.format, scales)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"format={self.format.name!r}, bias={self.bias is not None}, "
                f"packed={self.packed}")


def _torch_weights(weight: torch.Tensor, fmt: Format) -> TorchWeights:
    """``weight`` (out, in) in ``fmt``: bit for bit when it already is, else rounded."""
    native = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "f32"}
    if weight.dtype not in native:
        raise TypeError(f"weight dtype {weight.dtype} is not float32, bfloat16 or float16")
    weight = weight.contiguous()
    if native[weight.dtype] == fmt.name:
        return TorchWeights.wrap(weight)  # zero-copy; transpose/pack copy it once
    values = weight.float().numpy()  # exact widening of 16-bit weights
    if fmt.name == "f32":
        return TorchWeights(values, fmt)
    return TorchWeights(encode(values, fmt), fmt)


def _skipped(name: str, skip: Iterable[str]) -> bool:
    """A module is skipped when ``skip`` names it in full or names its last part."""
    return any(name == s or name.rsplit(".", 1)[-1] == s for s in skip)


def convert(model: torch.nn.Module, format: str = "bf16", *, pack: bool = True,
            skip: Iterable[str] = (), threads: bool | int = True,
            batch_invariant: bool = False) -> torch.nn.Module:
    """Replace every ``torch.nn.Linear`` in ``model`` by a :class:`Linear`, in place.

    Args:
        model: any module; its ``nn.Linear`` children at any depth are replaced.
        format: ``"bf16"``, ``"fp16"``, ``"f32"``, or FP8 ``"e4m3fn"`` / ``"e5m2"`` with
            one scale per output feature (:meth:`Linear.from_torch`). A model already in
            that format keeps every weight bit.
        pack: store the CPU's packed layout (same bits, faster at small batches).
        skip: module names left alone: a full name (``"encoder.layer.0.output.dense"``) or
            a last part (``"lm_head"``, every module so named).

        batch_invariant: also replace the model's other ops that can change a row's bits
            with the batch, padding, threads or CPU (attention, RMSNorm, SiLU, the rotary
            embedding; :func:`make_batch_invariant`), so that every logit of a prompt is the
            same whatever runs beside it. ``transformers`` Llama-architecture models only;
            nothing may be skipped. docs/invariance.md lists what it replaces and costs.

    Returns:
        ``model``. The converted layers' float parameters are dropped from it (freed unless
        something else, a tied embedding say, still holds them).

    Threads: unless ``threads`` is False, :func:`set_num_threads` gives the model
    ``threads`` threads (every CPU for True): narrowmm runs its parts on PyTorch's OpenMP
    team where it can, or else on its own pool with PyTorch's set to 1 thread, so that two
    pools never fight over the cores (see there for figures).
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


@functools.cache
def torch_openmp_team() -> tuple[int | None, str]:
    """Where PyTorch's intra-op OpenMP team can be entered: ``(address of GOMP_parallel, the
    library's path)``, or ``(None, why not)``.

    Linux only: the libgomp that PyTorch's ops run on is found among the libraries this
    process has mapped (PyTorch's own copy first) and opened without loading anything new.
    Looked up once per process (PyTorch loads its OpenMP library when it is imported).
    """
    import ctypes
    import os

    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None, "PyTorch's intra-op backend is not OpenMP"
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            mapped = {line.split(maxsplit=5)[5].strip() for line in f
                      if len(line.split(maxsplit=5)) == 6}
    except OSError:
        return None, "no /proc/self/maps to find PyTorch's libgomp in"
    gomps = sorted(p for p in mapped if os.path.basename(p).startswith("libgomp"))
    package = os.path.dirname(torch.__file__)
    own = (os.path.join(package, "lib") + os.sep, package + ".libs" + os.sep)  # wheel, vendored
    ours = [p for p in gomps if p.startswith(own)]
    if ours:
        gomps = ours
    if len(gomps) != 1:
        return None, (f"{len(gomps)} libgomp libraries are loaded; which one PyTorch uses is "
                      "not known" if gomps else "PyTorch's OpenMP library is not libgomp")
    try:
        lib = ctypes.CDLL(gomps[0], mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        address = ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value
    except (OSError, AttributeError) as exc:
        return None, f"GOMP_parallel not found in {gomps[0]}: {exc}"
    return address, gomps[0]


def set_num_threads(n: int | None = None, *, shared_team: bool = True) -> None:
    """Give a model run through ``narrowmm.torch`` ``n`` threads (default: every CPU this
    process may use) without two thread pools fighting over the cores.

    After each op PyTorch's OpenMP workers spin for milliseconds waiting for the next one,
    on the cores narrowmm's own pool then needs for the layer that follows: two teams of
    spinning threads on the same cores take turns on them. So:

    - ``shared_team=True`` (where PyTorch runs on libgomp, as its Linux wheels do): PyTorch
      gets ``n`` intra-op threads and narrowmm runs its parallel parts on PyTorch's own
      OpenMP team (:func:`torch_openmp_team`), so the model's other ops (attention, GELU,
      norms) run on ``n`` threads too and one team serves both. The parts are the same as
      on narrowmm's pool, so no bit changes. Measured on all-MiniLM-L6-v2 (2-core AMD EPYC
      Zen 3, batch 32, ``model.encode``, medians of 4 interleaved rounds,
      ``tools/perf/shared_team_ab.py``): 2 threads 120.8 ms against 132.0 ms with
      narrowmm's pool and PyTorch on 1 thread, and 123.1 ms for PyTorch float32 on 2.
    - otherwise (or where the team cannot be found): narrowmm's pool gets ``n`` threads and
      PyTorch's team 1, and narrowmm's workers spin 2 ms after a call instead of 50 us
      (:data:`MODEL_SPIN_NS`) so that they are still awake when the next layer comes.
      Measured on the same model: torch 2 + narrowmm 2 threads took 188 ms, torch 1 +
      narrowmm 2 126 ms; on a Llama-3.2-1B-shaped decode at 2 threads the longer spin took
      the linear layers from 75 to 69 ms a token.

    ``narrowmm.runtime_info()["omp_team"]`` says which one is in use. Set
    ``torch.set_num_threads`` yourself afterwards to choose otherwise.
    """
    count = _threads.available_cpus() if n is None else n
    _threads.set_num_threads(count)
    c = core()
    address = torch_openmp_team()[0] if shared_team else None
    if c is not None:
        c.set_omp_team(address or 0)
    if address is not None:
        torch.set_num_threads(count)
        return
    torch.set_num_threads(1)
    if c is not None:
        c.set_spin_ns(MODEL_SPIN_NS)
