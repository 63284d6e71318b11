"""atheris target: the argument validation of matmul / encode / decode / Weights. Random
dtypes, shapes, strides, offsets, formats and flags; the only allowed failures are
TypeError and ValueError, and a rejected call must leave `out` untouched.
Run: python tests/fuzz/fuzz_api.py -max_total_time=30"""

import sys

import atheris
import numpy as np

with atheris.instrument_imports():  # narrowmm's code guides the fuzzer, not NumPy's
    import narrowmm as nm

DTYPES = [np.float32, np.float16, np.float64, np.uint16, np.int16, np.int32, np.uint8,
          np.complex64, ">f4", ">f2", object]
FORMATS = ["f32", "fp16", "bf16", "fp8", "float16", ""]


def array(fdp: atheris.FuzzedDataProvider) -> np.ndarray:
    dtype = np.dtype(DTYPES[fdp.ConsumeIntInRange(0, len(DTYPES) - 1)])
    ndim = fdp.ConsumeIntInRange(0, 3)
    shape = tuple(fdp.ConsumeIntInRange(0, 6) for _ in range(ndim))
    size = int(np.prod(shape)) if shape else 1
    if dtype.kind == "O":
        a = np.array([None] * size, dtype=object).reshape(shape)
    else:
        raw = fdp.ConsumeBytes(size * dtype.itemsize + 8)
        raw = raw + bytes(size * dtype.itemsize + 8 - len(raw))
        offset = fdp.ConsumeIntInRange(0, 7)
        a = np.frombuffer(bytearray(raw), np.uint8)[offset:offset + size * dtype.itemsize]
        a = a.view(dtype).reshape(shape)
    choice = fdp.ConsumeIntInRange(0, 4)
    if choice == 1 and a.ndim >= 1:
        a = a[::-1]
    elif choice == 2 and a.ndim == 2:
        a = a.T
    elif choice == 3 and a.ndim >= 1:
        a = a[::2]
    elif choice == 4:
        a.flags.writeable = False
    return a


def cut(fdp: atheris.FuzzedDataProvider, buf: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """A (rows, cols) view of buf at any offset, column step and order."""
    r0 = fdp.ConsumeIntInRange(0, buf.shape[0] - rows)
    step = fdp.ConsumeIntInRange(1, 3)
    c0 = fdp.ConsumeIntInRange(0, buf.shape[1] - (cols - 1) * step - 1)
    view = buf[r0:r0 + rows, c0:c0 + (cols - 1) * step + 1:step]
    return view[::-1] if fdp.ConsumeBool() else view


def overlap_case(fdp: atheris.FuzzedDataProvider) -> None:
    """x and out cut from one buffer: an overlap must be refused with `out` untouched, and
    views whose memory bounds are apart must give the bits of the same call on copies."""
    m, k, n = (fdp.ConsumeIntInRange(1, 4) for _ in range(3))
    buf = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    x, out = cut(fdp, buf, m, k), cut(fdp, buf, m, n)
    w = nm.Weights.from_bits(np.ones((k, n), np.float32), "f32")
    want = nm.matmul(x.copy(), w)
    before = buf.copy()
    try:
        nm.matmul(x, w, out=out)
    except ValueError as exc:
        # the contract refuses whatever numpy.may_share_memory flags (interleaved views
        # that never touch included): only views whose bounds are apart must be computed
        if not np.may_share_memory(x, out):
            raise AssertionError(f"disjoint views refused: {exc}") from None
        if not np.array_equal(buf, before):
            raise AssertionError("a refused call wrote into out") from None
        return
    if np.shares_memory(x, out):
        raise AssertionError("out overlapping x was accepted")
    if not np.array_equal(out, want):
        raise AssertionError("wrong result on disjoint views")


def one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    op = fdp.ConsumeIntInRange(0, 4)
    if op == 4:
        overlap_case(fdp)
        return
    fmt = FORMATS[fdp.ConsumeIntInRange(0, len(FORMATS) - 1)]
    try:
        if op == 0:
            x, w = array(fdp), array(fdp)
            out = array(fdp) if fdp.ConsumeBool() else None
            before = None if out is None or out.dtype.kind == "O" else out.tobytes()
            try:
                nm.matmul(x, w, out=out, accumulate=fdp.ConsumeBool() and out is not None)
            except (TypeError, ValueError):
                if before is not None and out.tobytes() != before:
                    raise AssertionError("a rejected call wrote into out") from None
                raise
        elif op == 1:
            nm.encode(array(fdp), fmt)
        elif op == 2:
            nm.decode(array(fdp), fmt)
        else:
            nm.Weights.from_bits(array(fdp), fmt)
    except (TypeError, ValueError):
        pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
