"""The producer's sender draining one topic's lanes, with every batch handed to a function of the
test instead of nsqd (what the group-commit and split tests drive)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from nsq_ha.connection import ConnectionConfig
from nsq_ha.producer.batch import Outcome, plain_size
from nsq_ha.producer.config import ProducerConfig
from nsq_ha.producer.message import BatchBuilder
from nsq_ha.producer.pool import ConnectionPool
from nsq_ha.producer.routes import Routes
from nsq_ha.producer.sender import Sender
from nsq_ha.producer.topic import SlotMemo, Topic
from nsq_ha.protocol.publish import PublishMessage
from nsq_ha.routing import get_strategy

#: ``send(topic, messages, slot)``: one batch; each message's outcome, or it raises
SendBatch = Callable[[str, list[PublishMessage], "int | None"], Awaitable[Sequence[Outcome]]]


def _sender(
    send: SendBatch,
    make_builder: Callable[[Routes | None], BatchBuilder],
    *,
    linger: float,
    max_batch: int,
) -> Sender:
    """A Sender whose batches go to ``send`` and are cut by ``make_builder`` (its seams: a
    compiled Sender cannot be subclassed)."""

    async def send_batch(
        topic: Topic, messages: list[PublishMessage], slot: int | None
    ) -> list[Outcome]:
        return list(await send(topic.name, messages, slot))

    settings = ProducerConfig(
        nsqd=("127.0.0.1:1",), max_batch=max_batch, linger=linger, unkeyed_window=1
    )
    return Sender(
        settings,
        ConnectionPool(ConnectionConfig(), {}),
        {},
        lambda: False,
        send_batch=send_batch,
        builder=make_builder,
    )


class Lanes:
    """One topic (``"t"``, no routes known) whose calls are queued and sent by a Sender."""

    def __init__(
        self,
        *,
        send: SendBatch,
        builder: Callable[[Routes | None], BatchBuilder],
        routes: object = None,
        linger: float = 0.0,
        max_batch: int,
    ) -> None:
        self.sender = _sender(send, builder, linger=linger, max_batch=max_batch)
        self.topic = Topic(
            "t",
            lookup=None,
            static=None,
            memo=SlotMemo(get_strategy("murmur3")),
            pool=self.sender.pool,
        )

    def submit(
        self,
        topic: str,
        slot: int | None,
        messages: list[PublishMessage],
    ) -> asyncio.Future[list[Outcome]]:
        assert topic == self.topic.name
        return self.sender.submit(self.topic, slot, messages, plain_size(messages))

    @property
    def queued(self) -> int:
        """Messages waiting in the topic's lanes."""
        return sum(lane.waiting for lane in self.topic.lanes.values())

    @property
    def split_calls(self) -> int:
        """Calls whose messages went in several batches and that still wait for some."""
        return len(self.sender.splits)
