"""Which topics a producer has not published to for a while (pure: the caller gives the clock).

A producer keeps routes, lanes, connections and a lookup refresh per topic it publishes to; a
topic idle for ``timeout`` seconds is freed, so that state stays bounded by the topics in use.
"""

from __future__ import annotations

from collections.abc import Container, Iterable

__all__ = ["IdleTopics"]


class IdleTopics:
    """When each topic was last used (``last_used``: topic -> monotonic seconds)."""

    __slots__ = ("last_used", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.last_used: dict[str, float] = {}

    @property
    def interval(self) -> float:
        """How often to look for idle topics: a topic is freed within 1.5 x ``timeout``."""
        return min(self.timeout / 2, 60.0)

    def expired(self, topics: Iterable[str], busy: Container[str], now: float) -> set[str]:
        """The topics among ``topics`` unused for ``timeout`` seconds at ``now``, forgotten here.

        A busy topic (messages queued or in flight), or one with no use recorded, counts as used
        ``now``: it is idle from its last work on, not from its last call.
        """
        cutoff = now - self.timeout
        expired: set[str] = set()
        for topic in topics:
            last = self.last_used.get(topic)
            if last is None or topic in busy:
                self.last_used[topic] = now
            elif last <= cutoff:
                expired.add(topic)
        for topic in expired:
            del self.last_used[topic]
        return expired
