"""The scripts in tools/ that back figures in docs/results/: their checks and what they
hand to the library they drive (llama-cpp-python is not installed here: a stand-in records
the call)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# llama_cpp as tools/requantize_gguf.py uses it: the default parameters, the file types and
# llama_model_quantize, which writes what it was asked in place of a file
FAKE_LLAMA_CPP = '''
import ctypes, os

class llama_model_quantize_params(ctypes.Structure):
    _fields_ = [("nthread", ctypes.c_int32), ("ftype", ctypes.c_int),
                ("allow_requantize", ctypes.c_bool)]

LLAMA_FTYPE_MOSTLY_Q4_K_M = 15
LLAMA_FTYPE_MOSTLY_Q6_K = 18

def llama_model_quantize_default_params():
    return llama_model_quantize_params(0, 7, False)

def llama_model_quantize(src, dst, params):
    p = params._obj
    if os.environ.get("FAKE_QUANTIZE") == "fail":
        return 1
    with open(dst, "w") as f:
        f.write(f"{src.decode()} {p.ftype} {p.allow_requantize} {p.nthread}")
    return 0
'''


def run_tool(tmp_path: Path, *args: str, fake: str | None = "works") -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if fake is not None:
        (tmp_path / "llama_cpp.py").write_text(FAKE_LLAMA_CPP)
        env["PYTHONPATH"] = str(tmp_path)
        env["FAKE_QUANTIZE"] = fake
    return subprocess.run([sys.executable, str(ROOT / "tools" / "requantize_gguf.py"), *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_requantize_hands_llama_cpp_the_file_type_and_requantizing(tmp_path):
    source = tmp_path / "in.gguf"
    source.write_bytes(b"GGUF")
    out = tmp_path / "out.gguf"
    done = run_tool(tmp_path, str(out), "--source", str(source), "--type", "Q6_K",
                    "--threads", "3")
    assert done.returncode == 0, done.stderr
    assert out.read_text() == f"{source} 18 True 3"
    assert "wrote" in done.stdout and "Q6_K" in done.stdout


@pytest.mark.parametrize("args, said", [
    (["--threads", "0"], "--threads must be at least 1, not 0"),
    (["--source", "missing.gguf"], "no such file: missing.gguf"),
    (["--type", "Q3_K"], "invalid choice: 'Q3_K'"),
])
def test_requantize_refuses_bad_arguments(tmp_path, args, said):
    (tmp_path / "in.gguf").write_bytes(b"GGUF")
    if "--source" not in args:
        args = [*args, "--source", str(tmp_path / "in.gguf")]
    done = run_tool(tmp_path, str(tmp_path / "out.gguf"), *args)
    assert done.returncode == 2 and said in done.stderr
    assert not (tmp_path / "out.gguf").exists()


def test_requantize_refuses_to_overwrite_its_source(tmp_path):
    source = tmp_path / "in.gguf"
    source.write_bytes(b"GGUF")
    done = run_tool(tmp_path, str(source), "--source", str(source))
    assert done.returncode == 2 and "is the source file" in done.stderr
    assert source.read_bytes() == b"GGUF"


def test_requantize_reports_a_failed_quantization(tmp_path):
    source = tmp_path / "in.gguf"
    source.write_bytes(b"GGUF")
    done = run_tool(tmp_path, str(tmp_path / "out.gguf"), "--source", str(source),
                    fake="fail")
    assert done.returncode == 1 and "llama_model_quantize failed" in done.stderr


def test_requantize_says_it_needs_llama_cpp_python(tmp_path):
    (tmp_path / "llama_cpp.py").write_text("raise ImportError('no llama_cpp here')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "requantize_gguf.py"),
                           str(tmp_path / "out.gguf")], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 2 and "needs llama-cpp-python" in done.stderr


# ---- tools/perf/walk_ab.py: an A/B of a walk setting in one process ----------------------

WALK_AB = ROOT / "tools" / "perf" / "walk_ab.py"
TINY_AB = ["--shape", "64x256", "--rounds", "3", "--evict-mib", "1", "--copies-mib", "1"]


def run_walk_ab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(WALK_AB), *args], capture_output=True,
                          text=True, timeout=300)


def test_walk_ab_times_every_value_of_the_setting_for_every_format():
    done = run_walk_ab("--setting", "decode=permute,in-place,default", "--format", "q4_0",
                       "--format", "q4_1", *TINY_AB)
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.strip().splitlines()
    assert "64 x 256, decode = permute, in-place, default by turns, 3 rounds" in header
    assert [r.split()[0] for r in rows] == ["q4_0", "q4_1"]
    for row in rows:
        assert "permute: " in row and "in-place: " in row and "default: " in row
        assert row.count(" ms [") == 3 and "1.000x" in row  # the first value against itself


@pytest.mark.parametrize("args, said", [
    (["--setting", "threads=1,2"],
     "--setting names one of streams, decode, prefetch, huge_pages"),
    (["--setting", "huge_pages=0,2"], "--setting huge_pages: a value is 0 or 1"),
    (["--setting", "streams=2"], "needs two or more different values"),
    (["--setting", "streams=2,2"], "needs two or more different values"),
    (["--setting", "streams=1,3"], "gemv_streams must be 1, 2 or None, not 3"),
    (["--setting", "prefetch=2048,-1"], "packed_gemv_ahead must be >= 0"),
    (["--setting", "decode=permute,fast"], "a decode is in-place, permute or default"),
    (["--setting", "streams=1,2", "--shape", "4096"], "--shape is k x n"),
    (["--setting", "streams=1,2", "--rows", "0"], "--rows must be in 1..64"),
    (["--setting", "streams=1,2", "--copies-mib", "100000000"], "more than half of the"),
    (["--setting", "streams=1,2", "--threads", "2"], "--threads is for --model"),
    (["--setting", "streams=1,2", "--format", "q9_9"], "--format q9_9"),
    (["--setting", "streams=1,2", "--format", "q6_k", "--shape", "64x256"],
     "--format q6_k: q6_k (GGUF Q6_K) takes k a positive multiple of its 256-row blocks"),
    (["--setting", "streams=1,2", "--model", "smollm2", "--format", "q4_0"],
     "--format is for the calls alone"),
    (["--setting", "streams=1,2", "--model", "smollm2", "--threads", "0"],
     "--threads takes counts of at least 1"),
])
def test_walk_ab_refuses_bad_arguments(args, said):
    done = run_walk_ab(*args)
    assert done.returncode == 2 and said in done.stderr, done.stderr


def test_walk_ab_leaves_the_setting_as_it_found_it(monkeypatch, capsys):
    import importlib.util

    from narrowmm.providers.native import core

    spec = importlib.util.spec_from_file_location("walk_ab", WALK_AB)
    walk_ab = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str(WALK_AB.parent))  # its import of walk_rates
    spec.loader.exec_module(walk_ab)
    c = core()
    c.set_gemv_streams(1)
    try:
        monkeypatch.setattr(sys, "argv", ["walk_ab.py", "--setting", "streams=2,default",
                                          "--format", "q8_0", *TINY_AB])
        walk_ab.main()
        assert c.get_gemv_streams() == 1
    finally:
        c.set_gemv_streams(None)
    assert capsys.readouterr().out.count("q8_0 ") == 1


@pytest.mark.parametrize("name, variable, formats", [
    ("huge_pages", "NARROWMM_HUGE_PAGES", ["q4_0", "q8_0"]),
    ("factored", "NARROWMM_FACTORED_SCALES", ["q4_k", "q6_k"]),
])
def test_walk_ab_packs_each_value_of_a_load_setting_with_its_variable_set(monkeypatch, capsys,
                                                                        name, variable,
                                                                        formats):
    """A load setting acts where weights are packed: each value gets copies of its own,
    packed with its variable set to it, which is put back after."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("walk_ab", WALK_AB)
    walk_ab = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str(WALK_AB.parent))
    spec.loader.exec_module(walk_ab)
    seen: list[str | None] = []
    real = walk_ab.more_copies

    def spy(w, count):
        seen.append(os.environ.get(variable))
        return real(w, count)

    monkeypatch.setattr(walk_ab, "more_copies", spy)
    monkeypatch.setenv(variable, "1")
    monkeypatch.setattr(sys, "argv", ["walk_ab.py", "--setting", f"{name}=0,1",
                                      "--format", formats[0], "--format", formats[1],
                                      *TINY_AB, "--shape", "256x64"])  # a K type's block
    walk_ab.main()
    assert seen == ["0", "1", "0", "1"]
    assert os.environ[variable] == "1"
    header, *rows = capsys.readouterr().out.strip().splitlines()
    assert f"{name} = 0, 1 by turns" in header
    assert [r.split()[0] for r in rows] == formats
    assert all("0: " in r and "1: " in r and r.count(" ms [") == 2 for r in rows)


@pytest.mark.parametrize("setting, first, second", [
    ("streams=2,1", "2", "1"),  # set call by call on one Decoder
    ("huge_pages=1,0", "1", "0"),  # a Decoder loaded with each value
])
def test_walk_ab_takes_a_settings_turns_on_a_gguf_files_decoder(setting, first, second):
    from conftest import require

    require("transformers")
    from test_gguf import smollm2_path

    done = run_walk_ab("--setting", setting, "--model", str(smollm2_path()),
                       "--threads", "1", "--rounds", "2", "--steps", "2")
    assert done.returncode == 0, done.stderr
    header, row = done.stdout.strip().splitlines()[-2:]
    name = setting.partition("=")[0]
    assert (f"SmolLM2-135M-Instruct.Q4_1.gguf's Decoder, {name} = {first}, {second} by turns, "
            "2 rounds of 2 steps") in header
    assert row.startswith(f"1 thread(s)  {first}: ") and f" {second}: " in row
    assert row.count(" ms a step ") == 2


def test_walk_ab_refuses_a_missing_model_file(tmp_path):
    done = run_walk_ab("--setting", "streams=1,2", "--model", str(tmp_path / "none.gguf"))
    assert done.returncode == 2 and "--model: no such file" in done.stderr


# ---- tools/perf/build_ab.py: an A/B of two builds of the C core in one process ------------

BUILD_AB = ROOT / "tools" / "perf" / "build_ab.py"
TINY_BUILD_AB = ["--shape", "64x256", "--rows", "9", "--rounds", "3", "--evict-mib", "1",
                 "--copies-mib", "1"]


def two_cores(tmp_path: Path) -> tuple[Path, Path]:
    """Two files of the installed extension, each in a build directory of its own."""
    import narrowmm

    (core,) = Path(narrowmm.__file__).parent.glob("_core*")
    dirs = (tmp_path / "a", tmp_path / "b")
    for d in dirs:
        d.mkdir()
        shutil.copy2(core, d / core.name)
    return dirs


def run_build_ab(*args: str, patch: str = "") -> subprocess.CompletedProcess:
    """build_ab's main in a fresh interpreter, after ``patch`` (Python, with the tool as
    ``build_ab``)."""
    code = (f"import importlib.util, sys\nsys.argv = ['build_ab.py', *{list(args)!r}]\n"
            f"spec = importlib.util.spec_from_file_location('build_ab', {str(BUILD_AB)!r})\n"
            "build_ab = importlib.util.module_from_spec(spec)\n"
            "spec.loader.exec_module(build_ab)\n" + patch + "build_ab.main()\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


def test_build_ab_times_both_builds_on_their_own_package_copies(tmp_path):
    a, b = two_cores(tmp_path)
    done = run_build_ab("--a", str(a), "--b", str(b), "--format", "q8_0", "--format", "bf16",
                        *TINY_BUILD_AB)
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.strip().splitlines()
    assert "(narrowmm_a)" in header and "(narrowmm_b)" in header
    assert "; m = 9, " in header and "64 x 256 packed, by turns, 3 rounds, 1 MiB read" in header
    assert [r.split()[0] for r in rows] == ["q8_0", "bf16"]
    assert all(" ms  B " in r and "x the speed of A" in r for r in rows)


def test_build_ab_refuses_builds_whose_products_differ(tmp_path):
    a, b = two_cores(tmp_path)
    # build B's matmul then flips the last bit of every product
    patch = ("load = build_ab.load_build\n"
             "def load_build(label, core, into):\n"
             "    nm = load(label, core, into)\n"
             "    if label == 'b':\n"
             "        real = nm.matmul\n"
             "        def matmul(x, w, out):\n"
             "            real(x, w, out=out)\n"
             "            out.view('uint32')[...] ^= 1\n"
             "        nm.matmul = matmul\n"
             "    return nm\n"
             "build_ab.load_build = load_build\n")
    done = run_build_ab("--a", str(a), "--b", str(b), "--format", "q4_0", *TINY_BUILD_AB,
                        patch=patch)
    assert done.returncode != 0
    assert "q4_0: the builds' products differ" in done.stderr


@pytest.mark.parametrize("args, said", [
    (["--shape", "4096"], "--shape is k x n"),
    (["--rows", "0"], "--rows must be in 1..256"),
    (["--rounds", "0"], "--rounds and --copies-mib must be positive"),
    (["--copies-mib", "100000000"], "more than half of the"),
    (["--format", "q9_9"], "--format q9_9"),
    (["--format", "q4_k", "--shape", "64x256"],
     "--format q4_k: q4_k (GGUF Q4_K) takes k a positive multiple of its 256-row blocks"),
])
def test_build_ab_refuses_bad_arguments(tmp_path, args, said):
    a, b = two_cores(tmp_path)
    done = run_build_ab("--a", str(a), "--b", str(b), *args)
    assert done.returncode == 2 and said in done.stderr, done.stderr


def test_build_ab_refuses_a_directory_without_one_extension_and_the_same_one_twice(tmp_path):
    a, _ = two_cores(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    done = run_build_ab("--a", str(a), "--b", str(empty))
    assert done.returncode == 2 and "holds 0 _core extensions, not one" in done.stderr
    done = run_build_ab("--a", str(a), "--b", str(a))
    assert done.returncode == 2 and "--a and --b are the same extension" in done.stderr
