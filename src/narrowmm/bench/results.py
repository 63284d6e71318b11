"""What ``narrowmm bench`` measures and records: its constants and the records of one
measurement and of the machine's limits (the JSON schema of docs/bench.md)."""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA = "narrowmm-bench/1"
# (name, k, n): k input features, n output features, as in the seed's benchmark
LLAMA_SHAPES = (
    ("q_proj 1B", 2048, 2048),
    ("q_proj 8B", 4096, 4096),
    ("ffn_up 8B", 4096, 11008),
    ("ffn_down 8B", 11008, 4096),
)
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
NARROWMM_FORMATS = ("fp16", "bf16", "f32", "e4m3fn", "e5m2", "q8_0", "q4_0", "q4_1")
FP8_FORMATS = ("e4m3fn", "e5m2")
# formats whose weights the bench makes with Weights.quantize (scales fitted to the values)
QUANTIZED_FORMATS = (*FP8_FORMATS, "q8_0", "q4_0", "q4_1", "q5_1")
# GGUF block types that load as an exact conversion to a narrowmm format (README, "GGUF
# files"): the bench times a tensor of random blocks as load_gguf gives it, on request only
# (--format); their name, the ggml type, and the format they run as
GGUF_CONVERTED_FORMATS = {"q5_0": ("Q5_0", "q8_0"), "q2_k": ("Q2_K", "q4_1"),
                          "q3_k": ("Q3_K", "q8_0"), "q4_k": ("Q4_K", "q4_1"),
                          "q5_k": ("Q5_K", "q5_1"), "q6_k": ("Q6_K", "q8_0"),
                          "iq4_nl": ("IQ4_NL", "q8_0"), "iq4_xs": ("IQ4_XS", "q8_0")}
# narrowmm formats timed on request only (--format), like the converted types
ON_REQUEST_FORMATS = ("q5_1",)
BENCH_FORMATS = (*NARROWMM_FORMATS, *ON_REQUEST_FORMATS, *GGUF_CONVERTED_FORMATS)
# the decode benches' (--model llama, --model PATH.gguf) prompts' lengths: batch 1 decodes
# the first, batch 8 all of them, left-padded; --context N moves the spread up to end at N
PROMPT_LENGTHS = (16, 9, 12, 16, 5, 14, 8, 11)
# narrowmm on row-major Weights, and on Weights.pack() of the same matrix
NARROWMM_SYSTEMS = ("narrowmm", "narrowmm-packed")
SLOW_CALL_S = 4.0  # a system whose single call takes longer is skipped for that case


@dataclass
class Result:
    """One timed (system, format, shape, m, threads, cache) measurement."""

    system: str
    format: str
    shape: str
    k: int
    n: int
    m: int
    threads: int
    cache: str
    isa: str | None
    median_ms: float
    min_ms: float
    max_ms: float
    calls: int
    weight_bytes: int
    gbps: float = 0.0
    gflops: float = 0.0
    limit: str = ""
    pct_of_limit: float = 0.0
    # m == 1, narrowmm only: the read probe timed between the same calls (see Case.probe)
    paired_read_gbps: float = 0.0
    pct_of_paired_read: float = 0.0
    # cold cache: the traffic between two uses of a weight copy over the 3 x L3 wanted
    # (1.0 unless the memory budget capped the rotation: ColdPlan)
    cold_fraction: float = 0.0


@dataclass
class Limits:
    threads: int
    isa: str
    read_gbps: float
    fma_gflops: float
