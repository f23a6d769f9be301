"""A consumer slot's answer path, against a recording connection: Message -> slot -> connection,
with the slot's held messages as the one in-flight count that the RDY flow follows."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from nsq_ha.connection import NsqdConnection
from nsq_ha.consumer import Consumer, ConsumerConfig, Fixed, Message, Outcome
from nsq_ha.consumer.slots import COUNTERS, Flow, Slot, SlotContext, Tally
from nsq_ha.errors import MessageAlreadyRespondedError, MessageConnectionGoneError, NsqError
from nsq_ha.protocol.frames import FrameType, encode_frame
from nsq_ha.protocol.message import DecodedMessage
from nsq_ha.transport import StreamTransport, Wakeup, _Pipe
from tests.unit.connection.wire import Wire, subscribed_session


class Recorder:
    """A real NsqdConnection, subscribed to vanilla nsqd (its session driven through IDENTIFY
    and SUB by hand) over a :class:`Wire`: :attr:`sent` reads back the commands the slot sent.
    A real one, as a compiled Slot and Flow refuse a stand-in."""

    def __init__(self) -> None:
        self.conn = NsqdConnection("127.0.0.1:4150")
        self.wire = Wire()
        session = subscribed_session()
        self.conn._session = session
        loop = asyncio.get_running_loop()
        self.conn._transport = StreamTransport(
            self.wire,  # type: ignore[arg-type]
            _Pipe(loop),
            "127.0.0.1:4150",
            65536,
        )

    @property
    def sent(self) -> list[str]:
        """The commands written so far, short: ``FIN 01`` (the id's last two digits), ``REQ 01 4``
        (the delay in seconds)."""
        assert self.conn._transport is not None
        self.conn._transport.flush()
        lines = []
        for line in bytes(self.wire.data).split(b"\n")[:-1]:
            name, _, rest = line.partition(b" ")
            if name == b"RDY":
                lines.append(f"RDY {int(rest)}")
            elif name == b"REQ":
                message_id, _, delay = rest.rpartition(b" ")
                lines.append(f"REQ {message_id[-2:].decode()} {int(delay) / 1000:g}")
            elif name in (b"FIN", b"TOUCH"):
                lines.append(f"{name.decode()} {rest[-2:].decode()}")
        return lines

    def break_down(self) -> None:
        """nsqd sent a fatal error: every send now raises ConnectionClosedError (an NsqError)
        while the connection has not closed yet."""
        session = self.conn._session
        session.receive_data(encode_frame(FrameType.ERROR, b"E_INVALID cannot do that"))
        with contextlib.suppress(NsqError):
            session.next_event()
        assert session.fatal_error is not None
        assert not self.conn.closed

    def close(self) -> None:
        """The connection closed."""
        self.conn._session.close()
        assert self.conn.closed


def decoded(number: int, attempts: int = 1) -> DecodedMessage:
    return DecodedMessage(timestamp=1, attempts=attempts, id=b"%016x" % number, body=b"%d" % number)


def make_slot(
    *, ordered: bool = False, backoff: bool = True
) -> tuple[Slot, Recorder, list[Message], list[Message], Tally]:
    config = ConsumerConfig(
        topic="t",
        channel="c",
        nsqd="127.0.0.1:4150",
        max_in_flight=10,
        requeue_delay=2.0,
        max_requeue_delay=5.0,
        backoff=Fixed(60.0) if backoff else None,
    )
    flow = Flow(config)
    delivered: list[Message] = []
    settled: list[Message] = []
    tally = Tally()
    context = SlotContext(
        config=config,
        flow=flow,
        planner=flow.planner,
        tally=tally,
        held_changed=Wakeup(),
        deliver=lambda slot, message: delivered.append(message),
        settled=settled.append,
    )
    slot = Slot(context, ("127.0.0.1:4150", 0), ordered)
    conn = Recorder()
    slot.conn = conn.conn
    flow.add(slot.key, conn.conn, max_rdy=2500, ordered=ordered)
    return slot, conn, delivered, settled, tally


async def test_finish_goes_through_the_slot_to_its_connection() -> None:
    slot, conn, delivered, _, tally = make_slot()
    slot.on_message(decoded(1))
    (message,) = delivered
    assert message.partition == 0
    assert len(slot.held) == 1
    await message.finish()
    assert conn.sent[-1] == "FIN 01"
    assert message.outcome is Outcome.FINISHED
    assert not slot.held
    assert (tally.total("received"), tally.total("finished")) == (1, 1)
    assert tally.of(0)["finished"] == 1
    with pytest.raises(MessageAlreadyRespondedError):
        await message.finish()


async def test_requeue_uses_the_policy_delay_and_touch_keeps_it_held() -> None:
    slot, conn, delivered, _, tally = make_slot(backoff=False)
    slot.on_message(decoded(1, attempts=2))
    slot.on_message(decoded(2, attempts=9))
    first, second = delivered
    await first.touch()
    assert conn.sent[-1] == "TOUCH 01"
    assert len(slot.held) == 2
    await first.requeue()
    await second.requeue()
    assert conn.sent[-2:] == ["REQ 01 4", "REQ 02 5"]  # attempts x 2 s, at most 5 s
    assert tally.total("requeued") == 2
    assert not slot.held


async def test_a_requeue_with_backoff_sends_rdy_0_before_the_req() -> None:
    slot, conn, delivered, _, _ = make_slot()
    slot.on_message(decoded(1))
    await delivered[0].requeue(0)
    assert conn.sent[-2:] == ["RDY 0", "REQ 01 0"]


async def test_ordered_answers_send_delay_0_and_tell_whoever_waits() -> None:
    slot, conn, delivered, settled, _ = make_slot(ordered=True)
    slot.on_message(decoded(1))
    await delivered[0].requeue(3.0, backoff=False)
    assert conn.sent[-1] == "REQ 01 0"
    assert settled == delivered


async def test_a_copy_delivered_again_replaces_the_held_one() -> None:
    slot, _, delivered, settled, tally = make_slot(ordered=True)
    slot.on_message(decoded(1))
    slot.on_message(decoded(1, attempts=2))
    first, copy = delivered
    assert first.outcome is Outcome.TIMED_OUT
    assert slot.held == {copy.id: copy}
    assert tally.total("timed_out") == 1
    assert settled == []  # a timed-out copy does not end the first handler's turn
    with pytest.raises(MessageAlreadyRespondedError):
        await first.finish()
    await copy.finish()
    assert not slot.held


async def test_an_ordered_copy_of_the_message_just_finished_is_finished_again_not_handed_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # right after a move the fork may deliver what its pump had read ahead, then the same
    # message again from the new position (same id), once the first copy's FIN is in
    slot, conn, delivered, settled, tally = make_slot(ordered=True)
    slot.on_message(decoded(1))
    await delivered[0].finish()
    with caplog.at_level(logging.INFO, logger="nsq_ha.consumer.slots"):
        slot.on_message(decoded(1))
    assert len(delivered) == 1
    assert conn.sent[-2:] == ["FIN 01", "FIN 01"]  # nsqd holds the copy in flight: answered
    assert not slot.held
    assert "again right after it was finished" in caplog.text
    assert settled == delivered  # the copy ends no handler's turn
    slot.on_message(decoded(2))
    assert [m.id for m in delivered] == [decoded(1).id, decoded(2).id]
    assert tally.total("received") == 2


async def test_an_ordered_copy_of_a_requeued_or_unordered_message_is_handed_out() -> None:
    slot, _, delivered, _, _ = make_slot(ordered=True)
    slot.on_message(decoded(1))
    await delivered[0].requeue(0, backoff=False)
    slot.on_message(decoded(1, attempts=2))
    assert len(delivered) == 2  # a requeued message comes again by design
    plain, _, plain_delivered, _, _ = make_slot()
    plain.on_message(decoded(1))
    await plain_delivered[0].finish()
    plain.on_message(decoded(1))
    assert len(plain_delivered) == 2  # nsqd's at-least-once, not a read-ahead copy


async def test_a_seek_lets_the_message_just_finished_come_again() -> None:
    slot, _, delivered, _, _ = make_slot(ordered=True)
    slot.on_message(decoded(1))
    await delivered[0].finish()
    slot.finished = b""  # what Consumer.seek does
    slot.on_message(decoded(1))
    assert len(delivered) == 2


async def test_an_answer_the_connection_refuses_abandons_the_message() -> None:
    slot, conn, delivered, _, tally = make_slot()
    slot.on_message(decoded(1))
    slot.on_message(decoded(2))
    conn.break_down()
    with pytest.raises(MessageConnectionGoneError):
        await delivered[0].finish()
    assert delivered[0].outcome is Outcome.ABANDONED
    assert list(slot.held) == [delivered[1].id]
    conn.close()
    with pytest.raises(MessageConnectionGoneError):
        await delivered[1].finish()
    slot.abandon_all()
    assert not slot.held
    assert tally.total("abandoned") == 2


async def test_a_message_abandoned_with_its_connection_says_so_when_answered() -> None:
    # the consumer noticed the close first (abandon_all) and the handler answers afterwards:
    # the answer fails because the connection is gone, not because someone answered already
    slot, conn, delivered, _, _ = make_slot()
    slot.on_message(decoded(1))
    conn.close()
    slot.abandon_all()
    message = delivered[0]
    assert message.outcome is Outcome.ABANDONED
    with pytest.raises(MessageConnectionGoneError, match=r"connection .* is gone"):
        await message.finish()
    with pytest.raises(MessageConnectionGoneError):
        await message.requeue()
    with pytest.raises(MessageConnectionGoneError):
        await message.touch()
    assert message.responded  # nothing more can be sent for it


def test_a_partitions_counters_start_at_0_and_stats_show_those_above() -> None:
    """Plain dicts (a Counter reads and writes items through Python-level slots): every name
    at 0 first, and Consumer.stats shows a partition's counters above 0 only, as before."""
    tally = Tally()
    counters = tally.of(3)
    assert counters == dict.fromkeys(COUNTERS, 0)
    assert tally.of(3) is counters
    counters["received"] += 2
    assert tally.total("received") == 2
    assert tally.total("leader_changes") == 0
    consumer = Consumer("t", "c", nsqd="127.0.0.1:4150")
    consumer._tally.of(0)["finished"] += 1
    consumer._tally.of(None)
    assert consumer.stats["partitions"] == {-1: {}, 0: {"finished": 1}}
    assert consumer.stats["finished"] == 1
