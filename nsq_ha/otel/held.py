"""The process spans still open: one per message handed out by ``get()``, ``async for`` or
``get_many()``, from the hand-out until the message is settled, the task that got it asks for
another one, or its consumer closes (:mod:`nsq_ha.otel.pulling` decides; this is the table).

Bounded: a message is in the table while its process span is open, and a message answered in a
way nsq_ha's settle hooks do not see (nsqd timed it out and delivered it again, its connection
went away) is swept out once the table has doubled since the last sweep (every message has an
``outcome`` once answered). What stays is what the application holds unanswered, which nsqd
bounds with ``max_in_flight``.
"""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opentelemetry.context import Context
from opentelemetry.trace import Span

if TYPE_CHECKING:
    from nsq_ha.consumer import Message
    from nsq_ha.otel.attributes import Attributes

__all__ = ["Held", "Open"]

Popped = list[tuple["Message", "Open"]]


@dataclass(eq=False, slots=True)
class Open:
    """One open process span and what ending it needs."""

    span: Span
    #: the Consumer that handed the message out
    consumer: object
    #: its ``messaging.client.id``
    client: str | None = None
    #: the attributes of ``messaging.process.duration``
    attrs: Attributes = field(default_factory=dict)
    #: ``time.perf_counter()`` at the hand-out
    started: float = field(default_factory=time.perf_counter)
    #: the context made current in the task that got the message (None: not made current),
    #: and the one it replaced
    context: Context | None = None
    previous: Context | None = None
    #: the task whose next ``get()`` ends the span (None: only a settle or the close does)
    task: object | None = None
    ended: bool = False


class Held:
    """Open process spans by message, by task and by consumer; safe from any thread (the
    blocking facade's loop and the application's loops share it)."""

    #: the table is swept of answered messages when it grows past this, then past twice the
    #: size it had after the last sweep
    SWEEP_AT = 256

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[Message, Open] = {}
        self._tasks: weakref.WeakKeyDictionary[object, list[Message]] = weakref.WeakKeyDictionary()
        self._attached: weakref.WeakKeyDictionary[object, Open] = weakref.WeakKeyDictionary()
        self._sweep_at = self.SWEEP_AT

    def __len__(self) -> int:
        return len(self._open)

    def add(self, message: Message, entry: Open, task: object | None = None) -> Popped:
        """Hold ``entry`` for ``message`` (ended by ``task``'s next ``get()`` when given);
        return the entries swept out because their messages were answered meanwhile (the caller
        ends them)."""
        with self._lock:
            self._open[message] = entry
            if task is not None:
                entry.task = task
                self._tasks.setdefault(task, []).append(message)
                if entry.context is not None:
                    self._attached[task] = entry
            if len(self._open) <= self._sweep_at:
                return []
            swept = [(m, e) for m, e in self._open.items() if m.outcome is not None]
            for m, _ in swept:
                self._remove(m)
            self._sweep_at = max(self.SWEEP_AT, 2 * len(self._open))
            return swept

    def get(self, message: Message) -> Open | None:
        """The open entry of ``message``."""
        return self._open.get(message)

    def pop(self, message: Message) -> Open | None:
        """Take ``message``'s entry out (None when it has none: it is the caller's to end)."""
        with self._lock:
            return self._remove(message)

    def keep(self, message: Message) -> Open | None:
        """``message``'s entry, no longer ended by its task's next ``get()`` (the application
        delimits its processing itself)."""
        with self._lock:
            entry = self._open.get(message)
            if entry is not None:
                self._untask(message, entry)
            return entry

    def pop_task(self, task: object, consumer: object) -> Popped:
        """Take out the entries ``task`` got from ``consumer``."""
        with self._lock:
            messages = self._tasks.get(task)
            if not messages:
                return []
            found = [(m, self._open[m]) for m in messages if self._open[m].consumer is consumer]
            for m, _ in found:
                self._remove(m)
            return found

    def pop_consumer(self, consumer: object) -> Popped:
        """Take out every entry of ``consumer``."""
        with self._lock:
            found = [(m, e) for m, e in self._open.items() if e.consumer is consumer]
            for m, _ in found:
                self._remove(m)
            return found

    def pop_all(self) -> Popped:
        """Take out every entry."""
        with self._lock:
            found = list(self._open.items())
            for m, _ in found:
                self._remove(m)
            return found

    def attached(self, task: object) -> Open | None:
        """The entry whose span was last made current in ``task`` (maybe ended since)."""
        return self._attached.get(task)

    def _remove(self, message: Message) -> Open | None:
        entry = self._open.pop(message, None)
        if entry is not None:
            self._untask(message, entry)
        return entry

    def _untask(self, message: Message, entry: Open) -> None:
        if entry.task is None:
            return
        messages = self._tasks.get(entry.task)
        if messages is not None:
            messages.remove(message)
            if not messages:
                del self._tasks[entry.task]
        entry.task = None
