"""A topic's turn order: keyed calls that wait for the topic's routes are queued in call order,
all at once when the routes come, and the turns end there."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from nsq_ha.connection import ConnectionConfig
from nsq_ha.errors import ConfigError, TopicNotFoundError
from nsq_ha.producer import topic as producer_topic
from nsq_ha.producer.pool import ConnectionPool
from nsq_ha.producer.routes import Routes
from nsq_ha.producer.topic import SlotMemo
from nsq_ha.routing import get_strategy

#: the routes a lookup gives (a real object: a compiled Topic checks what ready() returns)
ROUTES = Routes("t", False, {}, 0)


def arrival_order() -> producer_topic.Topic:
    """A producer's topic ``"t"``, whose turn order is what is tested."""
    pool = ConnectionPool(ConnectionConfig(), {})
    memo = SlotMemo(get_strategy("murmur3"))
    return producer_topic.Topic("t", lookup=None, static=None, memo=memo, pool=pool)


def waiting_for(order: producer_topic.Topic) -> bool:
    """True while an earlier keyed call has not queued its messages yet."""
    return order.waiting is not None


class Topic:
    """A topic's routes (None until a lookup gives them) and the calls queued, in order."""

    def __init__(self) -> None:
        self.routes: Routes | None = None
        self.queued: list[str] = []
        #: the future each queued call was given
        self.futures: dict[str, asyncio.Future[str]] = {}
        self.lookups: list[str] = []
        self.lookup_answer = asyncio.Event()
        self.lookup_error: BaseException | None = None
        #: run in the named call's task as soon as its turn() returns or raises
        self.after: dict[str, Callable[[], object]] = {}

    def ready(self) -> Routes | None:
        return self.routes

    def call(self, order: producer_topic.Topic, name: str) -> asyncio.Task[asyncio.Future[str]]:
        async def look_up() -> Routes:
            self.lookups.append(name)
            await self.lookup_answer.wait()
            if self.lookup_error is not None:
                error, self.lookup_error = self.lookup_error, None
                raise error
            self.routes = ROUTES
            return ROUTES

        def submit(_: object, routes: Routes) -> asyncio.Future[str]:
            if name.startswith("bad"):
                raise ConfigError(f"{name}: refused before anything was queued")
            self.queued.append(name)
            future = self.futures[name] = asyncio.get_running_loop().create_future()
            return future

        async def run() -> asyncio.Future[str]:
            try:
                return await order.turn(self.ready, look_up, submit)
            finally:
                self.after.pop(name, lambda: None)()

        return asyncio.create_task(run())


async def test_waiting_calls_are_queued_in_call_order_in_one_step_and_the_turns_end() -> None:
    order, topic = arrival_order(), Topic()
    calls = [topic.call(order, f"c{i}") for i in range(50)]
    await asyncio.sleep(0)  # every task has made its call
    assert waiting_for(order)
    assert topic.lookups == ["c0"]
    topic.lookup_answer.set()
    async with asyncio.timeout(5):
        await calls[0]
    assert topic.queued == [f"c{i}" for i in range(50)]  # before any other call resumed
    assert not waiting_for(order)
    results = await asyncio.gather(*calls)
    assert all(isinstance(f, asyncio.Future) for f in results)
    assert topic.lookups == ["c0"]


async def test_a_refused_call_gets_its_own_error_and_the_others_are_queued() -> None:
    order, topic = arrival_order(), Topic()
    calls = [topic.call(order, name) for name in ("c0", "c1", "bad2", "c3")]
    await asyncio.sleep(0)
    topic.lookup_answer.set()
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(outcomes[2], ConfigError)
    assert topic.queued == ["c0", "c1", "c3"]
    assert not waiting_for(order)


async def test_a_failed_lookup_hands_the_turn_to_the_next_call_which_looks_up_itself() -> None:
    order, topic = arrival_order(), Topic()
    topic.lookup_error = TopicNotFoundError("no such topic (made up by the test)")
    calls = [topic.call(order, f"c{i}") for i in range(4)]
    await asyncio.sleep(0)
    topic.lookup_answer.set()
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(outcomes[0], TopicNotFoundError)
    assert topic.lookups == ["c0", "c1"]
    assert topic.queued == ["c1", "c2", "c3"]
    assert not waiting_for(order)


async def test_a_call_cancelled_while_waiting_is_skipped() -> None:
    order, topic = arrival_order(), Topic()
    calls = [topic.call(order, f"c{i}") for i in range(3)]
    await asyncio.sleep(0)
    calls[1].cancel()
    topic.lookup_answer.set()
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(outcomes[1], asyncio.CancelledError)
    assert topic.queued == ["c0", "c2"]
    assert not waiting_for(order)


async def test_a_call_cancelled_once_queued_has_its_future_cancelled() -> None:
    order, topic = arrival_order(), Topic()
    calls = [topic.call(order, f"c{i}") for i in range(2)]
    # c0 has just queued c1, which has not resumed yet: c1 is cancelled then
    topic.after["c0"] = calls[1].cancel
    await asyncio.sleep(0)
    topic.lookup_answer.set()
    await calls[0]
    assert topic.queued == ["c0", "c1"]
    with pytest.raises(asyncio.CancelledError):
        await calls[1]
    assert topic.futures["c1"].cancelled()  # a lane skips a call whose future is cancelled
    assert not topic.futures["c0"].cancelled()
    assert not waiting_for(order)


async def test_a_call_cancelled_as_it_is_handed_the_turn_passes_it_on() -> None:
    order, topic = arrival_order(), Topic()
    topic.lookup_error = TopicNotFoundError("no such topic (made up by the test)")
    calls = [topic.call(order, f"c{i}") for i in range(3)]
    # c0's lookup failed and it has just handed the turn to c1, which has not resumed yet
    topic.after["c0"] = calls[1].cancel
    await asyncio.sleep(0)
    topic.lookup_answer.set()
    async with asyncio.timeout(5):
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(outcomes[0], TopicNotFoundError)
    assert isinstance(outcomes[1], asyncio.CancelledError)
    assert topic.lookups == ["c0", "c2"]
    assert topic.queued == ["c2"]
    assert not waiting_for(order)
