"""A bad NARROWMM_* variable never breaks `import narrowmm` or `narrowmm info`: info shows
the problem, and the first call that needs what the variable configures raises an error
naming the variable and its valid values."""

from __future__ import annotations

import subprocess
import sys

import pytest

from narrowmm.providers.native import core, supported_isas

CALL = ("import numpy as np, narrowmm as nm;"
        "nm.matmul(np.ones((2, 3), np.float32), nm.Weights.from_bits("
        "np.ones((3, 4), np.float32), 'f32'))")


def run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          env={"PATH": "", **env}, timeout=120)


def unsupported_row() -> str | None:
    return next((name for name, ok, _ in core().isa_rows() if not ok), None)


BAD_ISA = ["sse9", *([unsupported_row()] if unsupported_row() else [])]


@pytest.mark.parametrize("value", BAD_ISA)
def test_bad_isa_leaves_import_and_info_working(value):
    out = run(["-c", "import narrowmm"], NARROWMM_ISA=value)
    assert out.returncode == 0, out.stderr
    info = run(["-m", "narrowmm", "info"], NARROWMM_ISA=value)
    assert info.returncode == 0, info.stderr
    assert f"PROBLEM:   NARROWMM_ISA='{value}'" in info.stdout
    assert "scalar" in info.stdout  # the valid values are listed
    js = run(["-m", "narrowmm", "info", "--json"], NARROWMM_ISA=value)
    assert js.returncode == 0 and "NARROWMM_ISA" in js.stdout


@pytest.mark.parametrize("value", BAD_ISA)
def test_bad_isa_fails_the_first_native_call_naming_it(value):
    out = run(["-c", CALL], NARROWMM_ISA=value)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("narrowmm._environ.EnvironmentVariableError: NARROWMM_ISA="), last
    assert "scalar" in last  # names what would work
    pack = run(["-c", "import numpy as np, narrowmm as nm;"
                      "nm.Weights.encode(np.ones((4, 4), np.float32), 'bf16').pack()"],
               NARROWMM_ISA=value)
    assert pack.returncode != 0 and "NARROWMM_ISA" in pack.stderr.splitlines()[-1]


def test_bad_isa_does_not_stop_the_other_providers():
    out = run(["-c", CALL], NARROWMM_ISA="sse9", NARROWMM_PROVIDER="numpy")
    assert out.returncode == 0, out.stderr


def test_bad_provider_is_named_at_the_first_call_and_in_info():
    assert run(["-c", "import narrowmm"], NARROWMM_PROVIDER="bogus").returncode == 0
    out = run(["-c", CALL], NARROWMM_PROVIDER="bogus")
    last = out.stderr.strip().splitlines()[-1]
    assert "NARROWMM_PROVIDER='bogus' is not a provider" in last
    assert "native, numpy, reference" in last
    info = run(["-m", "narrowmm", "info"], NARROWMM_PROVIDER="bogus")
    assert info.returncode == 0 and "PROBLEM:   NARROWMM_PROVIDER='bogus'" in info.stdout


def test_bad_thread_count_is_shown_by_info():
    info = run(["-m", "narrowmm", "info"], NARROWMM_NUM_THREADS="0")
    assert info.returncode == 0, info.stderr
    assert "PROBLEM:   NARROWMM_NUM_THREADS must be between 1 and 256, got 0" in info.stdout


def test_good_isa_is_applied_and_reported():
    info = run(["-m", "narrowmm", "info"], NARROWMM_ISA="scalar")
    assert "isa:       scalar  (forced by NARROWMM_ISA=scalar)" in info.stdout
    assert "PROBLEM" not in info.stdout


# variables the core reads for its settings, bad values, and what info says of them
BAD_SETTINGS = [(name, value, "must be an integer in 0..1048576")
                for name in ("NARROWMM_SLIVER_OUTER_KIB", "NARROWMM_GEMV_PREFETCH_BYTES")
                for value in ("x", "-1", "1.5", str((1 << 20) + 1))]
BAD_SETTINGS += [("NARROWMM_NIBBLE_DECODE", value, "must be one of in-place, permute")
                 for value in ("x", "in_place", "PERMUTE", "1")]
BAD_SETTINGS += [("NARROWMM_GEMV_STREAMS", value, "must be one of 1, 2")
                 for value in ("0", "3", "two", "1.0")]


@pytest.mark.parametrize("name,value,says", BAD_SETTINGS)
def test_bad_setting_is_shown_by_info_and_fails_the_first_call(name, value, says):
    info = run(["-m", "narrowmm", "info"], **{name: value})
    assert info.returncode == 0, info.stderr
    assert f"PROBLEM:   {name}='{value}' {says}" in info.stdout
    out = run(["-c", CALL], **{name: value})
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"narrowmm._environ.EnvironmentVariableError: {name}='{value}'"), last


def test_good_sliver_outer_limit_is_applied_and_reported():
    probe = ("import narrowmm, narrowmm.providers.native as n;"
             "print(n.core().get_sliver_outer_a_bytes())")
    assert run(["-c", probe], NARROWMM_SLIVER_OUTER_KIB="300").stdout.split() == ["307200"]
    assert run(["-c", probe], NARROWMM_SLIVER_OUTER_KIB="0").stdout.split() == ["0"]
    default = run(["-c", probe]).stdout.split()
    assert default == [str(core().sliver_outer_a_default())]
    info = run(["-m", "narrowmm", "info"], NARROWMM_SLIVER_OUTER_KIB="300")
    assert ("while A takes at most 300 KiB (forced by NARROWMM_SLIVER_OUTER_KIB=300)"
            in info.stdout)
    assert "PROBLEM" not in info.stdout


def test_good_gemv_prefetch_distance_is_applied_and_reported():
    probe = ("import narrowmm, narrowmm.providers.native as n;"
             "print(n.core().get_packed_gemv_ahead(), *n.core().packed_gemv_ahead())")
    default = run(["-c", probe]).stdout.split()
    assert default[0] == "None" and default[1] == default[2], default
    forced = run(["-c", probe], NARROWMM_GEMV_PREFETCH_BYTES="512", NARROWMM_ISA="avx2")
    if "avx2" in supported_isas():
        assert forced.stdout.split() == ["512", "512", "2048"], forced.stdout + forced.stderr
        info = run(["-m", "narrowmm", "info"], NARROWMM_GEMV_PREFETCH_BYTES="0",
                   NARROWMM_ISA="avx2")
        assert ("prefetch:  packed weights at m = 1 and 2: no software prefetch (the "
                "hardware's alone) (forced by NARROWMM_GEMV_PREFETCH_BYTES; default 2048)"
                in info.stdout), info.stdout
        assert "PROBLEM" not in info.stdout
    info = run(["-m", "narrowmm", "info"], NARROWMM_GEMV_PREFETCH_BYTES="4096",
               NARROWMM_ISA="scalar")
    assert ("prefetch:  packed weights at m = 1 and 2: no software prefetch on the scalar row"
            in info.stdout), info.stdout


# the avx512 row's walk settings by variable: the core's name for the setting, its two
# values, and info's line for a value (the line's start alone on rows without the setting)
ROW_CHOICES = {
    "NARROWMM_NIBBLE_DECODE": ("nibble_decode", ("in-place", "permute"), "nibbles:",
                               "nibbles:   packed 4-bit weights at m = 1 and 2: the {} decode"),
    "NARROWMM_GEMV_STREAMS": ("gemv_streams", ("1", "2"), "streams:",
                              "streams:   packed weights with pair walks at m = 1: {}"),
}
STREAM_WORDS = {"1": "one group at a time", "2": "two groups at once"}


@pytest.mark.parametrize("variable", list(ROW_CHOICES))
def test_good_row_choice_is_applied_and_reported(variable):
    """NARROWMM_NIBBLE_DECODE forces the avx512 row's 4-bit decode and NARROWMM_GEMV_STREAMS
    its groups at once at m = 1 (the other rows have one way, and say nothing of it); info
    says which runs and whether it was forced."""
    name, values, start, line = ROW_CHOICES[variable]
    words = STREAM_WORDS if name == "gemv_streams" else {v: v for v in values}
    probe = ("import narrowmm, narrowmm.providers.native as n;"
             f"print(n.core().get_{name}(), *n.core().{name}())")
    for value in values:
        forced = run(["-c", probe], **{variable: value, "NARROWMM_ISA": "scalar"})
        assert forced.stdout.split() == [value, "None", "None"], forced.stdout + forced.stderr
    info = run(["-m", "narrowmm", "info"], **{variable: values[1], "NARROWMM_ISA": "scalar"})
    assert start not in info.stdout and "PROBLEM" not in info.stdout, info.stdout
    if "avx512" not in supported_isas():
        return
    default = run(["-c", probe], NARROWMM_ISA="avx512").stdout.split()
    assert default[0] == "None" and default[1] == default[2] != "None", default
    other = values[0] if default[1] == values[1] else values[1]
    forced = run(["-c", probe], **{variable: other, "NARROWMM_ISA": "avx512"})
    assert forced.stdout.split() == [other, other, default[1]], forced.stdout + forced.stderr
    info = run(["-m", "narrowmm", "info"], **{variable: other, "NARROWMM_ISA": "avx512"})
    assert (line.format(words[other]) + f" (forced by {variable}; default {default[1]})"
            in info.stdout), info.stdout
    assert "PROBLEM" not in info.stdout
