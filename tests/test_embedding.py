"""narrowmm.torch.Embedding: a token table kept narrow, each looked-up row the exact decode
of the whole table's (TorchWeights.decode), in the model's forward (NumPy) and in the
Decoder's C step (nm_embedding), for every format a table comes in."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ISAS, assert_same_bits, k_type_weights, require

torch = require("torch")
require("transformers")

gguf = require("gguf")

import narrowmm as nm  # noqa: E402
import narrowmm.torch as nmt  # noqa: E402
from narrowmm.checkpoints import _gguf_blocks  # noqa: E402
from narrowmm.providers.native import use_isa  # noqa: E402
from narrowmm.torch import invariance as inv  # noqa: E402

pytestmark = pytest.mark.usefixtures("restore_torch_threads")

CONFIG = inv.llama_config("small")
PROMPTS = inv.fixed_prompts(CONFIG.vocab_size)


def table(fmt: str, vocab: int, dim: int, seed: int = 0) -> nm.TorchWeights:
    """A (vocab, dim) table in ``fmt``: GGUF's blocks for the GGUF formats, per-row scales for
    FP8, rounded values for the 16-bit ones; some rows of zeros and huge values."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((vocab, dim)) * 0.05).astype(np.float32)
    w[3] = 0.0
    w[4, :7] = [1e4, -1e4, 3e-8, -0.0, 0.0, 65504.0, -65504.0]
    return narrow(w, fmt)


def narrow(w: np.ndarray, fmt: str) -> nm.TorchWeights:
    """The float32 table ``w`` (vocab, dim) in ``fmt``."""
    vocab = w.shape[0]
    if fmt in ("q8_0", "q4_0", "q4_1", "q5_1"):  # gguf-py's blocks, as a file holds them
        t = gguf.GGMLQuantizationType[fmt.upper()]
        raw = gguf.quants.quantize(w, t)
        blocks = raw.reshape(vocab, -1, gguf.constants.GGML_QUANT_SIZES[t][1])
        return _gguf_blocks.as_torch_weights(_gguf_blocks.convert(fmt.upper(), blocks))
    if fmt in ("e4m3fn", "e5m2"):  # a scale per row: the largest magnitude over 448 or 57344
        top = {"e4m3fn": 448.0, "e5m2": 57344.0}[fmt]
        s = np.maximum(np.abs(w).max(axis=1, keepdims=True), 1e-30) / np.float32(top)
        return nm.TorchWeights(nm.encode(w / s, fmt), fmt, nm.Scales(s, (1, 0)))
    return nm.TorchWeights(nm.encode(w, fmt) if fmt != "f32" else w, fmt)


FORMATS = ["q8_0", "q4_0", "q4_1", "q5_1", "bf16", "fp16", "e4m3fn", "f32"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_are_the_whole_tables_bits(fmt):
    w = table(fmt, 200, 96)
    emb = nmt.Embedding.from_weights(w)
    full = w.decode()
    ids = torch.tensor([[0, 3, 4, 199], [4, 4, 17, 3]])
    assert_same_bits(emb(ids).numpy(), full[ids.numpy()])
    assert emb(ids).shape == (2, 4, 96)
    assert_same_bits(emb(torch.tensor(5)).numpy(), full[5])  # a 0-d id
    assert_same_bits(emb(ids.to(torch.int32)).numpy(), full[ids.numpy()])
    assert_same_bits(emb.weight.numpy(), full)
    assert emb.num_embeddings == 200 and emb.embedding_dim == 96


def test_the_decoder_reads_a_narrow_table_as_the_model_does_on_every_row():
    """A small random Llama whose embedding is a q4_1 Embedding (scales and offsets): the
    Decoder's C lookup gives the model's own logits, bit for bit, on every ISA row (the
    layers row-major, which every row runs)."""
    model = nmt.convert(inv.random_llama(CONFIG, torch.float32, seed=0), "bf16",
                        batch_invariant=True, pack=False, threads=False).float()
    vocab, dim = CONFIG.vocab_size, CONFIG.hidden_size
    w = model.model.embed_tokens.weight.detach().numpy()
    model.model.embed_tokens = nmt.Embedding.from_weights(narrow(w, "q4_1"))
    assert model.model.embed_tokens.embedding_dim == dim
    want = [inv.prompt_logits(model, [p])[0][-1] for p in PROMPTS[:3]]
    for isa in ISAS:
        with use_isa(isa):
            dec = nmt.Decoder(model)
            for p, w_ in zip(PROMPTS[:3], want, strict=True):
                dec.reset(1, len(p))
                got = dec.step(np.array([p]), np.arange(len(p))[None], np.array([0]))
                assert torch.equal(got[0], w_), (isa, p)
    assert vocab == model.model.embed_tokens.num_embeddings


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0", "q5_1", "bf16", "fp16", "e5m2"])
def test_the_decoders_lookup_is_the_modules_for_every_format(fmt):
    """The embedding in each format, and no layer in between that could hide a wrong row:
    the Decoder's logits equal the model's, so its rows are the module's."""
    model = nmt.convert(inv.random_llama(CONFIG, torch.float32, seed=1), "bf16",
                        batch_invariant=True, threads=False).float()
    w = model.model.embed_tokens.weight.detach().numpy()
    model.model.embed_tokens = nmt.Embedding.from_weights(table(fmt, *w.shape, seed=2))
    prompt = PROMPTS[1]
    want = inv.prompt_logits(model, [prompt])[0][-1]
    dec = nmt.Decoder(model)
    dec.reset(1, len(prompt))
    got = dec.step(np.array([prompt]), np.arange(len(prompt))[None], np.array([0]))
    assert torch.equal(got[0], want)


def test_bad_ids_and_inputs_are_refused_by_value():
    emb = nmt.Embedding.from_weights(table("q8_0", 10, 32))
    with pytest.raises(IndexError, match=r"embedding id 10 is outside \[0, 10\)"):
        emb(torch.tensor([1, 10]))
    with pytest.raises(IndexError, match=r"embedding id -1 is outside"):
        emb(torch.tensor([-1]))
    with pytest.raises(TypeError, match=r"integer ids, got torch\.float32"):
        emb(torch.tensor([1.0]))
    with pytest.raises(TypeError, match="TorchWeights or a narrowmm Linear, got ndarray"):
        nmt.Embedding(np.zeros((2, 2), np.float32))
    assert emb(torch.zeros((0, 3), dtype=torch.int64)).shape == (0, 3, 32)


@pytest.mark.parametrize("change, message", [
    (lambda s: (s[0], s[1][:-1], *s[2:]), r"the token embedding: 'q8_0' codes of shape \(\d+, "
                                          r"\d+\) do not hold \d+ aligned rows of \d+ values"),
    (lambda s: (s[0], s[1], None, *s[3:]), r"format 'q8_0' takes scales and no offsets"),
    (lambda s: (*s[:4], 0), r"a block >= 1 with scales\), got scales given, offsets None, "
                            r"block 0"),
    (lambda s: (s[0], s[1], s[2][:-1], *s[3:]), r"the token embedding's scales must hold"),
    (lambda s: (99, *s[1:]), r"unknown format code 99"),
    (lambda s: s[:3], r"expected a float32 table or \(fmt, bits, scales, offsets, block\)"),
])
def test_the_c_plan_refuses_a_table_that_does_not_fit(monkeypatch, change, message):
    model = nmt.convert(inv.random_llama(CONFIG, torch.float32, seed=0), "bf16",
                        batch_invariant=True, threads=False).float()
    w = model.model.embed_tokens.weight.detach().numpy()
    model.model.embed_tokens = nmt.Embedding.from_weights(table("q8_0", *w.shape))
    spec = nmt.Embedding.spec
    monkeypatch.setattr(nmt.Embedding, "spec", lambda self: change(spec(self)))
    with pytest.raises((ValueError, TypeError), match=message):
        nmt.Decoder(model)


def test_torch_compile_sees_the_operator_and_gives_the_eager_bits():
    """Traced (torch.compile, one graph), the lookup runs as torch.ops.narrowmm.embedding,
    whose fake implementation gives the shape: the same rows as eager."""
    emb = nmt.Embedding.from_weights(table("q4_1", 50, 64))
    ids = torch.tensor([[0, 3, 4, 49], [7, 7, 1, 2]])
    torch._dynamo.reset()
    compiled = torch.compile(emb, fullgraph=True)
    assert_same_bits(compiled(ids).numpy(), emb(ids).numpy())


TIED_FORMATS = ["q8_0", "q4_0", "q4_1", "q5_1", "bf16", "fp16", "f32"]


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "row-major"])
@pytest.mark.parametrize("fmt", TIED_FORMATS)
def test_a_table_tied_to_a_layer_reads_the_layers_weights(fmt, pack):
    """Tied to an output layer (packed or row-major, binary16 grids for the GGUF formats):
    row t is the layer's output feature t, the bits of the table decoded, with nothing of
    its own held."""
    w = table(fmt, 200, 96, seed=3)
    layer = nmt.Linear.from_weights(w, pack=pack)
    emb = nmt.Embedding.tied_to(layer)
    assert emb.tied is layer and emb.weight_bits is None and emb.weight_scales is None
    ids = torch.tensor([[0, 3, 4, 199], [4, 31, 32, 33]])
    full = w.decode()
    assert_same_bits(emb(ids).numpy(), full[ids.numpy()])
    assert_same_bits(emb.weight.numpy(), full)
    if fmt == "q4_1":  # traced: the operator (one format, or dynamo's recompile limit hits)
        torch._dynamo.reset()
        assert_same_bits(torch.compile(emb, fullgraph=True)(ids).numpy(), full[ids.numpy()])
    with pytest.raises(IndexError, match=r"embedding id 200 is outside \[0, 200\)"):
        emb(torch.tensor([200]))


@pytest.mark.parametrize("fmt", ["q4_0", "q4_1", "q8_0", "bf16"])
def test_the_decoder_reads_a_tied_table_from_the_output_layer_on_every_row(fmt):
    """A small Llama whose lm_head holds the table and whose embedding is tied to it: the
    Decoder's C rows (read from the layer, either layout; Q4_0's packed bytes XOR-ed back)
    give the model's logits."""
    base = inv.random_llama(CONFIG, torch.float32, seed=4)
    table_w = narrow(base.model.embed_tokens.weight.detach().numpy(), fmt)
    for isa in ISAS:
        with use_isa(isa):
            for pack in (True, False):
                model = nmt.convert(inv.random_llama(CONFIG, torch.float32, seed=4), "bf16",
                                    batch_invariant=True, pack=pack, threads=False).float()
                model.lm_head = nmt.Linear.from_weights(table_w, pack=pack)
                model.model.embed_tokens = nmt.Embedding.tied_to(model.lm_head)
                prompt = PROMPTS[2]
                want = inv.prompt_logits(model, [prompt])[0][-1]
                dec = nmt.Decoder(model)
                dec.reset(1, len(prompt))
                got = dec.step(np.array([prompt]), np.arange(len(prompt))[None], np.array([0]))
                assert torch.equal(got[0], want), (isa, pack)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K"])
def test_a_table_tied_to_a_k_type_layer_reads_its_factored_grid(type_name):
    """A K-type output layer, packed, keeps a factored grid (int8 codes, a float32 factor
    per 256 rows): the table tied to it reads its rows through that grid, in the module
    (NumPy) and in the Decoder's C step on every row, the bits of the table decoded."""
    w = k_type_weights(type_name, CONFIG.hidden_size, CONFIG.vocab_size, seed=5)
    full = w.decode()
    for isa in ISAS:
        with use_isa(isa):
            model = nmt.convert(inv.random_llama(CONFIG, torch.float32, seed=4), "bf16",
                                batch_invariant=True, threads=False).float()
            model.lm_head = nmt.Linear.from_weights(w, pack=True)
            assert model.lm_head.weight_scales.dtype == torch.int8
            model.model.embed_tokens = nmt.Embedding.tied_to(model.lm_head)
            ids = torch.tensor([[0, 3, 999], [4, 500, 31]])
            assert_same_bits(model.model.embed_tokens(ids).numpy(), full[ids.numpy()])
            prompt = PROMPTS[1]
            want = inv.prompt_logits(model, [prompt])[0][-1]
            dec = nmt.Decoder(model)
            dec.reset(1, len(prompt))
            got = dec.step(np.array([prompt]), np.arange(len(prompt))[None], np.array([0]))
            assert torch.equal(got[0], want), isa


def test_a_table_tied_elsewhere_or_to_an_fp8_layer_is_refused():
    model = nmt.convert(inv.random_llama(CONFIG, torch.float32, seed=0), "bf16",
                        batch_invariant=True, threads=False).float()
    other = nmt.Linear.from_weights(table("q8_0", CONFIG.vocab_size, CONFIG.hidden_size))
    model.model.embed_tokens = nmt.Embedding.tied_to(other)
    with pytest.raises(ValueError, match="tied to a layer other than the model's lm_head"):
        nmt.Decoder(model)
    fp8 = nmt.Linear.from_weights(table("e4m3fn", 20, 32))
    with pytest.raises(ValueError, match=r"cannot be tied to a e4m3fn layer"):
        nmt.Embedding.tied_to(fp8)


def test_dtype_casts_of_the_model_leave_a_tables_scales_alone():
    """The scales and offsets are int32 bits in the module: half() and .to(bfloat16) keep
    the rows' bits."""
    w = table("q4_1", 60, 64, seed=5)
    emb = nmt.Embedding.from_weights(w)
    assert emb.weight_scales.dtype == torch.int32 == emb.weight_offsets.dtype
    ids = torch.tensor([1, 4, 59])
    emb.half()
    emb.to(torch.bfloat16)
    assert_same_bits(emb(ids).numpy(), w.decode()[ids.numpy()])
