"""Handler modes: ``run(handler)`` and ``run_batches(handler)``, over an :class:`Intake`.

Both take messages from the intake, call the handler, then finish what it left unanswered (or
requeue it, with backoff, when it raised), and release each ordered message afterwards, so a
partition's next message waits for the handler call holding the previous one.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nsq_ha.consumer.handout import Intake
from nsq_ha.consumer.message import Message
from nsq_ha.consumer.slots import slot_of
from nsq_ha.errors import MessageResponseError

__all__ = ["BatchHandler", "Handler", "call_handler", "run", "run_batches"]

log = logging.getLogger(__name__)

Handler = Callable[[Message], Awaitable[object] | object]
BatchHandler = Callable[[list[Message]], Awaitable[object] | object]


async def call_handler(
    handler: Callable[[Any], Awaitable[object] | object],
    argument: object,
    messages: list[Message],
) -> None:
    """Run ``handler(argument)``; then finish the messages it left unanswered, or requeue them
    (with backoff) if it raised."""
    failed = False
    try:
        result = handler(argument)
        if inspect.isawaitable(result):
            await result
    except Exception as exc:
        failed = True
        log.warning(
            "handler failed on %s: %r; requeueing",
            repr(messages[0]) if len(messages) == 1 else f"{len(messages)} messages",
            exc,
        )
    for message in messages:
        if not message.responded:
            with contextlib.suppress(MessageResponseError):
                await (message.requeue() if failed else message.finish())


def give_back(messages: list[Message]) -> None:
    """A worker was cancelled: requeue at once (no backoff) what it took and nobody answered,
    instead of leaving it held until the consumer's drain timeout or nsqd's msg_timeout."""
    for message in messages:
        if not message.responded:
            slot_of(message).requeue_now(message)


async def run(intake: Intake, handler: Handler, *, concurrency: int) -> None:
    """``concurrency`` workers calling ``handler(message)`` until the intake closes."""

    async def worker() -> None:
        while (message := await intake.take()) is not None:
            try:
                await call_handler(handler, message, [message])
            except asyncio.CancelledError:
                give_back([message])
                raise
            finally:
                if message.ordered:
                    intake.release(message)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def run_batches(
    intake: Intake,
    handler: BatchHandler,
    *,
    max_size: int,
    max_wait: float,
    concurrency: int,
    is_starved: Callable[[], bool],
) -> None:
    """``concurrency`` workers calling ``handler(messages)`` with up to ``max_size`` messages,
    handed over when full, after ``max_wait`` s, or as soon as ``is_starved()``."""
    loop = asyncio.get_running_loop()

    async def worker() -> None:
        while (first := await intake.take()) is not None:
            batch = [first]
            try:
                deadline = loop.time() + max_wait
                while len(batch) < max_size:
                    message = intake.take_nowait()  # what is here already, without a timer
                    if message is None:
                        if is_starved() or intake.closing:
                            break
                        message = await intake.take(max(0.0, deadline - loop.time()))
                        if message is None:
                            break
                    batch.append(message)
                await call_handler(handler, batch, batch)
            except asyncio.CancelledError:  # gathering, or in the handler
                give_back(batch)
                raise
            finally:
                for message in batch:
                    if message.ordered:
                        intake.release(message)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
