"""Reading ``.safetensors`` checkpoints, memory-mapped and zero-copy.

The format: an 8-byte little-endian header length N, N bytes of UTF-8 JSON mapping each
tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to
the data that follows the header; an optional ``"__metadata__"`` maps strings to strings),
then the data. The ``safetensors`` package cannot give NumPy a bfloat16 tensor, so this
module parses the header itself and validates all of it before any tensor is handed out:
every offset lies inside the file, no two tensors overlap, the data is covered without
holes, and each byte range is exactly shape x item size. Nothing is read out of bounds.
"""

from __future__ import annotations

import json
import math
import mmap
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from .._scales import Scales
from .._weights import TorchWeights
from ._files import missing_tensor, open_regular_file

MAX_HEADER_BYTES = 100_000_000  # the format's own limit
_MAX_ARRAY_BYTES = 2**63 - 1  # NumPy's limit on an array's size in bytes (64-bit intp)

# every dtype the format defines -> (item size in bytes, what narrowmm makes of it)
_DTYPES: dict[str, tuple[int, str | None]] = {
    "F32": (4, "f32"), "F16": (2, "fp16"), "BF16": (2, "bf16"),
    "F64": (8, None), "I64": (8, None), "U64": (8, None), "I32": (4, None), "U32": (4, None),
    "I16": (2, None), "U16": (2, None), "I8": (1, None), "U8": (1, None), "BOOL": (1, None),
    "F8_E4M3": (1, "e4m3fn"), "F8_E5M2": (1, "e5m2"), "F8_E8M0": (1, None),
}
# the float dtypes a scale tensor may have, read exactly as float32
_SCALE_DTYPES = ("F32", "F16", "BF16")
_NUMPY = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
          "I64": np.int64, "U64": np.uint64, "I32": np.int32, "U32": np.uint32,
          "I16": np.int16, "U16": np.uint16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_,
          "F8_E4M3": np.uint8, "F8_E5M2": np.uint8, "F8_E8M0": np.uint8}


class SafetensorsError(ValueError):
    """A malformed or unsupported safetensors file or tensor."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte offsets in the file (not relative to the data)
    end: int

    @property
    def format(self) -> str | None:
        """narrowmm's format name for this dtype, or None if narrowmm does not load it."""
        return _DTYPES[self.dtype][1]


def _fail(path: str, problem: str) -> SafetensorsError:
    return SafetensorsError(f"{path}: {problem}")


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object that names a key twice means two things; refuse it rather than keep
    whichever came last, as json.loads would."""
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _BadNumber(Exception):
    pass


# No dimension or offset of a real file needs more digits than 2^64 has; Python's own limit
# (4300 digits) would raise a ValueError that does not name the file.
_MAX_INT_DIGITS = 20


def _small_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise _BadNumber(f"an integer of {len(text)} digits (at most {_MAX_INT_DIGITS})")
    return int(text)


def _no_constant(text: str) -> float:
    raise _BadNumber(f"{text}, which JSON does not allow")


def _parse_header(path: str, raw: bytes, file_size: int) -> tuple[dict[str, TensorInfo],
                                                                    dict[str, str]]:
    if len(raw) < 8:
        raise _fail(path, f"truncated: {len(raw)} bytes, a header length needs 8")
    n = int.from_bytes(raw[:8], "little")
    if n > MAX_HEADER_BYTES:
        raise _fail(path, f"header length {n} exceeds the format's limit of "
                          f"{MAX_HEADER_BYTES} bytes")
    if 8 + n > file_size:
        raise _fail(path, f"header length {n} runs past the end of the file "
                          f"({file_size} bytes)")
    try:
        text = raw[8:8 + n].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(path, f"header is not UTF-8 ({exc.reason} at byte {8 + exc.start})") from None
    try:
        header = json.loads(text, object_pairs_hook=_unique_keys, parse_int=_small_int,
                            parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise _fail(path, f"header is not JSON ({exc.msg} at character {exc.pos})") from None
    except _DuplicateKey as exc:
        raise _fail(path, f"header names {exc.args[0]!r} twice") from None
    except _BadNumber as exc:
        raise _fail(path, f"header holds {exc.args[0]}") from None
    except RecursionError:  # [[[[... nested deeper than the parser's stack
        raise _fail(path, "header nests too deeply (a valid header nests 3 levels)") from None
    if not isinstance(header, dict):
        raise _fail(path, f"header must be a JSON object, got {type(header).__name__}")
    data_start = 8 + n
    data_size = file_size - data_start
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise _fail(path, "__metadata__ must map strings to strings")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        tensors[name] = _parse_entry(path, name, entry, data_start, data_size)
    # the data must be covered exactly: sorted ranges touch end to begin, no overlap
    covered = 0
    for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        start = t.begin - data_start
        if start < covered:
            other = next(o.name for o in tensors.values()
                         if o is not t and o.begin < t.end and t.begin < o.end)
            raise _fail(path, f"tensor {t.name!r} overlaps tensor {other!r}")
        if start > covered:
            raise _fail(path, f"bytes {covered}..{start} of the data belong to no tensor "
                              f"(a hole before {t.name!r})")
        covered = t.end - data_start
    if covered != data_size:
        raise _fail(path, f"the last {data_size - covered} bytes of the data belong to no "
                          "tensor")
    return tensors, metadata


def _parse_entry(path: str, name: str, entry: object, data_start: int,
                 data_size: int) -> TensorInfo:
    where = f"tensor {name!r}"
    if not isinstance(entry, dict):
        raise _fail(path, f"{where}: entry must be an object, got {type(entry).__name__}")
    dtype = entry.get("dtype")
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise _fail(path, f"{where}: unknown dtype {dtype!r}")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise _fail(path, f"{where}: shape must be a list of non-negative integers, "
                          f"got {shape!r}")
    offsets = entry.get("data_offsets")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(
            isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise _fail(path, f"{where}: data_offsets must be [begin, end], got {offsets!r}")
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
        raise _fail(path, f"{where}: data_offsets [{begin}, {end}] lie outside the "
                          f"{data_size} bytes of data")
    itemsize = _DTYPES[dtype][0]
    # what NumPy can represent: the product of the non-zero dimensions, in bytes, must fit
    # in a signed 64-bit size (a zero dimension does not excuse [10**30, 0])
    if math.prod(d for d in shape if d) * itemsize > _MAX_ARRAY_BYTES:
        raise _fail(path, f"{where}: shape {tuple(shape)} of {dtype} is larger than an array "
                          "can be")
    nbytes = math.prod(shape) * itemsize
    if end - begin != nbytes:
        raise _fail(path, f"{where}: shape {tuple(shape)} of {dtype} needs {nbytes} bytes, "
                          f"data_offsets hold {end - begin}")
    return TensorInfo(name, dtype, tuple(shape), data_start + begin, data_start + end)


class SafetensorsFile(Mapping[str, TorchWeights]):
    """A memory-mapped checkpoint: a read-only mapping from tensor name to
    :class:`TorchWeights`.

    Opening reads and validates the header only; tensor data stays on disk until a kernel
    reads it. ``file[name]`` gives a 2-D F16 / BF16 / F32 / F8_E4M3 / F8_E5M2 tensor as a
    zero-copy :class:`TorchWeights`: PyTorch's ``(out_features, in_features)`` layout, the
    one checkpoints store. ``nm.Linear(file[name])`` computes ``x @ W.T``; narrowmm's own
    ``(in, out)`` :class:`Weights` take an explicit ``file[name].transpose()``. Other
    tensors are listed (``info``) and readable as arrays (:meth:`array`); asking for them as
    weights raises :class:`SafetensorsError` saying why.

    An FP8 weight comes with its scales, found by the two conventions Hugging Face
    checkpoints use (:meth:`scales`): ``<name>_scale_inv``, a grid of ``fp8_block``
    blocks (DeepSeek-V3, Qwen3-FP8: 128 x 128), or ``<name>_scale``, one scale or one per
    output feature (compressed-tensors, FBGEMM). Either way the weight is ``q * scale``.

    Args:
        path: the file.
        fp8_block: ``(out, in)`` size of the blocks of ``*_scale_inv`` grids.
    """

    def __init__(self, path: str | os.PathLike[str], *,
                 fp8_block: tuple[int, int] = (128, 128)) -> None:
        self.path = os.fspath(path)
        if len(fp8_block) != 2 or any(not isinstance(b, int) or b <= 0 for b in fp8_block):
            raise ValueError(f"fp8_block must be two positive sizes, got {fp8_block!r}")
        self.fp8_block = tuple(fp8_block)
        fd, _ = open_regular_file(self.path, SafetensorsError)
        try:
            f = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        with f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else 0
            raw = head + f.read(min(n, MAX_HEADER_BYTES + 1, max(size - 8, 0)))
            self.info, self.metadata = _parse_header(self.path, raw, size)
            # mmap cannot map an empty file; a header-only file has no data to map
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None

    def array(self, name: str) -> np.ndarray:
        """The tensor as a read-only NumPy view of the file (BF16 as uint16 bits)."""
        t = self._entry(name)
        count = math.prod(t.shape)
        if count == 0 or self._map is None:
            return np.zeros(t.shape, _NUMPY[t.dtype])
        a = np.frombuffer(self._map, dtype=_NUMPY[t.dtype], count=count, offset=t.begin)
        return a.reshape(t.shape)

    def _entry(self, name: str) -> TensorInfo:
        try:
            return self.info[name]
        except KeyError:
            raise missing_tensor(self.path, name, self.info) from None

    def release(self, name: str) -> None:
        """Tell the OS that the mapped pages of tensor ``name`` are not needed now.

        After a layer made its own copy (transposed or packed), its mapped view still counts
        in the process's resident memory until the OS evicts it; releasing drops those pages
        at once, so a loader holds about one copy of the weights, not two. Views of the
        tensor stay valid: a later read faults the pages back in from the file."""
        t = self._entry(name)
        if self._map is None or t.end == t.begin or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        begin = t.begin - t.begin % page
        self._map.madvise(mmap.MADV_DONTNEED, begin, t.end - begin)

    def __getitem__(self, name: str) -> TorchWeights:
        t = self._entry(name)
        if t.format is None:
            raise SafetensorsError(f"{self.path}: tensor {name!r} has dtype {t.dtype}; "
                                   "narrowmm loads F16, BF16, F32, F8_E4M3 and F8_E5M2 "
                                   "weights")
        if len(t.shape) != 2:
            raise SafetensorsError(f"{self.path}: tensor {name!r} has shape {t.shape}; "
                                   "weights must be 2-D (use .array() for other tensors)")
        bits = self.array(name)
        if not t.dtype.startswith("F8_"):
            return TorchWeights(bits.view(np.uint16) if t.dtype == "F16" else bits, t.format)
        try:
            return TorchWeights(bits, t.format, self.scales(name))
        except SafetensorsError:
            raise
        except ValueError as exc:  # scales the format cannot take (NaN, too large)
            raise SafetensorsError(f"{self.path}: the scales of {name!r}: {exc}") from None

    def _scale_values(self, name: str) -> np.ndarray:
        t = self._entry(name)
        if t.dtype not in _SCALE_DTYPES:
            raise SafetensorsError(f"{self.path}: scale tensor {name!r} has dtype {t.dtype}; "
                                   f"expected one of {', '.join(_SCALE_DTYPES)}")
        a = self.array(name)
        if t.dtype == "BF16":
            return (a.astype(np.uint32) << 16).view(np.float32)
        return a.astype(np.float32)

    def scales(self, name: str) -> Scales:
        """The :class:`Scales` of FP8 weight ``name``, in its ``(out, in)`` orientation.

        ``<name>_scale_inv`` (DeepSeek's name: the factor that undoes the quantization) is
        a ``(ceil(out / bo), ceil(in / bi))`` grid for ``fp8_block = (bo, bi)``;
        ``<name>_scale`` holds one scale (shape ``()`` or ``(1,)``) or one per output
        feature (``(out,)`` or ``(out, 1)``). With neither, the weights are taken as they
        are (scale 1.0).

        Raises:
            SafetensorsError: a scale tensor of the wrong dtype or shape.
        """
        out, inp = self._entry(name).shape
        if name + "_scale_inv" in self.info:
            sname = name + "_scale_inv"
            grid = self._scale_values(sname)
            bo, bi = self.fp8_block
            want = (-(-out // bo), -(-inp // bi))
            if grid.shape != want:
                raise SafetensorsError(
                    f"{self.path}: {sname!r} has shape {grid.shape}, but ({out}, {inp}) "
                    f"weights in {bo} x {bi} blocks need {want}; open the file with the "
                    f"checkpoint's block size (load_safetensors(path, fp8_block=...))")
            return Scales.blocks(grid, (bo, bi))
        if name + "_scale" in self.info:
            sname = name + "_scale"
            v = self._scale_values(sname)
            if v.size == 1:
                return Scales.tensor(float(v.reshape(-1)[0]))
            if v.shape in ((out,), (out, 1)):
                return Scales(v.reshape(out, 1), (1, 0))
            raise SafetensorsError(
                f"{self.path}: {sname!r} has shape {v.shape}; expected one scale or one per "
                f"output feature ({out},) or ({out}, 1)")
        return Scales.tensor(1.0)

    def __iter__(self) -> Iterator[str]:
        return iter(self.info)

    def __len__(self) -> int:
        return len(self.info)

    def __repr__(self) -> str:
        return f"<SafetensorsFile {self.path!r}: {len(self)} tensors>"


def load_safetensors(path: str | os.PathLike[str], *,
                     fp8_block: tuple[int, int] = (128, 128)) -> SafetensorsFile:
    """Open a ``.safetensors`` file, memory-mapped: a mapping name -> :class:`TorchWeights`
    (PyTorch's ``(out_features, in_features)`` layout). FP8 weights come with their scales
    (see :class:`SafetensorsFile`; ``fp8_block`` is the block of ``*_scale_inv`` grids).

    Raises :class:`SafetensorsError` (a ValueError) naming the tensor and the problem for a
    malformed file: truncated, header length past the end, a non-UTF-8 or non-JSON header,
    an unknown dtype, offsets out of range, overlapping or leaving holes, or a shape that
    does not match its byte range.
    """
    return SafetensorsFile(path, fp8_block=fp8_block)
