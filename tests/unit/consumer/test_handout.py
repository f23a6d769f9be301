"""The consumer's hand-out queue (nsq_ha.consumer.handout.HandoutQueue): asyncio.Queue's
behaviour for what the consumer uses, without asking for the running loop on every wait."""

from __future__ import annotations

import asyncio

import pytest

from nsq_ha.consumer.handout import HandoutQueue


async def test_items_come_out_in_order_and_readers_are_served_in_the_order_they_came() -> None:
    queue: HandoutQueue[int] = HandoutQueue()
    queue.put(1)
    queue.put(2)
    assert list(queue.items) == [1, 2]
    assert [await queue.get(), queue.items.popleft()] == [1, 2]
    assert not queue.items
    got: list[tuple[str, int]] = []

    async def reader(name: str) -> None:
        got.append((name, await queue.get()))

    readers = [asyncio.create_task(reader(name)) for name in ("first", "second")]
    await asyncio.sleep(0)  # both wait, "first" first
    queue.put(10)
    queue.put(20)
    await asyncio.gather(*readers)
    assert got == [("first", 10), ("second", 20)]


async def test_a_reader_cancelled_after_its_wake_up_passes_the_item_on() -> None:
    queue: HandoutQueue[str] = HandoutQueue()
    first = asyncio.create_task(queue.get())
    second = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    queue.put("only")  # wakes ``first``...
    first.cancel()  # ...which is cancelled before it runs
    assert await asyncio.wait_for(second, 1.0) == "only"
    assert first.cancelled()
    assert not queue.items


async def test_a_cancelled_waiting_reader_leaves_no_trace() -> None:
    queue: HandoutQueue[str] = HandoutQueue()
    waiting = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    queue.put("kept")
    assert await queue.get() == "kept"
