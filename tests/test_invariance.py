"""Whole-model batch invariance (docs/invariance.md): a random Llama (and a Qwen2, a Qwen3)
from transformers in bf16, 8 prompts of different lengths; every prompt's logits are
bit-identical alone, in a batch of 4 and in a batch of 8, on 1, 2 and 3 threads, on every
ISA row, and in prefill and decode; greedy generate() gives the same tokens alone and
batched. Plain PyTorch on the same model is the control, side by side."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import ISAS, require

torch = require("torch")
transformers = require("transformers")

import narrowmm.torch as nmt  # noqa: E402
from narrowmm.providers.native import core  # noqa: E402
from narrowmm.torch import invariance as inv  # noqa: E402

pytestmark = pytest.mark.usefixtures("restore_torch_threads")

CONFIG = inv.llama_config("small")
PROMPTS = inv.fixed_prompts(CONFIG.vocab_size)


@pytest.fixture(scope="module")
def invariant_model():
    model = inv.random_llama(CONFIG, torch.bfloat16)
    return nmt.convert(model, "bf16", batch_invariant=True)


def test_batch_composition_and_threads_with_the_control(invariant_model, capsys):
    control = {}
    for dtype in (torch.float32, torch.bfloat16):
        result = inv.batch_conditions(inv.random_llama(CONFIG, dtype), PROMPTS)
        control[str(dtype)] = result.differing_prompts()
    result = inv.batch_conditions(invariant_model, PROMPTS)
    with capsys.disabled():
        print(f"\n  prompts whose logits differ over 9 conditions (batch x threads): plain "
              f"torch {control}, narrowmm batch-invariant {result.differing_prompts()}")
    assert len(result.digests) == 9
    assert result.distinct() == [1] * len(PROMPTS), result.digests
    # the conditions do tell models apart: plain torch changes with them on this model
    assert sum(control.values()) > 0, control


def test_greedy_generate_alone_equals_batched(invariant_model):
    alone = [inv.greedy(invariant_model, [p], 6)[0] for p in PROMPTS]
    assert inv.greedy(invariant_model, PROMPTS, 6) == alone
    assert inv.greedy(invariant_model, PROMPTS[2:6], 6) == alone[2:6]


def test_prefill_equals_decode(invariant_model):
    for p in PROMPTS[:4]:
        assert inv.digest(inv.prompt_logits(invariant_model, [p])[0]) == \
            inv.digest(inv.decode_logits(invariant_model, p)), p


ROW_SCRIPT = """
import json, torch, narrowmm.torch as nmt
from narrowmm.torch import invariance as inv
from narrowmm.providers.native import core
config = inv.llama_config("small")
prompts = inv.fixed_prompts(config.vocab_size)
model = nmt.convert(inv.random_llama(config, torch.bfloat16), "bf16", batch_invariant=True,
                    threads=2)
alone = [inv.prompt_logits(model, [p])[0] for p in prompts]
batched = inv.prompt_logits(model, prompts)
print(json.dumps({"isa": core().isa(), "alone": [inv.digest(x) for x in alone],
                  "batched": [inv.digest(x) for x in batched]}))
"""


def test_every_isa_row_gives_the_same_logits(invariant_model):
    """Each ISA row in a process of its own (NARROWMM_ISA), against this process."""
    want = [inv.digest(x) for x in inv.prompt_logits(invariant_model, PROMPTS)]
    rows = [isa for isa in ISAS if isa != core().isa()] + [core().isa()]
    assert "scalar" in rows and len(rows) >= 2
    for isa in rows:
        env = dict(os.environ, NARROWMM_ISA=isa)
        run = subprocess.run([sys.executable, "-c", ROW_SCRIPT], env=env, capture_output=True,
                             text=True, timeout=300, check=False)
        assert run.returncode == 0, run.stderr[-2000:]
        got = json.loads(run.stdout.strip().splitlines()[-1])
        assert got["isa"] == isa
        assert got["alone"] == want and got["batched"] == want, isa


def test_float32_model_is_invariant_too():
    model = nmt.convert(inv.random_llama(CONFIG, torch.float32), "bf16", batch_invariant=True)
    result = inv.batch_conditions(model, PROMPTS[:4], threads=(1, 2))
    assert result.distinct() == [1] * 4


def test_what_it_replaces(invariant_model):
    kinds = {type(m).__name__ for m in invariant_model.modules()}
    assert {"RMSNorm", "SiLU", "RotaryTable", "Linear"} <= kinds
    assert not kinds & {"LlamaRMSNorm", "SiLUActivation"}
    # the model's own rotary module lives on inside the table, which computes with it
    assert type(invariant_model.model.rotary_emb).__name__ == "RotaryTable"
    assert invariant_model.config._attn_implementation == "narrowmm"
    assert nmt.is_batch_invariant(invariant_model)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_a_qwen_model_is_invariant_as_a_llama_is(family):
    """Qwen2 (Llama's layers with biases on q, k and v, drawn nonzero) and Qwen3 (RMS norms
    on each head's query and key, weights drawn away from 1; heads of 64 on a hidden size
    of 256): every prompt's logits the same bits alone, in batches of 4 and 8, on 1 and 2
    threads, and in prefill and decode; greedy generate alone equals batched. Plain torch on
    the same model is the control."""
    config = inv.qwen2_config("small") if family == "qwen2" else inv.qwen3_config("small")
    model = nmt.convert(inv.random_qwen(config, torch.bfloat16), "bf16", batch_invariant=True)
    kinds = {type(m).__name__ for m in model.modules()}
    assert {"RMSNorm", "SiLU", "RotaryTable", "Linear"} <= kinds
    assert not kinds & {"Qwen2RMSNorm", "Qwen3RMSNorm", "SiLUActivation"}
    attn = model.model.layers[0].self_attn
    if family == "qwen2":
        assert float(attn.k_proj.bias.abs().max()) > 0.5
    else:
        assert type(attn.q_norm).__name__ == type(attn.k_norm).__name__ == "RMSNorm"
        assert float((attn.k_norm.weight - 1).abs().max()) > 0.2
        assert attn.q_proj.out_features == 512 != config.hidden_size
    result = inv.batch_conditions(model, PROMPTS, threads=(1, 2))
    assert result.distinct() == [1] * len(PROMPTS), result.digests
    control = inv.batch_conditions(inv.random_qwen(config, torch.float32), PROMPTS,
                                   threads=(1, 2))
    assert control.differing_prompts() > 0  # the conditions change plain torch's bits
    for p in PROMPTS[:3]:
        assert inv.digest(inv.prompt_logits(model, [p])[0]) == \
            inv.digest(inv.decode_logits(model, p)), p
    alone = [inv.greedy(model, [p], 4)[0] for p in PROMPTS[:4]]
    assert inv.greedy(model, PROMPTS[:4], 4) == alone


def test_unsupported_models_are_refused_before_any_change():
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)
    model = transformers.GPT2LMHeadModel(config).eval()
    with pytest.raises(NotImplementedError, match="model type 'gpt2'"):
        nmt.convert(model, "bf16", batch_invariant=True)
    assert not nmt.converted_layers(model) and not nmt.is_batch_invariant(model)
    sliding = transformers.Qwen2Config(use_sliding_window=True, max_window_layers=2,
                                       **inv.SIZES["small"])
    qwen2 = transformers.Qwen2ForCausalLM(sliding).eval()
    with pytest.raises(NotImplementedError,
                       match=r"layers \[2, 3\] of type 'sliding_attention' \(supported: "
                             r"'full_attention'\)"):
        nmt.convert(qwen2, "bf16", batch_invariant=True)
    assert not nmt.converted_layers(qwen2) and not nmt.is_batch_invariant(qwen2)
    llama = inv.random_llama(CONFIG, torch.bfloat16)
    with pytest.raises(ValueError, match="needs every linear layer converted"):
        nmt.convert(llama, "bf16", skip=("lm_head",), batch_invariant=True)
    with pytest.raises(NotImplementedError, match=r"lm_head: a torch\.nn\.Linear not converted"):
        nmt.make_batch_invariant(nmt.convert(llama, "bf16", skip=("lm_head",)))


def test_close_to_pytorch_float32():
    """Invariance does not cost accuracy: against PyTorch's float32 model on the same
    (bf16-rounded) weights, logits within 1e-5 of the largest, the same greedy tokens."""
    reference = inv.random_llama(CONFIG, torch.bfloat16).float()
    model = nmt.convert(inv.random_llama(CONFIG, torch.bfloat16).float(), "bf16",
                        batch_invariant=True)
    for p in PROMPTS:
        a, b = inv.prompt_logits(reference, [p])[0], inv.prompt_logits(model, [p])[0]
        assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max()), p
    assert inv.greedy(model, PROMPTS, 8) == inv.greedy(reference, PROMPTS, 8)


def test_gguf_for_the_llama_cpp_peer_holds_the_same_weights(tmp_path):
    """narrowmm bench --model llama writes the model for llama.cpp: read it back with the
    gguf package and find every weight, bf16 bit for bit (q and k in GGUF's interleaved
    rotary order, which undoing the permutation gives back)."""
    gguf = require("gguf")
    from narrowmm.bench.llama import _permute_for_gguf, write_gguf

    model = inv.random_llama(CONFIG, torch.bfloat16)
    path = tmp_path / "m.gguf"
    write_gguf(model, path, "BF16")
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    assert len(tensors) == 2 + 1 + 9 * CONFIG.num_hidden_layers
    sd = model.state_dict()

    def bits(name):
        return sd[name].view(torch.int16).numpy().view(np.uint16)

    q = bits("model.layers.1.self_attn.q_proj.weight")
    def stored(name):  # BF16 tensors come back as their raw bytes
        return np.ascontiguousarray(tensors[name].data).view(np.uint16)

    got_q = stored("blk.1.attn_q.weight").reshape(q.shape)
    assert np.array_equal(got_q, _permute_for_gguf(q, CONFIG.num_attention_heads))
    assert not np.array_equal(got_q, q)  # the permutation is real
    up = bits("model.layers.3.mlp.up_proj.weight")
    assert np.array_equal(stored("blk.3.ffn_up.weight").reshape(up.shape), up)
    norm = sd["model.norm.weight"].float().numpy()
    assert np.array_equal(np.asarray(tensors["output_norm.weight"].data), norm)
