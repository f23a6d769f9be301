"""Duration options and arguments: the one check every layer uses.

A duration is a real number of seconds (not a ``bool``), finite (NaN would compare false with
every deadline, infinity is a wait without one), above 0 (or 0 with ``zero``), and at most
``maximum`` (by default ``threading.TIMEOUT_MAX``, the longest wait Python can arm); ``None``
means "no limit" where :func:`optional_seconds` allows it. A refusal is a
:class:`~nsq_ha.errors.ConfigError` raised before anything is sent or changed.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import threading

from nsq_ha.errors import ConfigError

__all__ = ["optional_seconds", "seconds"]


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def seconds(
    value: object, name: str, *, zero: bool = False, maximum: float = threading.TIMEOUT_MAX
) -> float:
    """``value`` as float seconds, or :class:`ConfigError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name} must be a number of seconds, not {_shown(value)}")
    number = math.nan
    with contextlib.suppress(OverflowError, ValueError):  # float(10**400)
        number = float(value)
    if (number >= 0 if zero else number > 0) and number <= maximum:  # False for NaN
        return number
    bound = ">= 0" if zero else "> 0"
    raise ConfigError(
        f"{name} must be a finite number of seconds {bound} and at most {maximum:g}, "
        f"got {_shown(value)}"
    )


def optional_seconds(
    value: object, name: str, *, zero: bool = True, maximum: float = threading.TIMEOUT_MAX
) -> float | None:
    """A wait limit: ``None`` (no limit) or :func:`seconds` (``>= 0`` by default)."""
    return None if value is None else seconds(value, name, zero=zero, maximum=maximum)
