"""What the library chose on this machine and why (the ``narrowmm info`` command)."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _environ
from ._arena import huge_pages_enabled, placement, transparent_huge_pages
from ._formats import get_format, operations
from ._threads import get_num_threads
from .providers import forced_provider, get_provider, providers, resolve
from .providers.native import core, describe_kernels


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name as the OS reports it; on x86 with its family and model numbers,
    since a virtual machine may report no more than "AMD EPYC" and those tell its generation
    (family 25 model 17 is a Zen 4, family 26 a Zen 5)."""
    name, fields = "", {}
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:  # the first of each field: the first CPU's
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "hardware", "cpu model") and not name:
                    name = value.strip()
                elif key in ("cpu family", "model"):
                    fields.setdefault(key, value.strip())
    except OSError:
        pass
    name = name or platform.processor() or platform.machine()
    if fields.get("cpu family", "").isdigit() and fields.get("model", "").isdigit():
        name += f" (family {fields['cpu family']} model {fields['model']})"
    return name


def _labelled_walks(kernel_names: Callable[[str, Any], list[str]] | None, fmt: Any,
                    *parts: tuple[str, tuple[str, ...]]) -> str:
    """The C walks the row in use has for each (operation, labels) of ``parts``, each name
    followed by its label, joined by "; " ("" where it has none, or without
    ``kernel_names``)."""
    if kernel_names is None:
        return ""
    return "; ".join(f"{walk}{label}" for what, labels in parts
                     for walk, label in zip(kernel_names(what, fmt), labels, strict=False))


def runtime_info() -> dict[str, Any]:
    """A JSON-ready description: version, CPU, ISA row, threads, providers, kernels."""
    from ._version import __version__

    c = core()
    native = get_provider("native")
    prefetch = c.packed_gemv_ahead() if c else (None, None)
    nibbles = c.nibble_decode() if c else (None, None)
    streams = c.gemv_streams() if c else (None, None)
    kernels = []
    for op, fmt in operations():
        try:
            provider, kernel = resolve(op, fmt)
        except (RuntimeError, ValueError) as exc:  # a bad NARROWMM_* value, say: show it
            kernels.append({"op": op, "format": fmt.name, "provider": None,
                            "kernel": None, "error": str(exc)})
            continue
        name = kernel.name
        entry = {"op": op, "format": fmt.name, "provider": provider.name}
        if provider is native:  # names of the row in use now, not when first resolved
            packed = native.kernel_names("matmul_packed", fmt) if op == "matmul" else []
            name = describe_kernels(op, native.kernel_names(op, fmt), packed or None)
            if op == "matmul" and fmt.special_bits:  # what weights without NaN/Inf take
                entry["finite_kernel"] = describe_kernels(
                    op, native.kernel_names("matmul_finite", fmt),
                    native.kernel_names("matmul_packed_finite", fmt) or None)
            half = native.kernel_names("matmul_packed_half", fmt) if op == "matmul" else []
            if half:  # packed weights whose scales are binary16 (Format.half_scales)
                rows = ("m=1", "m=2", "4 rows")[:len(half)]  # the m == 4 walk: optional
                entry["half_scale_kernel"] = "; ".join(
                    f"{name} ({r})" for name, r in zip(half, rows, strict=True))
            walks = native.kernel_names if op == "matmul" else None
            # packed weights under a factored grid (the K types): the row's own m = 1 (and
            # m = 2) walks and the m == 4 walk on the grid multiplied out, where it has them
            factored = _labelled_walks(walks, fmt,
                                       ("matmul_packed_factored", (" (m=1)", " (m=2)")),
                                       ("matmul_packed_quad", (" (4 rows)",)))
            if factored:
                entry["factored_scale_kernel"] = factored
            # m = 1 over two groups at once (gemv_streams): float32, binary16, factored grids
            pair = _labelled_walks(walks, fmt,
                                   ("matmul_packed_pair", ("", " (binary16 scales)")),
                                   ("matmul_packed_factored_pair", (" (factored scales)",)))
            if pair:
                entry["pair_kernel"] = pair
        kernels.append({**entry, "kernel": name})
    return {
        "version": __version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_features": list(c.cpu_features()) if c else [],
        "isa": c.isa() if c else None,
        "isa_forced": (None if "NARROWMM_ISA" in _environ.problems()
                       else os.environ.get("NARROWMM_ISA") or None),
        "isa_rows": [{"name": n, "supported": s, "missing": list(miss)}
                     for n, s, miss in (c.isa_rows() if c else [])],
        "threads": get_num_threads(),
        "wake_min_work": c.get_wake_min_work() if c else None,
        # packed weights at few rows: slivers outside the k blocks while A for all of k
        # fits this many bytes (NARROWMM_SLIVER_OUTER_KIB, else the core's L2 held within
        # 512 KiB..1 MiB)
        "sliver_outer_a_bytes": c.get_sliver_outer_a_bytes() if c else None,
        "sliver_outer_forced": (None if "NARROWMM_SLIVER_OUTER_KIB" in _environ.problems()
                                else os.environ.get("NARROWMM_SLIVER_OUTER_KIB", "").strip()
                                or None),
        "l2_cache_bytes": c.l2_cache_bytes() if c else None,
        # how far the packed m <= 2 walks of the row in use prefetch their weights (bytes;
        # None: a row without the hint), its default on this CPU, and whether
        # NARROWMM_GEMV_PREFETCH_BYTES forced it
        "gemv_prefetch_bytes": prefetch[0],
        "gemv_prefetch_default": prefetch[1],
        "gemv_prefetch_forced": c.get_packed_gemv_ahead() is not None if c else False,
        # how the packed m <= 2 walks of the row in use decode 4-bit codes ("in-place" or
        # "permute"; None: a row with one decode), its default on this CPU, and whether
        # NARROWMM_NIBBLE_DECODE forced it
        "nibble_decode": nibbles[0],
        "nibble_decode_default": nibbles[1],
        "nibble_decode_forced": c.get_nibble_decode() is not None if c else False,
        # how many groups of packed weights the m = 1 walks of the row in use take at once
        # (1 or 2; None: a row without pair walks), its default on this CPU, and whether
        # NARROWMM_GEMV_STREAMS forced it
        "gemv_streams": streams[0],
        "gemv_streams_default": streams[1],
        "gemv_streams_forced": c.get_gemv_streams() is not None if c else False,
        "spin_ns": c.get_spin_ns() if c else None,
        "omp_team": bool(c.omp_team()) if c else False,
        # the packed width of a 16-bit format, then of a byte one (Weights.pack)
        "pack_width": ([c.pack_width(get_format(f).code) for f in ("bf16", "q8_0")]
                       if c else None),
        "provider_forced": forced_provider(),
        "providers": [{"name": p.name, "priority": p.priority, "available": p.available(),
                       "reason": p.unavailable_reason()} for p in providers()],
        "kernels": kernels,
        # narrowmm.ops (the C core only): SiLU and attention's softmax exps have a kernel
        # per ISA row, RMS norm and attention one portable C function each
        "model_ops": ({"silu": c.kernel_names("silu", 0)[0], "rms_norm": "ops/rowops.c",
                       "attention": "ops/attention.c",
                       "softmax_exp": c.kernel_names("expf", 0)[0]} if c else {}),
        # what multiplies out the K types' factored grids of scales for the kernels, and
        # whether packed weights make them (NARROWMM_FACTORED_SCALES; None: a bad value)
        "factored_scales": c.kernel_names("widen_factored", 0)[0] if c else None,
        "factored_scales_enabled": _factored_setting(),
        # where a load packs its weights (_arena): on huge pages when both say so
        "huge_pages": {"enabled": _environ.setting("NARROWMM_HUGE_PAGES", huge_pages_enabled),
                       "transparent_huge_pages": transparent_huge_pages()},
        "environment_problems": _environ.problems(),
    }


def _factored_setting() -> bool | None:
    """NARROWMM_FACTORED_SCALES as packed weights read it; None (the problem recorded, for
    the report) for a bad value."""
    from ._weights import factored_scales_enabled

    return _environ.setting("NARROWMM_FACTORED_SCALES", factored_scales_enabled)


def show_runtime(as_json: bool = False) -> None:
    """Print :func:`runtime_info` for people (or as JSON)."""
    info = runtime_info()
    if as_json:
        print(json.dumps(info, indent=2))
        return
    print(f"narrowmm {info['version']}  (Python {info['python']}, NumPy {info['numpy']})")
    print(f"cpu:       {info['cpu']} [{info['machine']}]")
    print(f"features:  {' '.join(info['cpu_features']) or '-'}")
    rows = ", ".join(
        r["name"] + ("" if r["supported"] else f" (missing {' '.join(r['missing'])})")
        for r in info["isa_rows"]
    )
    forced = f"  (forced by NARROWMM_ISA={info['isa_forced']})" if info["isa_forced"] else ""
    print(f"isa:       {info['isa']}{forced}; rows built: {rows or '-'}")
    wake = info["wake_min_work"]
    rule = (f" (a call under {wake:,} multiply-adds runs on the caller alone while the "
            "workers sleep)" if wake and info["threads"] > 1 else "")
    spin = info["spin_ns"]
    if info["omp_team"]:
        rule = (" on an OpenMP team shared with the framework (narrowmm.torch."
                "set_num_threads), not narrowmm's pool")
    elif spin is not None and info["threads"] > 1:
        rule += f"; workers spin {spin / 1000:g} us after a call before they sleep"
    print(f"threads:   {info['threads']}{rule}")
    if info["sliver_outer_a_bytes"] is not None:
        l2 = info["l2_cache_bytes"]
        source = (f"forced by NARROWMM_SLIVER_OUTER_KIB={info['sliver_outer_forced']}"
                  if info["sliver_outer_forced"]
                  else f"this core's L2: {l2 >> 10} KiB" if l2 else "the L2 size is unknown")
        print(f"tiling:    packed weights at few rows walk slivers outside the k blocks "
              f"while A takes at most {info['sliver_outer_a_bytes'] >> 10} KiB ({source})")
    if info["gemv_prefetch_bytes"] is not None:
        ahead, default = info["gemv_prefetch_bytes"], info["gemv_prefetch_default"]
        walks = ("packed weights at m = 1 and 2: "
                 + (f"the walks prefetch {ahead} bytes down their stream" if ahead
                    else "no software prefetch (the hardware's alone)"))
        source = ("forced by NARROWMM_GEMV_PREFETCH_BYTES" if info["gemv_prefetch_forced"]
                  else "this row's default on this CPU")
        print(f"prefetch:  {walks} ({source}"
              + (f"; default {default})" if info["gemv_prefetch_forced"] else ")"))
    elif info["isa"]:
        print(f"prefetch:  packed weights at m = 1 and 2: no software prefetch on the "
              f"{info['isa']} row")
    if info["nibble_decode"] is not None:
        source = ("forced by NARROWMM_NIBBLE_DECODE; default "
                  f"{info['nibble_decode_default']}" if info["nibble_decode_forced"]
                  else "this row's default on this CPU")
        print(f"nibbles:   packed 4-bit weights at m = 1 and 2: the {info['nibble_decode']} "
              f"decode ({source})")
    if info["gemv_streams"] is not None:
        source = ("forced by NARROWMM_GEMV_STREAMS; default "
                  f"{info['gemv_streams_default']}" if info["gemv_streams_forced"]
                  else "this row's default on this CPU")
        groups = "two groups at once" if info["gemv_streams"] == 2 else "one group at a time"
        print(f"streams:   packed weights with pair walks at m = 1: {groups} ({source})")
    if info["pack_width"]:
        wide, byte = info["pack_width"]
        print(f"packing:   Weights.pack() makes {wide}-column slivers for this row "
              f"({byte} for the formats of a byte or less a weight)")
    for p in info["providers"]:
        state = "available" if p["available"] else f"unavailable: {p['reason']}"
        print(f"provider:  {p['name']:<9} priority {p['priority']:>3}  {state}")
    if info["provider_forced"]:
        print(f"forced:    NARROWMM_PROVIDER={info['provider_forced']}")
    for message in info["environment_problems"].values():
        print(f"PROBLEM:   {message}")
    print("kernels:")
    for k in info["kernels"]:
        if k["provider"] is None:
            known = k["error"] in info["environment_problems"].values()
            print(f"  {k['op']:<6} {k['format']:<6} unusable: "
                  f"{'see PROBLEM above' if known else k['error']}")
        else:
            print(f"  {k['op']:<6} {k['format']:<6} {k['provider']:<9} {k['kernel']}")
            if "finite_kernel" in k:
                print(f"  {'':<6} {'':<6} {'':<9} weights without NaN/Inf codes: "
                      f"{k['finite_kernel']}")
            if "half_scale_kernel" in k:
                print(f"  {'':<6} {'':<6} {'':<9} packed, binary16 scales: "
                      f"{k['half_scale_kernel']}")
            if "factored_scale_kernel" in k:
                print(f"  {'':<6} {'':<6} {'':<9} packed, factored scales: "
                      f"{k['factored_scale_kernel']}")
            if "pair_kernel" in k:
                print(f"  {'':<6} {'':<6} {'':<9} packed, two groups at m=1: "
                      f"{k['pair_kernel']}")
    ops = ", ".join(f"{op} {name}" for op, name in info["model_ops"].items())
    print(f"model ops: {ops or 'unavailable (no C core)'}")
    if info["factored_scales"]:
        setting = {True: "", False: " (off: NARROWMM_FACTORED_SCALES=0)",
                   None: " (see PROBLEM above)"}[info["factored_scales_enabled"]]
        print(f"factored scales (the K types, packed): {info['factored_scales']}{setting}")
    problem = " (see PROBLEM above)" if info["huge_pages"]["enabled"] is None else ""
    print(f"a load's packed weights: {placement(info['huge_pages'])}{problem}")
