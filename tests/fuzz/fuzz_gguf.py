"""atheris target: arbitrary bytes as a GGUF file. The loader may reject them only with
GGUFError (or KeyError for a missing name); whatever it accepts must be readable, and a
2-D tensor of a computed type must run through a narrowmm layer.
Run: python tests/fuzz/fuzz_gguf.py -max_total_time=30

Half the inputs are raw bytes; the other half (first byte odd) build a file the way one who
knows the format would attack it: counts and lengths that lie, value and tensor types past
the table, arrays nested deep or long, dimensions past NumPy's limits next to a zero,
offsets near the end or misaligned. Flipping bytes of a valid file rarely gets that far."""

import os
import struct
import sys
import tempfile

import atheris
from _checkpoint import check_file

with atheris.instrument_imports():  # narrowmm's code guides the fuzzer, not NumPy's
    import narrowmm as nm

PATH = os.path.join(tempfile.mkdtemp(prefix="nm-fuzz-"), "input.gguf")
BIG = [0, 1, 2, 31, 32, 33, 2**31, 2**32, 2**62, 2**63 - 1, 2**64 - 1]


def _string(fdp) -> bytes:
    raw = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 6))
    n = len(raw) if fdp.ConsumeIntInRange(0, 7) else fdp.PickValueInList(BIG)
    return struct.pack("<Q", n) + raw


def _value(fdp, vtype: int, depth: int = 0) -> bytes:
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if vtype in sizes:
        return fdp.ConsumeBytes(sizes[vtype])
    if vtype == 8:
        return _string(fdp)
    if vtype == 9 and depth < 12:
        etype = fdp.ConsumeIntInRange(0, 14)
        count = fdp.ConsumeIntInRange(0, 4) if fdp.ConsumeBool() else fdp.PickValueInList(BIG)
        body = b"".join(_value(fdp, etype, depth + 1) for _ in range(min(count, 4)))
        return struct.pack("<IQ", etype, count) + body
    return fdp.ConsumeBytes(4)


def structured(data: bytes) -> bytes:
    fdp = atheris.FuzzedDataProvider(data)
    version = fdp.PickValueInList([1, 2, 3, 3, 3, 0x03000000, fdp.ConsumeInt(4)])
    kvs = []
    for _ in range(fdp.ConsumeIntInRange(0, 4)):
        vtype = fdp.ConsumeIntInRange(0, 14)
        key = (b"general.alignment" if fdp.ConsumeIntInRange(0, 5) == 0
               else fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 4)))
        kvs.append(struct.pack("<Q", len(key)) + key + struct.pack("<I", vtype)
                   + _value(fdp, vtype))
    entries = []
    for _ in range(fdp.ConsumeIntInRange(0, 3)):
        name = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 3))
        n_dims = fdp.PickValueInList([1, 2, 2, 2, 3, 0, 5])
        dims = [fdp.PickValueInList([1, 2, 32, 64, *BIG]) for _ in range(min(n_dims, 5))]
        gtype = fdp.PickValueInList([0, 1, 8, 30, 2, 3, 12, 14, 4, 99])
        offset = fdp.PickValueInList([0, 0, 32, 64, 1, 2**63])
        entries.append(struct.pack("<Q", len(name)) + name + struct.pack("<I", n_dims)
                       + b"".join(struct.pack("<Q", d) for d in dims)
                       + struct.pack("<IQ", gtype, offset))
    n_t = len(entries) if fdp.ConsumeIntInRange(0, 7) else fdp.PickValueInList(BIG)
    n_kv = len(kvs) if fdp.ConsumeIntInRange(0, 7) else fdp.PickValueInList(BIG)
    head = (b"GGUF" + struct.pack("<I", version & 0xFFFFFFFF) + struct.pack("<QQ", n_t, n_kv)
            + b"".join(kvs) + b"".join(entries))
    return head + b"\0" * (-len(head) % 32) + fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300))


def one_input(data: bytes) -> None:
    if data and data[0] & 1:
        data = structured(data[1:])
    check_file(data, PATH, nm.load_gguf, nm.GGUFError, nm)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
