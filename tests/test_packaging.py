"""What a package index and a user see: the license, the metadata, and the sdist."""

from __future__ import annotations

import tarfile
from importlib import metadata
from pathlib import Path

import pytest
from conftest import require

ROOT = Path(__file__).resolve().parents[1]


def test_installed_metadata():
    meta = metadata.metadata("narrowmm")
    assert meta["License-Expression"] == "MIT"
    assert meta["Author"] == "The narrowmm developers"
    classifiers = meta.get_all("Classifier")
    assert "Topic :: Scientific/Engineering :: Artificial Intelligence" in classifiers
    assert "Programming Language :: C" in classifiers
    assert any(c.startswith("Programming Language :: Python :: 3.1") for c in classifiers)
    assert any(c.startswith("Operating System ::") for c in classifiers)
    assert meta.get_all("Project-URL") is None  # none invented
    files = [str(f) for f in metadata.files("narrowmm")]
    assert any(f.endswith("licenses/LICENSE") for f in files), files


def test_license_file_is_mit():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "The narrowmm developers" in text


def test_sdist_carries_the_license(tmp_path, monkeypatch):
    build = require("scikit_build_core.build")
    monkeypatch.chdir(ROOT)
    name = build.build_sdist(str(tmp_path))
    with tarfile.open(tmp_path / name) as sdist:
        names = sdist.getnames()
    top = name.removesuffix(".tar.gz")
    for member in ("LICENSE", "PKG-INFO", "pyproject.toml", "CMakeLists.txt",
                   "src/narrowmm/__init__.py", "csrc/python/module.c"):
        assert f"{top}/{member}" in names, member


@pytest.mark.parametrize("extra", ["tutorial", "bench", "plot", "torch", "models", "test"])
def test_every_extra_is_named_in_the_readme(extra):
    assert f"`{extra}`" in (ROOT / "README.md").read_text()
