"""Provider registry, forcing, and the fallback warning."""

import subprocess
import sys
import warnings

import numpy as np
import pytest

import narrowmm as nm
from narrowmm import providers as reg
from narrowmm._formats import get_format, operations
from narrowmm.providers.native import NativeProvider


def test_priorities_and_order():
    names = [(p.name, p.priority) for p in nm.list_providers()]
    assert names == [("native", 100), ("numpy", 50), ("reference", 0)]


def test_native_serves_every_operation_and_format():
    # the regression the seed exists for: a missing native kernel hiding as a slow one
    for op, fmt in operations():
        provider, kernel = reg.resolve(op, fmt)
        assert provider.name == "native", f"{op} {fmt.name} is served by {provider.name}"
        assert kernel.name


def test_use_provider_forces_and_restores():
    fmt = get_format("fp16")
    with nm.use_provider("reference"):
        assert reg.resolve("matmul", fmt)[0].name == "reference"
        with nm.use_provider("numpy"):
            assert reg.resolve("matmul", fmt)[0].name == "numpy"
        assert reg.resolve("matmul", fmt)[0].name == "reference"
    assert reg.resolve("matmul", fmt)[0].name == "native"


def test_env_var_forces(monkeypatch):
    try:
        monkeypatch.setenv("NARROWMM_PROVIDER", "numpy")
        reg.clear_cache()  # the variable is read at import and by clear_cache
        assert reg.resolve("decode", get_format("bf16"))[0].name == "numpy"
        monkeypatch.setenv("NARROWMM_PROVIDER", "gpu")
        reg.clear_cache()
        with pytest.raises(nm.EnvironmentVariableError,
                           match="NARROWMM_PROVIDER='gpu' is not a provider"):
            reg.resolve("decode", get_format("bf16"))
        with nm.use_provider("numpy"):  # an explicit choice overrides the bad variable
            assert reg.resolve("decode", get_format("bf16"))[0].name == "numpy"
    finally:
        monkeypatch.delenv("NARROWMM_PROVIDER")
        reg.clear_cache()


def test_forcing_an_unavailable_provider_is_an_error(monkeypatch):
    monkeypatch.setattr(NativeProvider, "available", lambda self: False)
    monkeypatch.setattr(NativeProvider, "unavailable_reason", lambda self: "not built")
    reg.clear_cache()
    try:
        with pytest.raises(RuntimeError, match="'native' is unavailable: not built"):
            with nm.use_provider("native"):
                pass
        # unforced, the cascade serves from numpy without complaint: native is not loaded
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert reg.resolve("matmul", get_format("bf16"))[0].name == "numpy"
    finally:
        reg.clear_cache()


def test_missing_native_kernel_warns_once_and_cascades(monkeypatch):
    real = NativeProvider.lookup

    def without_bf16_decode(self, op, fmt):
        return None if (op, fmt.name) == ("decode", "bf16") else real(self, op, fmt)

    monkeypatch.setattr(NativeProvider, "lookup", without_bf16_decode)
    reg.clear_cache()
    try:
        bits = np.array([0x3F80], np.uint16)
        with pytest.warns(nm.FallbackWarning, match="no decode kernel for bf16.*'numpy'"):
            assert nm.decode(bits, "bf16")[0] == 1.0
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once only
            nm.decode(bits, "bf16")
            reg.clear_cache()
            with nm.use_provider("numpy"):  # asked for: no warning
                nm.decode(bits, "bf16")
    finally:
        reg.clear_cache()


def test_registering_a_duplicate_name_fails():
    with pytest.raises(ValueError, match="already registered"):
        reg.register(NativeProvider())


def test_env_provider_in_a_fresh_process():
    code = ("import numpy as np, narrowmm as nm;"
            "print(nm.runtime_info()['kernels'][0]['provider'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"NARROWMM_PROVIDER": "reference", "PATH": ""}, check=True)
    assert out.stdout.strip() == "reference"


def test_forcing_the_scalar_row():
    code = "import narrowmm as nm; print(nm.runtime_info()['isa'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"NARROWMM_ISA": "scalar"}, check=True)
    assert out.stdout.strip() == "scalar"
