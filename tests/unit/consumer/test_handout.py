"""The consumer's hand-out queue (nsq_ha.consumer.handout.Intake): asyncio.Queue's behaviour
for what the consumer uses, without asking for the running loop on every wait."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nsq_ha.consumer import ConsumerConfig, Message
from nsq_ha.consumer.handout import Claims, Intake
from nsq_ha.consumer.slots import Flow, Slot, SlotContext, Tally
from nsq_ha.consumer.tasks import Background
from nsq_ha.protocol.message import DecodedMessage
from nsq_ha.transport import Wakeup

CONFIG = ConsumerConfig(topic="t", channel="c", nsqd="127.0.0.1:4150", max_attempts=0)


def plain() -> Slot:
    """The slot that delivered: a real one (a compiled Intake refuses a stand-in), of an
    unordered subscription, with no connection (nothing here answers)."""
    flow = Flow(CONFIG)
    context = SlotContext(
        config=CONFIG,
        flow=flow,
        planner=flow.planner,
        tally=Tally(),
        held_changed=Wakeup(),
        deliver=lambda slot, message: None,
        settled=lambda message: None,
    )
    return Slot(context, ("127.0.0.1:4150", -1), False)


def message(number: int) -> Message:
    decoded = DecodedMessage(
        timestamp=1, attempts=1, id=number.to_bytes(16, "big"), body=b"%d" % number
    )
    return Message(decoded, plain())


def deliver(intake: Intake, *messages: Message) -> None:
    for one in messages:
        intake.deliver(plain(), one)


def intake() -> Intake:
    return Intake(CONFIG, Background())


async def test_items_come_out_in_order_and_readers_are_served_in_the_order_they_came() -> None:
    queue = intake()
    one, two, ten, twenty = message(1), message(2), message(10), message(20)
    deliver(queue, one, two)
    assert queue.queued == 2
    assert [await queue.take(), queue.take_nowait()] == [one, two]
    assert queue.take_nowait() is None
    got: list[tuple[str, Any]] = []

    async def reader(name: str) -> None:
        got.append((name, await queue.take()))

    readers = [asyncio.create_task(reader(name)) for name in ("first", "second")]
    await asyncio.sleep(0)  # both wait, "first" first
    deliver(queue, ten, twenty)
    await asyncio.gather(*readers)
    assert got == [("first", ten), ("second", twenty)]


async def test_a_reader_cancelled_after_its_wake_up_passes_the_item_on() -> None:
    queue = intake()
    first = asyncio.create_task(queue.take())
    second = asyncio.create_task(queue.take())
    await asyncio.sleep(0)
    only = message(1)
    deliver(queue, only)  # wakes ``first``...
    first.cancel()  # ...which is cancelled before it runs
    assert await asyncio.wait_for(second, 1.0) is only
    assert first.cancelled()
    assert queue.queued == 0


async def test_a_cancelled_waiting_reader_leaves_no_trace() -> None:
    queue = intake()
    waiting = asyncio.create_task(queue.take())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    kept = message(1)
    deliver(queue, kept)
    assert queue.take_nowait() is kept


async def test_the_calling_task_is_the_running_task() -> None:
    intake = Intake(CONFIG, Background())

    async def ask() -> Any:
        return intake._current_task()

    task = asyncio.create_task(ask())
    assert await task is task


async def test_a_claim_ends_when_its_task_asks_again_is_answered_for_or_ends() -> None:
    released: list[Message] = []
    claims = Claims(released.append)
    first, second, third = message(1), message(2), message(3)
    done = asyncio.Event()

    async def loop() -> None:
        task = asyncio.current_task()
        assert task is not None
        claims.add(task, first)
        claims.done_with(task)  # asked again: done with the first
        assert released == [first]
        claims.add(task, second)
        claims.answered(second)  # answered: released, the task still known
        assert released == [first, second]
        assert claims
        claims.done_with(task)  # holding nothing: releases nothing
        assert released == [first, second]
        claims.add(task, third)
        await done.wait()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    done.set()
    await task
    await asyncio.sleep(0)  # the task's done callback
    assert released == [first, second, third]
    assert not claims  # a task that ended is forgotten
