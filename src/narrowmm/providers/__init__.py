"""Kernel providers and the dispatch that chooses among them.

Providers are tried in priority order (native 100 > numpy 50 > reference 0); the first
available one whose ``lookup`` returns a kernel serves the call, and a None cascades to the
next. ``NARROWMM_PROVIDER`` (read at import, and again by :func:`clear_cache`) or
:func:`use_provider` forces one provider for every call.

A call served below ``native`` while the extension is loaded is a missing native kernel
hiding as a slow one; it raises :class:`FallbackWarning` once per (operation, format).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import warnings
from collections.abc import Iterator

from .. import _environ
from .._environ import EnvironmentVariableError
from .._formats import Format
from ._base import Kernel, Provider
from .native import NativeProvider
from .numpy_impl import NumpyProvider
from .reference import ReferenceProvider

__all__ = [
    "FallbackWarning",
    "Kernel",
    "Provider",
    "get_provider",
    "providers",
    "register",
    "resolve",
    "use_provider",
]


class FallbackWarning(RuntimeWarning):
    """A call was served by a slower provider although the native core is loaded."""


_lock = threading.Lock()
_providers: list[Provider] = []
_cache: dict[tuple[str, str, str | None], tuple[Provider, Kernel]] = {}
_warned: set[tuple[str, str]] = set()
_forced: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "narrowmm_provider", default=None
)
_env_forced: str | None = os.environ.get("NARROWMM_PROVIDER") or None


def register(provider: Provider) -> None:
    """Add a provider; the list stays sorted by priority, highest first."""
    with _lock:
        if any(p.name == provider.name for p in _providers):
            raise ValueError(f"a provider named {provider.name!r} is already registered")
        _providers.append(provider)
        _providers.sort(key=lambda p: -p.priority)
        _cache.clear()


def providers() -> list[Provider]:
    """The registered providers, highest priority first."""
    return list(_providers)


def get_provider(name: str) -> Provider:
    """The registered provider called ``name`` (ValueError if there is none)."""
    for p in _providers:
        if p.name == name:
            return p
    known = ", ".join(p.name for p in _providers)
    raise ValueError(f"unknown provider {name!r}; known providers: {known}")


def forced_provider() -> str | None:
    """The provider forced by :func:`use_provider` or ``NARROWMM_PROVIDER``, if any."""
    return _forced.get() or _env_forced


@contextlib.contextmanager
def use_provider(name: str) -> Iterator[Provider]:
    """Serve every call inside the ``with`` block from provider ``name``.

    The choice is local to the current thread / async context. Raises ValueError for an
    unknown name and RuntimeError if the provider is unavailable here.
    """
    provider = get_provider(name)
    _check_available(provider)
    token = _forced.set(name)
    try:
        yield provider
    finally:
        _forced.reset(token)


def _check_available(provider: Provider) -> None:
    if not provider.available():
        raise RuntimeError(
            f"provider {provider.name!r} is unavailable: {provider.unavailable_reason()}"
        )


def resolve(op: str, fmt: Format) -> tuple[Provider, Kernel]:
    """The provider and kernel that serve ``(op, fmt)`` now."""
    forced = forced_provider()
    key = (op, fmt.name, forced)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    if forced is not None:
        provider = _forced_by_environment(forced) if _forced.get() is None else None
        provider = provider or get_provider(forced)
        _check_available(provider)
        kernel = provider.lookup(op, fmt)
        if kernel is None:
            raise RuntimeError(f"provider {forced!r} has no kernel for {op} {fmt.name}")
        result = (provider, kernel)
    else:
        result = _cascade(op, fmt)
    with _lock:
        _cache[key] = result
    return result


def _forced_by_environment(name: str) -> Provider:
    """The provider ``NARROWMM_PROVIDER`` names, or an error that names the variable."""
    try:
        provider = get_provider(name)
    except ValueError:
        known = ", ".join(p.name for p in _providers)
        raise EnvironmentVariableError(
            f"NARROWMM_PROVIDER={name!r} is not a provider (valid values: {known}); unset it "
            f"to let narrowmm choose") from None
    if not provider.available():
        raise EnvironmentVariableError(
            f"NARROWMM_PROVIDER={name!r} forces a provider that is unavailable here: "
            f"{provider.unavailable_reason()}")
    return provider


def _cascade(op: str, fmt: Format) -> tuple[Provider, Kernel]:
    native_loaded = False
    for provider in _providers:
        if not provider.available():
            continue
        kernel = provider.lookup(op, fmt)
        if kernel is None:
            native_loaded = native_loaded or provider.name == "native"
            continue
        if native_loaded and (op, fmt.name) not in _warned:
            _warned.add((op, fmt.name))
            warnings.warn(
                f"narrowmm: the native core has no {op} kernel for {fmt.name}; "
                f"served by the slower {provider.name!r} provider",
                FallbackWarning,
                stacklevel=4,
            )
        return provider, kernel
    raise RuntimeError(f"no provider serves {op} for format {fmt.name}")


def clear_cache() -> None:
    """Forget resolved kernels and re-read ``NARROWMM_PROVIDER`` (after registering a
    provider, switching ISA rows or changing the environment)."""
    global _env_forced
    with _lock:
        _cache.clear()
        _warned.clear()
        _env_forced = os.environ.get("NARROWMM_PROVIDER") or None
    _record_environment()


def _record_environment() -> None:
    """Note a bad ``NARROWMM_PROVIDER`` for ``narrowmm info`` (calls raise it themselves)."""
    _environ.forget("NARROWMM_PROVIDER")
    if _env_forced is not None:
        try:
            _forced_by_environment(_env_forced)
        except EnvironmentVariableError as exc:
            _environ.record("NARROWMM_PROVIDER", str(exc))


for _p in (NativeProvider(), NumpyProvider(), ReferenceProvider()):
    register(_p)
_record_environment()
