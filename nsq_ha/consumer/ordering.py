"""Serial hand-out per partition on ordered subscriptions.

On an ordered channel nsqd has one message of a partition out at a time, but it sends that
message again while the first delivery may still be in a handler: after ``msg_timeout`` (on the
same connection), after a requeue, or after the partition's leader moved (on the new leader's
connection). Handing the copy out at once would let a second handler finish it, nsqd would send
the next messages, and their handlers could complete before the first one.

:class:`PartitionGate` keeps, per partition, the one message whose handling is under way (the
*current* one) and parks what arrives for that partition meanwhile. When the current message's
handling ends, :meth:`PartitionGate.release` names the next message to hand out; messages
answered (or abandoned) while they waited are skipped. The gate itself is pure (no clocks, no
I/O); :class:`Claims` tracks who holds what ``get()`` handed out.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nsq_ha.consumer.message import Message

__all__ = ["Claims", "PartitionGate"]


def _key(message: Message) -> int:
    partition = message.partition
    return -1 if partition is None else partition


class PartitionGate:
    """At most one message per partition handed out; the others wait in arrival order."""

    __slots__ = ("_current", "_waiting")

    def __init__(self) -> None:
        """An empty gate."""
        self._current: dict[int, Message] = {}
        self._waiting: dict[int, deque[Message]] = {}

    def __repr__(self) -> str:
        """Show the partitions busy and the messages waiting."""
        return f"<PartitionGate busy={sorted(self._current)} waiting={self.waiting}>"

    @property
    def waiting(self) -> int:
        """Messages parked behind a partition's current one."""
        return sum(len(queue) for queue in self._waiting.values())

    def admit(self, message: Message) -> bool:
        """True: hand ``message`` out now (it becomes its partition's current message).
        False: it waits until the current one is released."""
        key = _key(message)
        if key not in self._current:
            self._current[key] = message
            return True
        queue = self._waiting.setdefault(key, deque())
        live = [m for m in queue if m.outcome is None]  # answered or replaced copies go
        if len(live) != len(queue):
            queue.clear()
            queue.extend(live)
        queue.append(message)
        return False

    def holds(self, message: Message) -> bool:
        """True when ``message`` is its partition's current message."""
        return self._current.get(_key(message)) is message

    def release(self, message: Message) -> Message | None:
        """The handling of ``message`` ended: the partition's next message to hand out, if any.

        Does nothing (``None``) unless ``message`` is its partition's current message, so a
        second release of the same message is harmless.
        """
        key = _key(message)
        if self._current.get(key) is not message:
            return None
        queue = self._waiting.get(key)
        while queue:
            candidate = queue.popleft()
            if candidate.outcome is None:
                self._current[key] = candidate
                return candidate
        del self._current[key]
        self._waiting.pop(key, None)
        return None

    def clear(self) -> list[Message]:
        """Forget everything (closing); return the waiting messages still to be answered."""
        left = [m for queue in self._waiting.values() for m in queue if m.outcome is None]
        self._current.clear()
        self._waiting.clear()
        return left


class Claims:
    """Ordered messages handed out by ``get()`` / ``get_many()`` / ``async for``, by the task
    that got them.

    Such a message's handling ends when it is answered (:meth:`answered`), when the same task
    asks for more (:meth:`drop`), or when that task ends; then ``release(message)`` is called
    (the consumer hands out the partition's next message).
    """

    __slots__ = ("_by_task", "_release")

    def __init__(self, release: Callable[[Message], None]) -> None:
        """Claims that call ``release`` when their handling ends."""
        self._by_task: dict[asyncio.Task[Any], list[Message]] = {}
        self._release = release

    def __bool__(self) -> bool:
        """True while some task holds a message."""
        return bool(self._by_task)

    def add(self, task: asyncio.Task[Any], message: Message) -> None:
        """``task`` got ``message`` (after :meth:`drop` of what it had)."""
        held = self._by_task.get(task)
        if held is None:
            self._by_task[task] = [message]
            task.add_done_callback(self._task_done)
        else:
            held.append(message)

    def drop(self, task: asyncio.Task[Any]) -> None:
        """``task`` is done with the messages it got last, if any."""
        held = self._by_task.pop(task, None)
        if held is not None:
            task.remove_done_callback(self._task_done)
            for message in held:
                self._release(message)

    def answered(self, message: Message) -> None:
        """``message`` was finished or requeued: whoever got it is done with it."""
        for task, held in self._by_task.items():
            if message in held:
                held.remove(message)
                if not held:
                    del self._by_task[task]
                    task.remove_done_callback(self._task_done)
                self._release(message)
                return

    def clear(self) -> None:
        """Forget every claim (closing), releasing nothing."""
        for task in self._by_task:
            task.remove_done_callback(self._task_done)
        self._by_task.clear()

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        for message in self._by_task.pop(task, ()):
            self._release(message)
