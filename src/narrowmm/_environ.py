"""The environment variables narrowmm reads, and what was wrong with them.

A bad value never breaks ``import narrowmm`` or ``narrowmm info``: it is recorded here at
import, shown by :func:`narrowmm.show_runtime`, and raised (as :class:`EnvironmentVariableError`,
naming the variable and its valid values) by the first call that needs what it configures.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
_problems: dict[str, str] = {}


class EnvironmentVariableError(ValueError):
    """A ``NARROWMM_*`` environment variable has a value this machine cannot honour."""


def record(variable: str, message: str) -> None:
    """Remember what is wrong with ``variable`` (the message names it)."""
    _problems[variable] = message


def forget(variable: str) -> None:
    """Drop the problem recorded for ``variable`` (after it was re-read and is fine)."""
    _problems.pop(variable, None)


def problems() -> dict[str, str]:
    """Every recorded problem: variable name -> message."""
    return dict(_problems)


def switch(variable: str, on: str, off: str) -> bool:
    """A ``NARROWMM_*`` variable that is 1 (the default: ``on`` says what that does) or 0
    (``off``), read now.

    Raises:
        EnvironmentVariableError: another value, naming the variable and both meanings.
    """
    value = os.environ.get(variable, "1").strip()
    if value not in ("0", "1"):
        raise EnvironmentVariableError(
            f"{variable} must be 1 ({on}, the default) or 0 ({off}), got {value!r}")
    return value == "1"


def setting(variable: str, read: Callable[[], T]) -> T | None:
    """``read()`` (which reads ``variable``) for a report: None, the problem recorded, when
    the value is bad; else its value, any problem recorded before forgotten."""
    try:
        value = read()
    except EnvironmentVariableError as exc:
        record(variable, str(exc))
        return None
    forget(variable)
    return value


def check(*variables: str) -> None:
    """Raise :class:`EnvironmentVariableError` if one of ``variables`` has a problem."""
    for name in variables:
        message = _problems.get(name)
        if message is not None:
            raise EnvironmentVariableError(message)
