"""Argument types shared by the commands: a duration follows the library's rule.

Every ``--timeout``, ``--defer`` and interval option takes seconds through :func:`duration` or
:func:`wait`, so ``nan``, ``inf`` and negatives are refused by argparse (exit 2) before the
command opens a connection, with the same words the library's ``ConfigError`` uses. An option
whose default is the library's reads it with :func:`field_default` (or is not passed on when not
given), so that the default is written once, on the library's dataclass.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from nsq_ha.durations import seconds
from nsq_ha.errors import ConfigError

__all__ = ["duration", "field_default", "wait"]


def _parsed(text: str, *, zero: bool) -> float:
    try:
        number = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    try:
        return seconds(number, "the value", zero=zero)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def duration(text: str) -> float:
    """A finite number of seconds above 0: a deadline (``--timeout``)."""
    return _parsed(text, zero=False)


def wait(text: str) -> float:
    """A finite number of seconds, 0 allowed: a delay (``--defer``)."""
    return _parsed(text, zero=True)


def field_default(cls: type[Any], name: str) -> Any:
    """The default of field ``name`` of the library's dataclass ``cls`` (for a help text, or
    a bound the command needs)."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)
