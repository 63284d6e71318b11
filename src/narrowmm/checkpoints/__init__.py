"""Checkpoint readers: each maps a file, validates its header and hands out its tensors as
narrowmm weights (:mod:`.safetensors`, :mod:`.gguf`). ``narrowmm.load_safetensors``,
``narrowmm.load_gguf`` and the rest are re-exported by the package root."""

from .gguf import GGMLType, GGUFError, GGUFFile, GGUFTensorInfo, load_gguf
from .safetensors import SafetensorsError, SafetensorsFile, TensorInfo, load_safetensors

__all__ = ["GGMLType", "GGUFError", "GGUFFile", "GGUFTensorInfo", "SafetensorsError",
           "SafetensorsFile", "TensorInfo", "load_gguf", "load_safetensors"]
