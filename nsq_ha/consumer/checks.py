"""Argument checks of the consumer: a bad value raises a ConfigError naming it."""

from __future__ import annotations

from nsq_ha.durations import seconds
from nsq_ha.errors import ConfigError

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
