"""The embedded broker's partition store, against the numbers the real fork produced."""

from __future__ import annotations

import pytest

from nsq_ha.devcluster.store import REQ_TO_END_THRESHOLD, Partition, record_size
from nsq_ha.errors import InvalidArgumentError


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.wall = 1_700_000_000_000_000_000

    def __call__(self) -> float:
        return self.now

    def ns(self) -> int:
        self.wall += 1_000
        return self.wall


def partition(**kwargs: bool) -> tuple[Partition, Clock]:
    clock = Clock()
    return Partition("t", 0, clock=clock, wall_clock_ns=clock.ns, **kwargs), clock


def test_ids_offsets_and_raw_sizes_follow_the_real_server() -> None:
    # observed on nsqd 0.3.7-HA.1.13.0: five 5-byte bodies at offsets 0, 35, 70, 105, 140;
    # the first internal id of a new partition is 2
    part, _ = partition()
    stored = [part.append(b"hello") for _ in range(5)]
    assert [m.offset for m in stored] == [0, 35, 70, 105, 140]
    assert [m.internal_id for m in stored] == [2, 3, 4, 5, 6]
    assert {m.raw_size for m in stored} == {35}
    assert part.end == 175
    traced = part.append(b"x", trace_id=77)
    assert traced.id == (7).to_bytes(8, "big") + (77).to_bytes(8, "big")


def test_ext_topic_record_sizes() -> None:
    part, _ = partition(ext=True)
    plain = part.append(b"body")
    headed = part.append(b"body", header=b'{"a":"b"}')
    assert plain.raw_size == record_size(b"body", ext_topic=True) == 4 + 27 + 4
    assert headed.raw_size == 4 + 29 + 9 + 4
    assert (headed.ext_version, headed.ext_data) == (4, b'{"a":"b"}')
    plain_topic, _ = partition()
    with pytest.raises(InvalidArgumentError):
        plain_topic.append(b"x", header=b"{}")


def test_a_new_channel_starts_at_the_end() -> None:
    part, clock = partition()
    part.append(b"before")
    channel = part.channel("c")
    assert channel.take("client", 60, clock.now) is None
    part.append(b"after")
    flight = channel.take("client", 60, clock.now)
    assert flight is not None
    assert (flight.message.body, flight.attempts) == (b"after", 1)


def test_fin_req_touch_and_timeouts_on_a_plain_channel() -> None:
    part, clock = partition()
    channel = part.channel("c")
    for body in (b"a", b"b", b"c"):
        part.append(body)
    a = channel.take("x", 1.0, clock.now)
    b = channel.take("x", 1.0, clock.now)
    assert a is not None
    assert b is not None
    with pytest.raises(KeyError):
        channel.finish(a.message.internal_id, "someone else")
    channel.finish(a.message.internal_id, "x")
    assert channel.requeue(b.message.internal_id, "x", 5.0, clock.now)  # deferred 5 s
    c = channel.take("x", 1.0, clock.now)
    assert c is not None
    assert c.message.body == b"c"
    assert channel.take("x", 1.0, clock.now) is None  # b not due yet
    clock.now += 0.5
    channel.touch(c.message.internal_id, "x", 1.0, clock.now)
    clock.now += 0.8  # past c's first deadline, not its touched one
    assert channel.expire(clock.now) == []
    clock.now += 0.5
    [expired] = channel.expire(clock.now)
    assert expired.message.body == b"c"
    clock.now += 5
    again = [channel.take("x", 1.0, clock.now) for _ in range(2)]
    assert sorted((f.message.body, f.attempts) for f in again if f) == [(b"b", 2), (b"c", 2)]
    # the timeout is a requeue too (nsqd's doRequeue counts both)
    assert (channel.finished, channel.requeue_count, channel.timeout_count) == (1, 2, 1)


def test_ordered_channel_one_in_flight_same_message_back_and_delays_ignored() -> None:
    part, clock = partition(ordered=True)
    channel = part.channel("o")
    for body in (b"1", b"2"):
        part.append(body)
    first = channel.take("x", 4.0, clock.now)
    assert first is not None
    assert channel.take("y", 4.0, clock.now) is None  # one in flight across all clients
    assert not channel.requeue(first.message.internal_id, "x", 5.0, clock.now)  # ignored
    assert channel.requeue(first.message.internal_id, "x", 0, clock.now)
    again = channel.take("y", 4.0, clock.now)  # the same message, maybe to another client
    assert again is not None
    assert (again.message.offset, again.attempts) == (first.message.offset, 2)
    clock.now += 4.0
    channel.expire(clock.now)
    third = channel.take("x", 4.0, clock.now)
    assert third is not None
    assert (third.message.body, third.attempts) == (b"1", 3)
    channel.finish(third.message.internal_id, "x")
    nxt = channel.take("x", 4.0, clock.now)
    assert nxt is not None
    assert nxt.message.offset == first.message.end


def test_seek_by_offset_count_timestamp_and_end() -> None:
    part, clock = partition()
    channel = part.channel("s")
    stored = [part.append(b"hello") for _ in range(5)]

    def next_body_offset() -> int | None:
        flight = channel.take("x", 60, clock.now)
        if flight is None:
            return None
        channel.finish(flight.message.internal_id, "x")
        return flight.message.offset

    channel.seek(offset=0, read_ahead=False)
    assert next_body_offset() == 0
    channel.seek(
        offset=36, read_ahead=False
    )  # not a record boundary: the next record (observed: 70)
    assert next_body_offset() == 70
    channel.seek(count=3, read_ahead=False)  # the third message (observed: offset 70)
    assert next_body_offset() == 70
    channel.seek(timestamp_ns=stored[3].timestamp, read_ahead=False)
    assert next_body_offset() == 105
    channel.seek(end=True, read_ahead=False)
    assert next_body_offset() is None
    channel.seek(offset=999_999, read_ahead=False)  # past the end: accepted, nothing delivered
    assert next_body_offset() is None
    with pytest.raises(InvalidArgumentError):
        channel.seek()
    with pytest.raises(InvalidArgumentError):
        channel.seek(count=0)


def test_a_seek_keeps_the_message_read_ahead_and_forgets_what_is_in_flight() -> None:
    """The fork's channel pump holds the next message; a seek delivers it first, then goes on
    from the new position; what was in flight is forgotten (returned to tell its holder)."""
    part, clock = partition()
    channel = part.channel("ra")
    stored = [part.append(b"m%d" % i) for i in range(5)]
    held = channel.take("x", 60, clock.now)
    assert held is not None
    assert held.message is stored[0]
    assert channel.read_ts == stored[1].timestamp  # the pump has read the second already
    assert channel.seek(offset=stored[3].offset) == [held]
    assert (channel.in_flight, channel.depth, channel.read_ts) == ({}, 2, 0)
    with pytest.raises(KeyError):
        channel.finish(stored[0].internal_id, "x")
    bodies = []
    while (flight := channel.take("x", 60, clock.now)) is not None:
        bodies.append((flight.message.body, flight.attempts))
        channel.finish(flight.message.internal_id, "x")
    assert bodies == [(b"m1", 1), (b"m3", 1), (b"m4", 1)]
    assert channel.read_ts == stored[4].timestamp
    # nothing unread: nothing is held, and the next seek has nothing to keep
    channel.seek(offset=0)
    assert [channel.take("x", 60, clock.now).message.body for _ in range(5)] == [  # type: ignore[union-attr]
        b"m0",
        b"m1",
        b"m2",
        b"m3",
        b"m4",
    ]


def test_a_seek_onto_the_held_message_delivers_it_once() -> None:
    part, clock = partition()
    channel = part.channel("onto")
    stored = [part.append(b"m%d" % i) for i in range(3)]
    channel.seek(offset=stored[0].offset)
    bodies = []
    while (flight := channel.take("x", 60, clock.now)) is not None:
        bodies.append(flight.message.body)
        channel.finish(flight.message.internal_id, "x")
    assert bodies == [b"m0", b"m1", b"m2"]


def test_a_requeued_message_is_the_one_held() -> None:
    part, clock = partition()
    channel = part.channel("rq")
    for i in range(3):
        part.append(b"m%d" % i)
    for _ in range(3):
        channel.take("gone", 60, clock.now)
    channel.release("gone", clock.now)
    channel.seek(end=True)
    flight = channel.take("x", 60, clock.now)
    assert flight is not None
    assert (flight.message.body, flight.attempts) == (b"m0", 1)
    assert channel.take("x", 60, clock.now) is None


def test_an_ordered_seek_sends_the_message_after_the_held_one_twice() -> None:
    """Observed on the fork: held m0, then m2 twice under one id (the FIN of m0 resets the
    ordered reader again, which forgets the first m2), then m3."""
    part, clock = partition(ordered=True)
    channel = part.channel("ord")
    stored = [part.append(b"m%d" % i) for i in range(4)]
    channel.seek(offset=stored[2].offset)
    first = channel.take("x", 60, clock.now)
    assert first is not None
    assert first.message is stored[0]
    assert channel.replay() is None
    channel.finish(first.message.internal_id, "x")
    again = channel.take("x", 60, clock.now)
    assert again is not None
    assert again.message is stored[2]
    assert channel.replay() is again
    second = channel.take("x", 60, clock.now)
    assert second is not None
    assert (second.message, second.attempts) == (stored[2], 1)
    assert channel.replay() is None
    channel.finish(second.message.internal_id, "x")
    last = channel.take("x", 60, clock.now)
    assert last is not None
    assert last.message is stored[3]


def test_no_read_ahead_while_an_ordered_message_is_in_flight_or_when_asked() -> None:
    part, clock = partition(ordered=True)
    channel = part.channel("ord2")
    stored = [part.append(b"m%d" % i) for i in range(3)]
    held = channel.take("x", 60, clock.now)
    assert held is not None
    assert channel.read_ts == stored[0].timestamp
    assert channel.seek(offset=stored[2].offset) == [held]
    assert channel.ahead is None
    plain = part.channel("plain2")
    part.append(b"m3")
    plain.seek(offset=stored[1].offset, read_ahead=False)
    assert plain.ahead is None


def test_depth_and_release_of_a_departed_client() -> None:
    part, clock = partition()
    channel = part.channel("d")
    for _ in range(4):
        part.append(b"m")
    held = [channel.take("gone", 60, clock.now) for _ in range(2)]
    assert all(held)
    assert (channel.depth, len(channel.in_flight)) == (2, 2)
    channel.release("gone", clock.now)
    assert (channel.depth, len(channel.in_flight)) == (4, 0)
    assert channel.has_ready(clock.now)


def test_a_req_over_the_threshold_goes_to_the_delayed_queue_and_comes_back() -> None:
    part, clock = partition()
    channel = part.channel("late")
    part.append(b"m")
    flight = channel.take("x", 60, clock.now)
    assert flight is not None
    delay = REQ_TO_END_THRESHOLD + 1
    assert channel.requeue(flight.message.internal_id, "x", delay, clock.now)
    assert (channel.delayed_queue_count, channel.delayed_count, channel.depth) == (1, 0, 0)
    assert (channel.finished, channel.in_flight) == (1, {})
    assert channel.take("x", 60, clock.now) is None
    clock.now += delay
    again = channel.take("x", 60, clock.now)
    assert again is not None
    assert (again.message, again.attempts, channel.delayed_queue_count) == (flight.message, 2, 0)
    assert channel.requeue_count == 0  # nsqd's requeue count does not see the delayed queue


@pytest.mark.parametrize(("age", "copies"), [(0.0, 1), (0.2, 2)])
def test_the_first_sub_ordered_sends_a_held_head_twice(age: float, copies: int) -> None:
    """nsqd's SetOrdered resets the reader: a head message the pump held (published 0.1 s
    ago or more) goes out, is forgotten and goes out again; a fresh one once."""
    part, clock = partition()
    channel = part.channel("first")
    head, _ = part.append(b"m0"), part.append(b"m1")
    clock.wall += int(age * 1e9)
    channel.require_order()
    sent = [channel.take("x", 60, clock.now)]
    if channel.replay() is not None:
        sent.append(channel.take("x", 60, clock.now))
    assert [(f.message, f.attempts) for f in sent if f is not None] == [(head, 1)] * copies
    channel.require_order()  # only the first time
    assert channel.replay() is None
