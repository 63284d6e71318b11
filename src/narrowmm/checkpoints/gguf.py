"""Reading GGUF files (llama.cpp's format), memory-mapped, every field checked.

The format (versions 2 and 3, little-endian): the magic ``GGUF``, a uint32 version, uint64
counts of tensors and of metadata entries, the metadata (a string key, a uint32 value type,
the value: integers, floats, bools, strings of a uint64 length, arrays of a type and a
uint64 count, arrays nested), then one entry per tensor (name, uint32 dimension count, that
many uint64 dimensions ``ne`` with ``ne[0]`` the innermost, a uint32 ``ggml_type``, a uint64
offset into the data), padding to ``general.alignment`` (32 unless set), and the data.

Everything is validated before any tensor is handed out: every count and length against
the bytes that are left, so a lying count cannot make the reader allocate or loop for
nothing; nesting, dimensions and offsets against their limits; each tensor's bytes inside
the data, aligned, not overlapping another's. A malformed file raises :class:`GGUFError`
naming the file and the field, never reads outside the map.

Tensors come back in PyTorch's reading, ``(out_features, in_features)``: GGUF's ``ne`` is
innermost first, so a 2-D tensor of ``ne = [in, out]`` is an ``(out, in)`` array.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._formats import get_format
from .._scales import Scales
from .._weights import TorchWeights
from ._files import missing_tensor, open_regular_file
from ._gguf_blocks import as_torch_weights, convert

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_NESTING = 8  # arrays of arrays: real files nest 1 level
_MAX_ARRAY_BYTES = 2**63 - 1


class GGUFError(ValueError):
    """A malformed or unsupported GGUF file or tensor."""


@dataclass(frozen=True)
class GGMLType:
    """A tensor type of ggml: elements per block and bytes per block (1 and the item size
    for the plain types), and the narrowmm format its tensors load as (None: listed and
    readable as raw bytes with :meth:`GGUFFile.array`, not yet computed on)."""

    name: str
    block_size: int
    type_size: int
    format: str | None = None


# ggml's type codes (ggml.h, enum ggml_type). Removed codes (4, 5: Q4_2, Q4_3; 31-33:
# Q4_0_4_4 and the other repacked ones, which files no longer hold) are unknown here.
GGML_TYPES: dict[int, GGMLType] = {
    0: GGMLType("F32", 1, 4, "f32"), 1: GGMLType("F16", 1, 2, "fp16"),
    2: GGMLType("Q4_0", 32, 18, "q4_0"), 3: GGMLType("Q4_1", 32, 20, "q4_1"),
    6: GGMLType("Q5_0", 32, 22, "q8_0"), 7: GGMLType("Q5_1", 32, 24, "q5_1"),
    8: GGMLType("Q8_0", 32, 34, "q8_0"), 9: GGMLType("Q8_1", 32, 36),
    10: GGMLType("Q2_K", 256, 84, "q4_1"), 11: GGMLType("Q3_K", 256, 110, "q8_0"),
    12: GGMLType("Q4_K", 256, 144, "q4_1"), 13: GGMLType("Q5_K", 256, 176, "q5_1"),
    14: GGMLType("Q6_K", 256, 210, "q8_0"), 15: GGMLType("Q8_K", 256, 292),
    16: GGMLType("IQ2_XXS", 256, 66), 17: GGMLType("IQ2_XS", 256, 74),
    18: GGMLType("IQ3_XXS", 256, 98), 19: GGMLType("IQ1_S", 256, 50),
    20: GGMLType("IQ4_NL", 32, 18, "q8_0"), 21: GGMLType("IQ3_S", 256, 110),
    22: GGMLType("IQ2_S", 256, 82), 23: GGMLType("IQ4_XS", 256, 136, "q8_0"),
    24: GGMLType("I8", 1, 1), 25: GGMLType("I16", 1, 2), 26: GGMLType("I32", 1, 4),
    27: GGMLType("I64", 1, 8), 28: GGMLType("F64", 1, 8), 29: GGMLType("IQ1_M", 256, 56),
    30: GGMLType("BF16", 1, 2, "bf16"), 34: GGMLType("TQ1_0", 256, 54),
    35: GGMLType("TQ2_0", 256, 66), 39: GGMLType("MXFP4", 32, 17),
    40: GGMLType("NVFP4", 64, 36), 41: GGMLType("Q1_0", 128, 18),
}
# the types that load as weights, as the errors for the others list them
LOADABLE_TYPES = ", ".join(t.name for t in GGML_TYPES.values() if t.format)
# what .array() gives for a plain type (block types: their raw bytes, uint8)
_NUMPY = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
          "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64}

# metadata value types: code -> (name, struct format or None for string / array)
_VALUE_TYPES: dict[int, tuple[str, str | None]] = {
    0: ("UINT8", "<B"), 1: ("INT8", "<b"), 2: ("UINT16", "<H"), 3: ("INT16", "<h"),
    4: ("UINT32", "<I"), 5: ("INT32", "<i"), 6: ("FLOAT32", "<f"), 7: ("BOOL", "<B"),
    8: ("STRING", None), 9: ("ARRAY", None), 10: ("UINT64", "<Q"), 11: ("INT64", "<q"),
    12: ("FLOAT64", "<d"),
}
_STRING, _ARRAY, _BOOL = 8, 9, 7
# fixed-size element types as NumPy dtypes, for reading long arrays in one go
_ARRAY_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4",
                 10: "<u8", 11: "<i8", 12: "<f8"}


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor's entry: its name, GGUF dimensions (``ne``, innermost first), type, and
    where its bytes lie in the file."""

    name: str
    ne: tuple[int, ...]
    type: GGMLType
    begin: int  # byte offsets in the file
    end: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The NumPy / PyTorch shape: ``ne`` reversed (outermost first)."""
        return tuple(reversed(self.ne))

    @property
    def format(self) -> str | None:
        """narrowmm's format for this tensor type, or None if narrowmm does not load it."""
        return self.type.format


class _Reader:
    """Little-endian fields from a bytes-like object, each checked against its end; every
    problem raises GGUFError naming the file and the field being read."""

    def __init__(self, path: str, buf: Any, size: int) -> None:
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def fail(self, problem: str) -> GGUFError:
        return GGUFError(f"{self.path}: {problem}")

    def take(self, n: int, what: str) -> bytes:
        if n > self.size - self.pos:
            raise self.fail(f"truncated: {what} needs {n} bytes at offset {self.pos}, the "
                            f"file has {self.size - self.pos} left")
        out = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return out

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def u32(self, what: str) -> int:
        return self.scalar("<I", what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", what)

    def string(self, what: str) -> str:
        n = self.u64(f"the length of {what}")
        if n > self.size - self.pos:
            raise self.fail(f"{what}: a string of {n} bytes runs past the end of the file "
                            f"({self.size - self.pos} bytes left at offset {self.pos})")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not UTF-8 ({exc.reason} at byte {exc.start} of the "
                            "string)") from None

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype not in _VALUE_TYPES:
            raise self.fail(f"{what}: unknown value type {vtype} (GGUF defines 0..12)")
        _name, fmt = _VALUE_TYPES[vtype]
        if fmt is not None:
            v = self.scalar(fmt, what)
            if vtype == _BOOL:
                if v not in (0, 1):
                    raise self.fail(f"{what}: a BOOL holds {v}, not 0 or 1")
                return bool(v)
            return v
        if vtype == _STRING:
            return self.string(what)
        if depth >= MAX_NESTING:
            raise self.fail(f"{what}: arrays nest deeper than {MAX_NESTING} levels")
        etype = self.u32(f"the element type of {what}")
        count = self.u64(f"the element count of {what}")
        if etype not in _VALUE_TYPES:
            raise self.fail(f"{what}: unknown array element type {etype} (GGUF defines "
                            "0..12)")
        # the smallest an element can be: its fixed size, a string's length, an array's
        # type and count; a count that cannot fit in what is left is a lie
        least = (struct.calcsize(_VALUE_TYPES[etype][1]) if _VALUE_TYPES[etype][1]
                 else 8 if etype == _STRING else 12)
        left = self.size - self.pos
        if count > left // least:
            raise self.fail(f"{what}: an array of {count} {_VALUE_TYPES[etype][0]} elements "
                            f"needs at least {count * least} bytes, the file has {left} "
                            f"left at offset {self.pos}")
        if etype in _ARRAY_DTYPES:
            raw = self.take(count * least, what)
            return np.frombuffer(raw, dtype=_ARRAY_DTYPES[etype]).tolist()
        if etype == _BOOL:
            raw = self.take(count, what)
            if any(b > 1 for b in raw):
                raise self.fail(f"{what}: a BOOL element is not 0 or 1")
            return [bool(b) for b in raw]
        return [self.value(etype, f"{what}[{i}]", depth + 1) for i in range(count)]


def _parse(path: str, buf: Any, size: int) -> tuple[int, dict[str, Any],
                                                      dict[str, GGUFTensorInfo], int]:
    r = _Reader(path, buf, size)
    magic = r.take(4, "the magic")
    if magic != MAGIC:
        raise r.fail(f"not a GGUF file: the magic is {magic!r}, not {MAGIC!r}")
    version = r.u32("the version")
    if version not in VERSIONS:
        if version & 0xFFFF == 0 and (version >> 24) in VERSIONS:
            raise r.fail(f"a big-endian GGUF file (version {version >> 24}); narrowmm "
                         "reads little-endian ones")
        raise r.fail(f"GGUF version {version} is not supported (narrowmm reads "
                     f"{', '.join(map(str, VERSIONS))})")
    n_tensors = r.u64("the tensor count")
    n_kv = r.u64("the metadata count")
    # a key is at least 8 + 4 + 1 bytes, a tensor entry 8 + 4 + 4 + 8
    if n_kv > (size - r.pos) // 13:
        raise r.fail(f"the metadata count {n_kv} cannot fit in the {size - r.pos} bytes left")
    metadata: dict[str, Any] = {}
    for i in range(n_kv):
        key = r.string(f"metadata key {i}")
        if key in metadata:
            raise r.fail(f"metadata key {key!r} appears twice")
        vtype = r.u32(f"the value type of {key!r}")
        metadata[key] = r.value(vtype, f"metadata {key!r}")
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if (isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0
            or alignment & (alignment - 1)):
        raise r.fail(f"general.alignment must be a power of two, got {alignment!r}")
    if n_tensors > (size - r.pos) // 24:
        raise r.fail(f"the tensor count {n_tensors} cannot fit in the {size - r.pos} bytes "
                     "left")
    entries = []
    for i in range(n_tensors):
        name = r.string(f"the name of tensor {i}")
        where = f"tensor {name!r}"
        n_dims = r.u32(f"the dimension count of {where}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise r.fail(f"{where}: {n_dims} dimensions (ggml allows 1..{MAX_DIMS})")
        ne = tuple(r.u64(f"dimension {d} of {where}") for d in range(n_dims))
        code = r.u32(f"the type of {where}")
        offset = r.u64(f"the data offset of {where}")
        entries.append((name, ne, code, offset))
    data_start = -(-r.pos // alignment) * alignment
    if data_start > size:
        raise r.fail(f"the data section starts at {data_start} (after padding to "
                     f"{alignment}), past the end of the file ({size} bytes)")
    tensors: dict[str, GGUFTensorInfo] = {}
    for name, ne, code, offset in entries:
        if name in tensors:
            raise r.fail(f"tensor {name!r} appears twice")
        tensors[name] = _tensor_entry(r, name, ne, code, offset, data_start, alignment)
    last_end, last = data_start, None
    for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if t.begin < last_end and t.end > t.begin:
            raise r.fail(f"tensor {t.name!r} overlaps tensor {last!r}")
        if t.end > t.begin:
            last_end, last = t.end, t.name
    return version, metadata, tensors, data_start


def _tensor_entry(r: _Reader, name: str, ne: tuple[int, ...], code: int, offset: int,
                  data_start: int, alignment: int) -> GGUFTensorInfo:
    where = f"tensor {name!r}"
    if code not in GGML_TYPES:
        raise r.fail(f"{where}: unknown ggml type {code}")
    t = GGML_TYPES[code]
    if ne[0] % t.block_size:
        raise r.fail(f"{where}: its innermost dimension {ne[0]} is not a whole number of "
                     f"{t.name} blocks of {t.block_size}")
    if math.prod(d for d in ne if d) > _MAX_ARRAY_BYTES // t.type_size:
        raise r.fail(f"{where}: dimensions {list(ne)} are larger than an array can be")
    nbytes = math.prod(ne) // t.block_size * t.type_size
    if offset % alignment:
        raise r.fail(f"{where}: data offset {offset} is not a multiple of the alignment "
                     f"{alignment}")
    if offset > r.size - data_start or nbytes > r.size - data_start - offset:
        raise r.fail(f"{where}: {nbytes} bytes at data offset {offset} run past the end of "
                     f"the file ({r.size - data_start} bytes of data)")
    begin = data_start + offset
    return GGUFTensorInfo(name, ne, t, begin, begin + nbytes)


class GGUFFile(Mapping[str, TorchWeights]):
    """A memory-mapped GGUF file: a read-only mapping from tensor name to
    :class:`TorchWeights`, and its metadata.

    Opening reads and validates the header; tensor data stays on disk until it is used.
    ``file[name]`` gives a 2-D tensor as :class:`TorchWeights` in PyTorch's ``(out_features,
    in_features)`` reading: F32, F16 and BF16 as zero-copy views of the file; Q8_0 as its
    int8 codes gathered into one ``(out, in)`` array (the blocks interleave each 32 codes
    with their fp16 scale, which no strided view can skip; the copy takes 32/34 of the
    tensor's bytes) with the scales, exactly the file's, as ``(1, 32)`` blocks of
    :class:`~narrowmm.Scales`. Other ggml types are listed (``info``) and readable as their
    raw block bytes (:meth:`array`); asking for them as weights raises :class:`GGUFError`.

    The file must not change while it is open: each access checks its size and modification
    time against those seen at open and raises :class:`GGUFError` if they moved (as with
    any memory map, a view handed out before a truncation must not be read after it).

    Attributes:
        path: the file.
        version: the GGUF version (2 or 3).
        metadata: every metadata entry, as Python values (arrays as lists).
        info: each tensor's :class:`GGUFTensorInfo`, in file order.
        alignment: the data's alignment.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        fd, st = open_regular_file(self.path, GGUFError)
        try:
            if st.st_size == 0:
                raise GGUFError(f"{self.path}: empty file (a GGUF file starts with {MAGIC!r})")
            self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)  # the map keeps what it needs
        self._stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        self._closed = False
        try:
            self.version, self.metadata, self.info, self._data_start = _parse(
                self.path, self._map, st.st_size)
        except BaseException:
            self._map.close()
            raise
        self.alignment: int = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)

    def _check_unchanged(self) -> None:
        if self._closed:
            raise GGUFError(f"{self.path}: the file was closed")
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise GGUFError(f"{self.path}: the file is gone since it was opened ({exc})") from None
        if (st.st_size, st.st_mtime_ns, st.st_ino) != self._stamp:
            raise GGUFError(f"{self.path}: the file changed since it was opened (size "
                            f"{self._stamp[0]} -> {st.st_size}); open it again")

    def _entry(self, name: str) -> GGUFTensorInfo:
        try:
            return self.info[name]
        except KeyError:
            raise missing_tensor(self.path, name, self.info) from None

    def array(self, name: str) -> np.ndarray:
        """The tensor as a read-only NumPy view of the file, in PyTorch's shape (``ne``
        reversed); BF16 as uint16 bits; a block type as uint8 bytes, each row (the
        innermost dimension) its blocks one after another."""
        t = self._entry(name)
        self._check_unchanged()
        shape = t.shape
        if t.type.block_size > 1 or t.type.name not in _NUMPY:
            dtype, shape = np.dtype(np.uint8), (*shape[:-1], shape[-1] // t.type.block_size *
                                                t.type.type_size)
        else:
            dtype = np.dtype(_NUMPY[t.type.name])
        count = math.prod(shape)
        if count == 0:
            return np.zeros(shape, dtype)
        a = np.frombuffer(self._map, dtype=dtype, count=count, offset=t.begin)
        return a.reshape(shape)

    def __getitem__(self, name: str) -> TorchWeights:
        t = self._entry(name)
        if t.format is None:
            raise GGUFError(f"{self.path}: tensor {name!r} has ggml type {t.type.name}; "
                            f"narrowmm computes on {LOADABLE_TYPES} (use .array() for its "
                            "bytes)")
        if len(t.ne) != 2:
            raise GGUFError(f"{self.path}: tensor {name!r} has {len(t.ne)} dimensions "
                            f"(shape {t.shape}); weights must be 2-D (use .array())")
        raw = self.array(name)
        if t.type.block_size == 1:
            return TorchWeights(raw.view(np.uint16) if t.type.name == "F16" else raw, t.format)
        return self._blocks(name, raw, t.type)

    def _blocks(self, name: str, raw: np.ndarray, t: GGMLType) -> TorchWeights:
        """A block type's tensor as narrowmm weights (_gguf_blocks): its codes regrouped,
        its scales (and offsets) as the file holds them or as their exact products."""
        fmt = get_format(t.format)
        out, row_bytes = raw.shape
        n_blocks = row_bytes // t.type_size
        if out == 0 or n_blocks == 0:  # no weight: one scale (and offset) stands for none
            return TorchWeights(np.zeros((out, n_blocks * t.block_size // fmt.kpack), np.uint8),
                                fmt, Scales.tensor(1.0), Scales.tensor(0.0) if fmt.offsets
                                else None)
        converted = convert(t.name, raw.reshape(out, n_blocks, t.type_size))
        for grid, what in ((converted[2], "scale"), (converted[3], "offset")):
            if grid is not None and not np.isfinite(grid).all():
                r, b = (int(i) for i in np.argwhere(~np.isfinite(grid))[0])
                raise GGUFError(f"{self.path}: tensor {name!r}: the {what} of block {b} of "
                                f"row {r} is {float(grid[r, b])!r}")
        return as_torch_weights(converted)

    def __iter__(self) -> Iterator[str]:
        return iter(self.info)

    def __len__(self) -> int:
        return len(self.info)

    def close(self) -> None:
        """Let go of the file: unmapped now, or, while arrays handed out still view it,
        when the last of them goes (they stay valid). Later accesses raise GGUFError."""
        self._closed = True
        try:
            self._map.close()
        except BufferError:  # views exported: the map stays until they are gone
            pass

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        arch = self.metadata.get("general.architecture", "?")
        return f"<GGUFFile {self.path!r}: v{self.version}, {arch}, {len(self)} tensors>"


def load_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Open a GGUF file, memory-mapped: a mapping name -> :class:`TorchWeights` (PyTorch's
    ``(out_features, in_features)`` reading), with ``.metadata`` (see :class:`GGUFFile`).

    Raises :class:`GGUFError` (a ValueError) naming the file and the field for a malformed
    file: a bad magic or version, truncation anywhere, counts or lengths that run past the
    end, unknown value or tensor types, nesting past 8 levels, keys or tensors named twice,
    a bad alignment, misaligned, overlapping or out-of-range tensor data.
    """
    return GGUFFile(path)
