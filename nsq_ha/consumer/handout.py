"""Handing delivered messages out to the application: :class:`Intake`, with its queue.

Why a gate on ordered subscriptions: nsqd sends a partition's message again while the first
delivery may still be in a handler (after ``msg_timeout``, a requeue, or a leader move); handing
the copy out would let the next messages' handlers complete before the first. So
:class:`PartitionGate` parks what arrives while a partition's message is being handled.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import sys
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from nsq_ha import events
from nsq_ha.consumer.config import ConsumerConfig
from nsq_ha.consumer.message import Message
from nsq_ha.consumer.slots import Slot, slot_of
from nsq_ha.consumer.tasks import Background
from nsq_ha.errors import MessageResponseError

#: The running task of each loop, which Python 3.11's ``asyncio.current_task()`` reads in Python
#: code (a frame per ordered message); from 3.12 that function is C, and this is ``None``.
_CURRENT_TASKS: Final[dict[Any, asyncio.Task[Any]] | None] = (
    getattr(asyncio.tasks, "_current_tasks", None) if sys.version_info < (3, 12) else None
)

log = logging.getLogger(__name__)


class PartitionGate:
    """At most one message per partition handed out; the others wait in arrival order."""

    __slots__ = ("_current", "_waiting")

    def __init__(self) -> None:
        self._current: dict[int | None, Message] = {}  # by partition (None: vanilla)
        self._waiting: dict[int | None, deque[Message]] = {}

    @property
    def waiting(self) -> int:
        """Messages parked behind a partition's current one."""
        return sum(len(queue) for queue in self._waiting.values())

    def admit(self, message: Message) -> bool:
        """True: hand ``message`` out now; False: it waits for the current one's release."""
        key = message.partition
        if key not in self._current:
            self._current[key] = message
            return True
        waiting = self._waiting  # answered or replaced copies go
        waiting[key] = queue = deque(m for m in waiting.get(key, ()) if m.outcome is None)
        queue.append(message)
        return False

    def holds(self, message: Message) -> bool:
        """True when ``message`` is its partition's current message."""
        return self._current.get(message.partition) is message

    def release(self, message: Message) -> Message | None:
        """The handling of ``message`` ended: its partition's next message, if any (and if
        ``message`` was the current one)."""
        key = message.partition
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
    that got them: each is released once answered, or when the task asks again or ends.

    A task stays known (with its done callback) until it ends, even while it holds nothing:
    adding and removing the callback per claim cost more than the rest of it."""

    __slots__ = ("_by_task", "_release")

    def __init__(self, release: Callable[[Message], None]) -> None:
        self._by_task: dict[asyncio.Task[Any], list[Message]] = {}
        self._release = release

    def __bool__(self) -> bool:
        return bool(self._by_task)

    def add(self, task: asyncio.Task[Any], message: Message) -> None:
        """``task`` got ``message`` (after :meth:`done_with` what it had)."""
        held = self._by_task.get(task)
        if held is None:
            self._by_task[task] = [message]
            task.add_done_callback(self.drop)
        else:
            held.append(message)

    def done_with(self, task: asyncio.Task[Any]) -> None:
        """``task`` asked again: it is done with the messages it got last."""
        held = self._by_task.get(task)
        if held:
            self._by_task[task] = []
            for message in held:
                self._release(message)

    def drop(self, task: asyncio.Task[Any]) -> None:
        """``task`` ended: it is done with the messages it got last."""
        self.done_with(task)
        self._by_task.pop(task, None)

    def answered(self, message: Message) -> None:
        """``message`` was finished or requeued: whoever got it is done with it."""
        for held in self._by_task.values():
            if message in held:
                held.remove(message)
                self._release(message)
                return

    def clear(self) -> None:
        """Forget every claim (closing), releasing nothing."""
        for task in self._by_task:
            task.remove_done_callback(self.drop)
        self._by_task.clear()


class Intake:
    """The queue of messages to hand out, the ordered gate, and the give-up path.

    The queue is a deque that readers await in the order they came (``None`` in it: closing),
    not an asyncio.Queue: that asks for the running loop on every wait, on Python 3.11 a
    ``getpid()`` system call per message (strace: 5060 for 5000 messages at RDY 1)."""

    __slots__ = (
        "_background",
        "_claims",
        "_gate",
        "_getters",
        "_items",
        "_loop",
        "_stopped",
        "closing",
        "max_attempts",
        "on_give_up",
    )

    def __init__(self, config: ConsumerConfig, background: Background) -> None:
        self.max_attempts = config.max_attempts
        self.on_give_up = config.on_give_up
        self._background = background
        self._items: deque[Message | None] = deque()
        self._getters: deque[asyncio.Future[None]] = deque()
        self._gate = PartitionGate()
        self._claims = Claims(self.release)
        self._loop: asyncio.AbstractEventLoop | None = None  # set by the first wait or claim
        self.closing = False  # what arrives from now on is requeued
        self._stopped = False

    @property
    def queued(self) -> int:
        """Messages waiting to be handed out (in the queue, or behind their partition's)."""
        return len(self._items) - (1 if self._stopped else 0) + self._gate.waiting

    def _put(self, item: Message | None) -> None:
        self._items.append(item)
        self._wake_next()

    def _wake_next(self) -> None:
        getters = self._getters
        while getters:
            getter = getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    def deliver(self, slot: Slot, message: Message) -> None:
        """A slot received ``message``: hand it out (or requeue it when closing)."""
        if self.closing:
            slot.requeue_now(message)
            return
        if slot.ordered and not self._gate.admit(message):
            return  # a copy, or the next one: waits until its partition's handler is done
        self._dispatch(slot, message)

    def _dispatch(self, slot: Slot, message: Message) -> None:
        """To the readers, or to ``on_give_up`` after too many attempts."""
        if self.max_attempts and message.attempts > self.max_attempts:
            if slot.ordered and self.on_give_up is None:
                log.error(
                    "%r: delivered %d times (max_attempts %d) on an ordered channel; not "
                    "skipping it, which would break order (pass on_give_up= to skip)",
                    message,
                    message.attempts,
                    self.max_attempts,
                )
            else:
                self._background.spawn(self._give_up(slot, message), "nsq_ha-give-up")
                return
        self._put(message)

    async def _give_up(self, slot: Slot, message: Message) -> None:
        slot.counts["given_up"] += 1
        events.emit(
            events.MessageGaveUp(
                topic=slot.topic,
                channel=slot.channel,
                partition=slot.partition,
                message_id=message.id.hex(),
                attempts=message.attempts,
                max_attempts=self.max_attempts,
            )
        )
        failed = False
        try:
            if self.on_give_up is None:
                log.warning(
                    "giving up on %r after %d attempts (max_attempts %d): finishing it",
                    message,
                    message.attempts,
                    self.max_attempts,
                )
            else:
                result = self.on_give_up(message)
                if inspect.isawaitable(result):
                    await result
        except BaseException as exc:  # sys.exit() in on_give_up must not hold the message
            failed = True
            if isinstance(exc, asyncio.CancelledError):
                raise  # close() cut it off; Background.finish logged that
            hint = ""
            if isinstance(exc, SystemExit | KeyboardInterrupt):  # it would stop every client
                hint = (
                    f" ({type(exc).__name__}): on_give_up must not call sys.exit() or raise "
                    "KeyboardInterrupt (it runs on the client's event loop); the consumer keeps "
                    "running. To stop the program, close the consumer or signal the main thread"
                )
            log.error("on_give_up failed for %r%s; requeueing it", message, hint, exc_info=exc)
        finally:
            if not message.responded:
                with contextlib.suppress(MessageResponseError):
                    if failed:
                        slot.requeue(message, None, False)
                    else:
                        slot.finish(message)
            if message.ordered:
                self.release(message)

    def release(self, message: Message) -> None:
        """The handling of an ordered ``message`` ended: hand out its partition's next one."""
        following = self._gate.release(message)
        while following is not None:
            if not self.closing:
                self._dispatch(slot_of(following), following)
                return
            slot_of(following).requeue_now(following)
            following = self._gate.release(following)

    def answered(self, message: Message) -> None:
        """An ordered message was finished or requeued: whoever got it is done with it."""
        if self._claims:
            self._claims.answered(message)

    def _usable(self, item: Message | None) -> bool:
        """True for a message still to answer and for the closing marker (put back for others)."""
        if item is None:
            self._put(None)
            return True
        if item.outcome is None:
            return True
        if item.ordered:
            self.release(item)
        return False

    def take_nowait(self) -> Message | None:
        """The next message queued now (``None``: none, or closing)."""
        items = self._items
        while items:
            item = items.popleft()
            if self._usable(item):
                return item
        return None

    async def take(self, timeout: float | None = None) -> Message | None:  # noqa: ASYNC109
        """The next message; ``None`` when closing or after ``timeout`` s."""
        item = self.take_nowait()
        if item is not None:  # else none, or the closing marker: _wait finds it at once
            return item
        if timeout is None:  # no timer to set and cancel per message
            return await self._wait()
        try:
            async with asyncio.timeout(timeout):
                return await self._wait()
        except TimeoutError:
            return None

    async def _wait(self) -> Message | None:
        items = self._items
        while True:
            while not items:
                loop = self._loop
                if loop is None:
                    loop = self._loop = asyncio.get_running_loop()
                getter = loop.create_future()
                self._getters.append(getter)
                try:
                    await getter
                except BaseException:
                    getter.cancel()
                    with contextlib.suppress(ValueError):
                        self._getters.remove(getter)
                    if items and not getter.cancelled():
                        self._wake_next()  # it was woken, then cancelled: the next one takes it
                    raise
            item = items.popleft()
            if self._usable(item):
                return item

    async def get(self, timeout: float | None = None) -> Message | None:  # noqa: ASYNC109
        """:meth:`take`, claiming an ordered message for the calling task (:class:`Claims`)."""
        claims = self._claims
        task = self._current_task() if claims else None
        if task is not None:
            claims.done_with(task)  # what it got before
        message = self.take_nowait()
        if message is None:  # one coroutine fewer to pass through when waiting without a limit
            message = await (self._wait() if timeout is None else self.take(timeout))
        if message is not None and message.ordered and self._gate.holds(message):
            if task is None:
                task = self._current_task()
            if task is not None:
                claims.add(task, message)
        return message

    def _current_task(self) -> asyncio.Task[Any] | None:
        """The calling task. ``asyncio.current_task()`` without a loop asks for the running
        loop, which on Python 3.11 makes a getpid() system call: one per ordered message."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        if _CURRENT_TASKS is not None:
            return _CURRENT_TASKS.get(loop)
        return asyncio.current_task(loop)

    async def get_many(self, max_count: int, timeout: float | None = None) -> list[Message]:  # noqa: ASYNC109
        """:meth:`get`, then up to ``max_count`` - 1 more of what is queued now."""
        first = await self.get(timeout)
        if first is None:
            return []
        batch = [first]
        while len(batch) < max_count and (item := self.take_nowait()) is not None:
            batch.append(item)
        held = [m for m in batch[1:] if m.ordered and self._gate.holds(m)]
        task = self._current_task() if held else None
        if task is not None:
            for message in held:
                self._claims.add(task, message)
        return batch

    def stop(self) -> int:
        """Closing: requeue what was not handed out (returns how many); readers get ``None``."""
        self.closing = True
        if self._stopped:
            return 0
        self._stopped = True
        self._claims.clear()
        left = self._gate.clear()  # parked behind their partition's handler, then the queue
        items = self._items
        while items:
            message = items.popleft()
            if message is not None and message.outcome is None:
                left.append(message)
        for message in left:
            slot_of(message).requeue_now(message)
        self._put(None)  # readers stop (each puts it back for the next)
        return len(left)
