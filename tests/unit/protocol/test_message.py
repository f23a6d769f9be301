"""Message frame payloads: every layout of §4.2, round trips, truncation and garbage."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_ha._compiled_finder import is_compiled
from nsq_ha.errors import InvalidArgumentError, NsqError, RemoteProtocolError
from nsq_ha.protocol import DecodedMessage, MessageFormat, decode_message
from nsq_ha.protocol.broker import encode_message, join_fork_id
from nsq_ha.protocol.message import EXT_VERSION_JSON, EXT_VERSION_TAG

u64 = st.integers(0, (1 << 64) - 1)
FORMATS = [
    MessageFormat.vanilla(),
    MessageFormat(),
    MessageFormat(ext=True),
    MessageFormat(detail=True),
    MessageFormat(ext=True, detail=True),
]
HEADER = bytes.fromhex("18ea17cd3926da98000100000000000000021122334455667788")


@st.composite
def messages(draw: st.DrawFn, fmt: MessageFormat) -> DecodedMessage:
    """A message that is valid in ``fmt``."""
    internal_id, trace_id = draw(u64), draw(u64)
    message_id = (
        join_fork_id(internal_id, trace_id)
        if fmt.fork_ids
        else draw(st.binary(min_size=16, max_size=16))
    )
    ext_version = ext_data = None
    if fmt.ext:
        ext_version = draw(st.sampled_from([0, EXT_VERSION_TAG, EXT_VERSION_JSON, 7]))
        ext_data = b"" if ext_version == 0 else draw(st.binary(max_size=40))
    return DecodedMessage(
        timestamp=draw(st.integers(-(1 << 63), (1 << 63) - 1)),
        attempts=draw(st.integers(0, 0xFFFF)),
        id=message_id,
        body=draw(st.binary(max_size=60)),
        internal_id=internal_id if fmt.fork_ids else None,
        trace_id=trace_id if fmt.fork_ids else None,
        ext_version=ext_version,
        ext_data=ext_data,
        offset=draw(u64) if fmt.detail else None,
        raw_size=draw(st.integers(0, (1 << 32) - 1)) if fmt.detail else None,
    )


@pytest.mark.parametrize("fmt", FORMATS, ids=repr)
@given(data=st.data())
def test_round_trip(fmt: MessageFormat, data: st.DataObject) -> None:
    message = data.draw(messages(fmt))
    assert decode_message(encode_message(message, fmt), fmt) == message


def test_the_four_fork_layouts_put_the_body_where_section_4_2_says() -> None:
    ext = b"\x04\x00\x07" + b'{"a":1}'
    detail = bytes.fromhex("000000000000002200000023")
    plain = decode_message(HEADER + b"body", MessageFormat())
    assert (plain.body, plain.internal_id, plain.trace_id) == (b"body", 2, 0x1122334455667788)
    assert plain.offset is plain.ext_version is None
    with_ext = decode_message(HEADER + ext + b"body", MessageFormat(ext=True))
    assert (with_ext.ext_version, with_ext.ext_data, with_ext.body) == (4, b'{"a":1}', b"body")
    assert with_ext.json_header() == {"a": 1}
    with_detail = decode_message(HEADER + detail + b"body", MessageFormat(detail=True))
    assert (with_detail.offset, with_detail.raw_size, with_detail.body) == (34, 35, b"body")
    both = decode_message(HEADER + ext + detail + b"body", MessageFormat(ext=True, detail=True))
    assert (both.ext_data, both.offset, both.raw_size, both.body) == (b'{"a":1}', 34, 35, b"body")
    version0 = decode_message(
        HEADER + b"\x00" + detail + b"b", MessageFormat(ext=True, detail=True)
    )
    assert (version0.ext_version, version0.ext_data, version0.json_header()) == (0, b"", {})


def test_vanilla_ids_stay_opaque() -> None:
    data = bytes.fromhex("18ea180257c0a1a20001") + b"18a33cc8cb001000" + b"v-1"
    message = decode_message(data, MessageFormat.vanilla())
    assert message.id == b"18a33cc8cb001000"
    assert message.internal_id is None
    assert message.trace_id is None
    assert message.body == b"v-1"
    assert message.attempts == 1


@pytest.mark.parametrize(
    ("data", "fmt", "match"),
    [
        (HEADER[:25], MessageFormat(), "fewer than the 26-byte header"),
        (b"", MessageFormat.vanilla(), "fewer than the 26-byte header"),
        (HEADER, MessageFormat(ext=True), "ext version byte"),
        (HEADER + b"\x04\x00", MessageFormat(ext=True), "ext length"),
        (HEADER + b"\x04\x00\x05abc", MessageFormat(ext=True), "5-byte ext data"),
        (HEADER + bytes(11), MessageFormat(detail=True), "offset/raw-size"),
        (HEADER + b"\x00" + bytes(11), MessageFormat(ext=True, detail=True), "offset/raw-size"),
    ],
)
def test_truncated_input(data: bytes, fmt: MessageFormat, match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        decode_message(data, fmt)


@pytest.mark.parametrize(
    ("ext", "match"), [(b"not json", "not valid JSON"), (b"[1,2]", "not a JSON object")]
)
def test_bad_json_header(ext: bytes, match: str) -> None:
    part = bytes([EXT_VERSION_JSON]) + len(ext).to_bytes(2, "big") + ext
    message = decode_message(HEADER + part + b"x", MessageFormat(ext=True))
    with pytest.raises(RemoteProtocolError, match=match):
        message.json_header()


def test_tag_ext_has_no_json_header() -> None:
    part = bytes([EXT_VERSION_TAG, 0, 3]) + b"tag"
    message = decode_message(HEADER + part + b"x", MessageFormat(ext=True))
    assert (message.ext_version, message.ext_data, message.json_header()) == (2, b"tag", {})


@settings(max_examples=300)
@given(st.binary(max_size=120), st.sampled_from(FORMATS))
def test_garbage_raises_only_nsq_errors(data: bytes, fmt: MessageFormat) -> None:
    try:
        message = decode_message(data, fmt)
        message.json_header()
    except NsqError:
        pass


def test_format_rules() -> None:
    with pytest.raises(InvalidArgumentError, match="vanilla"):
        MessageFormat(fork_ids=False, ext=True)
    with pytest.raises(InvalidArgumentError, match="vanilla"):
        MessageFormat(fork_ids=False, detail=True)


def test_fork_id_helpers() -> None:
    assert join_fork_id(2, 999) == bytes.fromhex("000000000000000200000000000003e7")
    assert join_fork_id(10) == bytes.fromhex("000000000000000a0000000000000000")
    with pytest.raises(InvalidArgumentError):
        join_fork_id(-1)
    with pytest.raises(InvalidArgumentError):
        join_fork_id(1, 1 << 64)


@pytest.mark.parametrize(
    ("message", "fmt", "match"),
    [
        (DecodedMessage(timestamp=0, attempts=1, id=b"x", body=b""), MessageFormat(), "16 bytes"),
        (
            DecodedMessage(timestamp=0, attempts=1, id=bytes(16), body=b""),
            MessageFormat(detail=True),
            "offset and raw_size",
        ),
        (
            DecodedMessage(timestamp=0, attempts=1 << 16, id=bytes(16), body=b""),
            MessageFormat(),
            "out of range",
        ),
        (
            DecodedMessage(timestamp=0, attempts=1, id=bytes(16), body=b"", ext_version=256),
            MessageFormat(ext=True),
            "u8",
        ),
        (
            DecodedMessage(timestamp=0, attempts=1, id=bytes(16), body=b"", ext_data=b"x"),
            MessageFormat(ext=True),
            "ext version other than 0",
        ),
        (
            DecodedMessage(
                timestamp=0,
                attempts=1,
                id=bytes(16),
                body=b"",
                ext_version=4,
                ext_data=bytes(1 << 16),
            ),
            MessageFormat(ext=True),
            "u16",
        ),
    ],
)
def test_encode_refuses_inconsistent_messages(
    message: DecodedMessage, fmt: MessageFormat, match: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        encode_message(message, fmt)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_a_bytes_like_frame_decodes_to_bytes_or_is_refused(kind: type) -> None:
    """The frame decoder hands ``bytes``; other bytes-like data decodes to ``bytes`` fields
    in pure Python, and the compiled build refuses it at the call (its annotation)."""
    native = is_compiled(sys.modules[decode_message.__module__])
    for fmt in (MessageFormat(), MessageFormat(ext=True, detail=True)):
        data = HEADER + (b"\x00" + b"\x00" * 12 if fmt.ext else b"") + b"body"
        if native and kind is not bytes:
            with pytest.raises(TypeError):
                decode_message(kind(data), fmt)
            continue
        decoded = decode_message(kind(data), fmt)
        assert type(decoded.id) is bytes
        assert type(decoded.body) is bytes
