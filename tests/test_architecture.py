"""The package's rooms stay apart: no module imports, at any depth of its code, a module
that imports it back (an import circle), and the C core is called for compute only from
providers/."""

from __future__ import annotations

import ast
from pathlib import Path

import narrowmm

PACKAGE = Path(narrowmm.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(name: str) -> bool:
    return (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists()


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def import_graph() -> dict[str, set[str]]:
    """narrowmm module -> the narrowmm modules its code imports, function bodies included
    (``from pkg import name`` counts as a module when ``pkg.name`` is one, else as ``pkg``)."""
    modules = _modules()
    extensions = {f"narrowmm.{p.name.split('.')[0]}" for p in PACKAGE.glob("*.so")}
    extensions.add("narrowmm._core")  # where the build puts it, even from a source tree
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if _is_package(name) else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                for alias in node.names:
                    sub = f"{mod}.{alias.name}"
                    if sub in extensions:
                        continue  # the compiled core imports nothing of ours
                    targets.append(sub if sub in modules else mod)
            for t in targets:
                if t in modules and t != name:
                    graph[name].add(t)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return [*stack[stack.index(m):], m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_no_import_circles():
    graph = import_graph()
    assert "narrowmm._api" in graph and "narrowmm.torch._layer" in graph
    # the walker sees what it should: a function-level import counts
    assert "narrowmm.bench.kernels" in graph["narrowmm.cli"]
    cycle = _cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_walker_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_only_providers_call_the_core_for_compute():
    """matmul, matmul_packed, encode and decode of the binding are called from providers/
    only: everything else goes through a resolved kernel, so "which kernel ran" holds."""
    compute = {"matmul", "matmul_packed", "encode", "decode"}
    offenders = []
    for name, path in _modules().items():
        if name.startswith("narrowmm.providers"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in compute and isinstance(node.func.value, ast.Call)
                    and getattr(node.func.value.func, "id", "") in ("core", "checked_core")):
                offenders.append(f"{name}:{node.lineno}")
    assert offenders == []


def test_no_caller_outside_providers_tests_a_provider_name():
    offenders = []
    for name, path in _modules().items():
        if name.startswith("narrowmm.providers") or name in ("narrowmm._runtime",):
            continue  # _runtime reports the provider that serves each operation
        text = path.read_text()
        for needle in ('.name == "native"', ".name != \"native\"", "name == 'native'"):
            if needle in text:
                offenders.append(f"{name}: {needle}")
    assert offenders == []
