"""The C core outside Python: the C test driver natively under ASan + UBSan and under TSan,
cross-built for AArch64 and run under qemu (the neon row), and warning-free builds with gcc
and clang.

Each builds with CMake into a temporary folder. Locally a missing tool skips the test; in CI
(CI=true) it fails, since .ci/run installs the tools (tools/install-test-deps)."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        if IN_CI:
            pytest.fail(f"CI must provide {missing} (see tools/install-test-deps)")
        pytest.skip(f"{missing} not installed (tools/install-test-deps installs them)")


def build(tmp_path: Path, *options: str, env: dict | None = None) -> tuple[Path, str]:
    """Configure and build the C core and its test driver; returns (build dir, log)."""
    need("cmake")
    build_dir = tmp_path / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    cmd_env = {**os.environ, **(env or {})}
    log = ""
    for cmd in (["cmake", "-S", str(ROOT), "-B", str(build_dir), *generator,
                 "-DNM_BUILD_PYTHON=OFF", "-DNM_BUILD_C_TESTS=ON", *options],
                ["cmake", "--build", str(build_dir)]):
        out = subprocess.run(cmd, capture_output=True, text=True, env=cmd_env, timeout=600)
        log += out.stdout + out.stderr
        assert out.returncode == 0, log
    return build_dir, log


def run_driver(cmd: list[str]) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    text = out.stdout + out.stderr
    print(text)  # shown with -s, and in the failure report
    assert out.returncode == 0, text
    summary = re.search(r"^(\d+) passed, (\d+) failed$", out.stdout, flags=re.M)
    assert summary and int(summary.group(1)) > 0 and summary.group(2) == "0", text
    return text


def test_driver_under_address_and_undefined_sanitizers(tmp_path):
    need("cc")
    build_dir, _ = build(tmp_path, "-DNM_SANITIZE=address,undefined",
                         "-DCMAKE_BUILD_TYPE=RelWithDebInfo")
    text = run_driver([str(build_dir / "nm_test_kernels")])
    assert "runtime error" not in text and "AddressSanitizer" not in text


def test_driver_under_thread_sanitizer(tmp_path):
    """The pool's spin-then-sleep handshake and the per-part buffers, raced by ThreadSanitizer
    across the driver's thread counts (1 to 7)."""
    need("cc")
    build_dir, _ = build(tmp_path, "-DNM_SANITIZE=thread", "-DCMAKE_BUILD_TYPE=RelWithDebInfo")
    text = run_driver([str(build_dir / "nm_test_kernels")])
    assert "ThreadSanitizer" not in text


def cross_toolchain_problem(tmp_path: Path, *extra: str) -> str | None:
    """Why aarch64-linux-gnu-gcc cannot link a program, naming the package to install, or
    None. A compiler installed without its C library (gcc-aarch64-linux-gnu only recommends
    libc6-dev-arm64-cross) passes `need` but fails every link: say so in one line, not in a
    CMake log."""
    src = tmp_path / "hello.c"
    src.write_text("#include <stdio.h>\nint main(void) { puts(\"ok\"); return 0; }\n")
    out = subprocess.run(["aarch64-linux-gnu-gcc", *extra, str(src), "-o",
                          str(tmp_path / "hello")], capture_output=True, text=True, timeout=120)
    if out.returncode == 0:
        return None
    said = " ".join(out.stderr.split())[:300]
    return ("the AArch64 cross toolchain is half-installed: aarch64-linux-gnu-gcc cannot link "
            "a program, so its C library is missing; install libc6-dev-arm64-cross "
            f"(tools/install-test-deps does). The linker said: {said}")


def test_half_installed_cross_toolchain_is_named(tmp_path):
    """-nostdlib (no crt files, no libc at link time) stands for a machine without
    libc6-dev-arm64-cross."""
    need("aarch64-linux-gnu-gcc")
    problem = cross_toolchain_problem(tmp_path, "-nostdlib")
    assert problem is not None and "install libc6-dev-arm64-cross" in problem
    assert cross_toolchain_problem(tmp_path) is None, "the real toolchain must link"


def test_install_script_names_the_cross_libc(tmp_path):
    """tools/install-test-deps --check lists libc6-dev-arm64-cross when the sysroot lacks
    it, even where the compiler is installed."""
    (tmp_path / "lib").mkdir()
    out = subprocess.run(["bash", str(ROOT / "tools" / "install-test-deps"), "--check"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "NM_AARCH64_SYSROOT": str(tmp_path)})
    assert out.returncode == 1
    assert "libc6-dev-arm64-cross" in out.stdout


def test_neon_row_under_qemu(tmp_path):
    need("aarch64-linux-gnu-gcc", "qemu-aarch64")
    problem = cross_toolchain_problem(tmp_path)
    if problem:
        pytest.fail(problem) if IN_CI else pytest.skip(problem)
    build_dir, log = build(tmp_path, f"-DCMAKE_TOOLCHAIN_FILE={ROOT}/cmake/aarch64-linux-gnu.cmake")
    assert "warning:" not in log, log
    text = run_driver(["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu",
                       str(build_dir / "nm_test_kernels")])
    assert "row neon: ok" in text and "row scalar: ok" in text


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_core_builds_without_warnings(tmp_path, compiler):
    need(compiler)
    _, log = build(tmp_path, env={"CC": compiler})
    assert "warning:" not in log, log
