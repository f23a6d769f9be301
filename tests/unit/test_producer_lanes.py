"""Group commit (``nsq_ha.producer.lanes``): what a publish call waits on is the outcome of each
of its messages, in order, whether they left in one batch or several."""

from __future__ import annotations

import asyncio

import pytest

from nsq_ha.errors import PubFailedError
from nsq_ha.producer.batch import BatchBuilder, OutgoingMessage, prepare_messages
from nsq_ha.producer.lanes import Lanes, Outcome
from nsq_ha.producer.result import PublishResult
from nsq_ha.producer.routes import Routes


def _lanes(
    sent: list[list[bytes]],
    max_batch: int,
    fail: set[int] | None = None,
    second_out: asyncio.Event | None = None,
) -> Lanes:
    async def send(
        topic: str, messages: list[OutgoingMessage], slot: int | None
    ) -> list[PublishResult]:
        number = len(sent)
        sent.append([m.body for m in messages])
        if number == 1 and second_out is not None:
            second_out.set()
        await asyncio.sleep(0)
        if fail and number in fail:
            raise PubFailedError("E_PUB_FAILED", f"batch {number}")
        return [PublishResult(topic, slot, "node", 1, internal_id=number) for _ in messages]

    def builder(routes: Routes | None, share: int | None) -> BatchBuilder:
        return BatchBuilder(max_msg_size=1 << 20, max_body_size=5 << 20, max_count=max_batch)

    return Lanes(send=send, builder=builder, routes=lambda t: None, linger=0.0, max_batch=max_batch)


def _bodies(prefix: str, count: int) -> list[OutgoingMessage]:
    return prepare_messages([f"{prefix}{i}".encode() for i in range(count)])


async def test_a_call_split_over_batches_gets_every_outcome_in_order() -> None:
    sent: list[list[bytes]] = []
    lanes = _lanes(sent, max_batch=3)
    one = lanes.submit("t", 0, _bodies("a", 1))
    many = lanes.submit("t", 0, _bodies("b", 7))
    first, outcomes = await asyncio.gather(one, many)
    assert [len(batch) for batch in sent] == [3, 3, 2]  # b0..b6 left in three batches
    assert sent[0] == [b"a0", b"b0", b"b1"]
    assert len(first) == 1
    assert isinstance(first[0], PublishResult)
    assert first[0].internal_id == 0
    # each message's outcome is its own batch's, in the call's order
    assert [o.internal_id for o in outcomes if isinstance(o, PublishResult)] == [
        0, 0, 1, 1, 1, 2, 2,
    ]  # fmt: skip


async def test_a_failed_batch_fails_only_its_messages_of_a_split_call() -> None:
    sent: list[list[bytes]] = []
    lanes = _lanes(sent, max_batch=2, fail={1})
    outcomes: list[Outcome] = await lanes.submit("t", 0, _bodies("m", 5))
    kinds = [type(o).__name__ for o in outcomes]
    assert kinds == ["PublishResult"] * 2 + ["PubFailedError"] * 2 + ["PublishResult"]


async def test_a_call_cancelled_between_its_batches_leaves_nothing_behind() -> None:
    sent: list[list[bytes]] = []
    second_out = asyncio.Event()
    lanes = _lanes(sent, max_batch=2, second_out=second_out)
    call = lanes.submit("t", 0, _bodies("c", 5))
    await second_out.wait()  # the first batch settled (its outcomes kept), the second is out
    assert lanes.split_calls == 1
    call.cancel()
    after = lanes.submit("t", 0, _bodies("d", 1))
    assert isinstance((await after)[0], PublishResult)
    with pytest.raises(asyncio.CancelledError):
        await call
    assert lanes.queued == 0
    assert lanes.split_calls == 0
