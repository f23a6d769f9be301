"""Every duration option of the Consumer refuses NaN, infinities and negatives (ConfigError),
before anything is sent; the ordered-partition gate hands one message per partition out."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

import pytest

from nsq_ha.consumer import Consumer, Message, Outcome
from nsq_ha.consumer.checks import MAX_REQUEUE_DELAY, check_requeue_delay
from nsq_ha.consumer.handout import PartitionGate
from nsq_ha.errors import ConfigError
from nsq_ha.protocol.message import DecodedMessage

#: nowhere: these consumers are never started
NSQD = "127.0.0.1:1"

#: option -> does 0 make sense for it
DURATIONS = {
    "requeue_delay": True,
    "max_requeue_delay": True,
    "lookup_interval": False,
    "drain_timeout": False,
    "rdy_redistribute_interval": False,
    "low_rdy_idle_timeout": False,
    "low_rdy_timeout": False,
    "reconnect_interval": False,
    "max_reconnect_interval": False,
    "msg_timeout": False,
}
BAD = [math.nan, math.inf, -math.inf, -1, -0.001, "1", True, None]


@pytest.mark.parametrize("name", sorted(DURATIONS))
@pytest.mark.parametrize("value", BAD, ids=repr)
def test_every_consumer_duration_refuses_nan_infinity_and_negatives(name: str, value: Any) -> None:
    if value is None and name == "msg_timeout":
        return  # msg_timeout=None means "nsqd's default"
    with pytest.raises(ConfigError, match=name):
        Consumer("t", "c", nsqd=NSQD, **{name: value})


@pytest.mark.parametrize("name", sorted(DURATIONS))
def test_zero_is_refused_where_it_means_nothing(name: str) -> None:
    if DURATIONS[name]:
        Consumer("t", "c", nsqd=NSQD, **{name: 0})
    else:
        with pytest.raises(ConfigError, match=name):
            Consumer("t", "c", nsqd=NSQD, **{name: 0})


def test_requeue_delays_nsqd_cannot_represent_are_refused() -> None:
    assert check_requeue_delay(MAX_REQUEUE_DELAY) == MAX_REQUEUE_DELAY
    for name in ("requeue_delay", "max_requeue_delay"):
        with pytest.raises(ConfigError, match=name):
            Consumer("t", "c", nsqd=NSQD, **{name: MAX_REQUEUE_DELAY * 2})


@pytest.mark.parametrize("value", [math.nan, math.inf, -1, "5"], ids=repr)
async def test_call_time_durations_are_checked_before_anything_happens(value: Any) -> None:
    consumer = Consumer("t", "c", nsqd=NSQD)
    async with asyncio.timeout(5):  # before the fix, get(timeout=nan) waited for ever
        with pytest.raises(ConfigError, match="timeout"):
            await consumer.get(timeout=value)
        with pytest.raises(ConfigError, match="max_wait"):
            await consumer.run_batches(lambda batch: None, max_wait=value)
        with pytest.raises(ConfigError, match="timestamp"):
            await consumer.seek(0, timestamp=value)
        with pytest.raises(ConfigError, match="drain_timeout"):
            await consumer.close(drain_timeout=value)
        assert " new " in repr(consumer)  # nothing was started by any of them
        await consumer.close()


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.run(print, concurrency=0),
        lambda c: c.run(print, concurrency=1.5),
        lambda c: c.run_batches(print, max_size=0),
        lambda c: c.run_batches(print, concurrency=True),
        lambda c: c.seek(-1, offset=0),
        lambda c: c.seek(0, offset=-5),
        lambda c: c.seek(0, count=0),
    ],
)
async def test_bad_counts_are_refused(call: Any) -> None:
    consumer = Consumer("t", "c", nsqd=NSQD)
    try:
        async with asyncio.timeout(5):  # before the fix, concurrency=True ran for ever
            with pytest.raises(ConfigError):
                await call(consumer)
    finally:
        await consumer.close(drain_timeout=1)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_a_bad_max_in_flight_is_refused_and_the_budget_kept(bad: Any) -> None:
    consumer = Consumer("t", "c", nsqd=NSQD, max_in_flight=7)
    with pytest.raises(ConfigError, match="max_in_flight"):
        consumer.set_max_in_flight(bad)
    assert consumer.max_in_flight == 7


# -- the gate ---------------------------------------------------------------------------------


@dataclass
class Owner:
    partition: int | None
    topic: str = "t"
    channel: str = "c"
    address: str = "127.0.0.1:4150"
    ordered: bool = True

    def finish(self, message: Message) -> None:
        message.outcome = Outcome.FINISHED

    def requeue(self, message: Message, delay: float | None, backoff: bool) -> None:
        message.outcome = Outcome.REQUEUED

    def touch(self, message: Message) -> None:
        return None


def message(partition: int | None, number: int) -> Message:
    decoded = DecodedMessage(
        timestamp=1, attempts=1, id=number.to_bytes(16, "big"), body=b"%d" % number
    )
    return Message(decoded, Owner(partition))


def test_gate_hands_out_one_message_per_partition_in_arrival_order() -> None:
    gate = PartitionGate()
    a0, a1, a2, b0 = message(0, 1), message(0, 2), message(0, 3), message(1, 4)
    assert gate.admit(a0)
    assert not gate.admit(a1)
    assert not gate.admit(a2)
    assert gate.admit(b0)  # another partition: not held back
    assert gate.waiting == 2
    assert gate.release(a1) is None  # not the current one: nothing happens
    assert gate.release(a0) is a1
    assert gate.release(a0) is None  # twice is harmless
    a2.outcome = Outcome.ABANDONED  # its connection went away while it waited
    assert gate.release(a1) is None
    assert gate.admit(message(0, 5))  # the partition is free again
    assert gate.release(b0) is None


def test_gate_clear_returns_what_still_waits() -> None:
    gate = PartitionGate()
    first, copy, gone = message(None, 1), message(None, 2), message(None, 3)
    assert gate.admit(first)
    assert not gate.admit(gone)
    gone.outcome = Outcome.TIMED_OUT
    assert not gate.admit(copy)  # admitting prunes what was answered meanwhile
    assert gate.waiting == 1
    assert gate.clear() == [copy]
    assert gate.waiting == 0
    assert gate.release(first) is None
