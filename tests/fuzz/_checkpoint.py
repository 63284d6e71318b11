"""What the checkpoint fuzz targets do with a file the reader accepted: read every tensor's
bytes, decode each one it loads as weights, and run the 2-D ones through a layer."""

import numpy as np


def exercise(ckpt, error: type[Exception], nm) -> None:
    """``error``: the reader's own exception, the only one a tensor may raise."""
    for name in ckpt:
        ckpt.array(name).tobytes()
        try:
            w = ckpt[name]
        except error:
            continue
        w.decode()
        if w.shape[0] and w.shape[1]:
            nm.Linear(w)(np.ones(w.in_features, np.float32))


def check_file(data: bytes, path: str, load, error: type[Exception], nm) -> None:
    """Write ``data`` to ``path`` and open it with ``load``: it may refuse only with
    ``error``; what it accepts must be readable (exercise)."""
    with open(path, "wb") as f:
        f.write(data)
    try:
        ckpt = load(path)
    except error:
        return
    exercise(ckpt, error, nm)
