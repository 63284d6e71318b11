"""The narrowmm layer for PyTorch: :class:`Linear` (a ``torch.nn.Module``) and the
operator ``torch.ops.narrowmm.linear`` it runs through when traced (a fake implementation
included, so ``torch.compile`` and ``torch.export`` see through it)."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

from .._codecs import encode
from .._formats import FORMATS, Format, get_format
from .._linear import Linear as ArrayLinear
from .._weights import GridScales, PackedWeights, TorchWeights, Weights
from ..providers import resolve
from ..providers.native import core

_BY_CODE: dict[int, Format] = {f.code: f for f in FORMATS.values()}
_WIDEN = {torch.bfloat16, torch.float16}


def _numpy_bits(weight: torch.Tensor, fmt: Format) -> np.ndarray:
    """The weight buffer as the NumPy bits narrowmm reads (int16 in torch, uint16 here)."""
    a = weight.numpy()
    return a.view(np.uint16) if fmt.itemsize == 2 else a


def buffer_grid(grid: np.ndarray) -> torch.Tensor:
    """A grid of scales as a module buffer: its bits as int16 (a float16 grid) or int32 (a
    float32 one), a factored grid as it is (int8), so that ``module.half()``, ``.float()``
    or ``.to(dtype)``, which cast floating buffers, leave its values (and the layer's bits)
    alone."""
    if grid.dtype == np.int8:
        return torch.from_numpy(grid)
    return torch.from_numpy(grid.view(np.int16) if grid.dtype == np.float16
                            else grid.view(np.int32))


def numpy_grid(grid: torch.Tensor) -> np.ndarray:
    """The float16, float32 or factored (int8) grid a :func:`buffer_grid` buffer holds."""
    a = grid.numpy()
    return a.view({np.dtype(np.int16): np.float16, np.dtype(np.int32): np.float32}.get(
        a.dtype, a.dtype))


def _layer_weights(weight: torch.Tensor, fmt: Format, out_features: int, packed: bool,
                   scales: torch.Tensor | None, scale_block: int,
                   finite: bool) -> Weights | PackedWeights:
    """The narrowmm weights over a layer's buffers, without a copy: the bits ((in, out) rows,
    or the (slivers, in, width) packed ones) and, for a scaled format, the scales as the
    layer stores them, in the kernels' form (``Weights.kernel_scales``: grid, block of
    rows, no NaN/Inf code), handed to the weights as they are (the grid is stored as its
    int16 or int32 bits, so that ``module.half()`` or ``.float()`` leaves it alone)."""
    bits = _numpy_bits(weight, fmt)
    plain = grid = offsets = None
    if scales is not None:  # read from the grid when asked, not copied (GridScales)
        grid = numpy_grid(scales)
        parts = 2 if fmt.offsets else 1
        k = (bits.shape[1] if packed else bits.shape[0]) * fmt.kpack
        plain = GridScales(grid, 0, parts, out_features, scale_block, fmt.scale_exponent, k)
        offsets = (GridScales(grid, 1, parts, out_features, scale_block, k=k) if fmt.offsets
                   else None)
    w = (PackedWeights(bits, out_features, fmt, _pack_isa(bits.shape[2], fmt), plain, offsets)
         if packed else Weights.from_bits(bits, fmt, plain, offsets))
    if grid is not None:
        w.preset_kernel_scales(grid, scale_block, finite)
    return w


def _linear_arrays(xa: np.ndarray, w: Weights | PackedWeights,
                   bias: np.ndarray | None) -> np.ndarray:
    """``xa`` (..., k) float32 times the layer's weights, the chains starting from the bias:
    the matmul kernel that serves the format now (``use_provider`` and the NARROWMM_*
    variables apply), called as ``narrowmm.matmul`` calls it."""
    x2 = xa.reshape(-1, xa.shape[-1])
    n = w.shape[1]
    out = np.empty((x2.shape[0], n), np.float32)
    _, kernel = resolve("matmul", w.format)
    kernel.fn(x2, w, out, False, bias)
    return out.reshape(*xa.shape[:-1], n)


def _linear_impl(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  format_code: int, out_features: int, packed: bool,
                  scales: torch.Tensor | None, scale_block: int,
                  finite: bool) -> torch.Tensor:
    """The operator's CPU implementation: the result is a tensor over narrowmm's output."""
    if x.dtype != torch.float32:
        raise TypeError(f"narrowmm.linear takes float32 input, got {x.dtype} (the module "
                        "narrowmm.torch.Linear widens bfloat16 and float16 itself)")
    w = _layer_weights(weight, _BY_CODE[format_code], out_features, packed, scales,
                       scale_block, finite)
    out = _linear_arrays(x.contiguous().numpy(), w,
                         None if bias is None else bias.contiguous().numpy())
    return torch.from_numpy(out)


@torch.library.custom_op("narrowmm::linear", mutates_args=(), device_types="cpu")
def _linear_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               format_code: int, out_features: int, packed: bool,
               scales: torch.Tensor | None = None, scale_block: int = 0,
               finite: bool = False) -> torch.Tensor:
    """``x @ W.T + bias`` for float32 ``x`` of shape ``(..., in_features)``.

    ``weight`` holds narrowmm's bits: ``(in_features, out_features)`` row-major, or the
    packed slivers ``(slivers, in_features, width)`` when ``packed``; 16-bit formats are
    stored as int16, 8-bit ones as uint8. A scaled format (FP8, GGUF's) passes its scales in
    the kernels' form (``Weights.kernel_scales``; the grid as its int16 bits for float16,
    int32 for float32): the grid, its block of rows, and whether the weights hold no NaN/Inf
    code."""
    return _linear_impl(x, weight, bias, format_code, out_features, packed, scales,
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


def _pack_isa(width: int, fmt: Format) -> str:
    """The ISA row a packed width of ``fmt`` belongs to now (matmul checks the width
    itself)."""
    c = core()
    return (c.isa() if c is not None and c.pack_width(fmt.code) == width
            else f"width-{width}")


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
        if weights.format.scaled:  # the default width: n, or whole slivers when packed
            grid, self.scale_block, self.finite = weights.kernel_scales()
            scales = buffer_grid(grid)  # as integer bits: dtype casts keep them
        self.register_buffer("weight_scales", scales, persistent=False)
        self.register_buffer("bias", None if bias is None else torch.from_numpy(
            np.ascontiguousarray(bias, dtype=np.float32)), persistent=False)
        # (weight_bits, bias, weight_scales, the narrowmm weights over them, the bias'
        # NumPy view): rebuilt if a buffer is replaced
        self._views: tuple = (None, None, None, None, None)

    @classmethod
    def from_torch(cls, linear: torch.nn.Linear, format: str = "bf16", *,
                   pack: bool = True) -> Linear:
        """The layer of ``linear`` with its weights in ``format`` (``"bf16"``, ``"fp16"``,
        ``"f32"``, ``"e4m3fn"``, ``"e5m2"`` or a GGUF format, ``"q8_0"``, ``"q4_0"``,
        ``"q4_1"``, ``"q5_1"``): float32 weights are rounded to nearest even, weights
        already in ``format`` are taken bit for bit. The FP8 formats get one scale per
        output feature, its largest weight magnitude over the format's largest finite
        value; the GGUF formats get GGUF's blocks of 32 input features
        (:meth:`narrowmm.Weights.quantize`). ``pack`` stores the CPU's packed layout (the
        same bits, faster at small batches)."""
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
            w = Weights.quantize(np.ascontiguousarray(weight.float().numpy().T), fmt)
            return cls(w.pack() if pack else w, bias)
        tw = _torch_weights(weight, fmt)
        return cls.from_weights(tw, bias, pack=pack)

    @classmethod
    def from_weights(cls, weight: TorchWeights, bias: object = None, *,
                     pack: bool = True) -> Linear:
        """The layer of a checkpoint tensor (``narrowmm.load_safetensors(path)[name]``,
        PyTorch's ``(out_features, in_features)``) and an optional bias."""
        layer = ArrayLinear(weight, bias, pack=pack)
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
                self._views = (weight_bits, bias, scales, self.weights(),
                               None if bias is None else bias.contiguous().numpy())
            y = torch.from_numpy(_linear_arrays(x.numpy(), self._views[3], self._views[4]))
        else:  # traced: the registered operator, which torch.compile and export see
            y = torch.ops.narrowmm.linear(x, self.weight_bits, self.bias, self.format.code,
                                          self.out_features, self.packed, self.weight_scales,
                                          self.scale_block, self.finite)
        return y if dtype == torch.float32 else y.to(dtype)

    def weights(self) -> Weights | PackedWeights:
        """The narrowmm weights this layer computes with (sharing its buffer)."""
        return _layer_weights(self.weight_bits, self.format, self.out_features, self.packed,
                              self.weight_scales, self.scale_block, self.finite)

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
