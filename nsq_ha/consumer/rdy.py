"""RDY planning for a consumer with many connections: pure, no I/O, the clock passed in.

nsqd sends a connection messages while its in-flight count is below its RDY (PROTOCOL.md §2.4):
a level, not a credit, so RDY is sent only when the wanted level changes. :class:`RdyPlanner`
decides the levels of one consumer's connections and returns the changes to send. Its rules
(§6.5 describes those of the fork's SDKs and pynsq):

* **Budget.** ``sum(max(rdy, in_flight))`` never exceeds ``max_in_flight``: a delivered message
  keeps its share until answered, even after its connection's RDY was lowered.
* **Probe, then full.** A new connection gets RDY 1, after its first message its share
  ``max(1, max_in_flight // connections)``, capped by its ``max_rdy_count`` and its own cap (1
  on ordered channels); a new connection lowers the others to the new share at once.
* **More connections than budget**: each gets at most 1; :meth:`RdyPlanner.redistribute`
  (periodic) takes RDY from connections idle for ``idle_timeout`` or holding it for
  ``hold_timeout`` while others wait, and gives it to those that waited longest (ties: the one
  added first), so every partition gets its turn.
* **Backoff.** A failed message raises the level and sets every connection to RDY 0 (one
  delivered before, failing meanwhile, changes nothing); when the consumer's timer fires
  (:meth:`RdyPlanner.backoff_elapsed`) one connection gets RDY 1 once nothing else is in flight.
  A success lowers the level (at 0 every connection is back to its share), a failure raises it.
* ``max_in_flight == 0`` pauses everything; raising it again re-probes every connection.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from nsq_ha.errors import ConfigError

#: nsqd's default ``--max-rdy-count``.
DEFAULT_MAX_RDY = 2500
#: A connection counts as starved when its in-flight count reaches this share of its RDY.
STARVED_RATIO = 0.85
#: The highest backoff level (the default backoff's pause reaches its 2 minutes at 8).
MAX_LEVEL = 8
#: What a call that changes nothing returns: one read-only mapping, not a new dict per message.
NO_CHANGES: Final[Mapping[Hashable, int]] = MappingProxyType({})


@dataclass(slots=True)
class ConnRdy:
    """What the planner knows of one connection."""

    key: Hashable
    #: the most RDY it gets: nsqd's max_rdy_count, or our own cap if lower
    cap: int
    rdy: int = 0
    in_flight: int = 0
    got_message: bool = False
    #: when RDY last went from 0 to above 0, or the last message came (idle since)
    active_at: float = 0.0
    #: when RDY last went from 0 to above 0 (held since)
    rdy_since: float = 0.0
    #: when RDY last became 0 (waiting since)
    waiting_since: float = 0.0


class RdyPlanner:
    """Decides each connection's RDY. Every method returns ``{key: new_rdy}`` for the changes
    (read-only: it may be :data:`NO_CHANGES`).

    The values come checked (``ConsumerConfig``'s ``low_rdy_*``); ``clock`` is monotonic."""

    def __init__(
        self,
        max_in_flight: int,
        *,
        idle_timeout: float,
        hold_timeout: float,
        clock: Callable[[], float],
    ) -> None:
        self.max_in_flight = max_in_flight
        self.idle_timeout = idle_timeout
        self.hold_timeout = hold_timeout
        self._clock = clock
        self.conns: dict[Hashable, ConnRdy] = {}
        #: backoff level (0 = not backing off)
        self.level = 0
        #: in backoff and waiting for the timer (every RDY 0)
        self.blocked = False
        #: the last plan left every connection at its goal: a finished message changes nothing
        self._at_goals = False

    def __repr__(self) -> str:
        states = " ".join(f"{c.key}={c.rdy}/{c.in_flight}" for c in self.conns.values())
        mif, level, blocked = self.max_in_flight, self.level, self.blocked
        return f"<RdyPlanner max_in_flight={mif} level={level} blocked={blocked} {states}>"

    @property
    def total_rdy(self) -> int:
        return sum(c.rdy for c in self.conns.values())

    def is_starved(self) -> bool:
        """True when some connection holds nearly its whole RDY in flight."""
        return any(
            c.in_flight > 0 and c.in_flight >= max(1.0, c.rdy * STARVED_RATIO)
            for c in self.conns.values()
        )

    def add(
        self, key: Hashable, *, max_rdy: int = DEFAULT_MAX_RDY, cap: int | None = None
    ) -> Mapping[Hashable, int]:
        """A connection subscribed; ``max_rdy`` is its ``max_rdy_count``, ``cap`` our own limit."""
        if key in self.conns:
            raise ConfigError(f"connection {key!r} is already planned")
        if max_rdy < 1:
            raise ConfigError(f"max_rdy must be >= 1, got {max_rdy}")
        now = self._clock()
        limit = max_rdy if cap is None else max(1, min(cap, max_rdy))
        self.conns[key] = ConnRdy(key, limit, active_at=now, waiting_since=now)
        return self._plan({})

    def remove(self, key: Hashable) -> Mapping[Hashable, int]:
        """A connection is gone (its in-flight messages with it); its budget is freed."""
        return NO_CHANGES if self.conns.pop(key, None) is None else self._plan({})

    def message(self, key: Hashable) -> Mapping[Hashable, int]:
        conn = self.conns.get(key)
        if conn is None:
            return NO_CHANGES
        conn.in_flight += 1
        conn.active_at = self._clock()
        if conn.got_message:
            return NO_CHANGES
        conn.got_message = True
        return self._plan({}) if self.level == 0 else NO_CHANGES

    def done(self, key: Hashable, *, success: bool | None = None) -> Mapping[Hashable, int]:
        """A message of ``key`` was answered; ``success`` True lowers the backoff level, False
        raises it, None (a requeue without backoff) leaves it."""
        conn = self.conns.get(key)
        if conn is not None and conn.in_flight > 0:
            conn.in_flight -= 1
        if success is False:
            if not self.blocked:  # then the consumer waits backoff(level): backoff_elapsed()
                self.level = min(MAX_LEVEL, self.level + 1)
                self.blocked = True
                return self._plan({})  # every connection to 0
            return NO_CHANGES
        if self._at_goals and self.level == 0:
            return NO_CHANGES  # the steady state: nothing to raise, so no work per message
        if success and self.level > 0 and not self.blocked:
            self.level -= 1
            if self.level > 0:  # continue backing off, with a shorter wait
                self.blocked = True
                return self._plan({})
            for c in self.conns.values():
                c.got_message = True  # straight back to full shares
        return self._plan({})

    def backoff_elapsed(self) -> Mapping[Hashable, int]:
        """The backoff wait is over: let one connection test the waters with RDY 1."""
        if not self.blocked:
            return NO_CHANGES
        self.blocked = False
        return self._plan({})

    def set_max_in_flight(self, max_in_flight: int) -> Mapping[Hashable, int]:
        """Change the budget; connections above their new share are lowered at once."""
        reenabled = self.max_in_flight == 0 and max_in_flight > 0
        self.max_in_flight = max_in_flight
        if max_in_flight == 0 or reenabled:
            for c in self.conns.values():
                c.got_message = False  # probe again when enabled
        return self._plan({})

    def redistribute(self) -> Mapping[Hashable, int]:
        """Periodic: move RDY from idle connections (and long holders while others wait)."""
        changes: dict[Hashable, int] = {}
        if len(self.conns) <= self.max_in_flight and (self.level == 0 or self.blocked):
            return changes  # every connection has its share, and no backoff tester sits idle
        now = self._clock()
        conns = list(self.conns.values())  # in the order added
        waiting = sum(1 for c in conns if c.rdy == 0 and c.in_flight == 0)
        holders = [c for c in conns if c.rdy > 0]
        for c in holders:
            if now - c.active_at >= self.idle_timeout:
                self._set(c, 0, changes)
                waiting -= 1
        # long holders make way for the connections waiting, the longest holders first
        long_held = [c for c in holders if c.rdy > 0 and now - c.rdy_since >= self.hold_timeout]
        for c in sorted(long_held, key=lambda c: c.rdy_since)[: max(0, waiting)]:
            self._set(c, 0, changes)
        return self._plan(changes)

    def stop(self) -> Mapping[Hashable, int]:
        """Closing: every connection to RDY 0 for good."""
        self.max_in_flight = 0
        return self._plan({})

    def _set(self, conn: ConnRdy, value: int, changes: dict[Hashable, int]) -> None:
        if conn.rdy == value:
            return
        now = self._clock()
        if conn.rdy == 0:
            conn.rdy_since = now
            conn.active_at = now
        if value == 0:
            conn.waiting_since = now
        conn.rdy = value
        changes[conn.key] = value

    def _goal(self, conn: ConnRdy, share: int) -> int:
        return max(1, min(share, conn.cap)) if conn.got_message else 1

    def _plan(self, changes: dict[Hashable, int]) -> Mapping[Hashable, int]:
        """Bring every connection toward its goal within the budget; record the changes."""
        conns = list(self.conns.values())  # in the order added
        self._at_goals = False
        if self.max_in_flight == 0 or self.blocked:
            for c in conns:
                self._set(c, 0, changes)
            return changes
        if self.level > 0:  # backoff, after the wait: one tester at RDY 1 once none is in flight
            testers = [c for c in conns if c.rdy > 0]
            for c in testers[1:]:
                self._set(c, 0, changes)
            if not testers and conns and not any(c.in_flight for c in conns):
                self._set(min(conns, key=lambda c: c.waiting_since), 1, changes)
            return changes
        share = max(1, self.max_in_flight // len(conns)) if conns else 0
        many = len(conns) > self.max_in_flight
        # lower first: a new connection or a smaller budget shrinks the others at once
        for c in conns:
            goal = 1 if many else self._goal(c, share)
            if c.rdy > goal:
                self._set(c, goal, changes)
        used = sum(max(c.rdy, c.in_flight) for c in conns)  # the budget in use
        if used > self.max_in_flight:  # a smaller budget: take RDY from the longest holders
            for c in sorted((c for c in conns if c.rdy), key=lambda c: c.rdy_since):
                if used <= self.max_in_flight:
                    break
                before = max(c.rdy, c.in_flight)
                self._set(c, 0, changes)
                used -= before - c.in_flight
        # then raise, longest-waiting first (sorted() is stable: ties go to the one added first)
        for c in sorted(conns, key=lambda c: c.waiting_since):
            goal = 1 if many else self._goal(c, share)
            if c.rdy >= goal or (many and c.rdy == 0 and c.in_flight > 0):
                continue
            extra = max(goal, c.in_flight) - max(c.rdy, c.in_flight)
            if used + extra > self.max_in_flight:
                continue
            used += extra
            self._set(c, goal, changes)
        self._at_goals = not many and all(c.rdy == self._goal(c, share) for c in conns)
        return changes
