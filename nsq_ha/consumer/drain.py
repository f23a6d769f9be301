"""Closing a consumer without leaving anything in flight on nsqd: :func:`drain`.

RDY 0 and ``CLS`` everywhere, messages not yet handed out are requeued, handlers get the drain
timeout to answer theirs, whatever is left is requeued, then a round trip per connection
(:meth:`~nsq_ha.connection.NsqdConnection.sync`) proves nsqd processed every answer before the
sockets close. Each piece is passed in; nothing here calls back into the consumer.
"""

from __future__ import annotations

import asyncio
import logging

from nsq_ha.consumer.discovery import Discovery
from nsq_ha.consumer.flow import Flow
from nsq_ha.consumer.handout import Intake
from nsq_ha.consumer.slots import Slot, Tally, wait_answered
from nsq_ha.consumer.tasks import Background

__all__ = ["drain"]

log = logging.getLogger(__name__)

#: Sync rounds at close: repeated while messages keep racing in after CLS.
SYNC_ROUNDS = 5


async def drain(
    *,
    name: str,
    discovery: Discovery,
    flow: Flow,
    intake: Intake,
    background: Background,
    held_changed: asyncio.Event,
    tally: Tally,
    timeout: float,  # noqa: ASYNC109 - the drain limit
) -> None:
    """Stop ``discovery``, pause ``flow``, requeue what ``intake`` still has, let handlers
    answer for up to ``timeout`` s, requeue the rest, sync, close every connection."""
    intake.closing = True  # what arrives from now on is requeued at once
    await discovery.stop()
    await flow.stop()
    slots = list(discovery.slots.values())
    requeued = intake.stop()
    # nothing new: CLS everywhere (what races in is requeued by the intake)
    await asyncio.gather(
        *(s.conn.stop_delivery() for s in slots if s.conn is not None), return_exceptions=True
    )
    held = sum(len(s.held) for s in slots)
    log.info(
        "closing %s: %d queued messages requeued, waiting up to %.1f s for %d held",
        name,
        requeued,
        timeout,
        held,
    )
    await wait_answered(slots, held_changed, timeout)
    for slot in slots:
        for message in list(slot.held.values()):
            log.warning("closing: %r still held after %.1f s: requeueing it", message, timeout)
            slot.requeue_now(message)
    await _sync(slots, tally)
    await asyncio.gather(
        *(s.conn.close() for s in slots if s.conn is not None), return_exceptions=True
    )
    # watchers end with their sockets; a stuck on_give_up is cut off
    await background.finish(max(timeout, 1.0))
    await discovery.close()


async def _sync(slots: list[Slot], tally: Tally) -> None:
    """Round trips until no message raced in: then nsqd has processed every answer."""
    for _ in range(SYNC_ROUNDS):
        before = tally.total("received")
        live = [s.conn for s in slots if s.conn is not None and not s.conn.closed]
        results = await asyncio.gather(*(c.sync() for c in live), return_exceptions=True)
        for conn, result in zip(live, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("closing: sync with %s failed: %s", conn.address, result)
        if tally.total("received") == before:
            return
    log.warning("closing: messages kept arriving after CLS; some may stay in flight")
