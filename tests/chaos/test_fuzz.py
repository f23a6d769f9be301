"""Chaos, bad input: every decoder of server bytes ends in data or a typed NsqError.

Pure properties (hypothesis) over the sans-IO decoders:

1. the frame decoder: arbitrary bytes in arbitrary chunks, valid streams in arbitrary chunks,
   truncated streams, size headers below 4 or above the limit (refused as soon as the 4 size
   bytes are in, without buffering the announced amount);
2. the message decoder in every layout (vanilla, fork plain, ext, detail, ext + detail) and the
   ext JSON header;
3. lookupd answers: ``unwrap`` of arbitrary bodies, ``parse_lookup``/``parse_listlookup`` of
   arbitrary JSON (wrong types, missing keys, bad ports and hosts, non-dict partitions);
4. the IDENTIFY (and AUTH) answer: arbitrary bytes and JSON, mutated real answers, plain ``OK``.

"No other exception" means none: no KeyError/TypeError/ValueError/UnicodeDecodeError/
struct.error/RecursionError/OverflowError, and nothing that would make a later step (httpx
building a URL) raise one either.

Then a server that lies: a tiny asyncio TCP server in the test plays nsqd for the real
:class:`~nsq_ha.connection.NsqdConnection` and answers with garbage, a frame cut by a close, a
huge size header, an unknown frame type or a message frame with a short body. Each ends in a
typed NsqError within a few seconds, without leaked tasks, error logs or a big allocation.

``NSQ_HA_FUZZ_EXAMPLES=20000`` (what ``make chaos`` sets) runs every pure property with that
many examples and no deadline; unset, they use the default settings (CI).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import struct
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import httpx
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from nsq_ha.connection import ConnectionConfig, NsqdConnection
from nsq_ha.errors import (
    BrokerError,
    ConnectionClosedError,
    HandshakeError,
    LocalProtocolError,
    NsqError,
    RemoteProtocolError,
)
from nsq_ha.lookup.wire import (
    LookupdError,
    NodeInfo,
    PartitionMap,
    merge_maps,
    parse_listlookup,
    parse_lookup,
    unwrap,
)
from nsq_ha.protocol.broker import encode_message
from nsq_ha.protocol.command_decoder import ClientCommand, CommandDecoder, Magic
from nsq_ha.protocol.error_frames import closes_connection, must_drop, parse_error_frame
from nsq_ha.protocol.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    FRAME_HEADER_SIZE,
    FrameType,
    encode_frame,
    max_frame_size_for,
)
from nsq_ha.protocol.identify import Negotiated, parse_auth_response, parse_identify_response
from nsq_ha.protocol.message import (
    EXT_VERSION_JSON,
    EXT_VERSION_NONE,
    EXT_VERSION_TAG,
    MESSAGE_HEADER_SIZE,
    DecodedMessage,
    MessageFormat,
    decode_message,
)
from nsq_ha.protocol.publish import Publish, PublishMessage
from nsq_ha.protocol.session import FrameDecoder


class Frame(NamedTuple):
    """One frame as the decoder gives it, for comparing."""

    frame_type: FrameType
    data: bytes

    def encode(self) -> bytes:
        return encode_frame(self.frame_type, self.data)


# --- settings --------------------------------------------------------------------------------

FUZZ_EXAMPLES_ENV = "NSQ_HA_FUZZ_EXAMPLES"
_T = TypeVar("_T")


def _fuzz_examples() -> int | None:
    raw = os.environ.get(FUZZ_EXAMPLES_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise pytest.UsageError(f"{FUZZ_EXAMPLES_ENV} must be a positive integer, got {raw!r}")
    return int(raw)


FUZZ_EXAMPLES = _fuzz_examples()
if FUZZ_EXAMPLES is not None:
    # the long run: many examples, no per-example deadline (a slow machine is not a hang here;
    # a real hang would stall the run, and every decoder is linear in its input)
    settings.register_profile(
        "nsq-ha-fuzz",
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def fuzz(test: _T) -> _T:
    """Apply the long-run profile to a pure decoder property when NSQ_HA_FUZZ_EXAMPLES is set."""
    if FUZZ_EXAMPLES is None:
        return test
    return settings.get_profile("nsq-ha-fuzz")(test)


#: The lying-server properties: each example opens real sockets, so a modest count.
lying_settings = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# --- golden recordings -----------------------------------------------------------------------

GOLDEN = Path(__file__).resolve().parent.parent / "golden"


def _golden(name: str) -> dict[str, Any]:
    with (GOLDEN / f"{name}.json").open(encoding="utf-8") as handle:
        data: dict[str, Any] = json.load(handle)
    return data


def _identify_answer(label: str) -> bytes:
    """The whole IDENTIFY answer frame recorded for the case ``label``."""
    for case in _golden("identify")["cases"]:
        if case["label"] == label:
            return next(bytes.fromhex(s["hex"]) for s in case["steps"] if s["dir"] == "s2c")
    raise LookupError(label)


VANILLA_IDENTIFY = _identify_answer("vanilla: feature_negotiation true, defaults")
FORK_IDENTIFY = _identify_answer("fork: feature_negotiation true, defaults")
GOLDEN_IDENTIFY_JSON = [
    json.loads(frame[FRAME_HEADER_SIZE:]) for frame in (VANILLA_IDENTIFY, FORK_IDENTIFY)
]


def _golden_streams() -> list[bytes]:
    """Every recorded server-to-client TCP stream (whole frames), one per connection."""
    streams: dict[tuple[str, str], list[bytes]] = {}
    for name in ("fork_pub_sub", "fork_ext_trace", "fork_ordered", "vanilla_pub_sub"):
        for step in _golden(name)["steps"]:
            if step["dir"] == "s2c":
                streams.setdefault((name, step["conn"]), []).append(bytes.fromhex(step["hex"]))
    for name in ("fork_errors", "vanilla_errors", "identify"):
        for case in _golden(name)["cases"]:
            for step in case["steps"]:
                if step["dir"] == "s2c":
                    key = (name, case["label"])
                    streams.setdefault(key, []).append(bytes.fromhex(step["hex"]))
    return [b"".join(parts) for parts in streams.values()]


GOLDEN_STREAMS = _golden_streams()


def _golden_lookup_answers() -> list[tuple[int, dict[str, str], bytes]]:
    """``(status, headers, body)`` of every recorded lookupd HTTP answer."""
    answers = []
    for name in ("lookup_fork", "lookup_vanilla", "lookup_nochannel", "listlookup"):
        for step in _golden(name)["steps"]:
            if step["dir"] == "s2c" and "http_status" in step:
                body = step.get("body_text", "").encode()
                answers.append((step["http_status"], step.get("http_headers", {}), body))
    return answers


GOLDEN_LOOKUP_ANSWERS = _golden_lookup_answers()

# --- strategies ------------------------------------------------------------------------------

#: Integers nsqd (Go int64) can and cannot send, around the edges that matter.
edge_ints = st.sampled_from(
    [0, -1, 1, 254, 255, 65535, 65536, 2**31 - 1, 2**31, 2**63 - 1, 2**63, -(2**63) - 1]
) | st.builds(pow, st.just(10), st.just(400))  # 401 digits: JSON reads it, a float cannot
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | edge_ints
    | st.floats()  # NaN and Infinity included: json.dumps writes them, json.loads reads them
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4)
    ),
    max_leaves=25,
)
good_ports = st.integers(1, 65535)
ports = (
    good_ports
    | st.integers(-70_000, 140_000)
    | edge_ints
    | st.text("0123456789", min_size=1, max_size=7)
    | st.sampled_from(["", "4161", "-1", "+80", " 80", "80 ", "\u00b2", "\u0663\u0663", "0x50"])
    | json_scalars
)
good_hosts = st.sampled_from(
    ["127.0.0.1", "10.0.0.2", "fe80::1", "fe80::1%eth0", "::1", "nsqd-0.local", "nsqd_1", "h"]
)
hosts = (
    good_hosts
    | st.sampled_from(
        [
            *("999.1.1.1", "01.2.3.4", "1.2.3", ":::", "x:y", "fe80::1%", "a b", "h/x"),
            *("[::1]", "h@x", "h?x", "h#x", "a%b", "\u00e4.example", ""),
        ]
    )
    | st.text(max_size=20)
)


def _node(host: st.SearchStrategy[Any], port: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.fixed_dictionaries(
        {"broadcast_address": host, "tcp_port": port},
        optional={
            "http_port": port,
            "version": st.sampled_from(["1.3.0", "0.3.7-HA.1.13.0"]) | json_values,
            "hostname": json_values,
            "distributed_id": json_values,
            "remote_address": json_values,
        },
    )


#: lookupd node objects: mostly well-formed (so parses succeed and are checked), some with one
#: bad field, some missing keys, some not objects at all
nodes = (
    _node(good_hosts, good_ports)
    | _node(hosts | json_scalars, good_ports)
    | _node(good_hosts, ports)
    | st.fixed_dictionaries({}, optional={"broadcast_address": hosts, "tcp_port": ports})
    | json_values
)
partition_keys = (
    st.integers(0, 254).map(str)
    | st.integers(-3, 300).map(str)
    | st.sampled_from(["\u0663", "1_0", " 3", "+3", "0x1", "1.5", ""])
    | st.builds(str.__mul__, st.just("9"), st.just(5000))  # int() refuses it: over 4300 digits
    | st.text(max_size=6)
)
metas = st.fixed_dictionaries(
    {},
    optional={
        "partition_num": st.integers(0, 255) | ports,
        "replica": st.integers(0, 3) | ports,
        "ordered": st.booleans() | json_values,
        "extend_support": st.booleans() | json_values,
    },
)
good_nodes = _node(good_hosts, good_ports)
#: well-formed answers (parsed and checked), answers with any part possibly broken, anything
lookup_results = (
    st.fixed_dictionaries(
        {},
        optional={
            "partitions": st.dictionaries(st.integers(0, 254).map(str), good_nodes, max_size=4),
            "producers": st.lists(good_nodes, max_size=4),
            "channels": st.lists(st.text(max_size=8), max_size=3),
            "meta": st.fixed_dictionaries(
                {"partition_num": st.integers(0, 255)},
                optional={"replica": st.integers(0, 3), "ordered": st.booleans()},
            ),
        },
    )
    | st.fixed_dictionaries(
        {},
        optional={
            "partitions": st.dictionaries(partition_keys, nodes, max_size=4) | json_values,
            "producers": st.lists(nodes, max_size=4) | json_values,
            "channels": st.lists(st.text(max_size=8), max_size=3) | json_values,
            "meta": metas | json_values,
        },
    )
    | json_values
)


def _lookupd_node(host: st.SearchStrategy[Any], port: st.SearchStrategy[Any]) -> Any:
    return st.fixed_dictionaries(
        {"NodeIP": host, "HttpPort": port},
        optional={"TcpPort": ports, "ID": json_values, "Epoch": json_values},
    )


lookupd_nodes = (
    _lookupd_node(good_hosts, good_ports.map(str))
    | _lookupd_node(good_hosts, good_ports)
    | _lookupd_node(hosts | json_values, good_ports.map(str))
    | _lookupd_node(good_hosts, ports)
    | json_values
)
good_lookupd_nodes = _lookupd_node(good_hosts, good_ports.map(str) | good_ports)
listlookup_results = (
    st.fixed_dictionaries(
        {},
        optional={
            "lookupdleader": good_lookupd_nodes,
            "lookupdnodes": st.lists(good_lookupd_nodes, max_size=4),
        },
    )
    | st.fixed_dictionaries(
        {},
        optional={
            "lookupdleader": lookupd_nodes,
            "lookupdnodes": st.lists(lookupd_nodes, max_size=4) | json_values,
        },
    )
    | json_values
)
statuses = st.sampled_from([200, 200, 200, 400, 404, 500, 503]) | st.integers(100, 599)
header_sets = st.sampled_from(
    [{}, {"X-NSQ-Content-Type": "nsq; version=1.0"}, {"x-nsq-content-type": "nonsense"}]
)
formats = st.sampled_from(
    [
        MessageFormat.vanilla(),
        MessageFormat(),
        MessageFormat(ext=True),
        MessageFormat(detail=True),
        MessageFormat(ext=True, detail=True),
    ]
)
u64 = st.integers(0, 2**64 - 1)
messages = st.builds(
    DecodedMessage,
    timestamp=st.integers(-(2**63), 2**63 - 1),
    attempts=st.integers(0, 2**16 - 1),
    id=st.binary(min_size=16, max_size=16),
    body=st.binary(max_size=100),
    ext_version=st.sampled_from([EXT_VERSION_NONE, EXT_VERSION_TAG, EXT_VERSION_JSON, 255]),
    ext_data=st.binary(max_size=40),
    offset=u64,
    raw_size=st.integers(0, 2**32 - 1),
)


def _encode_in(message: DecodedMessage, fmt: MessageFormat) -> bytes:
    if message.ext_version == EXT_VERSION_NONE:
        message = message._replace(ext_data=b"")  # version 0 carries no ext data
    return encode_message(message, fmt)


def _mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Apply (kind, position, byte) edits: 0 flips a byte, 1 inserts one, 2 deletes one."""
    out = bytearray(data)
    for kind, position, value in edits:
        at = position % (len(out) + 1)
        if kind == 0 and at < len(out):
            out[at] ^= value or 1
        elif kind == 1:
            out.insert(at, value)
        elif at < len(out):
            del out[at]
    return bytes(out)


edits = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 10**6), st.integers(0, 255)), max_size=4
)
#: message frame data: valid in some layout (maybe not the decoder's), mutated, or random
message_data = (
    st.builds(_mutate, st.builds(_encode_in, messages, formats), edits)
    | st.binary(min_size=MESSAGE_HEADER_SIZE, max_size=200)
    | st.binary(max_size=40)
)
frames = st.builds(Frame, st.sampled_from(FrameType), st.binary(max_size=200))
frame_streams = st.lists(frames, max_size=8).map(lambda fs: b"".join(f.encode() for f in fs))
valid_streams = frame_streams | st.sampled_from(GOLDEN_STREAMS)


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    """Split ``data`` at the given offsets (taken modulo its length, so any ints do)."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


# --- 1. frames -------------------------------------------------------------------------------


def feed(decoder: FrameDecoder, data: bytes) -> list[Frame]:
    """Add ``data`` to ``decoder`` and return every frame it completed."""
    decoder.receive_data(data)
    frames: list[Frame] = []
    while (parts := decoder.next_parts()) is not None:
        frames.append(Frame(*parts))
    return frames


def _decode_stepwise(chunks: list[bytes], max_frame_size: int) -> tuple[list[Frame], str | None]:
    """Decode with receive_data/next_parts (keeps frames completed before an error)."""
    decoder = FrameDecoder(max_frame_size)
    out: list[Frame] = []
    error: RemoteProtocolError | None = None
    try:
        for chunk in chunks:
            out += feed(decoder, chunk)
        decoder.feed_eof()
    except RemoteProtocolError as exc:
        error = exc
    if error is None:
        return out, None
    # broken for good: every later call raises the same error, and nothing stays buffered
    assert decoder.buffered == 0
    for call in (lambda: decoder.receive_data(b"more"), decoder.next_parts, decoder.feed_eof):
        with pytest.raises(RemoteProtocolError) as again:
            call()
        assert again.value is error
    return out, str(error)


@fuzz
@given(
    data=st.binary(max_size=600),
    cuts=st.lists(st.integers(0, 10**6), max_size=12),
    limit=st.sampled_from([4, 5, 16, 64, 300, DEFAULT_MAX_FRAME_SIZE]),
)
@example(data=b"\x7f\xff\xff\xff", cuts=[], limit=DEFAULT_MAX_FRAME_SIZE)
@example(data=b"\x00\x00\x00\x03\x00\x00\x00\x00", cuts=[1, 2, 3], limit=64)
@example(data=b"\x00\x00\x00\x04\x00\x00\x00\x07", cuts=[], limit=64)  # unknown type 7
@example(data=b"\x00\x00\x00\x04\xff\xff\xff\xff", cuts=[5], limit=64)  # type -1
@example(data=b"\x00\x00\x00\x09\x00\x00\x00\x00OK", cuts=[], limit=64)  # cut body
def test_arbitrary_bytes_in_any_chunks_decode_alike_or_fail_typed(
    data: bytes, cuts: list[int], limit: int
) -> None:
    """Garbage gives frames or RemoteProtocolError, and the same result whatever the chunks."""
    whole = _decode_stepwise([data], limit)
    assert _decode_stepwise(_cut(data, cuts), limit) == whole
    # byte by byte as well (the most extreme chunking)
    assert _decode_stepwise([data[i : i + 1] for i in range(len(data))], limit) == whole
    frames_out, error = whole
    event("error" if error else "frames")
    assert all(len(f.data) + 4 <= limit for f in frames_out)
    if error is None:
        assert b"".join(f.encode() for f in frames_out) == data


@fuzz
@given(stream=valid_streams, cuts=st.lists(st.integers(0, 10**6), max_size=20))
def test_any_chunking_of_a_valid_stream_gives_the_frames_of_one_chunk(
    stream: bytes, cuts: list[int]
) -> None:
    one = feed(FrameDecoder(), stream)
    decoder = FrameDecoder()
    chunked: list[Frame] = []
    for chunk in _cut(stream, cuts):
        chunked += feed(decoder, chunk)
    assert chunked == one
    assert b"".join(f.encode() for f in one) == stream
    assert decoder.buffered == 0
    decoder.feed_eof()


@fuzz
@given(stream=valid_streams, data=st.data())
def test_a_truncated_stream_gives_the_whole_frames_and_fails_at_eof(
    stream: bytes, data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, len(stream)), label="cut")
    whole = feed(FrameDecoder(), stream)
    decoder = FrameDecoder()
    got = feed(decoder, stream[:cut])
    assert got == whole[: len(got)]
    consumed = sum(len(f.encode()) for f in got)
    assert decoder.buffered == cut - consumed
    if cut == consumed:
        decoder.feed_eof()  # cut between frames: a clean end
    else:
        with pytest.raises(RemoteProtocolError, match="closed inside a frame"):
            decoder.feed_eof()


@fuzz
@given(
    limit=st.sampled_from([4, 100, DEFAULT_MAX_FRAME_SIZE, max_frame_size_for(64 * 1024 * 1024)]),
    data=st.data(),
)
@example(limit=DEFAULT_MAX_FRAME_SIZE, data=None)  # the 2**31-1 header below
def test_a_size_header_over_the_limit_fails_on_its_fourth_byte(
    limit: int, data: st.DataObject | None
) -> None:
    if data is None:
        size, rest = 2**31 - 1, b"\x00\x00\x00\x02" + b"x" * 100
    else:
        size = data.draw(st.integers(limit + 1, 2**32 - 1) | st.integers(0, 3), label="size")
        rest = data.draw(st.binary(max_size=64), label="rest")
    header = struct.pack(">I", size)
    decoder = FrameDecoder(limit)
    for byte in header[:3]:
        assert feed(decoder, bytes([byte])) == []
    with pytest.raises(RemoteProtocolError, match=r"exceeds the limit|below 4"):
        feed(decoder, header[3:])
    assert decoder.buffered == 0
    with pytest.raises(RemoteProtocolError):
        feed(decoder, rest)
    assert decoder.buffered == 0


def test_a_2gib_header_is_refused_without_allocating_it() -> None:
    """The decoder keeps no more than what arrived: tracemalloc sees kilobytes, not 2 GiB."""
    decoder = FrameDecoder()  # the connection default: 4 MiB + message overhead
    chunk = b"\x00" * 65536
    tracemalloc.start()
    try:
        with pytest.raises(RemoteProtocolError, match="2147483647 exceeds the limit"):
            feed(decoder, b"\x7f\xff\xff\xff")
        for _ in range(16):  # a server that keeps sending after its lie: refused, not buffered
            with pytest.raises(RemoteProtocolError):
                feed(decoder, chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024
    assert decoder.buffered == 0


def test_the_frame_limit_for_a_max_msg_size() -> None:
    """max_frame_size_for(max_msg_size) is the largest legal frame (the connection uses it, and
    never less than the default: see test_a_frame_within_a_raised_max_msg_size_is_legal)."""
    assert max_frame_size_for(1024 * 1024) < DEFAULT_MAX_FRAME_SIZE
    big = 64 * 1024 * 1024
    limit = max_frame_size_for(big)
    decoder = FrameDecoder(limit)
    decoder.receive_data(struct.pack(">Ii", limit, 2))
    assert decoder.next_parts() is None  # at the limit: waits for the body
    decoder = FrameDecoder(limit)
    decoder.receive_data(struct.pack(">I", limit + 1))
    with pytest.raises(RemoteProtocolError, match="exceeds the limit"):
        decoder.next_parts()


@fuzz
@given(
    data=st.binary(max_size=120)
    | st.sampled_from(
        [
            b"E_FIN_FAILED FIN [0 0 3 231 0 0 0 0 0 0 0 0 0 0 0 0] failed",
            b"E_FIN_FAILED FIN [999 0 3 231 0 0 0 0 0 0 0 0 0 0 0 0] failed",
            b"E_TOUCH_FAILED TOUCH 0123456789abcdef failed",
            b"too much client connections",
        ]
    )
    | st.text(max_size=60).map(lambda t: ("E_REQ_FAILED REQ " + t).encode()),
    after=st.sampled_from([None, b"PUB", b"SUB", b"FIN", b"MPUB_EXT", b"DPUB"]),
    fork=st.booleans(),
)
def test_error_frame_data_always_becomes_a_broker_error(
    data: bytes, after: bytes | None, fork: bool
) -> None:
    error = parse_error_frame(data)
    assert isinstance(error, BrokerError)
    assert isinstance(closes_connection(type(error), after, fork=fork), bool)
    assert isinstance(must_drop(type(error), after, fork=fork), bool)
    message_id = getattr(error, "message_id", None)
    assert message_id is None or len(message_id) == 16


# --- 2. messages -----------------------------------------------------------------------------


def _parts_size(fmt: MessageFormat, message: DecodedMessage) -> int:
    """Bytes before the body of ``message`` encoded in ``fmt``."""
    size = MESSAGE_HEADER_SIZE
    if fmt.ext:
        size += 1
        if message.ext_version:
            size += 2 + len(message.ext_data or b"")
    if fmt.detail:
        size += 12
    return size


def _check_json_header(message: DecodedMessage) -> None:
    try:
        header = message.json_header()
    except RemoteProtocolError:
        return
    assert isinstance(header, dict)


@fuzz
@given(data=message_data, fmt=formats)
@example(data=b"", fmt=MessageFormat.vanilla())
@example(data=b"\x00" * 25, fmt=MessageFormat())
@example(data=b"\x00" * 26 + b"\x04\x00", fmt=MessageFormat(ext=True))  # cut ext length
@example(data=b"\x00" * 26 + b"\x04\xff\xff{}", fmt=MessageFormat(ext=True))  # ext too long
@example(data=b"\x00" * 26 + b"\x04\x00\x01[", fmt=MessageFormat(ext=True))  # bad JSON
@example(data=b"\x00" * 26 + b"\x04\x00\x02\xff\xfe", fmt=MessageFormat(ext=True))  # not UTF-8
@example(data=b"\x00" * 37, fmt=MessageFormat(detail=True))  # 11 of 12 detail bytes
def test_arbitrary_message_data_decodes_and_reencodes_or_fails_typed(
    data: bytes, fmt: MessageFormat
) -> None:
    try:
        message = decode_message(data, fmt)
    except RemoteProtocolError:
        event("refused")
        return
    event("decoded")
    assert encode_message(message, fmt) == data  # what decodes, re-encodes to the same bytes
    assert (message.internal_id is not None) == fmt.fork_ids
    assert (message.offset is not None) == fmt.detail
    assert (message.ext_version is not None) == fmt.ext
    _check_json_header(message)


@fuzz
@given(message=messages, fmt=formats, data=st.data())
def test_a_truncated_message_fails_typed_inside_its_parts_and_keeps_a_body_prefix(
    message: DecodedMessage, fmt: MessageFormat, data: st.DataObject
) -> None:
    if message.ext_version == EXT_VERSION_NONE:
        message = message._replace(ext_data=b"")
    wire = _encode_in(message, fmt)
    cut = data.draw(st.integers(0, len(wire)), label="cut")
    head = _parts_size(fmt, message)
    if cut < head:
        with pytest.raises(RemoteProtocolError):
            decode_message(wire[:cut], fmt)
        return
    decoded = decode_message(wire[:cut], fmt)
    assert decoded.body == message.body[: cut - head]
    assert decoded.id == message.id
    assert decoded.timestamp == message.timestamp
    if fmt.detail:
        assert (decoded.offset, decoded.raw_size) == (message.offset, message.raw_size)
    if fmt.ext:
        assert decoded.ext_version == message.ext_version
        assert decoded.ext_data == (message.ext_data or b"")


@fuzz
@given(
    ext=json_values.map(lambda v: json.dumps(v).encode())
    | st.binary(max_size=60)
    | st.sampled_from([b"[" * 50_000, b'{"a":' * 50_000, b"1" * 5000, b"\xef\xbb\xbf{}"]),
    version=st.sampled_from([EXT_VERSION_JSON, EXT_VERSION_TAG, 7]),
)
def test_any_ext_header_gives_a_dict_or_a_typed_error(ext: bytes, version: int) -> None:
    ext = ext[:0xFFFF]
    message = DecodedMessage(
        timestamp=0, attempts=1, id=bytes(16), body=b"b", ext_version=version, ext_data=ext
    )
    fmt = MessageFormat(ext=True)
    decoded = decode_message(encode_message(message, fmt), fmt)
    assert decoded.ext_data == ext
    _check_json_header(decoded)


# --- 3. lookupd answers ----------------------------------------------------------------------


def _check_node(node: NodeInfo) -> None:
    assert isinstance(node.broadcast_address, str)
    assert node.broadcast_address
    assert 0 < node.tcp_port <= 65535
    assert 0 <= node.http_port <= 65535
    # what the client builds from a node must not raise later either: the HTTP URL (setoffset)
    # and the TCP address a connection is made for
    httpx.URL(f"{node.http_url}/channel/setoffset")
    conn = NsqdConnection(node.address)
    assert (conn.host, conn.port) == (node.broadcast_address, node.tcp_port)


def _check_map(pmap: PartitionMap) -> None:
    for partition, node in pmap.partitions.items():
        assert 0 <= partition <= 254
        _check_node(node)
    for node in pmap.producers:
        _check_node(node)
    assert all(isinstance(c, str) for c in pmap.channels)
    assert pmap.partition_num >= 0
    assert len(pmap.routes()) == (len(pmap.partitions) if pmap.fork else len(pmap.producers))
    merged = merge_maps([pmap, pmap])
    assert merged.partitions == pmap.partitions


def _parse_everything(result: object) -> None:
    """parse_lookup and parse_listlookup on one result: data or a typed error, checked."""
    for access in ("r", "w"):
        try:
            pmap = parse_lookup("t", access, result)
        except RemoteProtocolError:
            event("lookup: refused")
        else:
            event(f"lookup: {len(pmap.routes())} routes")
            _check_map(pmap)
    try:
        urls = parse_listlookup(result)
    except RemoteProtocolError:
        event("listlookup: refused")
        return
    event(f"listlookup: {len(urls)} urls")
    assert len(urls) == len(set(urls))
    for url in urls:
        parsed = httpx.URL(f"{url}/listlookup")  # must not raise InvalidURL later
        assert parsed.host
        assert 0 < (parsed.port or 80) < 65536  # httpx drops the scheme's default port 80


@fuzz
@given(result=lookup_results)
@example(result={"partitions": {None: {"broadcast_address": "h", "tcp_port": 1}}})  # TypeError
@example(result={"partitions": {"0": {"broadcast_address": "999.1.1.1", "tcp_port": 1}}})
@example(result={"producers": [{"broadcast_address": "a b", "tcp_port": 4150}]})
@example(result={"partitions": [{"broadcast_address": "h", "tcp_port": 1}]})
@example(result={"partitions": {"0": {"broadcast_address": "h", "tcp_port": -1}}})
@example(result={"producers": [{"broadcast_address": "h", "tcp_port": 0}]})  # ConfigError later
@example(result={"meta": {"partition_num": 10**400}})
def test_any_lookup_result_parses_or_fails_typed(result: object) -> None:
    _parse_everything(result)


@fuzz
@given(result=listlookup_results)
@example(result={"lookupdnodes": [{"NodeIP": "h", "HttpPort": "\u00b2"}]})  # httpx InvalidURL
@example(result={"lookupdnodes": [{"NodeIP": "h", "HttpPort": 99999999}]})
@example(result={"lookupdnodes": [{"NodeIP": "h", "HttpPort": -1}]})
@example(result={"lookupdnodes": [{"NodeIP": {"a": 1}, "HttpPort": "4161"}]})
@example(result={"lookupdnodes": [{"NodeIP": "x:y", "HttpPort": "4161"}]})
@example(result={"lookupdnodes": [{"NodeIP": "h", "HttpPort": "0" * 5000}]})
@example(result={"lookupdleader": {"NodeIP": "h", "HttpPort": True}})
@example(result={"lookupdnodes": [{"NodeIP": "127.0.0.1", "HttpPort": "80"}]})  # port 80 elided
def test_any_listlookup_result_parses_or_fails_typed(result: object) -> None:
    _parse_everything(result)


@fuzz
@given(
    status=statuses,
    headers=header_sets,
    body=st.binary(max_size=200)
    | st.sampled_from([body for _, _, body in GOLDEN_LOOKUP_ANSWERS])
    | (lookup_results | listlookup_results).map(lambda v: json.dumps(v).encode()),
    wrap=st.sampled_from([None, 200, 500, "200", None]),
)
@example(status=200, headers={}, body=b"[" * 100_000, wrap=None)  # RecursionError leaked
@example(status=500, headers={}, body=b"[" * 100_000, wrap=None)
@example(status=200, headers={}, body=b"1" * 5000, wrap=None)  # ValueError (4300 digits) leaked
@example(status=404, headers={}, body=b'{"message": ' + b"1" * 5000 + b"}", wrap=None)
@example(status=200, headers={}, body=b"\xff\xfe\x00{", wrap=None)
def test_any_lookupd_answer_unwraps_and_parses_or_fails_typed(
    status: int, headers: dict[str, str], body: bytes, wrap: object
) -> None:
    if wrap is not None:
        try:
            inner = json.loads(body)
        except (ValueError, RecursionError):
            inner = body.decode("utf-8", "replace")
        body = json.dumps({"status_code": wrap, "status_txt": "x", "data": inner}).encode()
    error: LookupdError | None = None
    refused: RemoteProtocolError | None = None
    try:
        result = unwrap(status, headers, body, "http://lookupd:4161/lookup")
    except LookupdError as exc:
        error = exc
    except RemoteProtocolError as exc:  # a lie refused unparsed (e.g. too many containers)
        refused = exc
    if refused is not None:
        event("unwrap: RemoteProtocolError")
        assert "refused unparsed" in str(refused)
        return
    if error is not None:
        event("unwrap: LookupdError")
        assert isinstance(error.status, int)
        return
    _parse_everything(result)


def test_the_recorded_lookupd_answers_still_parse() -> None:
    """The fixes refuse lies only: every real answer recorded from lookupd still parses."""
    parsed = 0
    for status, headers, body in GOLDEN_LOOKUP_ANSWERS:
        if status != 200:
            continue
        result = unwrap(status, headers, body)
        if isinstance(result, dict) and ("lookupdnodes" in result or "lookupdleader" in result):
            assert parse_listlookup(result)
        elif isinstance(result, dict):
            _check_map(parse_lookup("t", "r", result))
        parsed += 1
    assert parsed >= 5


# --- 4. IDENTIFY / AUTH answers --------------------------------------------------------------


def _check_negotiated(negotiated: Negotiated) -> None:
    assert isinstance(negotiated.feature_negotiation, bool)
    assert negotiated.version is None or isinstance(negotiated.version, str)
    assert isinstance(negotiated.is_fork, bool | None)
    for value in (negotiated.max_rdy_count, negotiated.deflate_level, negotiated.sample_rate):
        assert value is None or -(2**63) <= value < 2**63
    for seconds in (
        negotiated.msg_timeout,
        negotiated.max_msg_timeout,
        negotiated.output_buffer_timeout,
    ):
        assert seconds is None or math.isfinite(seconds)
    for flag in (negotiated.tls_v1, negotiated.snappy, negotiated.deflate):
        assert isinstance(flag, bool)


def _mutated_answers() -> st.SearchStrategy[bytes]:
    """Real IDENTIFY answers with keys dropped and values replaced by any JSON."""

    def mutate(base: dict[str, Any], drop: list[str], replace: dict[str, Any]) -> bytes:
        answer = {k: v for k, v in base.items() if k not in drop}
        answer.update(replace)
        return json.dumps(answer).encode()

    keys = sorted({k for answer in GOLDEN_IDENTIFY_JSON for k in answer})
    return st.builds(
        mutate,
        st.sampled_from(GOLDEN_IDENTIFY_JSON),
        st.lists(st.sampled_from(keys), max_size=4),
        st.dictionaries(st.sampled_from([*keys, "unknown"]), json_values, max_size=3),
    )


identify_answers = (
    st.binary(max_size=120)
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.tuples(json_values, st.sampled_from(["utf-8", "utf-16", "utf-32", "utf-8-sig"])).map(
        lambda ve: json.dumps(ve[0]).encode(ve[1])
    )
    | _mutated_answers()
    | st.sampled_from([b"OK", b"OK\n", b"ok", b""])
)


@fuzz
@given(data=identify_answers, request=st.sampled_from([None, {}, {"heartbeat_interval": -1}]))
@example(data=b'{"msg_timeout": 1' + b"0" * 400 + b"}", request=None)  # OverflowError leaked
@example(data=b'{"output_buffer_timeout": -1' + b"0" * 310 + b"}", request=None)
@example(data=b'{"max_rdy_count": 9223372036854775808}', request=None)
@example(data=b"[" * 100_000, request=None)
@example(data=b"1" * 5000, request=None)
@example(data=b"\xff\xfe\x00\x00", request=None)
@example(data=b"OK", request={"heartbeat_interval": 5000, "extend_support": True})
def test_any_identify_answer_negotiates_or_fails_typed(
    data: bytes, request: dict[str, object] | None
) -> None:
    try:
        negotiated = parse_identify_response(data, request)
    except RemoteProtocolError:
        event("refused")
        return
    event("negotiated")
    _check_negotiated(negotiated)
    if data == b"OK":
        assert negotiated.feature_negotiation is False
        assert negotiated.raw is None
    else:
        assert negotiated.feature_negotiation is True
        assert isinstance(negotiated.raw, dict)


def test_plain_ok_and_the_recorded_answers() -> None:
    plain = parse_identify_response(b"OK", {"heartbeat_interval": 5000, "extend_support": True})
    assert plain.feature_negotiation is False
    assert plain.heartbeat_interval == 5.0
    assert plain.extend_support is True
    for frame, fork in ((VANILLA_IDENTIFY, False), (FORK_IDENTIFY, True)):
        negotiated = parse_identify_response(frame[FRAME_HEADER_SIZE:])
        _check_negotiated(negotiated)
        assert negotiated.is_fork is fork


@fuzz
@given(
    data=st.binary(max_size=80)
    | st.fixed_dictionaries(
        {},
        optional={"identity": json_values, "identity_url": json_values, "permission_count": ports},
    ).map(lambda v: json.dumps(v).encode())
)
def test_any_auth_answer_parses_or_fails_typed(data: bytes) -> None:
    try:
        answer = parse_auth_response(data)
    except RemoteProtocolError:
        return
    assert isinstance(answer["identity"], str)
    assert isinstance(answer["permission_count"], int)


# --- 6. a server that lies -------------------------------------------------------------------

#: No scenario may take longer than this (the client's own timeouts are set far above it, so
#: an answer that only a timeout ends counts as a hang).
HANG_LIMIT = 5.0
Script = Callable[["Peer"], Awaitable[None]]


class Peer:
    """The fake nsqd's side of one connection: read the client's commands, write lies."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self._decoder = CommandDecoder()

    async def next_event(self) -> Magic | ClientCommand:
        """The client's next magic or command (IncompleteReadError when it hung up)."""
        while (got := self._decoder.pop()) is None:
            data = await self.reader.read(65536)
            if not data:
                raise asyncio.IncompleteReadError(b"", None)
            self._decoder.receive(data)
        return got

    async def expect(self, name: bytes) -> ClientCommand:
        """Read the next command and check it is ``name``."""
        got = await self.next_event()
        if not isinstance(got, ClientCommand) or got.name != name:
            raise AssertionError(f"fake nsqd expected {name!r}, got {got!r}")
        return got

    async def handshake(self, answer: bytes | None = VANILLA_IDENTIFY) -> None:
        """Read magic and IDENTIFY; write ``answer`` (a whole frame) if given."""
        magic = await self.next_event()
        if magic != Magic(b"  V2"):
            raise AssertionError(f"fake nsqd got the magic {magic!r}")
        await self.expect(b"IDENTIFY")
        if answer is not None:
            await self.send(answer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def until_client_closes(self) -> None:
        """Keep the connection open (reading and ignoring) until the client hangs up."""
        while await self.reader.read(65536):
            pass


class FakeNsqd:
    """A one-script TCP server on 127.0.0.1; each connection runs ``script`` then closes."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.port = 0
        self.errors: list[BaseException] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> FakeNsqd:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self.script(Peer(reader, writer))
        except (OSError, asyncio.IncompleteReadError):
            pass  # the client hung up first
        except Exception as exc:  # a broken test script: reported at exit
            self.errors.append(exc)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        running = [t for t in self._tasks if not t.done()]
        if running:  # ends once the client closed its side
            _, stuck = await asyncio.wait(running, timeout=2.0)
            for task in stuck:
                task.cancel()
            assert not stuck, "the client left its socket open"
        if self.errors:
            raise self.errors[0]


class _ErrorLogs(logging.Handler):
    """Collects ERROR records of nsq_ha (the read loop logs an unexpected exception so)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.asynccontextmanager
async def lying_server(script: Script) -> AsyncIterator[FakeNsqd]:
    """Run ``script`` as nsqd; afterwards no task may be left and no error logged."""
    before = asyncio.all_tasks()
    handler = _ErrorLogs()
    logger = logging.getLogger("nsq_ha")
    logger.addHandler(handler)
    try:
        async with FakeNsqd(script) as server:
            yield server
        leaked = await _tasks_that_do_not_end(before)
    finally:
        logger.removeHandler(handler)
    assert not leaked, f"tasks left behind: {leaked}"
    assert not handler.records, [r.getMessage() for r in handler.records]


async def _tasks_that_do_not_end(before: set[asyncio.Task[Any]]) -> set[asyncio.Task[Any]]:
    """Tasks started since ``before`` that are still running after a short grace.

    The grace is for asyncio's own accept task: when the client gave up before the server
    accepted (its connect timeout), the accept and its handler run late, during teardown.
    """
    deadline = asyncio.get_running_loop().time() + 2.0
    while True:
        current = asyncio.current_task()
        running = {t for t in asyncio.all_tasks() - before if not t.done() and t is not current}
        remaining = deadline - asyncio.get_running_loop().time()
        if not running or remaining <= 0:
            return running
        await asyncio.wait(running, timeout=remaining)


def _config(**overrides: Any) -> ConnectionConfig:
    """Client timeouts far above HANG_LIMIT unless a test lowers them on purpose."""
    values: dict[str, Any] = {
        "client_id": "chaos",
        "hostname": "chaos-host",
        "connect_timeout": 30.0,
        "command_timeout": 30.0,
        "close_timeout": 1.0,
    }
    values.update(overrides)
    return ConnectionConfig(**values)


@contextlib.contextmanager
def _no_hang(what: str) -> Iterator[None]:
    """Turn asyncio.timeout's plain TimeoutError into a test failure (NsqTimeoutError passes)."""
    try:
        yield
    except TimeoutError as exc:
        if isinstance(exc, NsqError):
            raise
        raise AssertionError(f"{what}: no typed error within {HANG_LIMIT} s (hang)") from exc


async def _connect(server: FakeNsqd, config: ConnectionConfig) -> tuple[NsqdConnection, NsqError]:
    """Connect to a server that lies in the handshake; return the error it ended with."""
    conn = NsqdConnection(("127.0.0.1", server.port), config=config)
    with _no_hang("connect"):
        async with asyncio.timeout(HANG_LIMIT):
            try:
                await conn.connect()
            except NsqError as exc:
                assert conn.closed
                return conn, exc
    await conn.close()
    raise AssertionError(f"the handshake succeeded: {conn!r}")


async def _publish_fails(server: FakeNsqd, config: ConnectionConfig | None = None) -> NsqError:
    """Connect (the server answers IDENTIFY), publish, return how the publish failed."""
    with _no_hang("publish"):
        async with asyncio.timeout(HANG_LIMIT):
            conn = NsqdConnection(("127.0.0.1", server.port), config=config or _config())
            await conn.connect()
            try:
                await conn.command(PUB_CHAOS)
            except NsqError as exc:
                error = exc
            else:
                raise AssertionError("the publish succeeded")
            finally:
                await conn.close()
    assert conn.closed
    assert conn.close_reason is error  # the reader's error went to the waiter as it was
    with pytest.raises(ConnectionClosedError):  # and the connection stays unusable
        await conn.command(PUB_CHAOS)
    return error


OK_FRAME = encode_frame(FrameType.RESPONSE, b"OK")
#: the publish the connection tests send (the producer's path: a typed Publish via command())
PUB_CHAOS = Publish(b"PUB", "chaos", None, [PublishMessage(b"body")])

# (a) garbage where the IDENTIFY answer should be --------------------------------------------

garbage = (
    st.binary(max_size=64)
    | frames.map(Frame.encode)  # a well-formed frame of any type and content
    | st.tuples(
        st.integers(0, 2**32 - 1), st.integers(-(2**31), 2**31 - 1), st.binary(max_size=16)
    ).map(lambda t: struct.pack(">Ii", *t[:2]) + t[2])  # any header, any type
    | st.builds(
        lambda answer, rest: encode_frame(FrameType.RESPONSE, answer) + rest,
        _mutated_answers(),  # a valid response frame with a lying JSON answer
        st.binary(max_size=16),
    )
)


@lying_settings
@given(
    when=st.sampled_from(["at once", "after the magic", "after IDENTIFY"]),
    lie=garbage,
    then_close=st.booleans(),
)
@example(when="after IDENTIFY", lie=OK_FRAME, then_close=True)  # plain OK: accepted
@example(when="after IDENTIFY", lie=OK_FRAME + b"\x00\x00", then_close=False)  # then garbage
@example(when="after IDENTIFY", lie=encode_frame(0, b'{"tls_v1":true}'), then_close=True)
@example(when="after IDENTIFY", lie=encode_frame(0, b'{"snappy":true}'), then_close=False)
@example(when="after IDENTIFY", lie=encode_frame(1, b"E_BAD_BODY no"), then_close=False)
@example(when="at once", lie=b"HTTP/1.1 400 Bad Request\r\n\r\n", then_close=True)
def test_garbage_for_an_identify_answer_ends_in_a_typed_error(
    when: str, lie: bytes, then_close: bool
) -> None:
    async def script(peer: Peer) -> None:
        if when != "at once":
            await peer.next_event()  # the magic
        if when == "after IDENTIFY":
            await peer.expect(b"IDENTIFY")
        await peer.send(lie)
        if not then_close:
            await peer.until_client_closes()

    async def scenario() -> None:
        async with lying_server(script) as server:
            # a cut frame on an open socket ends only by the handshake timeout: keep it short
            conn = NsqdConnection(("127.0.0.1", server.port), config=_config(connect_timeout=0.5))
            with _no_hang("connect"):
                async with asyncio.timeout(HANG_LIMIT):
                    try:
                        await conn.connect()
                    except NsqError as exc:
                        event(f"connect: {type(exc).__name__}")
                        assert conn.closed
                        return
            event("connect: accepted")
            # the lie was a valid answer (plain OK, or JSON that happens to be acceptable)
            await conn.close()
            assert conn.closed
            assert conn.close_reason is None or isinstance(conn.close_reason, NsqError)

    asyncio.run(scenario())


# (b) a frame cut by a close -----------------------------------------------------------------


@pytest.mark.parametrize("cut", [2, 4, 6, 8, 20, len(VANILLA_IDENTIFY) - 1])
async def test_a_close_inside_the_identify_answer(cut: int) -> None:
    async def script(peer: Peer) -> None:
        await peer.handshake(answer=None)
        await peer.send(VANILLA_IDENTIFY[:cut])  # then close

    async with lying_server(script) as server:
        _, error = await _connect(server, _config())
    assert isinstance(error, ConnectionClosedError)
    assert "closed" in str(error)


@pytest.mark.parametrize("cut", [0, 1, 3, 4, 7, 8, 9])
async def test_a_close_inside_a_frame_after_the_handshake(cut: int) -> None:
    async def script(peer: Peer) -> None:
        await peer.handshake()
        await peer.expect(b"PUB")
        await peer.send(OK_FRAME[:cut])  # then close: partial size header, type or body

    async with lying_server(script) as server:
        error = await _publish_fails(server)
    if cut == 0:
        assert isinstance(error, ConnectionClosedError)
    else:
        assert isinstance(error, RemoteProtocolError)
        assert f"({cut} bytes pending)" in str(error)


# (c) a huge size header ---------------------------------------------------------------------

HUGE_SIZES = [2**31 - 1, 2**32 - 1, DEFAULT_MAX_FRAME_SIZE + 1]


@contextlib.contextmanager
def _peak_memory_below(limit: int) -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < limit, f"allocated {peak} bytes"


@pytest.mark.parametrize("size", HUGE_SIZES)
async def test_a_huge_identify_answer_header_is_refused_at_once(size: int) -> None:
    async def script(peer: Peer) -> None:
        await peer.handshake(answer=None)
        await peer.send(struct.pack(">I", size))  # only the size, and the socket stays open
        await peer.until_client_closes()

    with _peak_memory_below(2 * 1024 * 1024):
        async with lying_server(script) as server:
            _, error = await _connect(server, _config())
    assert isinstance(error, RemoteProtocolError)
    assert f"frame size {size} exceeds the limit" in str(error)


@pytest.mark.parametrize(
    ("max_msg_size", "size"),
    [
        *((None, s) for s in HUGE_SIZES),
        (64 * 1024 * 1024, max_frame_size_for(64 * 1024 * 1024) + 1),
    ],
)
async def test_a_huge_frame_header_after_the_handshake_is_refused_at_once(
    max_msg_size: int | None, size: int
) -> None:
    async def script(peer: Peer) -> None:
        await peer.handshake()
        await peer.expect(b"PUB")
        await peer.send(struct.pack(">Ii", size, 0) + b"x" * 100)  # and never the rest
        await peer.until_client_closes()

    config = _config() if max_msg_size is None else _config(max_msg_size=max_msg_size)
    with _peak_memory_below(2 * 1024 * 1024):
        async with lying_server(script) as server:
            error = await _publish_fails(server, config)
    assert isinstance(error, RemoteProtocolError)
    assert f"frame size {size} exceeds the limit" in str(error)


async def test_a_frame_within_a_raised_max_msg_size_is_legal() -> None:
    """The connection's limit follows config.max_msg_size: with 64 MiB, a frame just over the
    default limit is legal, so the client waits for its body (a close inside it is the error)."""
    size = DEFAULT_MAX_FRAME_SIZE + 1

    async def script(peer: Peer) -> None:
        await peer.handshake()
        await peer.expect(b"PUB")
        await peer.send(struct.pack(">Ii", size, 0) + b"x" * 100)  # then close

    async with lying_server(script) as server:
        error = await _publish_fails(server, _config(max_msg_size=64 * 1024 * 1024))
    assert isinstance(error, RemoteProtocolError)
    assert "closed inside a frame (108 bytes pending)" in str(error)


# (d) a well-formed frame of an unknown type -------------------------------------------------

UNKNOWN_TYPES = [3, 7, -1, 2**31 - 1, -(2**31)]


@pytest.mark.parametrize("frame_type", UNKNOWN_TYPES)
async def test_an_unknown_frame_type_as_the_identify_answer(frame_type: int) -> None:
    async def script(peer: Peer) -> None:
        await peer.handshake(answer=encode_frame(frame_type, b"OK"))
        await peer.until_client_closes()

    async with lying_server(script) as server:
        _, error = await _connect(server, _config())
    assert isinstance(error, RemoteProtocolError)
    assert f"unknown frame type {frame_type}" in str(error)


async def test_a_message_frame_as_the_identify_answer() -> None:
    async def script(peer: Peer) -> None:
        await peer.handshake(answer=encode_frame(FrameType.MESSAGE, bytes(30)))
        await peer.until_client_closes()

    async with lying_server(script) as server:
        _, error = await _connect(server, _config())
    assert isinstance(error, RemoteProtocolError)


@pytest.mark.parametrize("frame_type", UNKNOWN_TYPES)
async def test_an_unknown_frame_type_after_the_handshake(frame_type: int) -> None:
    async def script(peer: Peer) -> None:
        await peer.handshake()
        await peer.expect(b"PUB")
        await peer.send(encode_frame(frame_type, b"OK"))
        await peer.until_client_closes()

    async with lying_server(script) as server:
        error = await _publish_fails(server)
    assert isinstance(error, RemoteProtocolError)
    assert f"unknown frame type {frame_type}" in str(error)


@pytest.mark.parametrize(
    ("asked", "answer", "match"),
    [
        ({}, {"tls_v1": True}, "started TLS that was not asked for"),
        ({}, {"snappy": True}, "started snappy that was not asked for"),
        ({}, {"deflate": True}, "started deflate that was not asked for"),
        ({"snappy": True}, {"snappy": True, "deflate": True}, "both snappy and deflate"),
        ({"deflate": True}, {"deflate": True, "deflate_level": -3}, "deflate level -3"),
        ({}, {"auth_required": True}, "requires AUTH and no auth_secret"),
    ],
)
async def test_an_upgrade_lie_in_the_identify_answer(
    asked: dict[str, Any], answer: dict[str, Any], match: str
) -> None:
    """Upgrades nobody asked for (or cannot do) end the handshake with a HandshakeError."""
    frame = encode_frame(FrameType.RESPONSE, json.dumps({"version": "1.3.0", **answer}).encode())

    async def script(peer: Peer) -> None:
        await peer.handshake(answer=frame)
        await peer.until_client_closes()

    async with lying_server(script) as server:
        _, error = await _connect(server, _config(**asked))
    assert isinstance(error, HandshakeError)
    assert match in str(error)


# (e) a message frame with a short body ------------------------------------------------------


@pytest.mark.parametrize(
    ("fork", "ordered", "extend_support", "data", "match"),
    [
        (False, False, False, b"", "fewer than the 26-byte header"),
        (False, False, False, bytes(10), "fewer than the 26-byte header"),
        (False, False, False, bytes(25), "fewer than the 26-byte header"),
        (True, False, False, bytes(20), "fewer than the 26-byte header"),
        (True, True, False, bytes(26 + 11), "inside its offset/raw-size part"),
        (True, False, True, bytes(26), "before its ext version byte"),
        (True, False, True, bytes(26) + b"\x04\x00", "inside its ext length"),
        (True, False, True, bytes(26) + b"\x04\x00\x64{}", "inside its 100-byte ext data"),
    ],
)
async def test_a_message_frame_with_a_short_body(
    fork: bool, ordered: bool, extend_support: bool, data: bytes, match: str
) -> None:
    async def script(peer: Peer) -> None:
        await peer.handshake(FORK_IDENTIFY if fork else VANILLA_IDENTIFY)
        await peer.expect(b"SUB_ORDERED" if ordered else b"SUB")
        await peer.send(OK_FRAME)
        await peer.expect(b"RDY")
        await peer.send(encode_frame(FrameType.MESSAGE, data))
        await peer.until_client_closes()

    async with lying_server(script) as server:
        config = _config(extend_support=extend_support)
        with _no_hang("subscribe"):
            async with asyncio.timeout(HANG_LIMIT):
                received: list[DecodedMessage] = []
                conn = NsqdConnection(
                    ("127.0.0.1", server.port), config=config, on_message=received.append
                )
                await conn.connect()
                try:
                    await conn.subscribe("chaos", "ch", 0 if fork else None, ordered=ordered)
                    conn.rdy(1)
                    await conn.wait_closed()
                finally:
                    await conn.close()
    assert received == []
    assert conn.in_flight == 0
    assert isinstance(conn.close_reason, RemoteProtocolError)
    assert match in str(conn.close_reason)
    with pytest.raises(ConnectionClosedError):
        conn.rdy(1)


async def test_the_fake_server_speaks_enough_nsq_for_a_clean_run() -> None:
    """Control: with honest answers the same client publishes and closes without error."""

    async def script(peer: Peer) -> None:
        await peer.handshake()
        await peer.expect(b"PUB")
        await peer.send(OK_FRAME)
        await peer.until_client_closes()

    async with lying_server(script) as server:
        async with asyncio.timeout(HANG_LIMIT):
            async with NsqdConnection(("127.0.0.1", server.port), config=_config()) as conn:
                assert await conn.command(PUB_CHAOS) == b"OK"
                assert conn.negotiated.version == "1.3.0"
    assert conn.close_reason is None
    with pytest.raises(LocalProtocolError):
        await conn.connect()
