"""Group commit (a topic's lanes, drained by the sender): what a publish call waits on is the
outcome of each of its messages, in order, whether they left in one batch or several."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lane_harness import Lanes

from nsq_ha.errors import PubFailedError
from nsq_ha.producer.batch import Outcome, batch_command, prepare_batch
from nsq_ha.producer.message import BatchBuilder, PublishResult
from nsq_ha.producer.routes import Routes
from nsq_ha.protocol.publish import Publish, PublishMessage


def _lanes(
    sent: list[list[bytes]],
    max_batch: int,
    fail: set[int] | None = None,
    second_out: asyncio.Event | None = None,
) -> Lanes:
    async def send(
        topic: str, messages: list[PublishMessage], slot: int | None
    ) -> list[PublishResult]:
        number = len(sent)
        sent.append([m.body for m in messages])
        if number == 1 and second_out is not None:
            second_out.set()
        await asyncio.sleep(0)
        if fail and number in fail:
            raise PubFailedError("E_PUB_FAILED", f"batch {number}")
        return [PublishResult(topic, slot, "node", 1, internal_id=number) for _ in messages]

    def builder(routes: Routes | None) -> BatchBuilder:
        return BatchBuilder(max_msg_size=1 << 20, max_body_size=5 << 20, max_count=max_batch)

    return Lanes(send=send, builder=builder, routes=lambda t: None, linger=0.0, max_batch=max_batch)


def _bodies(prefix: str, count: int) -> list[PublishMessage]:
    return prepare_batch([f"{prefix}{i}".encode() for i in range(count)])[0]


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


async def test_a_keyed_caller_answered_by_a_batch_rides_the_next_with_those_queued() -> None:
    sent: list[list[bytes]] = []
    out = asyncio.Event()

    async def send(
        topic: str, messages: list[PublishMessage], slot: int | None
    ) -> list[PublishResult]:
        sent.append([m.body for m in messages])
        out.set()
        await asyncio.sleep(0)
        return [PublishResult(topic, slot, "node", 1, internal_id=len(sent)) for _ in messages]

    def builder(routes: Routes | None) -> BatchBuilder:
        return BatchBuilder(max_msg_size=1 << 20, max_body_size=5 << 20, max_count=10)

    lanes = Lanes(send=send, builder=builder, max_batch=10)

    async def again() -> None:  # publishes, and publishes again once answered
        await lanes.submit("t", 0, _bodies("a", 1))
        await lanes.submit("t", 0, _bodies("again", 1))

    caller = asyncio.create_task(again())
    await out.wait()  # a0 is out
    other = lanes.submit("t", 0, _bodies("b", 1))
    await asyncio.gather(caller, other)
    assert sent == [[b"a0"], [b"b0", b"again0"]]  # not [b"b0"], then [b"again0"]


async def test_a_topic_is_used_until_its_lane_has_sent_everything() -> None:
    sent: list[list[bytes]] = []
    lanes = _lanes(sent, max_batch=3)
    lanes.topic.last_used = 0.0
    await lanes.submit("t", None, _bodies("u", 1))
    await asyncio.gather(*(task for lane in lanes.topic.lanes.values() for task in lane.senders))
    assert not lanes.topic.busy
    assert lanes.topic.last_used > 0.0  # the sweeper counts it idle from here


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


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(st.integers(1, 60), st.booleans(), st.booleans()), min_size=1, max_size=12
        ),
        min_size=1,
        max_size=8,
    ),
    st.integers(70, 300),
    st.integers(1, 12),
    st.booleans(),
)
def test_a_keyed_lane_sends_every_message_once_in_order_within_the_limits(
    calls: list[list[tuple[int, bool, bool]]], body_limit: int, max_batch: int, ext_topic: bool
) -> None:
    """Whole plain calls, cut calls and traced or ext ones: every batch is one nsqd accepts,
    every message leaves once, in call order, and each call gets one outcome per message."""
    max_msg = 80
    header = b'{"k":1}'

    async def run() -> None:
        sent: list[PublishMessage] = []

        async def send(
            topic: str, messages: list[PublishMessage], slot: int | None
        ) -> list[PublishResult]:
            if len(messages) > 1:  # a lone message is checked by prepare_message
                command = batch_command(messages)
                Publish(command, "t", 0, messages, max_msg, body_limit).encode()
            assert len(messages) <= max_batch
            first = len(sent)
            sent.extend(messages)
            await asyncio.sleep(0)
            return [
                PublishResult(topic, slot, "n", 1, internal_id=first + i)
                for i in range(len(messages))
            ]

        def builder(routes: Routes | None) -> BatchBuilder:
            return BatchBuilder(
                max_msg_size=max_msg,
                max_body_size=body_limit,
                max_count=max_batch,
                ext_topic=ext_topic,
            )

        lanes = Lanes(
            send=send, builder=builder, routes=lambda t: None, linger=0.0, max_batch=max_batch
        )
        queued = [
            [
                PublishMessage(b"b" * size, 7 if traced else None, header if ext else None)
                for size, traced, ext in call
            ]
            for call in calls
        ]
        futures = [lanes.submit("t", 0, messages) for messages in queued]
        outcomes = await asyncio.gather(*futures)
        assert sent == [m for messages in queued for m in messages]
        numbers = [o.internal_id for call in outcomes for o in call if isinstance(o, PublishResult)]
        assert numbers == list(range(len(sent)))
        assert lanes.queued == 0
        assert lanes.split_calls == 0

    asyncio.run(run())


@pytest.mark.parametrize(
    ("calls", "body_limit", "max_batch", "batches"),
    [
        # each 10-byte body costs 14 bytes of an MPUB body, plus 4 for the count: 5 fit in 74
        ([3, 4], 4 + 5 * 14, 100, [5, 2]),  # the second call is cut where the body is full
        ([2, 3], 4 + 5 * 14, 100, [5]),  # two whole calls fill it exactly
        ([2, 3], 4 + 5 * 14 - 1, 100, [4, 1]),  # one byte less: the fifth waits
        ([7], 1000, 3, [3, 3, 1]),  # a call over max_batch
        ([1, 1, 1, 1], 1000, 2, [2, 2]),
    ],
)
async def test_plain_calls_fill_batches_up_to_the_limits(
    calls: list[int], body_limit: int, max_batch: int, batches: list[int]
) -> None:
    sizes: list[int] = []

    async def send(
        topic: str, messages: list[PublishMessage], slot: int | None
    ) -> list[PublishResult]:
        if len(messages) > 1:
            Publish(batch_command(messages), "t", 0, messages, 100, body_limit).encode()
        sizes.append(len(messages))
        return [PublishResult(topic, slot, "n", 1) for _ in messages]

    def builder(routes: Routes | None) -> BatchBuilder:
        return BatchBuilder(max_msg_size=100, max_body_size=body_limit, max_count=max_batch)

    lanes = Lanes(
        send=send, builder=builder, routes=lambda t: None, linger=0.0, max_batch=max_batch
    )
    futures = [lanes.submit("t", 0, [PublishMessage(b"x" * 10)] * n) for n in calls]
    outcomes = await asyncio.gather(*futures)
    assert sizes == batches
    assert [len(o) for o in outcomes] == calls
    assert all(isinstance(o, PublishResult) for call in outcomes for o in call)


async def test_a_message_over_the_room_left_starts_the_next_batch_alone() -> None:
    sizes: list[int] = []

    async def send(
        topic: str, messages: list[PublishMessage], slot: int | None
    ) -> list[PublishResult]:
        sizes.append(len(messages))
        return [PublishResult(topic, slot, "n", 1) for _ in messages]

    def builder(routes: Routes | None) -> BatchBuilder:
        return BatchBuilder(max_msg_size=100, max_body_size=50, max_count=10)

    lanes = Lanes(send=send, builder=builder, routes=lambda t: None, linger=0.0, max_batch=10)
    await lanes.submit("t", 0, [PublishMessage(b"x" * 60)] * 2)  # each one alone is a PUB
    assert sizes == [1, 1]


async def test_an_unkeyed_call_is_never_cut_for_a_share_but_queued_calls_are_spread() -> None:
    """Unkeyed: one publish_many goes as few commands as the limits allow; calls queued
    together are spread over two batches at call boundaries (so callers that publish again
    after their batch never all wait on one batch)."""
    sent: list[list[bytes]] = []
    lanes = _lanes(sent, max_batch=1000)
    outcomes = await lanes.submit("t", None, _bodies("a", 500))
    assert [len(batch) for batch in sent] == [500]
    assert len(outcomes) == 500
    sent.clear()
    calls = [lanes.submit("t", None, _bodies(f"c{i}-", 100)) for i in range(4)]
    await asyncio.gather(*calls)
    assert sorted(len(batch) for batch in sent) == [200, 200]
