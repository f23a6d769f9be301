"""How long a consumer pauses at each backoff level (PROTOCOL.md §6.6).

A strategy is anything with ``delay(level) -> seconds`` (``level`` >= 1); :class:`Exponential`
is the default, as in go-nsq (1 s x 2^(level-1), at most 2 minutes).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from nsq_ha.durations import seconds
from nsq_ha.errors import ConfigError

__all__ = ["BackoffStrategy", "Exponential", "Fixed"]


@runtime_checkable
class BackoffStrategy(Protocol):
    """Seconds to keep every connection at RDY 0 at backoff level ``level`` (1, 2, ...)."""

    def delay(self, level: int) -> float:
        """The pause for ``level``."""
        ...


@dataclass(frozen=True, slots=True)
class Exponential:
    """``base * 2 ** (level - 1)``, at most ``maximum``, spread by +-``jitter`` (a fraction)."""

    base: float = 1.0
    maximum: float = 120.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        seconds(self.base, "backoff base")
        seconds(self.maximum, "backoff maximum")
        if not 0 <= self.jitter < 1:
            raise ConfigError(f"backoff jitter must be in [0, 1), got {self.jitter!r}")

    def delay(self, level: int) -> float:
        """The pause for ``level``."""
        value = min(self.maximum, self.base * float(2 ** max(0, min(level - 1, 62))))
        if self.jitter:
            value *= 1 + random.uniform(-self.jitter, self.jitter)  # noqa: S311
        return value


@dataclass(frozen=True, slots=True)
class Fixed:
    """The same pause at every level."""

    seconds: float = 1.0

    def __post_init__(self) -> None:
        seconds(self.seconds, "backoff seconds", zero=True)

    def delay(self, level: int) -> float:
        """The pause for ``level``."""
        return self.seconds
