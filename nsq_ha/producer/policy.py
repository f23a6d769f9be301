"""How a producer retries a publish: a small frozen config that the sender hands to
:func:`nsq_ha.retry.retry_after` (its attempts, its deadline and its :attr:`~RetryPolicy.waits`)."""

from __future__ import annotations

from dataclasses import dataclass

from nsq_ha.durations import seconds
from nsq_ha.errors import ConfigError
from nsq_ha.retry import Backoff


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """Retries of one publish (one batch) after a retriable error.

    ``attempts`` caps the tries (first one included); ``deadline`` caps the seconds from the first
    try until no new try starts (``None``: no deadline); the wait before try *n+1* is
    ``min(max_backoff, initial_backoff * 2**(n-1))`` plus up to ``jitter`` seconds at random.
    ``attempt_timeout`` bounds each try's wait for nsqd's answer.

    The defaults ride out a leader failover of the fork (a new leader is usually listed within
    a few seconds of a graceful stop, ~30 s after a crash), which the fork's own SDKs (3 tries
    within ~0.3 s) do not.
    """

    attempts: int = 60
    deadline: float | None = 60.0
    initial_backoff: float = 0.05
    max_backoff: float = 1.0
    jitter: float = 0.1
    attempt_timeout: float = 10.0

    def __post_init__(self) -> None:
        """Refuse values the retry loop would misread."""
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ConfigError(f"attempts must be an int, not {self.attempts!r}")
        if self.attempts < 1:
            raise ConfigError(f"attempts must be >= 1, got {self.attempts}")
        for name in ("initial_backoff", "max_backoff", "jitter"):
            seconds(getattr(self, name), name, zero=True)
        if self.deadline is not None:
            seconds(self.deadline, "deadline")
        seconds(self.attempt_timeout, "attempt_timeout")

    @property
    def waits(self) -> Backoff:
        """The waits as the project's retry loop takes them (:class:`nsq_ha.retry.Backoff`)."""
        return Backoff(initial=self.initial_backoff, cap=self.max_backoff, jitter=self.jitter)

    @classmethod
    def no_retry(cls) -> RetryPolicy:
        """One try only: every error reaches the caller (wrapped in PublishError if retriable)."""
        return cls(attempts=1, deadline=None)
