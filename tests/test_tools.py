"""The scripts in tools/ that back figures in docs/results/: their checks and what they
hand to the library they drive (llama-cpp-python is not installed here: a stand-in records
the call)."""

from __future__ import annotations

import os
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
