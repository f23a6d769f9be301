"""Typed commands in, bytes out: the session takes command objects (never bytes it parses again),
checks them against the state and returns their exact wire bytes; a warm publish and a warm
delivery with its FIN enter two protocol modules (the session and one codec)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType as PyFrame
from typing import Any

import pytest

import nsq_ha.protocol
from nsq_ha.errors import InvalidArgumentError, LocalProtocolError
from nsq_ha.protocol.broker import encode_message, join_fork_id
from nsq_ha.protocol.commands import (
    Auth,
    Cls,
    Fin,
    Identify,
    Nop,
    Rdy,
    Req,
    StartPosition,
    Sub,
    SubAdvanced,
    SubOrdered,
    Touch,
)
from nsq_ha.protocol.events import NEED_DATA, Answer, Delivered
from nsq_ha.protocol.frames import FrameType, encode_frame
from nsq_ha.protocol.identify import parse_identify_response
from nsq_ha.protocol.message import DecodedMessage, MessageFormat
from nsq_ha.protocol.publish import Dpub, Publish, PublishMessage
from nsq_ha.protocol.session import ClientSession, ConnState

PROTOCOL = Path(nsq_ha.protocol.__file__).resolve().parent
FORK = {"version": "0.3.7-HA.1.12.3", "max_rdy_count": 2500, "msg_timeout": 60000}
ID = join_fork_id(1, 7)


def ready() -> ClientSession:
    """A session past IDENTIFY with a fork nsqd."""
    session = ClientSession()
    session.start()
    session.identify({})
    answer = json.dumps(FORK).encode()
    session.receive_data(encode_frame(FrameType.RESPONSE, answer))
    assert isinstance(session.next_event(), Answer)
    session.identified(parse_identify_response(answer))
    session.ready()
    return session


def answer_ok(session: ClientSession) -> None:
    session.receive_data(encode_frame(FrameType.RESPONSE, b"OK"))
    assert isinstance(session.next_event(), Answer)


def subscribed(command: Sub | SubOrdered | SubAdvanced) -> ClientSession:
    session = ready()
    session.send(command)
    answer_ok(session)
    session.send_nowait(Rdy(10))
    return session


@pytest.mark.parametrize(
    ("command", "wire"),
    [
        (Sub("t", "c"), b"SUB t c\n"),
        (Sub("t", "c", 3), b"SUB t c 3\n"),
        (SubOrdered("t", "c", 0), b"SUB_ORDERED t c 0\n"),
        (SubAdvanced("t", "c", 2), b"SUB_ADVANCED t c 2\n"),
        (
            SubAdvanced("t", "c", None, StartPosition.at_count(5)),
            b"SUB_ADVANCED t c -1 msgcount:5\n",
        ),
    ],
)
def test_a_subscribe_command_gives_its_line_and_its_message_format(
    command: Sub | SubOrdered | SubAdvanced, wire: bytes
) -> None:
    session = ready()
    assert session.send(command) == wire
    assert session.state is ConnState.SUBSCRIBING
    assert session.message_format == MessageFormat(fork_ids=True, detail=command.name != b"SUB")


def test_message_commands_give_their_bytes_and_settle_or_renew_the_message() -> None:
    session = subscribed(Sub("t", "c", 0))
    frame = DecodedMessage(timestamp=1, attempts=1, id=ID, body=b"b")
    data = encode_message(frame, MessageFormat(fork_ids=True))
    session.receive_data(encode_frame(FrameType.MESSAGE, data))
    assert isinstance(session.next_event(), Delivered)
    assert session.in_flight == 1
    assert session.send_nowait(Touch(ID), now=1.0) == b"TOUCH " + ID + b"\n"
    assert session.send_nowait(Req(ID, 1.5)) == b"REQ " + ID + b" 1500\n"
    assert session.in_flight == 0
    assert session.send_nowait(Fin(ID)) == b"FIN " + ID + b"\n"
    assert session.send_nowait(Rdy(7)) == b"RDY 7\n"
    assert session.send_nowait(Nop()) == b"NOP\n"
    assert session.send(Cls()) == b"CLS\n"
    assert session.state is ConnState.CLOSING


def test_a_command_in_the_wrong_method_or_state_is_refused_before_any_byte() -> None:
    session = ready()
    with pytest.raises(LocalProtocolError, match="FIN"):
        session.send_nowait(Fin(ID))  # not subscribed
    with pytest.raises(LocalProtocolError, match="has no response"):
        session.send(Nop())
    with pytest.raises(LocalProtocolError, match="has a response"):
        session.send_nowait(Publish(b"PUB", "t", 0, [PublishMessage(b"x")]))
    with pytest.raises(InvalidArgumentError, match="RDY count 2501 is over max_rdy_count 2500"):
        subscribed(Sub("t", "c", 0)).send_nowait(Rdy(2501))
    assert subscribed(Sub("t", "c", 0)).send_nowait(Rdy(2500)) == b"RDY 2500\n"


@pytest.mark.parametrize(
    ("name", "messages", "wire"),
    [
        (b"PUB", [PublishMessage(b"ab")], b"PUB t 1\n\x00\x00\x00\x02ab"),
        (
            b"MPUB",
            [PublishMessage(b"a"), PublishMessage(b"bc")],
            b"MPUB t 1\n\x00\x00\x00\x0f\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x02bc",
        ),
        (  # a length packed once for a run of equal lengths, again when it changes
            b"MPUB",
            [PublishMessage(b) for b in (b"ab", b"cd", b"e", b"fg", b"hi")],
            b"MPUB t 1\n\x00\x00\x00\x21\x00\x00\x00\x05"
            + b"".join(len(b).to_bytes(4, "big") + b for b in (b"ab", b"cd", b"e", b"fg", b"hi")),
        ),
        (
            b"PUB_TRACE",
            [PublishMessage(b"a", 5)],
            b"PUB_TRACE t 1\n\x00\x00\x00\x09" + (5).to_bytes(8, "big") + b"a",
        ),
        (
            b"PUB_EXT",
            [PublishMessage(b"a", None, b"{}")],
            b"PUB_EXT t 1\n\x00\x00\x00\x05\x00\x02{}a",
        ),
    ],
)
def test_a_publish_of_checked_messages_gives_its_command(
    name: bytes, messages: list[PublishMessage], wire: bytes
) -> None:
    session = ready()
    assert session.send(Publish(name, "t", 1, messages)) == wire


def _modules(step: Callable[[], Any]) -> set[str]:
    """The protocol modules whose functions ``step`` calls."""
    seen: set[str] = set()

    def profile(frame: PyFrame, event: str, arg: object) -> None:
        if event == "call":
            path = Path(frame.f_code.co_filename).resolve()
            if path.parent == PROTOCOL:
                seen.add(path.name)

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return seen


def test_a_warm_publish_and_its_answer_enter_two_protocol_modules() -> None:
    session = ready()
    publish = Publish(b"PUB", "t", 0, [PublishMessage(b"body")])
    ok = encode_frame(FrameType.RESPONSE, b"OK")

    def step() -> None:
        session.send(publish)
        session.receive_data(ok, 1.0)
        assert isinstance(session.next_event(), Answer)
        assert session.next_event() is NEED_DATA

    assert len(_modules(step)) <= 2, _modules(step)


def test_a_warm_delivery_and_its_fin_enter_two_protocol_modules() -> None:
    session = subscribed(SubOrdered("t", "c", 0))
    fmt = MessageFormat(fork_ids=True, detail=True)
    frames = [
        encode_frame(
            FrameType.MESSAGE,
            encode_message(
                DecodedMessage(1, 1, join_fork_id(n, 7), b"b", offset=n, raw_size=31), fmt
            ),
        )
        for n in (1, 2)
    ]

    def step(frame: bytes) -> None:
        session.receive_data(frame, 1.0)
        event = session.next_event()
        assert isinstance(event, Delivered)
        assert session.next_event() is NEED_DATA
        session.fin(event.message.id)

    step(frames[0])
    assert len(_modules(lambda: step(frames[1]))) <= 2


def test_the_client_side_of_the_protocol_loads_without_the_server_side() -> None:
    """``import nsq_ha.protocol`` loads neither the command decoder nor the broker's encoders."""
    code = (
        "import sys, nsq_ha.protocol\n"
        "assert 'nsq_ha.protocol.command_decoder' not in sys.modules\n"
        "assert 'nsq_ha.protocol.broker' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "make",
    [
        lambda: Fin(b"short"),
        lambda: Touch(bytes(16)),  # internal id 0: nsqd closes the connection
        lambda: Req(ID, -1.0),
        lambda: Req(ID, float("nan")),
        lambda: Rdy(-1),
        lambda: Rdy(True),
        lambda: Sub("bad topic!", "c"),
        lambda: SubOrdered("t", "c", 255),
        lambda: Dpub("t", b"x", -0.5),
    ],
)
def test_a_command_cannot_be_made_with_what_nsqd_refuses(make: Callable[[], object]) -> None:
    """Commands are checked once, when made: encoding and the session trust them."""
    with pytest.raises(InvalidArgumentError):
        make()


@pytest.mark.parametrize(
    "command",
    [Identify, Auth, Sub, SubOrdered, SubAdvanced, Rdy, Fin, Req, Touch, Cls, Nop, Dpub],
)
def test_a_command_class_holds_no_value_besides_its_fields(command: type) -> None:
    """mypyc makes every value in a dataclass's body a field (a ``ClassVar`` too), so a value
    there would become a constructor argument in the compiled build: the wire name is a
    property (fields, methods and properties are descriptors)."""
    values = [
        name
        for name, value in vars(command).items()
        if not name.startswith("__") and not hasattr(type(value), "__get__")
    ]
    assert values == []
