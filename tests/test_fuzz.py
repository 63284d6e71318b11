"""Run the atheris fuzz targets (tests/fuzz/) for a bounded time: a crash, an exception other
than the documented ones, or a rejected call that wrote into `out` fails the test."""

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

FUZZ = Path(__file__).resolve().parent / "fuzz"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
SECONDS = 15


def _need_atheris() -> None:
    try:
        import atheris  # noqa: F401
    except ImportError:
        if IN_CI:
            pytest.fail("CI must have atheris (a test extra on Linux x86-64)")
        pytest.skip("atheris is not installed")


def _fuzz(target: str, corpus: Path) -> str:
    # the target's scratch file in the test's own directory (pytest removes old ones), not
    # a directory left in /tmp by every run
    env = {**os.environ, "TMPDIR": str(corpus.parent)}
    out = subprocess.run([sys.executable, str(FUZZ / target), str(corpus),
                          f"-max_total_time={SECONDS}", "-rss_limit_mb=4096"],
                         capture_output=True, text=True, timeout=SECONDS * 10, env=env)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    runs = re.search(r"Done (\d+) runs", text)
    assert runs and int(runs.group(1)) > 1000, text[-2000:]
    print(f"{target}: {runs.group(0)} in {SECONDS} s")
    return text


def test_fuzz_safetensors_loader(tmp_path):
    _need_atheris()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    header = json.dumps({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
                         "b": {"dtype": "F32", "shape": [3], "data_offsets": [12, 24]}})
    data = np.arange(6, dtype=np.uint16).tobytes() + np.ones(3, np.float32).tobytes()
    (corpus / "valid").write_bytes(struct.pack("<Q", len(header)) + header.encode() + data)
    _fuzz("fuzz_safetensors.py", corpus)


def test_fuzz_gguf_reader(tmp_path):
    _need_atheris()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    sys.path.insert(0, str(FUZZ.parent))
    try:
        from test_gguf import gguf_file, valid_parts  # a valid file to start from
    finally:
        sys.path.pop(0)
    (corpus / "valid").write_bytes(gguf_file(*valid_parts()))
    _fuzz("fuzz_gguf.py", corpus)


def test_fuzz_argument_validation(tmp_path):
    _need_atheris()
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    _fuzz("fuzz_api.py", corpus)
