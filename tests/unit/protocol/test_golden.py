"""Replay the golden recordings from the real servers, byte for byte.

* every client-to-server step is decoded with the server-side decoder and encoded again with
  the public encoders: the bytes must be identical, or the encoder must refuse the arguments
  (the recordings include deliberately bad commands), or the command cannot be expressed
  through the typed API at all (unknown command names, non-numeric tokens);
* every server-to-client stream is decoded by FrameDecoder (whole, byte at a time and at
  random split points) and each frame is checked against the recorded ``decoded`` values,
  traced responses, IDENTIFY answers and error texts, fatal flags and close behaviour.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import pytest
from golden_data import Exchange, exchange_id, exchanges, load, masked
from hypothesis import given
from hypothesis import strategies as st

from nsq_ha.errors import BrokerError, InvalidArgumentError, RemoteProtocolError
from nsq_ha.producer.message import prepare_message
from nsq_ha.protocol import (
    MAGIC_V2,
    Cls,
    DecodedMessage,
    Dpub,
    Fin,
    FrameDecoder,
    FrameType,
    Identify,
    MessageFormat,
    Nop,
    Publish,
    PublishMessage,
    Rdy,
    Req,
    StartKind,
    StartPosition,
    Sub,
    SubAdvanced,
    SubOrdered,
    Touch,
    decode_message,
    parse_traced_response,
    validate_partition,
    validate_topic,
)
from nsq_ha.protocol.broker import encode_message
from nsq_ha.protocol.command_decoder import (
    ClientCommand,
    CommandDecoder,
    split_ext_message,
    split_mpub_body,
    split_trace_message,
)
from nsq_ha.protocol.error_frames import closes_connection, parse_error_frame
from nsq_ha.protocol.frames import encode_frame
from nsq_ha.protocol.identify import build_identify, parse_identify_response
from nsq_ha.protocol.session import ClientSession, ConnState


class Frame(NamedTuple):
    """One frame as the decoder gives it, for comparing."""

    frame_type: FrameType
    data: bytes

    def encode(self) -> bytes:
        return encode_frame(self.frame_type, self.data)


MAX_MSG_SIZE = 1048576
MAX_BODY_SIZE = 5242880
MAX_RDY_COUNT = 2500
EXCHANGES = list(exchanges())


class InexpressibleError(Exception):
    """The recorded command has no counterpart in the typed encoder API."""


def _int_token(token: bytes) -> int:
    if not token.lstrip(b"-").isdigit():
        raise InexpressibleError(f"non-numeric token {token!r}")
    return int(token)


def _partition(params: tuple[bytes, ...], index: int) -> int | None:
    return _int_token(params[index]) if len(params) > index else None


def _seconds(token: bytes) -> float:
    return _int_token(token) / 1000


def _identify_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(body)
    for key in ("heartbeat_interval", "output_buffer_timeout", "msg_timeout"):
        value = kwargs.get(key)
        if isinstance(value, int) and value != -1:
            kwargs[key] = value / 1000
    return kwargs


def reencode(command: ClientCommand) -> bytes:
    """Encode the command again through the typed commands, from its decoded arguments (a
    publish's checked as the producer checks it)."""
    name, params, body = command.name, command.params, command.body
    if command.refused:
        raise InexpressibleError("body refused by size before it was sent")
    if b"" in params:
        raise InexpressibleError("empty token (double or trailing space)")
    if name == b"IDENTIFY":
        assert body is not None
        decoded = json.loads(body)
        raw = Identify.of(decoded).encode()
        if "some_unknown_key" not in decoded:  # the builder takes only known keys
            assert Identify.of(build_identify(**_identify_kwargs(decoded))).encode() == raw
        return raw
    if name in (b"SUB", b"SUB_ORDERED", b"SUB_ADVANCED"):
        topic, channel = (p.decode() for p in params[:2])
        if name == b"SUB_ADVANCED" and len(params) == 4:
            kind, _, value = params[3].decode().partition(":")
            start = StartPosition(StartKind(kind), int(value))
            return SubAdvanced(topic, channel, _partition(params, 2), start).encode()
        subscribe = {b"SUB": Sub, b"SUB_ORDERED": SubOrdered}.get(name, SubAdvanced)
        return subscribe(topic, channel, _partition(params, 2)).encode()
    if name == b"RDY":
        session = ClientSession()  # the session checks a count against max_rdy_count
        session.identified(parse_identify_response(b'{"max_rdy_count": %d}' % MAX_RDY_COUNT))
        session.state = ConnState.SUBSCRIBED
        return session.send_nowait(Rdy(_int_token(params[0])))
    if name == b"FIN":
        return Fin(params[0]).encode()
    if name == b"TOUCH":
        return Touch(params[0]).encode()
    if name == b"REQ":
        return Req(params[0], _seconds(params[1])).encode()
    if name == b"CLS":
        return Cls().encode()
    if name == b"NOP":
        return Nop().encode()
    if body is None:
        raise InexpressibleError(f"no encoder for {name!r}")
    topic = params[0].decode()
    if name == b"DPUB":
        message = prepare_message(body, max_msg_size=MAX_MSG_SIZE)
        return Dpub(validate_topic(topic), message.body, _seconds(params[1])).encode()
    messages: list[PublishMessage]
    if name == b"PUB":
        messages = [prepare_message(body)]
    elif name == b"PUB_TRACE":
        trace_id, payload = _split(split_trace_message, body)
        messages = [prepare_message(payload, trace_id=trace_id)]
    elif name == b"PUB_EXT":
        header, payload = _split(split_ext_message, body)
        messages = [prepare_message(payload, ext=header)]
    elif name == b"MPUB":
        messages = [prepare_message(message) for message in split_mpub_body(body)]
    elif name == b"MPUB_TRACE":
        pairs = [split_trace_message(message) for message in split_mpub_body(body)]
        messages = [prepare_message(payload, trace_id=trace_id) for trace_id, payload in pairs]
    elif name == b"MPUB_EXT":
        ext_pairs = [split_ext_message(message) for message in split_mpub_body(body)]
        messages = [prepare_message(payload, ext=header or None) for header, payload in ext_pairs]
    else:
        raise InexpressibleError(f"no encoder for {name!r}")
    checked = validate_topic(topic), validate_partition(_partition(params, 1))
    return Publish(name, *checked, messages, MAX_MSG_SIZE, MAX_BODY_SIZE).encode()


def _split(splitter: Any, body: bytes) -> Any:
    """Split a body, mapping an empty payload to the encoder call that must refuse it."""
    try:
        return splitter(body)
    except RemoteProtocolError:
        if splitter is split_trace_message and len(body) == 8:
            return int.from_bytes(body, "big"), b""
        if splitter is split_ext_message and len(body) >= 2:
            length = int.from_bytes(body[:2], "big")
            return body[2 : 2 + length], body[2 + length :]
        raise


def classify(raw: bytes) -> str:
    """Return 'exact', 'refused: ...' or 'inexpressible: ...' for one recorded c2s step."""
    if len(raw) == 4 and raw.startswith(b"  V"):
        return "exact" if raw == MAGIC_V2 else "inexpressible: bad magic"
    events = CommandDecoder(expect_magic=False, max_body_size=MAX_BODY_SIZE).feed(raw)
    if len(events) != 1:
        return "inexpressible: incomplete command (nsqd keeps waiting)"
    (command,) = events
    assert isinstance(command, ClientCommand)
    try:
        encoded = reencode(command)
    except InvalidArgumentError as exc:
        return f"refused: {type(exc).__name__}"
    except InexpressibleError as exc:
        return f"inexpressible: {exc}"
    assert encoded == raw, f"{encoded!r} != {raw!r}"
    return "exact"


def _c2s_outcomes() -> dict[str, list[str]]:
    outcomes: dict[str, list[str]] = {}
    for exchange in EXCHANGES:
        for step in exchange.steps:
            if step["dir"] == "c2s":
                outcome = classify(bytes.fromhex(step["hex"]))
                if outcome != "exact":
                    outcomes.setdefault(f"{exchange.source}: {exchange.conn}", []).append(outcome)
    return outcomes


# Every recorded c2s step that the encoders do not reproduce, and why. Anything else must be
# reproduced byte for byte.
EXPECTED_NOT_EXACT = {
    "fork_errors: bad magic '  V1'": ["inexpressible: bad magic"],
    "fork_errors: unknown command": ["inexpressible: no encoder for b'FOO'"],
    "fork_errors: SUB_ORDER (misspelling)": ["inexpressible: no encoder for b'SUB_ORDER'"],
    "fork_errors: PUB invalid topic name": ["refused: InvalidNameError"],
    "fork_errors: PUB invalid topic name, no partition": ["refused: InvalidNameError"],
    "fork_errors: SUB invalid topic name": ["refused: InvalidNameError"],
    "fork_errors: SUB invalid channel name": ["refused: InvalidNameError"],
    "fork_errors: SUB topic name 65 chars": ["refused: InvalidNameError"],
    "fork_errors: PUB partition not an int": ["inexpressible: non-numeric token b'x'"],
    "fork_errors: PUB oversize body (length 1048577, body not sent)": [
        "inexpressible: incomplete command (nsqd keeps waiting)"
    ],
    "fork_errors: PUB body length 0": ["inexpressible: body refused by size before it was sent"],
    "fork_errors: MPUB oversize body (5242881, body not sent)": [
        "inexpressible: body refused by size before it was sent"
    ],
    "fork_errors: MPUB count 0": ["inexpressible: body refused by size before it was sent"],
    "fork_errors: PUB_TRACE body of 8 bytes": ["refused: InvalidArgumentError"],
    "fork_errors: PUB_EXT empty header (json_len 0)": ["refused: InvalidArgumentError"],
    "fork_errors: PUB_EXT ##trace_id as JSON number": ["refused: InvalidArgumentError"],
    "fork_errors: PUB_EXT ##trace_id not decimal": ["refused: InvalidArgumentError"],
    "fork_errors: PUB_EXT invalid JSON header": ["refused: InvalidArgumentError"],
    "fork_errors: PUB with trailing space (4 tokens: partition token ignored)": [
        "inexpressible: empty token (double or trailing space)"
    ],
    "fork_errors: RDY not a number": ["inexpressible: non-numeric token b'abc'"],
    "fork_errors: RDY above max_rdy_count": ["refused: InvalidArgumentError"],
    "fork_errors: RDY negative": ["refused: InvalidArgumentError"],
    "fork_errors: FIN of id 0": ["refused: InvalidArgumentError"],
    "fork_errors: FIN short id": ["inexpressible: incomplete command (nsqd keeps waiting)"],
    "fork_errors: IDENTIFY heartbeat_interval 500": ["refused: InvalidArgumentError"],
    "vanilla_errors: bad magic": ["inexpressible: bad magic"],
    "vanilla_errors: unknown command": ["inexpressible: no encoder for b'FOO'"],
    "vanilla_errors: PUB invalid topic name": ["refused: InvalidNameError"],
    "vanilla_errors: SUB invalid topic name": ["refused: InvalidNameError"],
    "vanilla_errors: PUB oversize body (length 1048577, body not sent)": [
        "inexpressible: incomplete command (nsqd keeps waiting)"
    ],
    "vanilla_errors: PUB body length 0": ["inexpressible: body refused by size before it was sent"],
    "vanilla_errors: RDY not a number": ["inexpressible: non-numeric token b'abc'"],
    "vanilla_errors: RDY above max": ["refused: InvalidArgumentError"],
    "identify: fork: output_buffer_size 10 (1..63)": ["refused: InvalidArgumentError"],
    "identify: fork: msg_timeout 500": ["refused: InvalidArgumentError"],
    "identify: fork: heartbeat_interval 500": ["refused: InvalidArgumentError"],
    "identify: fork: sample_rate 100": ["refused: InvalidArgumentError"],
    "identify: fork: deflate false, deflate_level 0": ["refused: InvalidArgumentError"],
    "identify: fork: both snappy and deflate": ["refused: InvalidArgumentError"],
    "identify: fork: heartbeat_interval as string": ["refused: InvalidArgumentError"],
    "identify: vanilla: output_buffer_size 10 (1..63)": ["refused: InvalidArgumentError"],
    "identify: vanilla: msg_timeout 500": ["refused: InvalidArgumentError"],
    "identify: vanilla: heartbeat_interval 500": ["refused: InvalidArgumentError"],
    "identify: vanilla: sample_rate 100": ["refused: InvalidArgumentError"],
    "identify: vanilla: deflate false, deflate_level 0": ["refused: InvalidArgumentError"],
    "identify: vanilla: both snappy and deflate": ["refused: InvalidArgumentError"],
    "identify: vanilla: heartbeat_interval as string": ["refused: InvalidArgumentError"],
}


def test_every_c2s_step_is_reproduced_or_refused() -> None:
    assert _c2s_outcomes() == EXPECTED_NOT_EXACT


@pytest.mark.parametrize(
    ("encode", "declared"),
    [
        (
            lambda: Publish(b"PUB", "cf_err", 0, [PublishMessage(b"x" * 1048577)], MAX_MSG_SIZE),
            1048577,
        ),
        (
            lambda: Publish(
                b"MPUB", "cf_err", 0, [PublishMessage(b"x" * 1048572)] * 5, None, MAX_BODY_SIZE
            ),
            5242884,
        ),
    ],
)
def test_oversize_bodies_recorded_as_prefix_only_are_refused(encode: Any, declared: int) -> None:
    with pytest.raises(InvalidArgumentError, match=f"{declared} bytes, over the limit"):
        encode().encode()


# --- server-to-client -------------------------------------------------------------------------


def feed(decoder: FrameDecoder, data: bytes) -> list[Frame]:
    """Add ``data`` to ``decoder`` and return every frame it completed."""
    decoder.receive_data(data)
    frames: list[Frame] = []
    while (parts := decoder.next_parts()) is not None:
        frames.append(Frame(*parts))
    return frames


def _frames(stream: bytes) -> list[Frame]:
    decoder = FrameDecoder()
    frames = feed(decoder, stream)
    assert decoder.buffered == 0
    return frames


@pytest.mark.parametrize("exchange", EXCHANGES, ids=exchange_id)
def test_s2c_steps_are_whole_frames(exchange: Exchange) -> None:
    for step in exchange.steps:
        if step["dir"] == "s2c":
            (frame,) = _frames(bytes.fromhex(step["hex"]))
            assert frame.frame_type == step["frame_type"]
            assert frame.encode() == bytes.fromhex(step["hex"])


STREAMS = [e for e in EXCHANGES if e.s2c_stream]


@pytest.mark.parametrize("exchange", STREAMS, ids=exchange_id)
def test_byte_at_a_time_gives_the_same_frames(exchange: Exchange) -> None:
    stream = exchange.s2c_stream
    decoder = FrameDecoder()
    frames = [
        frame for index in range(len(stream)) for frame in feed(decoder, stream[index : index + 1])
    ]
    assert frames == _frames(stream)


@given(data=st.data())
def test_any_split_of_any_stream_gives_the_same_frames(data: st.DataObject) -> None:
    exchange = data.draw(st.sampled_from(STREAMS))
    stream = exchange.s2c_stream
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    decoder = FrameDecoder()
    frames: list[Frame] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        frames += feed(decoder, stream[start:end])
    assert frames == _frames(stream)


def _format_for(exchange: Exchange, sub_line: bytes, extend_support: bool) -> MessageFormat:
    name, topic = sub_line.split(b" ")[:2]
    if not exchange.fork:
        return MessageFormat.vanilla()
    ext = extend_support and topic.startswith(b"cf_ext")
    return MessageFormat(ext=ext, detail=name != b"SUB")


def _check_message(frame: Frame, fmt: MessageFormat, step: dict[str, Any]) -> DecodedMessage:
    message = decode_message(frame.data, fmt)
    assert encode_message(message, fmt) == frame.data
    expected = step.get("decoded")
    if expected is None:
        return message
    assert message.attempts == expected["attempts"]
    assert message.body == expected["body"].encode()
    assert len(frame.data) - len(message.body) == expected.get("body_at", 26)
    if "id16" in expected:
        assert message.id.hex() == expected["id16"]
        assert message.internal_id == expected["id_u64"]
        assert message.trace_id == expected["trace_u64"]
    else:
        assert message.id == expected["id_ascii"].encode()
        assert message.internal_id is None
        assert message.trace_id is None
    assert message.offset == expected.get("offset")
    assert message.raw_size == expected.get("raw_size")
    assert message.ext_version == expected.get("ext_ver")
    if "ext" in expected:
        assert message.ext_data == expected["ext"].encode()
        assert message.json_header() == json.loads(expected["ext"])
    # The broker side: building the frame from the recorded values alone reproduces the
    # recorded bytes outside the ranges that vary from run to run.
    rebuilt = DecodedMessage(
        timestamp=0,
        attempts=expected["attempts"],
        id=bytes.fromhex(expected["id16"]) if "id16" in expected else bytes(16),
        body=expected["body"].encode(),
        ext_version=expected.get("ext_ver"),
        ext_data=expected["ext"].encode() if "ext" in expected else None,
        offset=expected.get("offset"),
        raw_size=expected.get("raw_size"),
    )
    wire = encode_frame(FrameType.MESSAGE, encode_message(rebuilt, fmt))
    assert masked(wire.hex(), step["vary"]) == masked(step["hex"], step["vary"])
    return message


def _next_event(steps: list[dict[str, Any]], index: int) -> str | None:
    for step in steps[index + 1 :]:
        if step["dir"] == "event":
            return str(step["event"])
        if step["dir"] != "event" and step["dir"] != "s2c":
            return None
    return None


@pytest.mark.parametrize("exchange", EXCHANGES, ids=exchange_id)
def test_s2c_frames_decode_to_the_recorded_values(exchange: Exchange) -> None:
    fmt: MessageFormat | None = None
    extend_support = False
    last_command = b""
    identify_body: dict[str, Any] | None = None
    errors = closes_checked = 0
    for index, step in enumerate(exchange.steps):
        raw = bytes.fromhex(step.get("hex", ""))
        if step["dir"] == "c2s":
            last_command = raw.split(b"\n", 1)[0].split(b" ", 1)[0]  # the command's name
            events = CommandDecoder(expect_magic=False).feed(raw) if len(raw) != 4 else []
            if events and isinstance(events[0], ClientCommand):
                command = events[0]
                if command.name == b"IDENTIFY":
                    assert command.body is not None
                    identify_body = json.loads(command.body)
                    extend_support = identify_body.get("extend_support") is True
                if command.name.startswith(b"SUB"):
                    fmt = _format_for(exchange, raw.rstrip(b"\n"), extend_support)
            continue
        if step["dir"] != "s2c":
            continue
        (frame,) = _frames(raw)
        if frame.frame_type is FrameType.MESSAGE:
            assert fmt is not None
            _check_message(frame, fmt, step)
        elif frame.frame_type is FrameType.ERROR:
            errors += 1
            error = parse_error_frame(frame.data)
            error.fatal = closes_connection(type(error), last_command, fork=exchange.fork)
            assert error.code == frame.data.decode().split(" ")[0]
            if exchange.case.get("error_text") is not None:
                assert frame.data.decode() == exchange.case["error_text"]
            assert type(error) is not BrokerError, f"unregistered code {error.code}"
            after = _next_event(exchange.steps, index)
            if after in ("server_closed", "still_open"):
                assert error.fatal is (after == "server_closed"), (error, after)
                closes_checked += 1
        elif "decoded" in step:
            traced = parse_traced_response(frame.data)
            expected = step["decoded"]
            assert (traced.internal_id, traced.trace_id) == (expected["id"], expected["trace"])
            assert (traced.offset, traced.raw_size) == (expected["offset"], expected["raw_size"])
        elif last_command.startswith(b"IDENTIFY") and frame.data != b"_heartbeat_":
            negotiated = parse_identify_response(frame.data, identify_body)
            answer = exchange.case.get("answer_json")
            if answer is not None:
                assert negotiated.raw == answer
                assert negotiated.max_rdy_count == answer["max_rdy_count"]
                assert negotiated.msg_timeout == answer["msg_timeout"] / 1000
                assert negotiated.is_fork is exchange.fork
            if frame.data == b"OK":
                assert negotiated.feature_negotiation is False
                assert negotiated.is_fork is None
            else:
                assert negotiated.is_fork is exchange.fork
        else:
            assert frame.data in (b"OK", b"CLOSE_WAIT", b"_heartbeat_")
    assert (errors > 0) is ("error_text" in exchange.case)
    assert closes_checked == errors  # every recorded error says whether the server closed


def test_traced_response_matches_the_message_it_announces() -> None:
    """§2.16: for PUB_TRACE the response's bytes 2..17 are the id and 18..29 the detail part."""
    steps = load("fork_ext_trace")["steps"]
    traced = parse_traced_response(_frames(bytes.fromhex(steps[10]["hex"]))[0].data)
    (frame,) = _frames(bytes.fromhex(steps[11]["hex"]))
    message = decode_message(frame.data, MessageFormat(detail=True))
    assert message.id == traced.message_id
    assert (message.offset, message.raw_size) == (traced.offset, traced.raw_size)
