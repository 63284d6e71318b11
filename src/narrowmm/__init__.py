"""narrowmm: float32 activations times FP16 / BF16 / FP8 / GGUF Q8_0 weights on the CPU,
fast and bit-for-bit reproducible.

>>> import numpy as np, narrowmm as nm
>>> w = nm.Weights.encode(np.ones((4, 3), np.float32), "bf16")
>>> nm.matmul(np.ones((2, 4), np.float32), w)
array([[4., 4., 4.],
       [4., 4., 4.]], dtype=float32)
"""

from __future__ import annotations

from ._api import decode, encode, matmul
from ._arena import WeightArena, weight_arena
from ._environ import EnvironmentVariableError
from ._formats import FORMATS, Format, get_format
from ._linear import Linear
from ._runtime import runtime_info, show_runtime
from ._scales import Scales
from ._threads import get_num_threads, set_num_threads
from ._threads import init as _init_threads
from ._version import __version__
from ._weights import PackedWeights, TorchWeights, Weights
from .checkpoints import (
    GGUFError,
    GGUFFile,
    SafetensorsError,
    SafetensorsFile,
    load_gguf,
    load_safetensors,
)
from .providers import FallbackWarning, Provider, use_provider
from .providers import providers as list_providers

_init_threads()

__all__ = [
    "FORMATS",
    "EnvironmentVariableError",
    "FallbackWarning",
    "Format",
    "GGUFError",
    "GGUFFile",
    "Linear",
    "PackedWeights",
    "Provider",
    "SafetensorsError",
    "SafetensorsFile",
    "Scales",
    "TorchWeights",
    "WeightArena",
    "Weights",
    "__version__",
    "decode",
    "encode",
    "get_format",
    "get_num_threads",
    "list_providers",
    "load_gguf",
    "load_safetensors",
    "matmul",
    "runtime_info",
    "set_num_threads",
    "show_runtime",
    "use_provider",
    "weight_arena",
]
