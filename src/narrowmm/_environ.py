"""The environment variables narrowmm reads, and what was wrong with them.

A bad value never breaks ``import narrowmm`` or ``narrowmm info``: it is recorded here at
import, shown by :func:`narrowmm.show_runtime`, and raised (as :class:`EnvironmentVariableError`,
naming the variable and its valid values) by the first call that needs what it configures.
"""

from __future__ import annotations

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


def check(*variables: str) -> None:
    """Raise :class:`EnvironmentVariableError` if one of ``variables`` has a problem."""
    for name in variables:
        message = _problems.get(name)
        if message is not None:
            raise EnvironmentVariableError(message)
