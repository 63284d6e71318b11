"""The build runs on an x86-64 CPU without AVX-512: importing narrowmm and running every
format on the avx2 row must execute no instruction of a row the CPU lacks.

Every row's kernel table is filled at import on every CPU (csrc/kernels/nm_kernels.h,
NM_ROW_FILL), so an AVX-512 instruction in the avx512 file's fill killed the import on an
AVX2-only Zen 3 with SIGILL, while every test passed on the AVX-512 machines CI runs on.
qemu-x86_64 (user mode, TCG) implements AVX2 but not AVX-512, so it is such a CPU on any
x86-64 host: Python runs under it here, imports the package and multiplies, and the bits are
compared with the host's own avx2 row.

Locally a missing qemu-x86_64 skips; in CI (CI=true) it fails, since .ci/run installs it
(tools/install-test-deps: qemu-user)."""

import json
import os
import platform
import shutil
import subprocess
import sys

import pytest

import narrowmm as nm

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Runs under qemu: every format, row-major and packed, m = 1, 2 (the gemvs) and 5 (tiles),
# then the runtime report (which names every row's kernels). Prints the outputs' bits.
CHILD = r"""
import json, sys
import numpy as np
import narrowmm as nm
import narrowmm._core as core

assert core.isa() == "avx2", core.isa()
if sys.argv[2:] == ["no-avx512"]:  # the run under qemu: a CPU without AVX-512
    assert "avx512f" not in core.cpu_features(), core.cpu_features()
rng = np.random.default_rng(7)
k, n = 64, 40
w = rng.standard_normal((k, n)).astype(np.float32)
x = rng.standard_normal((5, k)).astype(np.float32)
out = {}
for fmt in sys.argv[1].split(","):
    f = nm.get_format(fmt)
    weights = (nm.Weights.quantize(w, fmt) if f.scaled
               else nm.Weights.from_bits(nm.encode(w, fmt), fmt) if f.has_codec
               else nm.Weights(w))
    for name, ws in (("rows", weights), ("packed", weights.pack())):
        for m in (1, 2, 5):
            y = nm.matmul(x[:m], ws)
            out[f"{fmt} {name} {m}"] = y.view(np.uint32).tolist()
nm.show_runtime()
print("RESULT " + json.dumps(out))
"""


def test_import_and_every_format_on_a_cpu_without_avx512(tmp_path):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("an x86-64 build's test")
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        if IN_CI:
            pytest.fail("CI must provide qemu-x86_64 (qemu-user; tools/install-test-deps)")
        pytest.skip("qemu-x86_64 not installed (tools/install-test-deps installs it)")
    rows = dict((name, ok) for name, ok, _ in nm._core.isa_rows())
    if "avx2" not in rows:
        pytest.skip("this build has no avx2 row")
    formats = list(nm.FORMATS)
    # "max" is every feature TCG implements: AVX2, FMA, F16C, and no AVX-512
    proc = subprocess.run([qemu, "-cpu", "max", sys.executable, "-c", CHILD, ",".join(formats),
                           "no-avx512"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NARROWMM_NUM_THREADS": "1"}, cwd=tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode} (-4: SIGILL) under qemu:\n{text}"
    if "avx512" in rows:  # built, and reported as the row this CPU lacks
        assert "avx512 (missing avx512f" in proc.stdout, proc.stdout
    got = json.loads(proc.stdout.split("RESULT ", 1)[1])

    # the host's own avx2 row gives the same bits (a host without AVX2 cannot check them)
    if not rows["avx2"]:
        return
    env = {**os.environ, "NARROWMM_ISA": "avx2", "NARROWMM_NUM_THREADS": "1"}
    host = subprocess.run([sys.executable, "-c", CHILD, ",".join(formats)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert host.returncode == 0, host.stdout + host.stderr
    expected = json.loads(host.stdout.split("RESULT ", 1)[1])
    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key] == expected[key], key
