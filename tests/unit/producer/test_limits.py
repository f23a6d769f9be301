"""What nsqd's size refusals teach the producer: the limit a refusal names, which refusals a
batch is split for, how a refused batch is cut, and the limits kept per nsqd.

The refusal texts are vanilla nsqd 1.3.0's and the fork's (PROTOCOL.md §2.10, §2.13).
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lane_harness import Lanes

from nsq_ha.errors import (
    BadMessageError,
    BadTopicError,
    BodyTooLargeError,
    BrokerError,
    ExtNotSupportedError,
    InvalidArgumentError,
    MpubFailedError,
    NotLeaderError,
    NsqConnectionError,
    PublishError,
)
from nsq_ha.producer.batch import Outcome
from nsq_ha.producer.limits import (
    MAX_SERVERS,
    ServerLimits,
    split_batch,
    splits_batch,
)
from nsq_ha.producer.message import BatchBuilder, PublishResult, mpub_sizes
from nsq_ha.producer.routes import Routes
from nsq_ha.protocol.publish import PublishMessage


def refusal(frame: str) -> BrokerError:
    """The error the connection raises for the error frame ``frame``."""
    code, _, description = frame.partition(" ")
    return BrokerError.class_for(code)(code, description)


def msg(body: bytes = b"x", trace_id: int | None = None) -> PublishMessage:
    return PublishMessage(body, trace_id, None)


def limits() -> ServerLimits:
    return ServerLimits(max_msg_size=1 << 20, max_body_size=5 << 20)


@pytest.mark.parametrize(
    ("frame", "named"),
    [
        ("E_BAD_MESSAGE MPUB message too big 2000 > 1000", ("max_msg_size", 1000)),
        ("E_BAD_MESSAGE PUB message too big 2000 > 1000", ("max_msg_size", 1000)),
        ("E_BAD_MESSAGE message too big 1048577 > 1048576", ("max_msg_size", 1048576)),
        ("E_BAD_BODY MPUB body too big 100084 > 100000", ("max_body_size", 100000)),
        ("E_BAD_BODY body too big 100084 > 100000", ("max_body_size", 100000)),
        ("E_BAD_BODY body too big 100084 > 100000 ", ("max_body_size", 100000)),
        ("E_BAD_MESSAGE PUB invalid message body size 0", None),
        ("E_BAD_MESSAGE MPUB failed to read message body", None),
        ("E_BAD_BODY MPUB invalid message count 0", None),
        ("E_BAD_MESSAGE message too big 5 > 9", None),  # does not add up: nothing learned
        ("E_BAD_TOPIC PUB topic name too big 2 > 1", None),  # not a size refusal
        ("E_MPUB_FAILED too big 2000 > 1000", None),
    ],
)
def test_a_size_refusal_names_the_limit(frame: str, named: tuple[str, int] | None) -> None:
    big = 1 << 40
    learner = ServerLimits(max_msg_size=big, max_body_size=big)
    learner.learn("a:4150", refusal(frame))
    if named is None:
        assert learner.learned == {}
    else:
        what, limit = named
        kept = (limit, big) if what == "max_msg_size" else (big, limit)
        assert learner.learned == {"a:4150": kept}


def test_only_refusals_of_a_batchs_messages_split_it() -> None:
    for split in (
        refusal("E_BAD_MESSAGE MPUB message too big 2000 > 1000"),
        refusal("E_BAD_BODY MPUB body too big 100084 > 100000"),
        refusal("E_BAD_MESSAGE MPUB failed to read message body"),
        refusal("E_EXT_NOT_SUPPORT ext content not supported in topic t"),
        refusal("E_INVALID_JSON_HEADER fail to parse json header:x"),
        refusal("INVALID_TRACE_ID invalid trace id"),
        BodyTooLargeError("an MPUB body", 200, 100),
    ):
        assert splits_batch(split), split
    assert isinstance(refusal("E_EXT_NOT_SUPPORT x"), ExtNotSupportedError)
    for kept in (
        NotLeaderError("E_FAILED_ON_NOT_LEADER"),
        MpubFailedError("E_MPUB_FAILED", "disk"),
        BadTopicError("E_BAD_TOPIC", "bad"),
        NsqConnectionError("closed"),
        PublishError("gave up", attempts=3),
        InvalidArgumentError("bad"),
        ValueError("a bug"),
    ):
        assert not splits_batch(kept), kept


def test_limits_are_learned_per_nsqd_and_only_ever_lowered() -> None:
    known = limits()
    assert not known.learned
    known.learn("a:1", NotLeaderError("E_FAILED_ON_NOT_LEADER"))
    assert not known.learned
    known.learn("a:1", refusal("E_BAD_BODY MPUB body too big 100084 > 100000"))
    assert known.learned == {"a:1": (1 << 20, 100000)}
    known.learn("a:1", refusal("E_BAD_MESSAGE MPUB message too big 2000 > 1000"))
    assert known.learned == {"a:1": (1000, 100000)}
    # a larger limit named later (another topic's refusal, a restart) does not raise it
    known.learn("a:1", refusal("E_BAD_BODY body too big 300000 > 200000"))
    assert known.learned == {"a:1": (1000, 100000)}
    # a limit over the configured one teaches nothing
    known.learn("b:2", refusal("E_BAD_BODY body too big 7000000 > 6000000"))
    assert list(known.learned) == ["a:1"]
    assert known.lowest(["b:2"]) == (1 << 20, 5 << 20, False)
    assert known.lowest(["b:2", "a:1"]) == (1000, 100000, True)
    assert "a:1" in repr(known)


def test_at_most_max_servers_limits_are_kept() -> None:
    known = limits()
    too_big = refusal("E_BAD_BODY body too big 200 > 100")
    for index in range(MAX_SERVERS + 5):
        known.learn(f"n{index}:1", too_big)
    assert "n0:1" not in known.learned  # the oldest were forgotten
    assert known.learned[f"n{MAX_SERVERS + 4}:1"] == (1 << 20, 100)
    assert len(known.learned) == MAX_SERVERS


def test_a_batch_over_a_learned_limit_is_refused_before_sending() -> None:
    known = limits()
    known.check("a:1", [msg(b"x" * 5000)] * 40, b"MPUB")  # nothing learned: nothing refused
    known.learn("a:1", refusal("E_BAD_BODY MPUB body too big 100084 > 100000"))
    with pytest.raises(BodyTooLargeError, match=r"100084 bytes, over the limit of 100000"):
        known.check("a:1", [msg(b"x" * 5000)] * 20, b"MPUB")
    known.check("a:1", [msg(b"x" * 5000)] * 19, b"MPUB")
    known.check("b:2", [msg(b"x" * 5000)] * 40, b"MPUB")  # another nsqd
    known.learn("a:1", refusal("E_BAD_MESSAGE MPUB message too big 2000 > 1000"))
    # nsqd measures a traced message with its 8-byte trace id
    with pytest.raises(BodyTooLargeError, match="1001 bytes, over the limit of 1000"):
        known.check("a:1", [msg(b"x" * 993), msg(b"y")], b"MPUB_TRACE")
    known.check("a:1", [msg(b"x" * 993), msg(b"y")], b"MPUB")
    known.check("a:1", [msg(b"x" * 5000)], b"PUB")  # one message: nsqd answers for it


def test_mpub_sizes_are_what_nsqd_measures() -> None:
    messages = [msg(b"x" * 10), msg(b"y" * 3)]
    assert mpub_sizes(messages, b"MPUB") == (4 + 14 + 7, 10)
    assert mpub_sizes(messages, b"MPUB_TRACE") == (4 + 22 + 15, 18)
    with_header = [PublishMessage(b"x" * 10, None, b'{"a":"b"}'), msg(b"y")]
    assert mpub_sizes(with_header, b"MPUB_EXT") == (4 + 4 + 2 + 9 + 10 + 4 + 2 + 1, 21)


def test_a_refused_batch_is_cut_under_the_learned_body_limit_in_order() -> None:
    batch = [msg(b"%04d" % i + b"x" * 4996) for i in range(20)]
    builder = BatchBuilder(max_msg_size=1 << 20, max_body_size=100_000)
    parts = split_batch(batch, builder)
    assert [len(part) for part in parts] == [19, 1]
    assert [m for part in parts for m in part] == batch


def test_a_message_over_the_learned_message_limit_is_cut_out_alone() -> None:
    big = msg(b"B" * 2000)
    batch = [msg(b"a"), msg(b"b"), big, msg(b"c")]
    builder = BatchBuilder(max_msg_size=1000, max_body_size=5 << 20, checks_each=True)
    assert split_batch(batch, builder) == [[msg(b"a"), msg(b"b")], [big], [msg(b"c")]]
    assert split_batch([big, msg(b"a")], builder) == [[big], [msg(b"a")]]


def test_a_batch_refused_for_a_reason_its_limits_do_not_show_is_halved() -> None:
    batch = [msg(bytes([65 + i])) for i in range(5)]
    builder = BatchBuilder(max_msg_size=1 << 20, max_body_size=5 << 20)
    assert split_batch(batch, builder) == [batch[:2], batch[2:]]
    assert split_batch(batch[:2], builder) == [batch[:1], batch[1:2]]


@given(
    st.lists(st.integers(1, 300), min_size=2, max_size=60),
    st.integers(1, 400),
    st.integers(50, 3000),
)
def test_every_split_keeps_the_order_and_makes_progress(
    sizes: list[int], max_msg: int, max_body: int
) -> None:
    batch = [msg(bytes([i % 256]) * size) for i, size in enumerate(sizes)]
    builder = BatchBuilder(max_msg_size=max_msg, max_body_size=max_body, checks_each=True)
    parts = split_batch(batch, builder)
    assert len(parts) >= 2
    assert all(parts)
    assert [m for part in parts for m in part] == batch
    for part in parts:
        if len(part) > 1:  # several messages together only under both limits
            body, largest = mpub_sizes(part, b"MPUB")
            assert largest <= max_msg
            assert body <= max_body


async def test_lanes_cut_around_a_message_over_a_learned_limit_and_settle_each_call() -> None:
    sent: list[list[bytes]] = []
    refused = BadMessageError("E_BAD_MESSAGE", "PUB message too big 2000 > 1000")

    async def send(topic: str, messages: list[PublishMessage], slot: int | None) -> list[Outcome]:
        sent.append([m.body for m in messages])
        return [
            refused if len(m.body) > 1000 else PublishResult(topic, slot, "n", 1) for m in messages
        ]

    def builder(routes: Routes | None) -> BatchBuilder:
        return BatchBuilder(max_msg_size=1000, max_body_size=5 << 20, checks_each=True)

    lanes = Lanes(send=send, builder=builder, routes=lambda t: None, linger=0.0, max_batch=100)
    bodies = [b"a", b"b", b"B" * 2000, b"c", b"d"]
    calls = [lanes.submit("t", 0, [msg(body)]) for body in bodies]
    outcomes = [outcome for (outcome,) in await asyncio.gather(*calls)]
    assert sent == [[b"a", b"b"], [b"B" * 2000], [b"c", b"d"]]
    assert outcomes[2] is refused
    assert [type(o) for o in outcomes[:2] + outcomes[3:]] == [PublishResult] * 4
