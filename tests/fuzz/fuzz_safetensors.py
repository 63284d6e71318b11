"""atheris target: arbitrary bytes as a .safetensors file. The loader may reject them only
with SafetensorsError (or KeyError for a missing name); whatever it accepts must be
readable. Run: python tests/fuzz/fuzz_safetensors.py -max_total_time=30"""

import os
import sys
import tempfile

import atheris
import numpy as np

with atheris.instrument_imports():  # narrowmm's code guides the fuzzer, not NumPy's
    import narrowmm as nm

PATH = os.path.join(tempfile.mkdtemp(prefix="nm-fuzz-"), "input.safetensors")


def one_input(data: bytes) -> None:
    with open(PATH, "wb") as f:
        f.write(data)
    try:
        ckpt = nm.load_safetensors(PATH)
    except nm.SafetensorsError:
        return
    for name in ckpt:
        ckpt.array(name).tobytes()
        try:
            w = ckpt[name]
        except nm.SafetensorsError:
            continue
        w.decode()
        if w.shape[0] and w.shape[1]:
            nm.Linear(w)(np.ones(w.in_features, np.float32))


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
