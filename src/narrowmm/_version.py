"""The installed package's version, for the modules that report it (the root re-exports it)."""

from __future__ import annotations

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("narrowmm")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = "0+unknown"
