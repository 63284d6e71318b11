"""atheris target: arbitrary bytes as a .safetensors file. The loader may reject them only
with SafetensorsError (or KeyError for a missing name); whatever it accepts must be
readable. Run: python tests/fuzz/fuzz_safetensors.py -max_total_time=30

Half the inputs are raw bytes; the other half (first byte odd) build a header the way one
who knows the format would attack it: deep nesting, integers of thousands of digits,
dimensions NumPy cannot hold next to a zero, __metadata__ of every JSON type. Flipping bytes
of a valid file never builds a 100,000-deep header."""

import json
import os
import struct
import sys
import tempfile

import atheris
from _checkpoint import check_file

with atheris.instrument_imports():  # narrowmm's code guides the fuzzer, not NumPy's
    import narrowmm as nm

PATH = os.path.join(tempfile.mkdtemp(prefix="nm-fuzz-"), "input.safetensors")


def _value(fdp, depth: int = 0):
    """A JSON value of any type, small."""
    kind = fdp.ConsumeIntInRange(0, 6 if depth < 3 else 4)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return fdp.ConsumeIntInRange(-(2**70), 2**70)
    if kind == 3:
        return fdp.ConsumeUnicodeNoSurrogates(6)
    if kind == 4:
        return fdp.ConsumeRegularFloat()
    if kind == 5:
        return [_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    return {fdp.ConsumeUnicodeNoSurrogates(4): _value(fdp, depth + 1)
            for _ in range(fdp.ConsumeIntInRange(0, 3))}


def structured(data: bytes) -> bytes:
    """A whole file whose header targets the parser's limits."""
    fdp = atheris.FuzzedDataProvider(data)
    kind = fdp.ConsumeIntInRange(0, 4)
    if kind == 0:  # nesting
        header = fdp.PickValueInList(["[", '{"a":']) * fdp.ConsumeIntInRange(1, 200_000)
    elif kind == 1:  # a huge integer where a dimension or an offset goes
        digits = "9" * fdp.ConsumeIntInRange(1, 6000)
        header = ('{"a": {"dtype": "F16", "shape": [' + digits + '], "data_offsets": [0, 0]}}'
                  if fdp.ConsumeBool() else
                  '{"a": {"dtype": "F16", "shape": [1], "data_offsets": [0, ' + digits + "]}}")
    elif kind == 2:  # zero-size shapes with dimensions past NumPy's limits
        dims = [fdp.PickValueInList([0, 1, 2**31, 2**62, 2**63 - 1, 2**64, 10**30])
                for _ in range(fdp.ConsumeIntInRange(0, 4))]
        header = json.dumps({"a": {"dtype": fdp.PickValueInList(["F16", "BF16", "F32", "U8"]),
                                   "shape": dims, "data_offsets": [0, 0]}})
    elif kind == 3:  # __metadata__ of any type
        header = json.dumps({"__metadata__": _value(fdp)})
    else:  # any value where an entry or a field goes
        header = json.dumps({"a": {"dtype": "F16", "shape": _value(fdp),
                                   "data_offsets": _value(fdp)}, "b": _value(fdp)})
    raw = header.encode()
    return struct.pack("<Q", len(raw)) + raw + fdp.ConsumeBytes(16)


def one_input(data: bytes) -> None:
    if data and data[0] & 1:
        data = structured(data[1:])
    check_file(data, PATH, nm.load_safetensors, nm.SafetensorsError, nm)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
