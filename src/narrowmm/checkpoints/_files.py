"""What the checkpoint readers share: opening a file safely, and a missing name's error."""

from __future__ import annotations

import difflib
import os
import stat
from collections.abc import Collection


def open_regular_file(path: str, error: type[Exception]) -> tuple[int, os.stat_result]:
    """A read-only descriptor of ``path`` and its stat, or ``error`` if it is not a regular
    file. Opened without blocking (a FIFO would otherwise wait for a writer), then made
    blocking again for reading."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: not a regular file (a FIFO, device, socket or directory); a "
                        "checkpoint must be a file")
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def missing_tensor(path: str, name: str, names: Collection[str]) -> KeyError:
    """The KeyError for a tensor the file does not hold, with the closest names it does."""
    close = difflib.get_close_matches(name, list(names), n=5, cutoff=0.6)
    hint = (f"; close matches: {', '.join(map(repr, close))}" if close
            else f"; it has {len(names)} tensors (list(file) names them)")
    return KeyError(f"{path}: no tensor named {name!r}{hint}")
