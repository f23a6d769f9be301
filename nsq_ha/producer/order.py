"""Keyed publishes reach their lanes in call order, even while some wait for routes.

A keyed call (``sharding_key``, ``sharding_keys`` or ``partition``) normally finds its topic's
routes cached and queues its messages on the partition's lane at once, in the same loop step:
call order is lane order, and the lane keeps it. A call that has to wait for a lookup breaks
that unless later calls wait too: the lookup caches the routes before its caller resumes, and a
call made in between would find them and queue first.

:class:`ArrivalOrder` makes such calls wait behind the one that holds the topic's *turn* (the
call looking up the routes), in the order they were made. When the holder has queued (or
failed), every waiting call whose routes are now cached is queued in that same loop step, in
call order, so they leave together as batches, exactly as calls on a warm producer do; the
turns end there, and a later call finds none taken and queues at once. Only a waiting call
that still finds no routes (the holder's lookup failed) takes the turn and looks up itself.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

__all__ = ["ArrivalOrder"]

#: a topic's routes
_R = TypeVar("_R")
#: what queuing a call gives: the future of its outcomes
_F = TypeVar("_F", bound="asyncio.Future[Any]")


class _Waiter(Generic[_F]):
    """A keyed call waiting behind the turn's holder: how to queue it if its routes are cached
    (its future then, else None), and the future that gets what that gave."""

    __slots__ = ("future", "queue_now")

    def __init__(
        self, queue_now: Callable[[], _F | None], future: asyncio.Future[_F | None]
    ) -> None:
        self.queue_now = queue_now
        self.future = future


class ArrivalOrder:
    """Per topic, the keyed calls waiting behind the one that holds the turn."""

    __slots__ = ("_waiting",)

    def __init__(self) -> None:
        #: topic -> the calls waiting for the turn's holder, in call order (present while a
        #: call holds the turn)
        self._waiting: dict[str, deque[_Waiter[Any]]] = {}

    def waiting(self, topic: str) -> bool:
        """True while an earlier keyed call on ``topic`` has not queued its messages yet."""
        return topic in self._waiting

    async def turn(
        self,
        topic: str,
        ready: Callable[[], _R | None],
        look_up: Callable[[], Awaitable[_R]],
        submit: Callable[[_R], _F],
    ) -> _F:
        """Queue a keyed call on ``topic`` after every one made before it; the future
        ``submit(routes)`` gave.

        ``ready()``: the cached routes, None when they do not serve; ``look_up()``: the routes
        from lookupd. With no turn taken, the call takes it, looks up and queues; otherwise it
        waits, and the holder, once done, queues the waiting calls whose routes are ready, in
        order. An error raised by either is this call's own. A call cancelled after it was
        queued has its future cancelled (as if cancelled while awaiting it)."""
        waiters = self._waiting.get(topic)
        if waiters is None:
            self._waiting[topic] = deque()
        else:

            def queue_now() -> _F | None:
                routes = ready()
                return None if routes is None else submit(routes)

            future: asyncio.Future[_F | None] = asyncio.get_running_loop().create_future()
            waiters.append(_Waiter(queue_now, future))
            try:
                queued = await future
            except asyncio.CancelledError:
                if future.done() and not future.cancelled() and future.exception() is None:
                    queued = future.result()
                    if queued is None:
                        self._pass_on(topic)  # handed the turn just as it was cancelled
                    else:
                        queued.cancel()
                raise
            if queued is not None:
                return queued  # queued by the holder, in order
        try:
            routes = ready()
            return submit(routes if routes is not None else await look_up())
        finally:
            self._pass_on(topic)

    def _pass_on(self, topic: str) -> None:
        """The holder is done: queue every waiting call now, in order, until one cannot be
        queued without a lookup; that one holds the turn next. No one left: no turn taken."""
        waiters = self._waiting[topic]
        while waiters:
            waiter = waiters.popleft()
            if waiter.future.done():
                continue  # cancelled while it waited
            try:
                queued = waiter.queue_now()
            except Exception as exc:  # its own refusal (a bad key): the others go on
                if not waiter.future.done():
                    waiter.future.set_exception(exc)
                continue
            except BaseException:
                if waiter.future.done():
                    self._pass_on(topic)
                else:
                    waiter.future.set_result(None)  # it holds the turn: its own try raises again
                raise
            if waiter.future.done():  # cancelled by what queued it: as if once queued
                if queued is not None:
                    queued.cancel()
                continue
            waiter.future.set_result(queued)
            if queued is None:
                return
        del self._waiting[topic]
