"""Argument checks of the consumer: each bad value raises :class:`~nsq_ha.errors.ConfigError`
naming it, before anything is sent or changed.

Durations are float seconds: finite (NaN and infinities are refused: "wait for ever" is never a
meaningful setting here, and ``None`` says "no limit" where one is allowed), never negative.
"""

from __future__ import annotations

from collections.abc import Iterable

from nsq_ha.durations import seconds
from nsq_ha.errors import ConfigError

__all__ = [
    "MAX_REQUEUE_DELAY",
    "check_count",
    "check_member",
    "check_partitions",
    "check_requeue_delay",
]

#: Longest requeue delay sent (s). nsqd clamps a REQ delay to its ``--max-req-timeout``, but it
#: reads the milliseconds into a Go duration (int64 nanoseconds, about 292 years): a larger value
#: would wrap around to a negative delay, that is an immediate redelivery.
MAX_REQUEUE_DELAY = 9.0e9


def check_requeue_delay(value: object, name: str = "requeue delay") -> float:
    """A REQ delay: finite seconds in ``0 .. MAX_REQUEUE_DELAY``."""
    delay = seconds(value, name, zero=True)
    if delay > MAX_REQUEUE_DELAY:
        raise ConfigError(
            f"{name} must be at most {MAX_REQUEUE_DELAY:.0f} s (nsqd cannot represent more; it "
            f"clamps to its --max-req-timeout anyway), got {value!r}"
        )
    return delay


def check_count(value: object, name: str, minimum: int) -> int:
    """An int of at least ``minimum`` (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_member(value: object) -> tuple[int, int] | None:
    """``member=(index, count)``: this consumer takes the partitions ``p % count == index``."""
    if value is None:
        return None
    index: object
    count: object
    try:
        index, count = value  # type: ignore[misc]
    except (TypeError, ValueError):
        raise ConfigError(f"member must be (index, count), got {value!r}") from None
    if (
        not isinstance(index, int)
        or not isinstance(count, int)
        or isinstance(index, bool)
        or isinstance(count, bool)
    ):
        raise ConfigError(f"member must be two ints, got {value!r}")
    if count < 1 or not 0 <= index < count:
        raise ConfigError(f"member=(i, n) needs n >= 1 and 0 <= i < n, got {value!r}")
    return index, count


def check_partitions(value: Iterable[int] | None) -> frozenset[int] | None:
    """``partitions=``: ints >= 0 (``None``: every partition)."""
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ConfigError(f"partitions must be a collection of ints, got {value!r}")
    chosen = list(value)
    if any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in chosen):
        raise ConfigError(f"partitions must be ints >= 0, got {chosen!r}")
    return frozenset(chosen)
