"""Checkpoint readers: each maps a file and hands out its tensors as narrowmm weights
without copying them (:mod:`.safetensors` today). ``narrowmm.load_safetensors`` and the
rest are re-exported by the package root."""

from .safetensors import SafetensorsError, SafetensorsFile, TensorInfo, load_safetensors

__all__ = ["SafetensorsError", "SafetensorsFile", "TensorInfo", "load_safetensors"]
