"""The sans-IO client session (nsq_ha.protocol.session): bytes in, events out, no I/O.

The golden recordings (real fork and vanilla nsqd) are replayed through a session driven by
the recorded commands; the rest are table tests of the decisions the session owns: answers in
order, heartbeats, error frames (fatal or not, after which command, on which server), message
formats, in-flight ids, CLOSE_WAIT and sync.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

import pytest
from golden_data import FLOW_FILES, Exchange, exchange_id, exchanges
from hypothesis import given
from hypothesis import strategies as st

from nsq_ha import errors
from nsq_ha.errors import (
    ExtNotSupportedError,
    FinFailedError,
    LocalProtocolError,
    NotLeaderError,
    PubFailedError,
    RemoteProtocolError,
    TouchFailedError,
)
from nsq_ha.protocol.broker import encode_message, join_fork_id
from nsq_ha.protocol.command_decoder import ClientCommand, CommandDecoder
from nsq_ha.protocol.commands import (
    MAGIC_V2,
    Cls,
    Command,
    Fin,
    Nop,
    Rdy,
    Req,
    Sub,
    SubOrdered,
    Touch,
)
from nsq_ha.protocol.error_frames import closes_connection, must_drop, parse_error_frame
from nsq_ha.protocol.events import (
    CLOSE_WAIT,
    HEARTBEAT,
    NEED_DATA,
    SYNCED,
    Answer,
    Delivered,
    Event,
    Failed,
)
from nsq_ha.protocol.frames import FrameType, encode_frame
from nsq_ha.protocol.identify import parse_identify_response
from nsq_ha.protocol.message import DecodedMessage, MessageFormat
from nsq_ha.protocol.publish import Publish, PublishMessage
from nsq_ha.protocol.session import SYNC_ID_FORK, SYNC_ID_VANILLA, ClientSession, ConnState

FORK_ANSWER = {"version": "0.3.7-HA.1.12.3", "max_rdy_count": 2500, "msg_timeout": 60000}
VANILLA_ANSWER = {"version": "1.3.0", "max_rdy_count": 2500, "msg_timeout": 60000}


def pub(topic: str, body: bytes, partition: int | None = None) -> Publish:
    return Publish(b"PUB", topic, partition, [PublishMessage(body)])


def ext(name: bytes, header: bytes | None, partition: int | None = None) -> Publish:
    return Publish(name, "t", partition, [PublishMessage(b"x", None, header)])


def response(data: bytes) -> bytes:
    return encode_frame(FrameType.RESPONSE, data)


def error_frame(data: bytes) -> bytes:
    return encode_frame(FrameType.ERROR, data)


def events(session: ClientSession, data: bytes = b"") -> list[Event]:
    """Feed ``data`` and return every event it completes."""
    session.receive_data(data)
    got: list[Event] = []
    while (event := session.next_event()) is not NEED_DATA:
        got.append(event)
    return got


def ready(*, fork: bool = True, extend_support: bool = False) -> ClientSession:
    """A session through the handshake with a fork or vanilla nsqd."""
    session = ClientSession()
    assert session.start() == MAGIC_V2
    body: dict[str, object] = {"extend_support": extend_support} if extend_support else {}
    session.identify(body)
    answer = json.dumps(FORK_ANSWER if fork else VANILLA_ANSWER).encode()
    (event,) = events(session, response(answer))
    assert event == Answer(answer, b"IDENTIFY")
    session.identified(parse_identify_response(answer, body))
    session.ready()
    assert session.state is ConnState.READY
    return session


def subscribed(command: Command, **kwargs: Any) -> ClientSession:
    """A ready session subscribed with ``command`` and RDY 100."""
    session = ready(**kwargs)
    session.send(command)
    assert session.state is ConnState.SUBSCRIBING
    assert events(session, response(b"OK")) == [Answer(b"OK", command.name)]
    assert session.state is ConnState.SUBSCRIBED
    session.send_nowait(Rdy(100))
    return session


def message(internal_id: int, **fields: Any) -> DecodedMessage:
    return DecodedMessage(
        timestamp=1_700_000_000_000_000_000,
        attempts=1,
        id=join_fork_id(internal_id, 7),
        body=b"body-%d" % internal_id,
        **fields,
    )


# --- the handshake and answers ---------------------------------------------------------------


def test_handshake_moves_through_the_states() -> None:
    session = ClientSession()
    assert session.state is ConnState.INIT
    session.start()
    assert session.state is ConnState.CONNECTED
    session.identify({})
    assert session.state is ConnState.IDENTIFYING
    session = ready()
    assert session.state is ConnState.READY
    assert session.is_fork
    assert session.pending == 0


def test_tls_compression_and_auth_answers_are_awaited_in_order() -> None:
    session = ClientSession()
    session.start()
    session.identify({"tls_v1": True, "snappy": True})
    answer = b'{"version":"1.3.0","tls_v1":true,"snappy":true,"auth_required":true}'
    assert events(session, response(answer)) == [Answer(answer, b"IDENTIFY")]
    session.start_tls()
    assert session.state is ConnState.TLS_UPGRADE
    assert events(session, response(b"OK")) == [Answer(b"OK", b"IDENTIFY")]
    session.start_compression()
    assert session.state is ConnState.COMPRESSION_UPGRADE
    assert events(session, response(b"OK")) == [Answer(b"OK", b"IDENTIFY")]
    assert session.authenticate("secret").startswith(b"AUTH\n")
    assert session.state is ConnState.AUTHENTICATING
    auth = b'{"identity":"me","identity_url":"","permission_count":1}'
    assert events(session, response(auth)) == [Answer(auth, b"AUTH")]
    session.ready()
    assert session.state is ConnState.READY


def test_bytes_before_the_tls_handshake_are_refused() -> None:
    """Bytes from outside TLS must not pass for bytes from inside it."""
    session = ClientSession()
    session.start()
    session.identify({"tls_v1": True})
    answer = b'{"version":"1.3.0","tls_v1":true}'
    session.receive_data(response(answer) + response(b"OK"))
    assert session.next_event() == Answer(answer, b"IDENTIFY")
    with pytest.raises(RemoteProtocolError, match="before the TLS handshake"):
        session.start_tls()


def test_bytes_after_the_identify_answer_are_handed_back_when_compression_starts() -> None:
    """What came after the answer in the same read was compressed already."""
    session = ClientSession()
    session.start()
    session.identify({"snappy": True})
    answer = b'{"version":"1.3.0","snappy":true}'
    session.receive_data(response(answer) + b"\xff\x06\x00\x00sNaPpY")
    assert session.next_event() == Answer(answer, b"IDENTIFY")
    assert session.start_compression() == b"\xff\x06\x00\x00sNaPpY"
    assert session.next_event() is NEED_DATA


def test_an_auth_failure_is_a_fatal_failed_event() -> None:
    session = ClientSession()
    session.start()
    session.identify({})
    events(session, response(b'{"version":"1.3.0","auth_required":true}'))
    session.identified(parse_identify_response(b'{"version":"1.3.0","auth_required":true}'))
    session.authenticate("wrong")
    (event,) = events(session, error_frame(b"E_AUTH_FAILED AUTH failed"))
    assert isinstance(event, Failed)
    assert isinstance(event.error, errors.AuthFailedError)
    assert (event.fatal, event.command) == (True, b"AUTH")
    assert session.fatal_error is event.error


def test_answers_complete_commands_in_order_and_heartbeats_complete_none() -> None:
    session = ready()
    session.send(pub("t", b"a", 0))
    session.send(pub("t", b"b", 0))
    assert session.pending == 2
    stream = response(b"OK") + response(b"_heartbeat_") + response(b"OK")
    assert events(session, stream) == [Answer(b"OK", b"PUB"), HEARTBEAT, Answer(b"OK", b"PUB")]
    assert session.pending == 0


def test_an_answer_without_a_command_is_a_protocol_violation() -> None:
    session = ready()
    with pytest.raises(RemoteProtocolError, match="answers no pending command"):
        events(session, response(b"OK"))


def _heartbeats_at(session: ClientSession, times: list[float]) -> list[Event]:
    """Feed one heartbeat at each time (seconds) and return the events."""
    got: list[Event] = []
    for now in times:
        session.receive_data(response(b"_heartbeat_"), now)
        while (event := session.next_event()) is not NEED_DATA:
            got.append(event)
    return got


def test_heartbeats_at_the_interval_or_bunched_by_a_stall_are_events() -> None:
    """nsqd sends one heartbeat per interval (1 s at the least); a stall may deliver a few
    together. Ten within one second and one a second for a minute are all heartbeats."""
    session = ready()
    assert _heartbeats_at(session, [5.0] * 10) == [HEARTBEAT] * 10
    assert _heartbeats_at(session, [6.0 + i for i in range(60)]) == [HEARTBEAT] * 60
    assert _heartbeats_at(session, [65.5] * 9) == [HEARTBEAT] * 9  # 10 within 65.0..65.5


@pytest.mark.parametrize("spread", [0.0, 0.9])
def test_a_flood_of_heartbeats_is_a_protocol_violation(spread: float) -> None:
    """More than ten heartbeats within one second is no nsqd: RemoteProtocolError, at once (a
    compressed stream of heartbeats would otherwise keep the client busy for minutes)."""
    session = ready()
    times = [1.0 + spread * i / 10 for i in range(10)]
    assert _heartbeats_at(session, times) == [HEARTBEAT] * 10
    with pytest.raises(RemoteProtocolError, match=r"more than 10 heartbeats within 1 s"):
        _heartbeats_at(session, [1.0 + spread])


@given(st.lists(st.integers(min_value=1, max_value=30), max_size=20))
def test_any_split_of_the_stream_gives_the_same_events(cuts: list[int]) -> None:
    """h11's habit: byte-at-a-time or arbitrary chunks give identical events."""
    stream = (
        response(b"OK")
        + response(b"_heartbeat_")
        + error_frame(b"E_PUB_FAILED x")
        + encode_frame(FrameType.MESSAGE, encode_message(message(5), MessageFormat()))
    )
    whole = subscribed(Sub("t", "c", 0))
    whole.send(pub("t", b"a", 0))
    whole.send(pub("t", b"b", 0))
    expected = events(whole, stream)
    split = subscribed(Sub("t", "c", 0))
    split.send(pub("t", b"a", 0))
    split.send(pub("t", b"b", 0))
    got: list[Event] = []
    position = 0
    for cut in itertools.chain(cuts, [len(stream)]):
        got += events(split, stream[position : position + cut])
        position += cut
    assert [type(e) for e in got] == [type(e) for e in expected]
    assert got[:2] == expected[:2]
    assert got[3] == expected[3]
    failed, expected_failed = got[2], expected[2]
    assert isinstance(failed, Failed)
    assert isinstance(expected_failed, Failed)
    assert (str(failed.error), failed.fatal, failed.command) == (
        str(expected_failed.error),
        expected_failed.fatal,
        expected_failed.command,
    )


# --- error frames: which command, fatal or not -----------------------------------------------

FATALITY = [
    # (error frame, command it answers, fork?, must drop the connection?)
    (b"E_FAILED_ON_NOT_LEADER x", pub("t", b"x", 0), True, False),
    (b"E_FAILED_ON_NOT_LEADER x", pub("t", b"x"), False, True),
    (b"E_FAILED_ON_NOT_WRITABLE x", pub("t", b"x", 0), True, False),
    (b"E_PUB_FAILED x", pub("t", b"x", 0), True, False),
    (b"E_PUB_FAILED x", pub("t", b"x"), False, True),
    (b"E_TOPIC_NOT_EXIST ", pub("t", b"x", 0), True, True),
    (b"E_BAD_TOPIC x", pub("t", b"x"), False, True),
    (b"E_EXT_NOT_SUPPORT x", ext(b"PUB_EXT", b'{"k":"v"}', 0), True, False),
    (b"E_INVALID_JSON_HEADER x", ext(b"PUB_EXT", b'{"k":"v"}', 0), True, False),
    # §2.15: after MPUB_EXT nsqd parses the unread body as commands: always out of step
    (b"E_EXT_NOT_SUPPORT x", ext(b"MPUB_EXT", b'{"k":"v"}', 0), True, True),
    (b"E_INVALID_JSON_HEADER x", ext(b"MPUB_EXT", b'{"k":"v"}', 0), True, True),
    (b"too much client connections", pub("t", b"x", 0), True, True),
]


@pytest.mark.parametrize(("frame", "command", "fork", "fatal"), FATALITY)
def test_error_frames_are_fatal_after_some_commands_only(
    frame: bytes, command: Command, fork: bool, fatal: bool
) -> None:
    session = ready(fork=fork)
    session.send(command)
    (event,) = events(session, error_frame(frame))
    assert isinstance(event, Failed)
    assert (event.fatal, event.error.fatal) == (fatal, fatal)
    assert event.command == command.name
    assert session.pending == 0
    assert (session.fatal_error is event.error) is fatal
    if fatal:
        with pytest.raises(LocalProtocolError, match="fatal"):
            session.send(pub("t", b"again", 0 if fork else None))
    else:
        session.send(pub("t", b"again", 0 if fork else None))


def test_leadership_errors_are_fatal_after_sub_and_fin() -> None:
    session = ready()
    session.send(Sub("t", "c", 0))
    (event,) = events(session, error_frame(b"E_FAILED_ON_NOT_LEADER x"))
    assert isinstance(event, Failed)
    assert isinstance(event.error, NotLeaderError)
    assert (event.fatal, event.command) == (True, b"SUB")
    assert session.state is ConnState.READY  # the subscribe failed


@pytest.mark.parametrize("fork", [True, False])
def test_fin_failures_answer_no_command_and_keep_the_connection(fork: bool) -> None:
    session = subscribed(Sub("t", "c", 0 if fork else None), fork=fork)
    session.send(pub("t", b"x", 0 if fork else None))
    text = (
        b"E_FIN_FAILED FIN [0 0 0 0 0 0 3 231 0 0 0 0 0 0 0 0] failed"
        if fork
        else b"E_FIN_FAILED FIN 0123456789abcdef failed"
    )
    (event,) = events(session, error_frame(text))
    assert isinstance(event, Failed)
    assert isinstance(event.error, FinFailedError)
    assert (event.fatal, event.command) == (False, None)
    assert event.error.message_id == (
        bytes([0, 0, 0, 0, 0, 0, 3, 231]) + bytes(8) if fork else b"0123456789abcdef"
    )
    assert session.pending == 1  # the PUB still waits for its answer
    assert events(session, response(b"OK")) == [Answer(b"OK", b"PUB")]


def test_an_error_nothing_waits_for_answers_no_command() -> None:
    session = ready()
    (event,) = events(session, error_frame(b"E_INVALID cannot RDY in state 2"))
    assert isinstance(event, Failed)
    assert (event.command, event.fatal) == (None, True)


# --- messages --------------------------------------------------------------------------------

FORMATS = [
    # (subscribe command, fork?, extend_support?, expected format)
    (Sub("t", "c", 0), True, False, MessageFormat()),
    (SubOrdered("t", "c", 0), True, False, MessageFormat(detail=True)),
    (Sub("t", "c", 0), True, True, MessageFormat(ext=True)),
    (SubOrdered("t", "c", 0), True, True, MessageFormat(ext=True, detail=True)),
    (Sub("t", "c"), False, False, MessageFormat.vanilla()),
]


@pytest.mark.parametrize(("command", "fork", "extend", "fmt"), FORMATS)
def test_messages_decode_in_the_format_the_subscribe_chose(
    command: Command, fork: bool, extend: bool, fmt: MessageFormat
) -> None:
    session = subscribed(command, fork=fork, extend_support=extend)
    assert session.message_format == fmt
    fields: dict[str, Any] = {}
    if fmt.ext:
        fields.update(ext_version=4, ext_data=b'{"k":"v"}')
    if fmt.detail:
        fields.update(offset=42, raw_size=9)
    sent = message(9, **fields)
    if not fmt.fork_ids:
        sent = DecodedMessage(
            timestamp=sent.timestamp, attempts=1, id=b"0123456789abcdef", body=b"v"
        )
    (event,) = events(session, encode_frame(FrameType.MESSAGE, encode_message(sent, fmt)))
    assert isinstance(event, Delivered)
    got = event.message
    assert (got.id, got.body, got.attempts) == (sent.id, sent.body, 1)
    assert (got.offset, got.raw_size) == (sent.offset, sent.raw_size)
    assert (got.ext_version, got.ext_data) == (sent.ext_version, sent.ext_data)
    assert session.in_flight == 1


def test_fin_and_req_settle_in_flight_messages() -> None:
    session = subscribed(Sub("t", "c", 0))
    fmt = MessageFormat()
    stream = b"".join(
        encode_frame(FrameType.MESSAGE, encode_message(message(n), fmt)) for n in (1, 2, 3)
    )
    assert len(events(session, stream)) == 3
    assert session.in_flight == 3
    assert session.fin(join_fork_id(1, 7)) == Fin(join_fork_id(1, 7)).encode()
    assert (
        session.send_nowait(Req(join_fork_id(2, 7), 1.5)) == Req(join_fork_id(2, 7), 1.5).encode()
    )
    session.send_nowait(Touch(join_fork_id(3, 7)), now=5.0)
    assert session.in_flight == 1
    # an id never delivered is still encoded (nsqd answers E_FIN_FAILED)
    assert session.fin(join_fork_id(99, 7)) == Fin(join_fork_id(99, 7)).encode()


def test_messages_need_a_subscription_and_the_rdy_given() -> None:
    frame = encode_frame(FrameType.MESSAGE, encode_message(message(1), MessageFormat()))
    with pytest.raises(RemoteProtocolError, match="did not subscribe"):
        events(ready(), frame)
    session = ready()
    session.send(Sub("t", "c", 0))
    events(session, response(b"OK"))
    with pytest.raises(RemoteProtocolError, match="beyond the RDY"):
        events(session, frame)  # no RDY sent yet


# --- CLS, sync, refusals ---------------------------------------------------------------------


def test_cls_is_answered_by_close_wait() -> None:
    session = subscribed(Sub("t", "c", 0))
    session.send(Cls())
    assert session.state is ConnState.CLOSING
    assert events(session, response(b"CLOSE_WAIT")) == [CLOSE_WAIT]
    assert session.state is ConnState.CLOSE_WAIT
    session.fin(join_fork_id(1, 7))  # FIN still allowed after CLOSE_WAIT


def test_cls_answered_with_anything_else_is_a_protocol_violation() -> None:
    session = subscribed(Sub("t", "c", 0))
    session.send(Cls())
    with pytest.raises(RemoteProtocolError, match="CLOSE_WAIT"):
        events(session, response(b"OK"))


@pytest.mark.parametrize(("fork", "sentinel"), [(True, SYNC_ID_FORK), (False, SYNC_ID_VANILLA)])
def test_sync_is_answered_by_its_touch_failure(fork: bool, sentinel: bytes) -> None:
    session = subscribed(Sub("t", "c", 0 if fork else None), fork=fork)
    assert session.sync() == Touch(sentinel).encode()
    failure = b"E_TOUCH_FAILED TOUCH %s failed" % (
        b"[127 255 255 255 255 255 255 255 0 0 0 0 0 0 0 0]" if fork else sentinel
    )
    assert events(session, error_frame(failure)) == [SYNCED]
    (event,) = events(session, error_frame(failure))  # no sync waits for a second one
    assert isinstance(event, Failed)
    assert isinstance(event.error, TouchFailedError)


def test_commands_are_refused_in_the_wrong_state_or_kind() -> None:
    session = ready(fork=False)
    for fork_only in (SubOrdered("t", "c", 0), ext(b"MPUB_EXT", None)):
        with pytest.raises(LocalProtocolError, match="only on the fork"):
            session.send(fork_only)
    with pytest.raises(LocalProtocolError, match="no response"):
        session.send(Nop())
    with pytest.raises(LocalProtocolError, match="has a response"):
        session.send_nowait(pub("t", b"x"))
    with pytest.raises(LocalProtocolError, match="cannot send FIN in state READY"):
        session.fin(join_fork_id(1, 7))
    session.close()
    assert session.closed
    with pytest.raises(LocalProtocolError):
        session.send(pub("t", b"x"))


# --- the golden recordings -------------------------------------------------------------------

GOLDEN = list(exchanges())
#: whole connections of a well-behaved client (the error cases send what the session refuses)
FLOWS = [e for e in GOLDEN if e.source in FLOW_FILES or e.conn.startswith("heartbeat-")]


@dataclass(frozen=True)
class Recorded:
    """A recorded command the session needs only the name of (it returns the bytes)."""

    name: bytes
    data: bytes

    def encode(self) -> bytes:
        return self.data


def typed(command: ClientCommand, raw: bytes) -> Command:
    """The typed command a recorded one is."""
    params = command.params
    if command.name == b"FIN":
        return Fin(params[0])
    if command.name == b"REQ":
        return Req(params[0], int(params[1]) / 1000)
    if command.name == b"TOUCH":
        return Touch(params[0])
    if command.name == b"RDY":
        return Rdy(int(params[0]))
    return Recorded(command.name, raw)


def _replay(exchange: Exchange) -> list[Event]:
    """Drive a session with the recorded commands, feed it the recorded frames, return the
    events."""
    session = ClientSession()
    body: dict[str, Any] = {}
    got: list[Event] = []
    for step in exchange.steps:
        raw = bytes.fromhex(step.get("hex", ""))
        if step["dir"] == "s2c":
            for event in events(session, raw):
                got.append(event)
                if isinstance(event, Answer) and event.command == b"IDENTIFY":
                    answer = event.data
                    if answer == b"OK":  # no feature negotiation: the recording says which
                        answer = json.dumps(
                            FORK_ANSWER if exchange.fork else VANILLA_ANSWER
                        ).encode()
                    session.identified(parse_identify_response(answer, body))
                    session.ready()
        elif step["dir"] == "c2s" and raw == MAGIC_V2:
            session.start()
        elif step["dir"] == "c2s":
            if session.state is ConnState.CONNECTED and not raw.startswith(b"IDENTIFY"):
                # a connection that never identified: the recording says which server it is
                version = FORK_ANSWER if exchange.fork else VANILLA_ANSWER
                session.identified(parse_identify_response(json.dumps(version).encode()))
                session.ready()
            (command,) = CommandDecoder(expect_magic=False).feed(raw)
            assert isinstance(command, ClientCommand)
            if command.name == b"IDENTIFY":
                assert command.body is not None
                body = json.loads(command.body)
                session.identify(body)
            elif command.name in (b"FIN", b"REQ", b"TOUCH", b"RDY", b"NOP"):
                session.send_nowait(typed(command, raw))
            else:
                session.send(typed(command, raw))
    return got


@pytest.mark.parametrize("exchange", FLOWS, ids=exchange_id)
def test_golden_connections_replay_through_the_session(exchange: Exchange) -> None:
    """Real servers' bytes: every frame becomes an event, answers meet their commands."""
    got = _replay(exchange)
    kinds = {FrameType.RESPONSE: 0, FrameType.MESSAGE: 0, FrameType.ERROR: 0}
    for step in exchange.steps:
        if step["dir"] == "s2c":
            kinds[FrameType(int.from_bytes(bytes.fromhex(step["hex"])[4:8], "big"))] += 1
    assert sum(isinstance(e, Delivered) for e in got) == kinds[FrameType.MESSAGE]
    assert sum(isinstance(e, Failed) for e in got) == kinds[FrameType.ERROR]
    assert len(got) == sum(kinds.values())


def _recorded_errors() -> list[tuple[str, bytes, bytes, bool, str]]:
    """(id, error frame data, command it answered, fork, what the server did next)."""
    cases = []
    for exchange in GOLDEN:
        last = b""
        for index, step in enumerate(exchange.steps):
            raw = bytes.fromhex(step.get("hex", ""))
            if step["dir"] == "c2s":
                last = raw.split(b"\n", 1)[0].split(b" ", 1)[0]  # the command's name
            elif step["dir"] == "s2c" and raw[4:8] == b"\x00\x00\x00\x01":
                after = [s.get("event") for s in exchange.steps[index + 1 :] if s["dir"] == "event"]
                if after and after[0] in ("server_closed", "still_open"):
                    cases.append((exchange_id(exchange), raw[8:], last, exchange.fork, after[0]))
    return cases


@pytest.mark.parametrize(
    ("data", "command", "fork", "outcome"),
    [case[1:] for case in _recorded_errors()],
    ids=[case[0] for case in _recorded_errors()],
)
def test_recorded_error_frames_are_fatal_when_the_server_closed(
    data: bytes, command: bytes, fork: bool, outcome: str
) -> None:
    """Every error the servers sent: the session drops the connection when nsqd closed it,
    and keeps it otherwise, except after MPUB_EXT (out of step although nsqd keeps it)."""
    error = parse_error_frame(data)
    assert closes_connection(type(error), command, fork=fork) is (outcome == "server_closed")
    out_of_step = command == b"MPUB_EXT"
    assert must_drop(type(error), command, fork=fork) is (outcome == "server_closed" or out_of_step)


# --- the kept classmethods give the protocol's answers ---------------------------------------


def test_pub_failures_differ_between_servers_only() -> None:
    assert not closes_connection(PubFailedError, b"PUB", fork=True)
    assert closes_connection(PubFailedError, b"PUB", fork=False)
    assert not closes_connection(ExtNotSupportedError, b"PUB_EXT", fork=True)


def test_end_of_stream_inside_a_frame_is_a_protocol_violation() -> None:
    session = ready()
    session.send(pub("t", b"x", 0))
    events(session, response(b"OK")[:5])
    assert "pending=1" in repr(session)
    with pytest.raises(RemoteProtocolError, match="inside a frame"):
        session.receive_eof()
    ready().receive_eof()  # between frames: a clean end
