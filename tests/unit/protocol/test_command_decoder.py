"""The server-side decoder of client commands: positional ids, bodies, splits, garbage."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_ha.errors import InvalidArgumentError, NsqError, RemoteProtocolError
from nsq_ha.protocol import Fin, Publish, PublishMessage, Rdy, Req, Sub, Touch
from nsq_ha.protocol.command_decoder import (
    BODY_COMMANDS,
    ClientCommand,
    CommandDecoder,
    Magic,
    split_ext_message,
    split_mpub_body,
    split_trace_message,
)

ID_WITH_NEWLINE = bytes.fromhex("000000000000000a0a20000000000000")


def test_magic_then_commands() -> None:
    decoder = CommandDecoder()
    events = decoder.feed(b"  V2SUB t c 0\nRDY 1\nNOP\r\n")
    assert events == [
        Magic(b"  V2"),
        ClientCommand(b"SUB", (b"t", b"c", b"0")),
        ClientCommand(b"RDY", (b"1",)),
        ClientCommand(b"NOP"),
    ]
    assert CommandDecoder().feed(b"  V1") == [Magic(b"  V1")]
    assert CommandDecoder().feed(b"  V") == []


def test_single_space_splitting_keeps_empty_tokens() -> None:
    (command,) = CommandDecoder(expect_magic=False).feed(b"PUB t 1 \n\x00\x00\x00\x01x")
    assert command == ClientCommand(b"PUB", (b"t", b"1", b""), b"x", 1)
    (double,) = CommandDecoder(expect_magic=False).feed(b"SUB t  c\n")
    assert double == ClientCommand(b"SUB", (b"t", b"", b"c"))


def test_ids_with_newlines_and_spaces_are_read_by_position() -> None:
    stream = (
        Fin(ID_WITH_NEWLINE).encode()
        + Req(ID_WITH_NEWLINE, 1.5).encode()
        + Touch(ID_WITH_NEWLINE).encode()
        + b"NOP\n"
    )
    events = CommandDecoder(expect_magic=False).feed(stream)
    assert events == [
        ClientCommand(b"FIN", (ID_WITH_NEWLINE,)),
        ClientCommand(b"REQ", (ID_WITH_NEWLINE, b"1500")),
        ClientCommand(b"TOUCH", (ID_WITH_NEWLINE,)),
        ClientCommand(b"NOP"),
    ]


def test_fin_waits_for_the_missing_id_bytes() -> None:
    decoder = CommandDecoder(expect_magic=False)
    assert decoder.feed(b"FIN 12345\n") == []
    assert decoder.feed(b"6789abcdef\n") == [ClientCommand(b"FIN", (b"12345\n6789abcdef",))]


def test_fin_ignores_extra_bytes_before_the_newline() -> None:
    events = CommandDecoder(expect_magic=False).feed(b"FIN 0123456789abcdefXYZ\nNOP\n")
    assert events == [ClientCommand(b"FIN", (b"0123456789abcdef",)), ClientCommand(b"NOP")]


def test_touch_reads_exactly_the_missing_bytes() -> None:
    decoder = CommandDecoder(expect_magic=False)
    assert decoder.feed(b"TOUCH 12\n") == []
    # 23 bytes in all: the 23rd byte is taken as the line end without a second readline.
    assert decoder.feed(b"3456789abcdefZNOP\n") == [
        ClientCommand(b"TOUCH", (b"12\n3456789abcdef",)),
        ClientCommand(b"NOP"),
    ]
    long_line = CommandDecoder(expect_magic=False).feed(b"TOUCH 0123456789abcdefEXTRA\n")
    assert long_line == [ClientCommand(b"TOUCH", (b"0123456789abcdef",))]
    assert CommandDecoder(expect_magic=False).feed(b"TOUCH 0123") == []


@pytest.mark.parametrize(
    ("stream", "declared"),
    [
        (b"PUB t\n\x00\x00\x00\x00", 0),
        (b"PUB t\n\xff\xff\xff\xff", -1),
        (b"PUB t\n\x00\x00\x00\x65", 101),
        (b"MPUB t\n\x00\x00\x00\x08\x00\x00\x00\x00", 8),
        (b"MPUB t\n\x00\x00\x00\x08\x00\x00\x00\x01\x00\x00\x00\x00", 8),
    ],
)
def test_refused_bodies_stop_the_stream(stream: bytes, declared: int) -> None:
    decoder = CommandDecoder(expect_magic=False, max_body_size=100)
    (command,) = decoder.feed(stream + b"NOP\n")
    assert isinstance(command, ClientCommand)
    assert command.refused
    assert command.body is None
    assert command.declared_size == declared
    with pytest.raises(RemoteProtocolError, match="stopped"):
        decoder.feed(b"NOP\n")


def test_mpub_is_read_structurally_whatever_the_declared_size() -> None:
    good = Publish(b"MPUB", "t", None, [PublishMessage(b"ab"), PublishMessage(b"c")]).encode()
    body = good[len(b"MPUB t\n") + 4 :]
    for declared in (len(body) + 4, len(body) - 3):
        stream = b"MPUB t\n" + declared.to_bytes(4, "big") + body + b"NOP\n"
        events = CommandDecoder(expect_magic=False).feed(stream)
        assert events == [ClientCommand(b"MPUB", (b"t",), body, declared), ClientCommand(b"NOP")]


@given(st.data())
def test_any_split_gives_the_same_commands(data: st.DataObject) -> None:
    stream = (
        b"  V2"
        + Sub("t", "c", 1).encode()
        + Rdy(3).encode()
        + Fin(ID_WITH_NEWLINE).encode()
        + Touch(ID_WITH_NEWLINE).encode()
        + Req(ID_WITH_NEWLINE, 0).encode()
        + Publish(b"PUB", "t", 0, [PublishMessage(b"body\n")]).encode()
        + Publish(b"MPUB", "t", 2, [PublishMessage(b"a"), PublishMessage(b"bb")]).encode()
    )
    expected = CommandDecoder().feed(stream)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=15)))
    decoder = CommandDecoder()
    events: list[Magic | ClientCommand] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        events += decoder.feed(stream[start:end])
    assert events == expected
    assert len(expected) == 8


@pytest.mark.parametrize("prefix", [b"", b"FIN ", b"REQ ", b"TOUCH "])
def test_overlong_lines_fail(prefix: bytes) -> None:
    decoder = CommandDecoder(expect_magic=False)
    with pytest.raises(RemoteProtocolError, match="longer than"):
        decoder.feed(prefix + b"x" * 5000)
    with pytest.raises(RemoteProtocolError, match="longer than"):
        decoder.feed(b"NOP\n")


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_garbage_never_hangs_or_escapes(garbage: bytes) -> None:
    decoder = CommandDecoder(max_body_size=200)
    with contextlib.suppress(NsqError):
        decoder.feed(garbage)


def test_bad_limit() -> None:
    with pytest.raises(InvalidArgumentError):
        CommandDecoder(max_body_size=0)


def test_split_helpers() -> None:
    assert split_mpub_body(b"\x00\x00\x00\x01\x00\x00\x00\x01x") == [b"x"]
    assert split_trace_message(bytes(7) + b"\x05" + b"b") == (5, b"b")
    assert split_ext_message(b"\x00\x02{}b") == (b"{}", b"b")
    assert split_ext_message(b"\x00\x00b") == (b"", b"b")


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"\x00\x00\x00", "shorter than its message count"),
        (b"\x00\x00\x00\x00", "invalid message count 0"),
        (b"\x00\x00\x00\x01\x00\x00", "before message\\(0\\) size"),
        (b"\x00\x00\x00\x01\x00\x00\x00\x00", "message\\(0\\) body size 0"),
        (b"\x00\x00\x00\x01\x00\x00\x00\x02x", "message\\(0\\) body size 2"),
        (b"\x00\x00\x00\x01\x00\x00\x00\x01xy", "1 trailing bytes"),
    ],
)
def test_split_mpub_body_errors(body: bytes, match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        split_mpub_body(body)


def test_split_message_errors() -> None:
    with pytest.raises(RemoteProtocolError, match="with trace id enabled"):
        split_trace_message(bytes(8))
    with pytest.raises(RemoteProtocolError, match="with ext json header enabled"):
        split_ext_message(b"\x00\x00")
    with pytest.raises(RemoteProtocolError, match="ext json header content length"):
        split_ext_message(b"\x00\x02{}")


def test_per_command_limits_refuse_from_the_size_alone() -> None:
    decoder = CommandDecoder(body_limits={b"PUB": 10}, max_body_size=100)
    (_, pub) = decoder.feed(b"  V2PUB t 0\n\x00\x00\x00\x0b")  # 11 > 10, body never sent
    assert pub.refused
    assert pub.declared_size == 11
    other = CommandDecoder(body_limits={b"PUB": 10}, max_body_size=100)
    (_, mpub) = other.feed(b"  V2MPUB t\n\x00\x00\x00\x0b\x00\x00\x00\x01\x00\x00\x00\x03abc")
    assert not mpub.refused  # MPUB keeps the general limit


@pytest.mark.parametrize(
    ("body", "refusal"),
    [
        (b"\x00\x00\x00\x00", ("count", "0")),
        (b"\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x00", ("message_size", "1", "0")),
        (b"\x00\x00\x00\x01\x00\x00\x00\x09", ("message_too_big", "0", "9")),
    ],
)
def test_mpub_refusals_say_why(body: bytes, refusal: tuple[str, ...]) -> None:
    decoder = CommandDecoder(max_message_size=8)
    (_, command) = decoder.feed(b"  V2MPUB t\n" + len(body).to_bytes(4, "big") + body)
    assert command.refused
    assert command.refusal == refusal


def test_fork_body_commands_leave_dpub_bodyless() -> None:
    decoder = CommandDecoder(body_commands=BODY_COMMANDS - {b"DPUB"})
    events = decoder.feed(b"  V2DPUB t 1000\n")
    assert events[1] == ClientCommand(b"DPUB", (b"t", b"1000"))


def test_pop_and_unread_put_bytes_back_in_front() -> None:
    decoder = CommandDecoder()
    decoder.receive(b"  V2NOP\nCLS\n")
    assert decoder.pop() == Magic(b"  V2")
    assert decoder.pop() == ClientCommand(b"NOP")
    decoder.unread(b"RDY 1\n")
    assert decoder.pop() == ClientCommand(b"RDY", (b"1",))
    assert decoder.pop() == ClientCommand(b"CLS")
    assert decoder.pop() is None


def test_body_wanted_lets_a_server_answer_before_the_body() -> None:
    decoder = CommandDecoder(body_wanted=lambda name, params: bool(params))
    events = decoder.feed(b"  V2PUB\nNOP\n")
    assert events[1:] == [ClientCommand(b"PUB"), ClientCommand(b"NOP")]
