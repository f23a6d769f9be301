"""Conformance: the same cases on the real fork cluster and on the in-process devcluster.

Every case runs twice through the module-scoped ``backend`` fixture (ids ``devcluster`` and
``fork``).  The real server is the reference: where the wire is deterministic (error frames,
``OK``, ``CLOSE_WAIT``, traced answers on fresh partitions, IDENTIFY JSON, message frames
with the timestamp masked) the bytes are compared exactly; elsewhere the sequence of frame
types, error codes and connection outcomes.  The section numbers in the docstrings point to
PROTOCOL.md.  The leader-move and node-stop cases come last: they change the cluster.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import snappy

from .backends import (
    EMPTY,
    EXT,
    FRESH_EXT,
    FRESH_OFFSET,
    FRESH_TRACE,
    ORDERED,
    PLAIN,
    REP,
    STOP,
    Backend,
    wait_for,
)
from .wire import (
    CLOSE_WAIT,
    FRAME_ERROR,
    FRAME_MESSAGE,
    FRAME_RESPONSE,
    HEARTBEAT,
    OK,
    Message,
    NoFrame,
    ServerClosed,
    Traced,
    Wire,
    fork_id,
    go_bytes,
    mask_timestamp,
    message_data,
    response_frame,
    traced_answer,
)

FORK_VERSION = "0.3.7-HA.1.13.0"
V1 = {"Accept": "application/vnd.nsq; version=1.0"}
UNKNOWN_TOPIC = "cf_no_such_topic"
#: a trace id whose bytes contain both "\n" and " ": FIN/REQ/TOUCH must be parsed by position
NASTY_TRACE = 0x0A200A200A200A20
#: an internal id that is never in flight
NOT_IN_FLIGHT = fork_id(999)

IDENT = {
    "client_id": "conformance",
    "hostname": "conformance-host",
    "user_agent": "conformance-probe/1.0",
}

#: the fork's IDENTIFY answer for a client that asked for nothing (§3.3), in key order
NEGOTIATED_DEFAULTS: dict[str, Any] = {
    "max_rdy_count": 2500,
    "version": FORK_VERSION,
    "max_msg_timeout": 900000,
    "msg_timeout": 60000,
    "tls_v1": False,
    "deflate": False,
    "deflate_level": 0,
    "max_deflate_level": 6,
    "snappy": False,
    "sample_rate": 0,
    "auth_required": False,
    "output_buffer_size": 100,
    "output_buffer_timeout": 50,
}


# -- helpers ----------------------------------------------------------------------------------


def compact(obj: Any) -> bytes:
    """JSON as Go's encoder writes it (no spaces)."""
    return json.dumps(obj, separators=(",", ":")).encode()


def fin_failed(msg_id: bytes) -> str:
    return (
        f"E_FIN_FAILED FIN {go_bytes(msg_id)} failed ErrType:7 ErrCode:0 : Message ID not in flight"
    )


def req_failed(msg_id: bytes) -> str:
    return f"E_REQ_FAILED REQ {go_bytes(msg_id)} failed Message ID not in flight"


def touch_failed(msg_id: bytes) -> str:
    return f"E_TOUCH_FAILED TOUCH {go_bytes(msg_id)} failed Message ID not in flight"


def identify(w: Wire, **fields: Any) -> None:
    """IDENTIFY without feature negotiation: the answer is ``OK``."""
    w.identify_body({**IDENT, **fields})
    w.expect_ok()


def prove_open_init(w: Wire) -> None:
    """NOP, then a second IDENTIFY (legal before SUB, §1.7) answered ``OK``."""
    w.command("NOP")
    identify(w)


def prove_open_subscribed(w: Wire) -> None:
    """NOP, then a FIN of an id not in flight, answered with the non-fatal E_FIN_FAILED."""
    w.command("NOP")
    w.send(b"FIN " + NOT_IN_FLIGHT + b"\n")
    w.expect_error(fin_failed(NOT_IN_FLIGHT))


def fin(w: Wire, msg_id: bytes) -> None:
    w.send(b"FIN " + msg_id + b"\n")


def req(w: Wire, msg_id: bytes, timeout_ms: int) -> None:
    w.send(b"REQ " + msg_id + b" " + str(timeout_ms).encode() + b"\n")


def touch(w: Wire, msg_id: bytes) -> None:
    w.send(b"TOUCH " + msg_id + b"\n")


def pub(w: Wire, topic: str, body: bytes, partition: int | None = 0) -> None:
    w.command(f"PUB {topic}" + ("" if partition is None else f" {partition}"), body)
    w.expect_ok()


def pub_trace(w: Wire, topic: str, body: bytes, trace: int, partition: int = 0) -> Traced:
    w.command(f"PUB_TRACE {topic} {partition}", struct.pack(">Q", trace) + body)
    frame = w.read_frame()
    assert frame.type == FRAME_RESPONSE, frame
    return Traced.parse(frame.data)


def ext_body(header: bytes, body: bytes) -> bytes:
    return struct.pack(">H", len(header)) + header + body


def pub_ext(w: Wire, topic: str, header: bytes, body: bytes, partition: int = 0) -> bytes:
    w.command(f"PUB_EXT {topic} {partition}", ext_body(header, body))
    frame = w.read_frame()
    assert frame.type == FRAME_RESPONSE, frame
    return frame.data


def mpub_body(messages: list[bytes]) -> bytes:
    out = struct.pack(">I", len(messages))
    for m in messages:
        out += struct.pack(">I", len(m)) + m
    return out


@dataclass
class Sub:
    """Parameters of one subscription."""

    topic: str
    channel: str
    partition: int | None = 0
    command: str = "SUB"
    ident: dict[str, Any] | None = None
    rdy: int | None = None

    @property
    def detail(self) -> bool:
        return self.command in ("SUB_ORDERED", "SUB_ADVANCED")

    @property
    def ext(self) -> bool:
        return bool(self.ident and self.ident.get("extend_support"))


def subscribe(address: str, sub: Sub) -> Wire:
    """A connection subscribed as ``sub`` says (``OK`` checked), RDY sent when given."""
    w = Wire(address)
    try:
        if sub.ident is not None:
            identify(w, **sub.ident)
        part = "" if sub.partition is None else f" {sub.partition}"
        w.command(f"{sub.command} {sub.topic} {sub.channel}{part}")
        w.expect_ok()
        if sub.rdy is not None:
            w.command(f"RDY {sub.rdy}")
    except BaseException:
        w.close()
        raise
    return w


def http(
    method: str,
    url: str,
    params: dict[str, str] | None = None,
    *,
    accept: bool = True,
    content: bytes | None = None,
) -> httpx.Response:
    """One HTTP request; ``accept`` sends the v1 ``Accept`` header (§5.1)."""
    with httpx.Client(timeout=10.0) as client:
        return client.request(
            method, url, params=params, headers=V1 if accept else {}, content=content
        )


def lookup(backend: Backend, params: dict[str, str], *, accept: bool = True) -> httpx.Response:
    return http("GET", f"{backend.lookupd_http}/lookup", params, accept=accept)


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


# == §1.1 the magic ===========================================================================


def test_bad_magic_is_rejected_and_closed(backend: Backend) -> None:
    """§1.1: a wrong magic gets one ``E_BAD_PROTOCOL`` error frame, then the close."""
    with Wire(backend.leader(PLAIN), magic=b"  V1") as w:
        w.expect(b"\x00\x00\x00\x12\x00\x00\x00\x01E_BAD_PROTOCOL")
        w.expect_closed()


def test_good_magic_gets_no_answer(backend: Backend) -> None:
    """§1.1: nsqd sends nothing after a good magic; the first frame answers the first command."""
    with Wire(backend.leader(PLAIN)) as w:
        w.expect_silence(0.5)
        identify(w)


# == §2.1 / §3 IDENTIFY =======================================================================


def test_identify_without_negotiation_answers_ok(backend: Backend) -> None:
    """§2.1: IDENTIFY without ``feature_negotiation`` is answered by a plain ``OK`` frame."""
    with Wire(backend.leader(PLAIN)) as w:
        w.identify_body({**IDENT, "feature_negotiation": False, "heartbeat_interval": 30000})
        w.expect(b"\x00\x00\x00\x06\x00\x00\x00\x00OK")
        w.expect_silence(0.3)


def test_identify_negotiation_defaults(backend: Backend) -> None:
    """§3.3: the negotiated JSON, byte for byte: key set, key order and the fork's defaults."""
    with Wire(backend.leader(PLAIN)) as w:
        w.identify_body({**IDENT, "feature_negotiation": True, "heartbeat_interval": 30000})
        w.expect(response_frame(compact(NEGOTIATED_DEFAULTS)))


@pytest.mark.parametrize(
    ("asked", "answered"),
    [
        pytest.param(
            {"output_buffer_size": 100000}, {"output_buffer_size": 65536}, id="obuf-clamped"
        ),
        pytest.param({"output_buffer_size": -1}, {"output_buffer_size": 1}, id="obuf-minus-1"),
        pytest.param({"output_buffer_timeout": 5}, {"output_buffer_timeout": 10}, id="obt-raised"),
        pytest.param({"msg_timeout": 5000}, {"msg_timeout": 5000}, id="msg-timeout"),
        pytest.param({"deflate": False, "deflate_level": 0}, {}, id="no-deflate-level-0"),
        pytest.param(
            {"desired_tag": "tagA", "extend_support": True, "some_unknown_key": 1},
            {"desired_tag": "tagA"},
            id="desired-tag-last",
        ),
    ],
)
def test_identify_negotiated_values(
    backend: Backend, asked: dict[str, Any], answered: dict[str, Any]
) -> None:
    """§3.1/§3.3: clamped and raised values, unknown keys ignored, ``desired_tag`` appended."""
    with Wire(backend.leader(PLAIN)) as w:
        w.identify_body({**IDENT, "feature_negotiation": True, **asked})
        w.expect(response_frame(compact({**NEGOTIATED_DEFAULTS, **answered})))
        prove_open_init(w)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        pytest.param(
            {"heartbeat_interval": 500}, "heartbeat interval (500) is invalid", id="hb-500"
        ),
        pytest.param(
            {"heartbeat_interval": 70000}, "heartbeat interval (70000) is invalid", id="hb-70000"
        ),
        pytest.param(
            {"output_buffer_size": 10}, "output buffer size (10) is invalid", id="obuf-10"
        ),
        pytest.param(
            {"output_buffer_timeout": 2000},
            "output buffer timeout (2000) is invalid",
            id="obt-2000",
        ),
        pytest.param({"msg_timeout": 500}, "msg timeout (500) is invalid", id="msg-timeout-500"),
        pytest.param({"sample_rate": 100}, "sample rate (100) is invalid", id="sample-rate-100"),
        pytest.param(
            {"heartbeat_interval": "1000"}, "failed to decode JSON body", id="string-for-int"
        ),
        pytest.param(
            {"desired_tag": "t" * 101}, "invalid tag len 101, exceed limit 100", id="tag-101"
        ),
    ],
)
def test_identify_validation_errors(backend: Backend, fields: dict[str, Any], error: str) -> None:
    """§2.1/§3.3: each out-of-range value is a fatal ``E_BAD_BODY IDENTIFY <message>``."""
    with Wire(backend.leader(PLAIN)) as w:
        w.identify_body({**IDENT, "feature_negotiation": True, **fields})
        w.expect_error_then_closed(f"E_BAD_BODY IDENTIFY {error}")


@pytest.mark.parametrize(
    ("size", "error"),
    [
        pytest.param(0, "E_BAD_BODY IDENTIFY invalid body size 0", id="size-0"),
        pytest.param(5242881, "E_BAD_BODY IDENTIFY body too big 5242881 > 5242880", id="too-big"),
    ],
)
def test_identify_body_size_errors(backend: Backend, size: int, error: str) -> None:
    """§2.1: a body length <= 0 or above MaxBodySize is fatal (answered from the length)."""
    with Wire(backend.leader(PLAIN)) as w:
        w.send(b"IDENTIFY\n" + struct.pack(">I", size))
        w.expect_error_then_closed(error)


def test_identify_snappy_and_deflate_is_fatal(backend: Backend) -> None:
    """§1.8: asking for snappy and deflate together is a fatal ``E_IDENTIFY_FAILED``."""
    with Wire(backend.leader(PLAIN)) as w:
        w.identify_body({**IDENT, "feature_negotiation": True, "snappy": True, "deflate": True})
        w.expect_error_then_closed(
            "E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"
        )


def test_identify_twice_before_sub_is_accepted(backend: Backend) -> None:
    """§1.7 (corrected): a second IDENTIFY before SUB is answered like the first."""
    with Wire(backend.leader(PLAIN)) as w:
        identify(w)
        identify(w, msg_timeout=5000)
        w.command(f"SUB {PLAIN} c_ident2 0")
        w.expect_ok()


def test_identify_after_sub_is_fatal(backend: Backend) -> None:
    """§1.7: IDENTIFY after SUB is ``E_INVALID cannot IDENTIFY in current state`` (F)."""
    with subscribe(backend.leader(PLAIN), Sub(PLAIN, "c_ident_after")) as w:
        w.identify_body(IDENT)
        w.expect_error_then_closed("E_INVALID cannot IDENTIFY in current state")


def test_identify_snappy_upgrade(backend: Backend) -> None:
    """§1.8: JSON in plain text, then an ``OK`` frame inside the snappy framed stream."""
    with Wire(backend.leader(PLAIN)) as w:
        w.identify_body({**IDENT, "feature_negotiation": True, "snappy": True})
        w.expect(response_frame(compact({**NEGOTIATED_DEFAULTS, "snappy": True})))
        decoder = snappy.StreamDecompressor()
        plain = b""
        while len(plain) < 10:
            chunk = w.recv_raw()
            assert chunk, "server closed during the snappy upgrade"
            plain += decoder.decompress(chunk)
        assert plain == response_frame(OK)


def test_identify_deflate_upgrade(backend: Backend) -> None:
    """§1.8: deflate level min(asked, 6) is echoed; then ``OK`` in raw DEFLATE."""
    with Wire(backend.leader(PLAIN)) as w:
        w.identify_body({**IDENT, "feature_negotiation": True, "deflate": True, "deflate_level": 3})
        answer = {**NEGOTIATED_DEFAULTS, "deflate": True, "deflate_level": 3}
        w.expect(response_frame(compact(answer)))
        decoder = zlib.decompressobj(-15)
        plain = b""
        while len(plain) < 10:
            chunk = w.recv_raw()
            assert chunk, "server closed during the deflate upgrade"
            plain += decoder.decompress(chunk)
        assert plain == response_frame(OK)


# == §1.4 heartbeats ==========================================================================


def test_heartbeat_arrives_at_the_interval(backend: Backend) -> None:
    """§1.4: with ``heartbeat_interval`` 1000 a ``_heartbeat_`` frame comes about 1 s later,
    also on a connection that never subscribes."""
    with Wire(backend.leader(PLAIN)) as w:
        identify(w, heartbeat_interval=1000)
        frame = w.read_frame(timeout=3.0, heartbeats=True)
        assert frame.raw == response_frame(HEARTBEAT)


def test_idle_connection_closed_after_missed_heartbeats(backend: Backend) -> None:
    """§1.4: no command for 3 intervals closes the connection, with no error frame, after
    the heartbeats of those intervals."""
    with Wire(backend.leader(PLAIN)) as w:
        identify(w, heartbeat_interval=1000)
        frames = []
        while True:
            try:
                frames.append(w.read_frame(timeout=10.0, heartbeats=True))
            except ServerClosed:
                break
        assert all(f.raw == response_frame(HEARTBEAT) for f in frames), frames
        assert len(frames) >= 2


# == §2.3 SUB, SUB_ORDERED, SUB_ADVANCED ======================================================


@pytest.mark.parametrize(
    ("command", "topic"),
    [
        pytest.param("SUB", PLAIN, id="SUB"),
        pytest.param("SUB_ADVANCED", PLAIN, id="SUB_ADVANCED"),
        pytest.param("SUB_ORDERED", ORDERED, id="SUB_ORDERED"),
    ],
)
def test_subscribe_answers_ok(backend: Backend, command: str, topic: str) -> None:
    """§2.3: a valid subscribe is answered ``OK``; nothing is delivered before RDY."""
    with Wire(backend.leader(topic)) as w:
        w.command(f"{command} {topic} c_subok_{command.lower()} 0")
        w.expect(b"\x00\x00\x00\x06\x00\x00\x00\x00OK")
        prove_open_subscribed(w)


def test_sub_without_partition_uses_the_led_partition(backend: Backend) -> None:
    """§2.0.3: ``SUB T C`` and ``PUB T`` on the leader use the partition it leads."""
    address = backend.leader(PLAIN)
    with subscribe(address, Sub(PLAIN, "c_nopart", None, rdy=1)) as sub, Wire(address) as p:
        pub(p, PLAIN, b"no-partition", None)
        assert sub.read_message().body == b"no-partition"


@dataclass(frozen=True)
class SubError:
    """A subscribe that must fail: where, how, and the exact fatal error."""

    node: Callable[[Backend], str]
    line: str
    error: str
    ident: dict[str, Any] | None = None


def _leader(topic: str, partition: int = 0) -> Callable[[Backend], str]:
    return lambda b: b.leader(topic, partition)


SUB_ERRORS = {
    # row 2
    "heartbeats-disabled": SubError(
        _leader(PLAIN),
        f"SUB {PLAIN} c_err 0",
        "E_INVALID cannot SUB with heartbeats disabled",
        {"heartbeat_interval": -1},
    ),
    # row 3
    "too-few-params": SubError(
        _leader(PLAIN), f"SUB {PLAIN}", "E_INVALID SUB insufficient number of parameters"
    ),
    # row 4
    "bad-topic": SubError(
        _leader(PLAIN),
        "SUB bad!topic c_err 0",
        'E_BAD_TOPIC SUB topic name "bad!topic" is not valid',
    ),
    "topic-65-chars": SubError(
        _leader(PLAIN),
        f"SUB {'t' * 65} c_err 0",
        f'E_BAD_TOPIC SUB topic name "{"t" * 65}" is not valid',
    ),
    # row 5
    "bad-channel": SubError(
        _leader(PLAIN),
        f"SUB {PLAIN} bad!ch 0",
        'E_BAD_CHANNEL SUB channel name "bad!ch" is not valid',
    ),
    # row 6
    "bad-partition": SubError(
        _leader(PLAIN),
        f"SUB {PLAIN} c_err x",
        'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "x": invalid syntax',
    ),
    # row 8
    "unknown-topic": SubError(_leader(PLAIN), f"SUB {UNKNOWN_TOPIC} c_err 0", "E_TOPIC_NOT_EXIST "),
    "partition-not-here": SubError(
        lambda b: b.non_host(REP, 0), f"SUB {REP} c_err 0", "E_TOPIC_NOT_EXIST "
    ),
    "partition-out-of-range": SubError(
        _leader(PLAIN), f"SUB {PLAIN} c_err 7", "E_TOPIC_NOT_EXIST "
    ),
    # row 9
    "SUB-on-ordered": SubError(
        _leader(ORDERED),
        f"SUB {ORDERED} c_err 0",
        "E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub",
    ),
    "SUB_ADVANCED-on-ordered": SubError(
        _leader(ORDERED),
        f"SUB_ADVANCED {ORDERED} c_err 0",
        "E_SUB_ORDER_IS_MUST this topic is configured only allow ordered sub",
    ),
    # row 10
    "ext-without-extend-support": SubError(
        _leader(EXT),
        f"SUB {EXT} c_err 0",
        "E_SUB_EXTEND_NEED this topic is extended and should identify as extend support.",
        {},
    ),
    "ext-without-identify": SubError(
        _leader(EXT),
        f"SUB {EXT} c_err 0",
        "E_SUB_EXTEND_NEED this topic is extended and should identify as extend support.",
    ),
    # row 11
    "non-ext-with-extend-support": SubError(
        _leader(PLAIN),
        f"SUB {PLAIN} c_err 0",
        "E_SUB_EXTEND_FORBIDDON this topic is not extended and should not identify as extend "
        "support.",
        {"extend_support": True},
    ),
    # row 12
    "replica-not-leader": SubError(
        lambda b: b.replica(REP, 0), f"SUB {REP} c_err 0", "E_FAILED_ON_NOT_LEADER "
    ),
    # row 15
    "ordered-with-sample-rate": SubError(
        _leader(ORDERED),
        f"SUB_ORDERED {ORDERED} c_err 0",
        "E_INVALID order consume is not allowed while sample rate is not 0",
        {"sample_rate": 10},
    ),
}


@pytest.mark.parametrize("case", list(SUB_ERRORS.values()), ids=list(SUB_ERRORS))
def test_subscribe_errors(backend: Backend, case: SubError) -> None:
    """§2.3 rows 2-6, 8-12, 15: the exact error text, then the server closes."""
    with Wire(case.node(backend)) as w:
        if case.ident is not None:
            identify(w, **case.ident)
        w.command(case.line)
        w.expect_error_then_closed(case.error)


@pytest.mark.parametrize(
    ("start", "error"),
    [
        pytest.param("bogus:1", "E_INVALID invalid consume offset:bogus:1", id="unknown-type"),
        pytest.param("special:5", "E_INVALID not supported offset type", id="special-5"),
        pytest.param(
            "virtual_queue:x",
            'E_INVALID strconv.ParseInt: parsing "x": invalid syntax',
            id="not-a-number",
        ),
    ],
)
def test_sub_advanced_start_position_errors(backend: Backend, start: str, error: str) -> None:
    """§2.3 rows 0/16, §2.3.1: a malformed or unsupported start position is fatal."""
    with Wire(backend.leader(PLAIN)) as w:
        w.command(f"SUB_ADVANCED {PLAIN} c_start 0 {start}")
        w.expect_error_then_closed(error)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(f"SUB {PLAIN} c_five_sub 7 extra", id="SUB"),
        pytest.param(f"SUB_ADVANCED {PLAIN} c_five_adv 7 special:-1", id="SUB_ADVANCED"),
        pytest.param(f"SUB_ADVANCED {PLAIN} c_five_trail 7 ", id="SUB_ADVANCED-trailing-space"),
    ],
)
def test_five_token_subscribe_ignores_the_partition(backend: Backend, line: str) -> None:
    """§2.0.3/§10 row 9: with 5 tokens the partition token is not parsed (partition 7 does
    not exist): the node's default partition is subscribed."""
    address = backend.leader(PLAIN)
    with Wire(address) as sub, Wire(address) as p:
        sub.command(line)
        sub.expect_ok()
        sub.command("RDY 1")
        pub(p, PLAIN, b"five-tokens")
        msg = sub.read_message(detail=line.startswith("SUB_ADVANCED"))
        assert msg.body == b"five-tokens"


def test_publish_on_a_subscribed_connection(backend: Backend) -> None:
    """§1.7/§1.5: publishing does not depend on the state; a consumer connection may PUB.
    Its ``OK`` and the delivery of its own message may come in either order."""
    with subscribe(backend.leader(PLAIN), Sub(PLAIN, "c_selfpub", rdy=1)) as w:
        w.command(f"PUB {PLAIN} 0", b"to-myself")
        frames = sorted([w.read_frame(), w.read_frame()], key=lambda f: f.type)
        assert frames[0].raw == response_frame(OK)
        assert frames[1].type == FRAME_MESSAGE
        assert Message.parse(frames[1].data).body == b"to-myself"


def test_second_sub_is_fatal(backend: Backend) -> None:
    """§2.3 row 1: only one SUB per connection."""
    with subscribe(backend.leader(PLAIN), Sub(PLAIN, "c_sub2")) as w:
        w.command(f"SUB {PLAIN} c_sub2b 0")
        w.expect_error_then_closed("E_INVALID cannot SUB in current state")


# == §2.4 RDY =================================================================================


@pytest.mark.parametrize(
    ("line", "error", "subscribed"),
    [
        pytest.param("RDY abc", "E_INVALID RDY could not parse count abc", True, id="not-a-number"),
        pytest.param("RDY -1", "E_INVALID RDY could not parse count -1", True, id="negative"),
        pytest.param(
            "RDY 2501", "E_INVALID RDY count 2501 out of range 0-2500", True, id="above-max"
        ),
        pytest.param("RDY 1", "E_INVALID cannot RDY in current state", False, id="before-sub"),
    ],
)
def test_rdy_errors(backend: Backend, line: str, error: str, subscribed: bool) -> None:
    """§2.4: every RDY error is fatal."""
    address = backend.leader(PLAIN)
    with subscribe(address, Sub(PLAIN, "c_rdy")) if subscribed else Wire(address) as w:
        w.command(line)
        w.expect_error_then_closed(error)


def test_rdy_without_count_means_one(backend: Backend) -> None:
    """§2.4: ``RDY`` alone sets 1: one message in flight until it is finished."""
    address = backend.leader(PLAIN)
    with subscribe(address, Sub(PLAIN, "c_rdy1")) as sub, Wire(address) as p:
        pub(p, PLAIN, b"r1")
        pub(p, PLAIN, b"r2")
        sub.command("RDY")
        first = sub.read_message()
        assert first.body == b"r1"
        sub.expect_silence(0.5)
        fin(sub, first.id)
        assert sub.read_message().body == b"r2"


def test_rdy_zero_holds_delivery(backend: Backend) -> None:
    """§2.4: nothing is delivered at RDY 0; raising RDY releases the queued message."""
    address = backend.leader(PLAIN)
    with subscribe(address, Sub(PLAIN, "c_rdy0", rdy=0)) as sub, Wire(address) as p:
        pub(p, PLAIN, b"held")
        sub.expect_silence(0.5)
        sub.command("RDY 1")
        assert sub.read_message().body == b"held"


# == §2.5-2.7 FIN, REQ, TOUCH =================================================================

BY_POSITION = {
    "FIN": lambda i: b"FIN " + i + b"\n",
    "REQ": lambda i: b"REQ " + i + b" 0\n",
    "TOUCH": lambda i: b"TOUCH " + i + b"\n",
}


@pytest.mark.parametrize("command", list(BY_POSITION))
def test_fin_req_touch_before_sub_are_fatal(backend: Backend, command: str) -> None:
    """§2.5-2.7: FIN/REQ/TOUCH need a subscription (``cannot <CMD> in current state``, F)."""
    with Wire(backend.leader(PLAIN)) as w:
        w.send(BY_POSITION[command](NOT_IN_FLIGHT))
        w.expect_error_then_closed(f"E_INVALID cannot {command} in current state")


@pytest.mark.parametrize(
    ("command", "error", "fatal"),
    [
        pytest.param("FIN", "E_INVALID Invalid Message ID", True, id="FIN"),
        pytest.param("REQ", req_failed(bytes(16)), False, id="REQ"),
        pytest.param("TOUCH", touch_failed(bytes(16)), False, id="TOUCH"),
    ],
)
def test_fin_req_touch_of_id_zero(backend: Backend, command: str, error: str, fatal: bool) -> None:
    """§2.5-2.7: internal id 0: FIN is the fatal ``E_INVALID Invalid Message ID``; REQ and
    TOUCH (observed on the real server, unlike PROTOCOL.md) answer the non-fatal
    ``E_*_FAILED ... not in flight``."""
    with subscribe(backend.leader(PLAIN), Sub(PLAIN, "c_id0")) as w:
        w.send(BY_POSITION[command](bytes(16)))
        w.expect_error(error)
        if fatal:
            w.expect_closed()
        else:
            prove_open_subscribed(w)


@pytest.mark.parametrize(
    ("command", "error"),
    [
        pytest.param("FIN", fin_failed(NOT_IN_FLIGHT), id="FIN"),
        pytest.param("REQ", req_failed(NOT_IN_FLIGHT), id="REQ"),
        pytest.param("TOUCH", touch_failed(NOT_IN_FLIGHT), id="TOUCH"),
    ],
)
def test_fin_req_touch_not_in_flight_are_non_fatal(
    backend: Backend, command: str, error: str
) -> None:
    """§2.5-2.7: an id not in flight: the exact ``E_*_FAILED`` text (FIN has the
    ``ErrType:7 ErrCode:0 : `` prefix, REQ/TOUCH not), and the connection stays usable."""
    with subscribe(backend.leader(PLAIN), Sub(PLAIN, "c_nif")) as w:
        w.send(BY_POSITION[command](NOT_IN_FLIGHT))
        w.expect_error(error)
        prove_open_subscribed(w)


@pytest.mark.parametrize("command", list(BY_POSITION))
def test_fin_req_touch_parse_ids_by_position(backend: Backend, command: str) -> None:
    """§2.5-2.7: an id containing 0x0a and 0x20 is read by position, not by line splitting."""
    address = backend.leader(PLAIN)
    with (
        subscribe(address, Sub(PLAIN, f"c_pos_{command.lower()}", rdy=1)) as sub,
        Wire(address) as p,
    ):
        traced = pub_trace(p, PLAIN, b"nasty-id", NASTY_TRACE)
        msg = sub.read_message()
        assert msg.id == traced.id
        assert b"\n" in msg.id
        assert b" " in msg.id
        sub.send(BY_POSITION[command](msg.id))
        if command == "REQ":
            again = sub.read_message()
            assert (again.id, again.attempts, again.body) == (msg.id, 2, b"nasty-id")
            fin(sub, msg.id)
        elif command == "TOUCH":
            sub.expect_silence(0.3)
            fin(sub, msg.id)
        # the FIN went through: the id is no longer in flight
        fin(sub, msg.id)
        sub.expect_error(fin_failed(msg.id))


def test_fin_short_line_waits_for_the_id(backend: Backend) -> None:
    """§2.5: ``FIN 12345`` (shorter than 21 bytes) is not an error: nsqd waits for more."""
    with subscribe(backend.leader(PLAIN), Sub(PLAIN, "c_short")) as w:
        w.send(b"FIN 12345\n")
        w.expect_silence(1.0)


@pytest.mark.parametrize(
    ("command", "error"),
    [
        pytest.param("FIN", fin_failed(NOT_IN_FLIGHT), id="FIN"),
        pytest.param("TOUCH", touch_failed(NOT_IN_FLIGHT), id="TOUCH"),
        pytest.param("REQ", "E_INVALID REQ insufficient number of params", id="REQ"),
    ],
)
def test_a_bare_fin_touch_or_req_waits_for_the_id(
    backend: Backend, command: str, error: str
) -> None:
    """§2.5-2.7: ``FIN\\n`` (no space, no id) gets no answer: nsqd reads the next 16 bytes as
    the id, whatever the byte after the name was; then it answers as for ``FIN <id>\\n`` (REQ
    without a timeout: the fatal ``insufficient number of params``)."""
    with subscribe(backend.leader(PLAIN), Sub(PLAIN, f"c_bare_{command.lower()}")) as w:
        w.send(command.encode() + b"\n")
        w.expect_silence(1.0)
        w.send(NOT_IN_FLIGHT + b"\n")
        w.expect_error(error)
        if command == "REQ":
            w.expect_closed()
        else:
            prove_open_subscribed(w)


def test_req_without_a_timeout_is_fatal(backend: Backend) -> None:
    """§2.6: ``REQ <id>\\n`` (no space, no timeout) is the fatal ``E_INVALID REQ insufficient
    number of params``."""
    with subscribe(backend.leader(PLAIN), Sub(PLAIN, "c_req_no_timeout")) as w:
        w.send(b"REQ " + NOT_IN_FLIGHT + b"\n")
        w.expect_error_then_closed("E_INVALID REQ insufficient number of params")


@pytest.mark.parametrize("value", [b"abc", b"-5"])
def test_req_unparsable_timeout_is_fatal(backend: Backend, value: bytes) -> None:
    """§2.6: a REQ timeout that is not decimal digits is a fatal ``E_INVALID``; the text
    (observed) repeats the raw id bytes and the timeout token."""
    with subscribe(backend.leader(PLAIN), Sub(PLAIN, "c_reqbad")) as w:
        w.send(b"REQ " + NOT_IN_FLIGHT + b" " + value + b"\n")
        w.expect_error_then_closed(
            b"E_INVALID REQ could not parse timeout " + NOT_IN_FLIGHT + b", " + value
        )


def test_req_with_delay_redelivers_later(backend: Backend) -> None:
    """§2.6: on a non-ordered channel ``REQ <id> 1000`` gets no answer and the message comes
    back later (not at once) with attempts 2 (the real nsqd took about 5 s)."""
    address = backend.leader(PLAIN)
    with subscribe(address, Sub(PLAIN, "c_reqdelay", rdy=1)) as sub, Wire(address) as p:
        pub(p, PLAIN, b"later")
        first = sub.read_message()
        req(sub, first.id, 1000)
        sub.expect_silence(0.5)
        again = sub.read_message(timeout=15.0)
        assert again.data == first.data[:8] + struct.pack(">H", 2) + first.data[10:]
        fin(sub, first.id)


def test_req_zero_redelivers_with_attempts_incremented(backend: Backend) -> None:
    """§2.6/§4.5: ``REQ <id> 0`` redelivers at once: same bytes, same timestamp, attempts+1."""
    address = backend.leader(PLAIN)
    with subscribe(address, Sub(PLAIN, "c_req0", rdy=1)) as sub, Wire(address) as p:
        pub(p, PLAIN, b"again")
        first = sub.read_message()
        assert first.attempts == 1
        for attempts in (2, 3):
            req(sub, first.id, 0)
            again = sub.read_message()
            assert again.data == first.data[:8] + struct.pack(">H", attempts) + first.data[10:]
        fin(sub, first.id)
        prove_open_subscribed(sub)


def test_touch_has_no_answer(backend: Backend) -> None:
    """§2.7: TOUCH of an in-flight message is silent; the message can still be finished."""
    address = backend.leader(PLAIN)
    with subscribe(address, Sub(PLAIN, "c_touch", rdy=1)) as sub, Wire(address) as p:
        pub(p, PLAIN, b"touched")
        msg = sub.read_message()
        touch(sub, msg.id)
        sub.expect_silence(0.3)
        fin(sub, msg.id)
        prove_open_subscribed(sub)


# == §2.8 CLS, §2.9 NOP =======================================================================


def test_cls_answers_close_wait_and_stops_delivery(backend: Backend) -> None:
    """§2.8: ``CLOSE_WAIT``; RDY is forced to 0, the server waits for the client to close."""
    address = backend.leader(PLAIN)
    with subscribe(address, Sub(PLAIN, "c_cls", rdy=5)) as sub, Wire(address) as p:
        sub.command("CLS")
        sub.expect(b"\x00\x00\x00\x0e\x00\x00\x00\x00" + CLOSE_WAIT)
        pub(p, PLAIN, b"after-cls")
        sub.expect_silence(1.0)


def test_closing_state_accepts_fin_and_publishes(backend: Backend) -> None:
    """§1.7/§2.8: after CLS, RDY is ignored (no error, no delivery), FIN of the in-flight
    message still works, and the connection can still publish."""
    address = backend.leader(PLAIN)
    with subscribe(address, Sub(PLAIN, "c_closing", rdy=1)) as sub, Wire(address) as p:
        pub(p, PLAIN, b"in-flight")
        msg = sub.read_message()
        sub.command("CLS")
        sub.expect(response_frame(CLOSE_WAIT))
        sub.command("RDY 5")
        fin(sub, msg.id)
        pub(sub, PLAIN, b"from-closing")
        sub.expect_silence(0.5)
        fin(sub, msg.id)
        sub.expect_error(fin_failed(msg.id))


def test_cls_before_sub_is_fatal(backend: Backend) -> None:
    """§2.8: CLS needs a subscription."""
    with Wire(backend.leader(PLAIN)) as w:
        w.command("CLS")
        w.expect_error_then_closed("E_INVALID cannot CLS in current state")


def test_nop_has_no_answer(backend: Backend) -> None:
    """§2.9: NOP is legal in every state and never answered."""
    with Wire(backend.leader(PLAIN)) as w:
        w.command("NOP")
        w.expect_silence(0.3)
        w.command(f"SUB {PLAIN} c_nop 0")
        w.expect_ok()
        w.command("NOP")
        w.expect_silence(0.3)


# == §2.18 commands the fork does not know ====================================================


@pytest.mark.parametrize(
    "tokens",
    [
        pytest.param([b"FOO", b"bar"], id="FOO"),
        pytest.param([b"DPUB", PLAIN.encode(), b"1000"], id="DPUB"),
        pytest.param([b"SUB_ORDER", ORDERED.encode(), b"ch", b"0"], id="SUB_ORDER"),
        pytest.param([b"PING"], id="PING"),
    ],
)
def test_unknown_commands(backend: Backend, tokens: list[bytes]) -> None:
    """§2.18: ``E_INVALID invalid command [<every token as a Go byte slice>]``, then close."""
    with Wire(backend.leader(PLAIN)) as w:
        w.command(b" ".join(tokens))
        text = "E_INVALID invalid command [" + " ".join(go_bytes(t) for t in tokens) + "]"
        w.expect_error_then_closed(text)


# == §2.10 PUB, §2.13 MPUB ====================================================================


def test_pub_answers_ok_and_ids_follow(backend: Backend) -> None:
    """§2.10/§4.4/§4.6: PUB answers ``OK``; the next message gets id+1 and the offset right
    after the previous record, whose raw size is 4 + 26 + len(body)."""
    address = backend.leader(PLAIN)
    with (
        subscribe(address, Sub(PLAIN, "c_pubids", command="SUB_ADVANCED", rdy=5)) as sub,
        Wire(address) as p,
    ):
        first = pub_trace(p, PLAIN, b"first", 0)
        assert first.raw_size == 4 + 26 + len(b"first")
        p.command(f"PUB {PLAIN} 0", b"second")
        p.expect(b"\x00\x00\x00\x06\x00\x00\x00\x00OK")
        m1 = sub.read_message(detail=True)
        m2 = sub.read_message(detail=True)
        assert (m1.internal_id, m1.offset, m1.raw_size) == (
            first.internal_id,
            first.offset,
            first.raw_size,
        )
        expected = message_data(
            attempts=1,
            internal_id=first.internal_id + 1,
            trace_id=0,
            body=b"second",
            detail=(first.offset + first.raw_size, 4 + 26 + len(b"second")),
        )
        assert mask_timestamp(m2.data) == expected


@pytest.mark.parametrize(
    "variant",
    [
        pytest.param(f"PUB {PLAIN}", id="no-partition"),
        pytest.param(f"PUB {PLAIN} -1", id="minus-1"),
        pytest.param(f"PUB {PLAIN} 0 ", id="trailing-space-4-tokens"),
    ],
)
def test_pub_partition_token_variants(backend: Backend, variant: str) -> None:
    """§2.0.3: no partition, ``-1`` and a 4-token line all publish to the led partition."""
    address = backend.leader(PLAIN)
    channel = f"c_variant_{len(variant.split(' '))}_{variant.endswith('-1')}"
    with subscribe(address, Sub(PLAIN, channel, rdy=1)) as sub, Wire(address) as p:
        p.command(variant, b"variant")
        p.expect_ok()
        msg = sub.read_message()
        assert msg.body == b"variant"
        fin(sub, msg.id)


@dataclass(frozen=True)
class PubError:
    node: Callable[[Backend], str]
    payload: Callable[[], bytes]
    error: str


def _line(line: str, body: bytes | None = b"x") -> Callable[[], bytes]:
    def build() -> bytes:
        out = line.encode() + b"\n"
        if body is not None:
            out += struct.pack(">I", len(body)) + body
        return out

    return build


def _raw(data: bytes) -> Callable[[], bytes]:
    return lambda: data


PUB_ERRORS = {
    "no-topic": PubError(
        _leader(PLAIN), _line("PUB", None), "E_INVALID insufficient number of parameters"
    ),
    "unknown-topic": PubError(
        _leader(PLAIN), _line(f"PUB {UNKNOWN_TOPIC} 0"), "E_TOPIC_NOT_EXIST "
    ),
    "invalid-name": PubError(_leader(PLAIN), _line("PUB bad!topic 0"), "E_TOPIC_NOT_EXIST "),
    "invalid-name-no-partition": PubError(
        _leader(PLAIN), _line("PUB bad!topic"), "E_TOPIC_NOT_EXIST "
    ),
    "bad-partition": PubError(
        _leader(PLAIN),
        _line(f"PUB {PLAIN} x"),
        'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "x": invalid syntax',
    ),
    "body-size-0": PubError(
        _leader(PLAIN),
        _raw(f"PUB {PLAIN} 0\n".encode() + bytes(4)),
        "E_BAD_BODY invalid body size 0",
    ),
    "too-big": PubError(
        _leader(PLAIN),
        _raw(f"PUB {PLAIN} 0\n".encode() + struct.pack(">I", 1048577)),
        "E_BAD_MESSAGE message too big 1048577 > 1048576",
    ),
    "partition-not-here": PubError(
        lambda b: b.non_host(REP, 0), _line(f"PUB {REP} 0"), "E_TOPIC_NOT_EXIST "
    ),
    "ordered-no-partition": PubError(
        _leader(ORDERED),
        _line(f"PUB {ORDERED}"),
        "E_BAD_PARTITION topic partition is not valid for multi partition: -1",
    ),
    "ordered-minus-1": PubError(
        _leader(ORDERED),
        _line(f"PUB {ORDERED} -1"),
        "E_BAD_PARTITION topic partition is not valid for multi partition: -1",
    ),
    "PUB_TRACE-body-8": PubError(
        _leader(PLAIN),
        _line(f"PUB_TRACE {PLAIN} 0", bytes(8)),
        "E_BAD_BODY invalid body size 8 with trace id enabled",
    ),
    "PUB_EXT-body-2": PubError(
        _leader(EXT),
        _line(f"PUB_EXT {EXT} 0", b"\x00\x00"),
        "E_BAD_BODY invalid body size 2 with ext json header enabled",
    ),
    "PUB_EXT-header-only": PubError(
        _leader(EXT),
        _line(f"PUB_EXT {EXT} 0", ext_body(b'{"k":"v"}', b"")),
        "E_BAD_BODY invalid body size 11 in ext json header content length",
    ),
    "PUB_EXT-partition-not-here": PubError(
        lambda b: b.non_host(REP, 0),
        _line(f"PUB_EXT {REP} 0", ext_body(b'{"k":"v"}', b"body")),
        "E_TOPIC_NOT_EXIST ",
    ),
    "MPUB-count-0": PubError(
        _leader(PLAIN),
        _line(f"MPUB {PLAIN} 0", struct.pack(">I", 0)),
        "E_BAD_BODY MPUB invalid message count 0",
    ),
    "MPUB-too-big": PubError(
        _leader(PLAIN),
        _raw(f"MPUB {PLAIN} 0\n".encode() + struct.pack(">I", 5242881)),
        "E_BAD_BODY body too big 5242881 > 5242880",
    ),
    "MPUB-message-size-0": PubError(
        _leader(PLAIN),
        _line(f"MPUB {PLAIN} 0", struct.pack(">II", 1, 0)),
        "E_BAD_MESSAGE MPUB invalid message(0) body size 0",
    ),
    "MPUB-message-too-big": PubError(
        _leader(PLAIN),
        _raw(f"MPUB {PLAIN} 0\n".encode() + struct.pack(">III", 1048585, 1, 1048577)),
        "E_BAD_MESSAGE MPUB message too big 1048577 > 1048576",
    ),
    "MPUB-partition-not-here": PubError(
        lambda b: b.non_host(REP, 0),
        _line(f"MPUB {REP} 0", mpub_body([b"a"])),
        "E_TOPIC_NOT_EXIST ",
    ),
    "MPUB_TRACE-message-8": PubError(
        _leader(PLAIN),
        _line(f"MPUB_TRACE {PLAIN} 0", mpub_body([bytes(8)])),
        "E_BAD_MESSAGE MPUB invalid message(0) body size 8 for tracing",
    ),
}


@pytest.mark.parametrize("case", list(PUB_ERRORS.values()), ids=list(PUB_ERRORS))
def test_publish_fatal_errors(backend: Backend, case: PubError) -> None:
    """§2.10-2.14: each fatal publish error, exact text, then the close."""
    with Wire(case.node(backend)) as w:
        w.send(case.payload())
        w.expect_error_then_closed(case.error)


@pytest.mark.parametrize(
    ("line", "body"),
    [
        pytest.param(f"PUB {REP} 0", b"to-replica", id="PUB"),
        pytest.param(f"MPUB {REP} 0", mpub_body([b"m1", b"m2"]), id="MPUB"),
        pytest.param(f"PUB_TRACE {REP} 0", struct.pack(">Q", 5) + b"traced", id="PUB_TRACE"),
    ],
)
def test_publish_to_replica_is_not_leader_non_fatal(
    backend: Backend, line: str, body: bytes
) -> None:
    """§2.0.3/§2.19: publishing to a replica: ``E_FAILED_ON_NOT_LEADER `` and the connection
    stays open (twice in a row, then a command that succeeds)."""
    with Wire(backend.replica(REP, 0)) as w:
        for _ in range(2):
            w.command(line, body)
            w.expect_error("E_FAILED_ON_NOT_LEADER ")
        prove_open_init(w)


def test_mpub_answers_ok_and_delivers_in_order(backend: Backend) -> None:
    """§2.13: MPUB answers ``OK``; the messages arrive in order with consecutive ids."""
    address = backend.leader(PLAIN)
    with subscribe(address, Sub(PLAIN, "c_mpub", rdy=10)) as sub, Wire(address) as p:
        p.command(f"MPUB {PLAIN} 0", mpub_body([b"m-1", b"m-22", b"m-333"]))
        p.expect_ok()
        msgs = [sub.read_message() for _ in range(3)]
        assert [m.body for m in msgs] == [b"m-1", b"m-22", b"m-333"]
        first = msgs[0].internal_id
        assert [m.internal_id for m in msgs] == [first, first + 1, first + 2]
        assert all(m.trace_id == 0 and m.attempts == 1 for m in msgs)


@pytest.mark.parametrize(
    "delta", [pytest.param(4, id="plus-4-java"), pytest.param(-4, id="minus-4")]
)
def test_mpub_body_length_is_not_compared(backend: Backend, delta: int) -> None:
    """§2.13: nsqd parses the MPUB body structurally; a body length off by 4 still works."""
    body = mpub_body([b"len-1", b"len-2"])
    with Wire(backend.leader(PLAIN)) as w:
        w.send(f"MPUB {PLAIN} 0\n".encode() + struct.pack(">I", len(body) + delta) + body)
        w.expect_ok()
        pub(w, PLAIN, b"after")


# == §2.11 PUB_TRACE, §2.14 MPUB_TRACE, §2.16 traced answers =================================


def test_traced_answers_on_a_fresh_partition(backend: Backend) -> None:
    """§2.16/§4.6 byte for byte on a fresh partition: PUB_TRACE (id 2, offset 0, raw 34),
    MPUB_TRACE (first id, trace 0, first offset, batch size), PUB_TRACE with trace 0; the
    SUB_ADVANCED frames carry the same ids and offset/raw size."""
    address = backend.leader(FRESH_TRACE)
    with (
        subscribe(address, Sub(FRESH_TRACE, "ch", command="SUB_ADVANCED", rdy=10)) as sub,
        Wire(address) as p,
    ):
        identify(p)
        p.command(f"PUB_TRACE {FRESH_TRACE} 0", struct.pack(">Q", 0x1122334455667788) + b"tr-1")
        p.expect(response_frame(traced_answer(2, 0x1122334455667788, 0, 34)))
        batch = mpub_body([struct.pack(">Q", 7) + b"mt-1", struct.pack(">Q", 8) + b"mt-22"])
        p.command(f"MPUB_TRACE {FRESH_TRACE} 0", batch)
        p.expect(response_frame(traced_answer(3, 0, 34, 69)))
        p.command(f"PUB_TRACE {FRESH_TRACE} 0", bytes(8) + b"tr-0")
        p.expect(response_frame(traced_answer(5, 0, 103, 34)))
        p.command(f"PUB {FRESH_TRACE} 0", b"plain")
        p.expect_ok()
        expected = [
            (2, 0x1122334455667788, 0, 34, b"tr-1"),
            (3, 7, 34, 34, b"mt-1"),
            (4, 8, 68, 35, b"mt-22"),
            (5, 0, 103, 34, b"tr-0"),
            (6, 0, 137, 35, b"plain"),
        ]
        for internal_id, trace, offset, raw_size, body in expected:
            msg = sub.read_message(detail=True)
            assert mask_timestamp(msg.data) == message_data(
                attempts=1,
                internal_id=internal_id,
                trace_id=trace,
                body=body,
                detail=(offset, raw_size),
            )
            fin(sub, msg.id)
        sub.command("CLS")
        sub.expect(response_frame(CLOSE_WAIT))


def test_pub_trace_relative_values(backend: Backend) -> None:
    """§2.16: on a used partition two PUB_TRACE answers are contiguous: id+1 and offset +
    raw size; the trace id is echoed."""
    with Wire(backend.leader(PLAIN)) as p:
        a = pub_trace(p, PLAIN, b"aaaa", 11)
        b = pub_trace(p, PLAIN, b"bbbbbbb", 12)
        assert (a.trace_id, b.trace_id) == (11, 12)
        assert b.internal_id == a.internal_id + 1
        assert b.offset == a.offset + a.raw_size
        assert (a.raw_size, b.raw_size) == (4 + 26 + 4, 4 + 26 + 7)


# == §2.12 PUB_EXT, §2.15 MPUB_EXT ============================================================


def test_ext_publishes_on_a_fresh_partition(backend: Backend) -> None:
    """§2.12/§2.15/§2.16 on a fresh ext partition: PUB_EXT with ``##trace_id`` answers the
    traced form (raw size 4+29+L+len(body)); without it ``OK``; plain PUB ``OK``; PUB_TRACE
    raw size 4+27+len(body); MPUB_EXT answers plain ``OK`` even with ``##trace_id``."""
    with Wire(backend.leader(FRESH_EXT)) as p:
        header = b'{"##trace_id":"999","k":"v"}'
        assert pub_ext(p, FRESH_EXT, header, b"ext-1") == traced_answer(2, 999, 0, 66)
        assert pub_ext(p, FRESH_EXT, b'{"k":"v2"}', b"ext-2") == OK
        pub(p, FRESH_EXT, b"plain-into-ext")
        p.command(f"PUB_TRACE {FRESH_EXT} 0", struct.pack(">Q", 42) + b"trace-into-ext")
        p.expect(response_frame(traced_answer(5, 42, 159, 45)))
        batch = mpub_body(
            [ext_body(b'{"##trace_id":"5","a":"b"}', b"mx-1"), ext_body(b"", b"mx-2")]
        )
        p.command(f"MPUB_EXT {FRESH_EXT} 0", batch)
        p.expect_ok()
        # the next record starts after mx-1 (4+29+26+4 = 63) and mx-2 (4+27+4 = 35)
        assert pub_ext(p, FRESH_EXT, b'{"##trace_id":"1"}', b"z") == traced_answer(
            8, 1, 204 + 63 + 35, 4 + 29 + 18 + 1
        )


@pytest.mark.parametrize(
    ("topic", "header", "error"),
    [
        pytest.param(
            PLAIN,
            b'{"k":"v"}',
            f"E_EXT_NOT_SUPPORT ext content not supported in topic {PLAIN}",
            id="non-ext-topic",
        ),
        pytest.param(
            EXT, b"", "E_INVALID_JSON_HEADER fail to parse json header:", id="empty-header"
        ),
        pytest.param(
            EXT, b'{"a":', "E_INVALID_JSON_HEADER fail to parse json header:", id="truncated-json"
        ),
        pytest.param(
            EXT,
            b'{"##trace_id":5}',
            "INVALID_TRACE_ID passin trace id should be string",
            id="trace-id-number",
        ),
        pytest.param(
            EXT, b'{"##trace_id":"abc"}', "INVALID_TRACE_ID invalid trace id", id="trace-id-abc"
        ),
    ],
)
def test_pub_ext_header_errors_are_non_fatal(
    backend: Backend, topic: str, header: bytes, error: str
) -> None:
    """§2.12: header problems are non-fatal; the JSON parser's own message after
    ``header:`` is not compared."""
    with Wire(backend.leader(topic)) as w:
        w.command(f"PUB_EXT {topic} 0", ext_body(header, b"body"))
        frame = w.read_frame()
        assert frame.type == FRAME_ERROR, frame
        if error.endswith("header:"):
            assert frame.data.startswith(error.encode()), frame
        else:
            assert frame.data == error.encode()
        prove_open_init(w)


#: headers the fork's parser (fastjson) refuses, and its exact words after ``header:``
BAD_JSON_HEADERS = {
    "truncated-object": (
        b'{"a":',
        "cannot parse JSON: cannot parse object: cannot parse object value: cannot parse "
        'empty string; unparsed tail: ""',
    ),
    "missing-colon": (
        b'{"a" 1}',
        "cannot parse JSON: cannot parse object: missing ':' after object key; "
        'unparsed tail: "1}"',
    ),
    "trailing-comma": (
        b'{"a":1,}',
        'cannot parse JSON: cannot parse object: cannot find opening \'"" for object key; '
        'unparsed tail: "}"',
    ),
    "bare-key": (
        b"{a:1}",
        'cannot parse JSON: cannot parse object: cannot find opening \'"" for object key; '
        'unparsed tail: "a:1}"',
    ),
    "truncated-array": (
        b"[1,",
        "cannot parse JSON: cannot parse array: cannot parse array value: cannot parse empty "
        'string; unparsed tail: ""',
    ),
    "unclosed-string": (
        b'"abc',
        'cannot parse JSON: cannot parse string: missing closing \'"\'; unparsed tail: ""',
    ),
    "bad-literal": (
        b"nul",
        'cannot parse JSON: unexpected value found: "nul"; unparsed tail: "nul"',
    ),
    "invalid-byte": (
        b"\xff",
        'cannot parse JSON: cannot parse number: unexpected char: "\\xff"; unparsed tail: "\\xff"',
    ),
    "tail": (b'{"a":1}x', 'unexpected tail: "x"'),
    "empty": (b"", 'cannot parse JSON: cannot parse empty string; unparsed tail: ""'),
}


@pytest.mark.parametrize(
    ("header", "words"), list(BAD_JSON_HEADERS.values()), ids=list(BAD_JSON_HEADERS)
)
def test_pub_ext_bad_json_header_is_refused_in_the_parsers_words(
    backend: Backend, header: bytes, words: str
) -> None:
    """§2.12: a header that is not JSON is refused with the parser's own words, byte for byte
    (the fork parses with fastjson: its texts, nested as it descended, and the rest quoted as
    Go quotes it), non-fatally."""
    with Wire(backend.leader(EXT)) as w:
        w.command(f"PUB_EXT {EXT} 0", ext_body(header, b"body"))
        w.expect_error(f"E_INVALID_JSON_HEADER fail to parse json header:{words}".encode())
        prove_open_init(w)


@pytest.mark.parametrize(
    "header",
    [b'{"a":1.2.3}', b'{"a":-1-}', b"[01,+5e]", b'{"a":"\\q"}', b"NaN", b"-Inf", b' {"a":1} '],
    ids=["two-dots", "minus-twice", "loose-numbers", "bad-escape", "nan", "inf", "spaces"],
)
def test_pub_ext_header_parser_is_lenient_as_the_forks(backend: Backend, header: bytes) -> None:
    """§2.12: what fastjson accepts is a header: numbers are any run of digits, signs, dots and
    exponents (or inf/nan), escapes in strings are not checked."""
    with Wire(backend.leader(EXT)) as w:
        w.command(f"PUB_EXT {EXT} 0", ext_body(header, b"body"))
        w.expect_ok()


def test_mpub_ext_header_on_non_ext_topic(backend: Backend) -> None:
    """§2.15: a JSON header into a non-ext topic is the non-fatal ``E_EXT_NOT_SUPPORT``; with
    the error on the last message nothing of the body is left and the connection goes on."""
    with Wire(backend.leader(PLAIN)) as w:
        w.command(f"MPUB_EXT {PLAIN} 0", mpub_body([ext_body(b'{"k":"v"}', b"body")]))
        w.expect_error(f"E_EXT_NOT_SUPPORT ext content not supported in topic {PLAIN}")
        prove_open_init(w)


def test_mpub_ext_header_error_desyncs_the_stream(backend: Backend) -> None:
    """§2.15 stream desync: the error is raised with the rest of the body unread; those bytes
    are then parsed as the next command line (an unknown command, fatal)."""
    with Wire(backend.leader(PLAIN)) as w:
        second = ext_body(b"", b"second")
        body = mpub_body([ext_body(b'{"k":"v"}', b"body"), second])
        w.command(f"MPUB_EXT {PLAIN} 0", body)
        w.expect_error(f"E_EXT_NOT_SUPPORT ext content not supported in topic {PLAIN}")
        w.command("NOP")
        leftover = struct.pack(">I", len(second)) + second + b"NOP"
        w.expect_error_then_closed(f"E_INVALID invalid command [{go_bytes(leftover)}]")


def test_mpub_ext_without_headers_on_non_ext_topic(backend: Backend) -> None:
    """§2.15: ``json_len`` 0 is allowed, also on a non-ext topic."""
    with Wire(backend.leader(PLAIN)) as w:
        w.command(f"MPUB_EXT {PLAIN} 0", mpub_body([ext_body(b"", b"b1"), ext_body(b"", b"b2")]))
        w.expect_ok()


# == §4.2 message frame layouts ===============================================================


@pytest.mark.parametrize(
    ("command", "ext"),
    [
        pytest.param("SUB", False, id="SUB-plain"),
        pytest.param("SUB", True, id="SUB-ext"),
        pytest.param("SUB_ADVANCED", False, id="SUB_ADVANCED-plain"),
        pytest.param("SUB_ADVANCED", True, id="SUB_ADVANCED-ext"),
    ],
)
def test_message_frame_layouts(backend: Backend, command: str, ext: bool) -> None:
    """§4.2: header, then the ext part (ext topic + extend_support), then the detail part
    (SUB_ADVANCED), then the body, byte for byte (timestamp masked)."""
    topic = EXT if ext else PLAIN
    address = backend.leader(topic)
    ident = {"extend_support": True} if ext else {}
    sub = Sub(topic, f"c_layout_{command.lower()}", command=command, ident=ident, rdy=5)
    with subscribe(address, sub) as s, Wire(address) as p:
        if ext:
            header = b'{"##trace_id":"77","k":"v"}'
            traced = Traced.parse(pub_ext(p, topic, header, b"layout"))
            ext_part: tuple[int, bytes] | None = (4, header)
        else:
            traced = pub_trace(p, topic, b"layout", 77)
            ext_part = None
        msg = s.read_message(ext=sub.ext, detail=sub.detail)
        detail = (traced.offset, traced.raw_size) if sub.detail else None
        expected = message_data(
            attempts=1,
            internal_id=traced.internal_id,
            trace_id=77,
            body=b"layout",
            ext=ext_part,
            detail=detail,
        )
        assert mask_timestamp(msg.data) == expected
        assert msg.timestamp > 0
        if ext:
            # a plain PUB into an ext topic is delivered with ext version 0
            pub(p, topic, b"v0")
            plain = s.read_message(ext=True, detail=sub.detail)
            assert (plain.ext_version, plain.body) == (0, b"v0")
            assert plain.data[26] == 0


# == §6.7 ordered consumption =================================================================


def test_ordered_one_message_in_flight(backend: Backend) -> None:
    """§6.7/§4.4: RDY 5 on SUB_ORDERED still gives one message in flight; after FIN the next
    one starts at offset + raw size of the previous."""
    address = backend.leader(ORDERED)
    with (
        subscribe(address, Sub(ORDERED, "c_ord_one", command="SUB_ORDERED")) as sub,
        Wire(address) as p,
    ):
        for i in range(3):
            pub(p, ORDERED, b"ord-%d" % i)
        sub.command("RDY 5")
        previous: Message | None = None
        for i in range(3):
            msg = sub.read_message(detail=True)
            assert msg.body == b"ord-%d" % i
            assert msg.raw_size == 4 + 26 + 5
            if previous is not None:
                assert msg.internal_id == previous.internal_id + 1
                assert msg.offset == (previous.offset or 0) + (previous.raw_size or 0)
            if i == 0:
                sub.expect_silence(1.0)
            fin(sub, msg.id)
            previous = msg


def test_ordered_req_zero_redelivers_same_message(backend: Backend) -> None:
    """§6.7: ``REQ <id> 0`` on an ordered channel redelivers the same id and offset at once,
    attempts + 1."""
    address = backend.leader(ORDERED)
    with (
        subscribe(address, Sub(ORDERED, "c_ord_req0", command="SUB_ORDERED", rdy=1)) as sub,
        Wire(address) as p,
    ):
        pub(p, ORDERED, b"ord-req")
        first = sub.read_message(detail=True)
        req(sub, first.id, 0)
        again = sub.read_message(detail=True)
        assert again.data == first.data[:8] + struct.pack(">H", 2) + first.data[10:]
        fin(sub, first.id)


def test_ordered_req_with_delay_is_ignored(backend: Backend) -> None:
    """§2.6/§6.7: ``REQ`` with a delay on an ordered channel gets no answer and has no effect:
    the message comes back after ``msg_timeout`` (1 s here), not after the 60 s delay."""
    address = backend.leader(ORDERED)
    sub_spec = Sub(ORDERED, "c_ord_reqd", command="SUB_ORDERED", ident={"msg_timeout": 1000})
    with subscribe(address, sub_spec) as sub, Wire(address) as p:
        pub(p, ORDERED, b"ord-delay")
        sub.command("RDY 1")
        first = sub.read_message(detail=True)
        req(sub, first.id, 60000)
        again = sub.read_message(detail=True, timeout=15.0)
        assert again.data == first.data[:8] + struct.pack(">H", 2) + first.data[10:]
        fin(sub, first.id)


def test_message_timeout_redelivers(backend: Backend) -> None:
    """§4.5: an unfinished message comes back after ``msg_timeout`` with attempts + 1."""
    address = backend.leader(PLAIN)
    sub_spec = Sub(PLAIN, "c_timeout", ident={"msg_timeout": 1000}, rdy=1)
    with subscribe(address, sub_spec) as sub, Wire(address) as p:
        pub(p, PLAIN, b"slow")
        first = sub.read_message()
        again = sub.read_message(timeout=15.0)
        assert again.data == first.data[:8] + struct.pack(">H", 2) + first.data[10:]
        fin(sub, first.id)


# == §5.2 lookup ==============================================================================

NODE_KEYS = [
    "id",
    "remote_address",
    "hostname",
    "broadcast_address",
    "tcp_port",
    "http_port",
    "version",
    "distributed_id",
]
META_KEYS = [
    "disable_channel_auto_create",
    "extend_support",
    "multi_part",
    "ordered",
    "partition_num",
    "replica",
]


def check_node_object(node: dict[str, Any], backend: Backend) -> None:
    assert list(node) == NODE_KEYS
    assert node["broadcast_address"] == "127.0.0.1"
    address = f"127.0.0.1:{node['tcp_port']}"
    assert address in backend.node_addresses()
    assert isinstance(node["http_port"], int)
    assert backend.http_url(address) == f"http://127.0.0.1:{node['http_port']}"
    assert node["version"] == FORK_VERSION
    assert re.fullmatch(r"127\.0\.0\.1:\d+:(\d+):\d+", node["distributed_id"])
    assert node["distributed_id"].split(":")[2] == str(node["tcp_port"])


def test_lookup_read_shape(backend: Backend) -> None:
    """§5.2: ``access=r&metainfo=true``: key order channels/meta/partitions/producers, meta
    key order and values, node objects, the v1 content-type header."""
    resp = lookup(backend, {"topic": REP, "access": "r", "metainfo": "true"})
    assert resp.status_code == 200
    assert resp.headers.get("X-Nsq-Content-Type") == "nsq; version=1.0"
    data = resp.json()
    assert list(data) == ["channels", "meta", "partitions", "producers"]
    assert list(data["meta"]) == META_KEYS
    assert data["meta"] == {
        "disable_channel_auto_create": False,
        "extend_support": False,
        "multi_part": True,
        "ordered": False,
        "partition_num": 2,
        "replica": 2,
    }
    assert sorted(data["partitions"]) == ["0", "1"]
    for number, node in data["partitions"].items():
        check_node_object(node, backend)
        assert f"127.0.0.1:{node['tcp_port']}" == backend.leader(REP, int(number))
        assert node in data["producers"]
    for node in data["producers"]:
        check_node_object(node, backend)
    assert isinstance(data["channels"], list)


def test_lookup_write_lists_the_leaders(backend: Backend) -> None:
    """§5.2: ``access=w`` maps every partition to its leader."""
    data = lookup(backend, {"topic": REP, "access": "w", "metainfo": "true"}).json()
    leaders = {p: f"127.0.0.1:{n['tcp_port']}" for p, n in data["partitions"].items()}
    assert leaders == {"0": backend.leader(REP, 0), "1": backend.leader(REP, 1)}


@pytest.mark.parametrize(
    ("topic", "flags"),
    [
        pytest.param(
            ORDERED, {"ordered": True, "extend_support": False, "partition_num": 2}, id="ordered"
        ),
        pytest.param(EXT, {"ordered": False, "extend_support": True, "partition_num": 1}, id="ext"),
    ],
)
def test_lookup_meta_flags(backend: Backend, topic: str, flags: dict[str, Any]) -> None:
    """§5.2: ``meta`` reports ordered (orderedmulti) and ext (extend) topics."""
    meta = lookup(backend, {"topic": topic, "access": "w", "metainfo": "true"}).json()["meta"]
    assert list(meta) == META_KEYS
    assert {k: meta[k] for k in flags} == flags
    assert meta["replica"] == 1


def test_lookup_meta_presence(backend: Backend) -> None:
    """§5.2: no ``metainfo`` → no ``meta``; any non-empty value (even ``false``) adds it."""
    without = lookup(backend, {"topic": PLAIN, "access": "r"}).json()
    assert list(without) == ["channels", "partitions", "producers"]
    with_false = lookup(backend, {"topic": PLAIN, "metainfo": "false"}).json()
    assert list(with_false) == ["channels", "meta", "partitions", "producers"]


def test_lookup_wrapped_without_accept(backend: Backend) -> None:
    """§5.1: without the ``Accept`` header the same lookup object is wrapped in
    ``status_code``/``status_txt``/``data`` and the v1 content-type header is absent."""
    params = {"topic": REP, "access": "r", "metainfo": "true"}
    plain = lookup(backend, params).json()
    resp = lookup(backend, params, accept=False)
    assert resp.status_code == 200
    assert "X-Nsq-Content-Type" not in resp.headers
    wrapped = resp.json()
    assert list(wrapped) == ["status_code", "status_txt", "data"]
    assert (wrapped["status_code"], wrapped["status_txt"]) == (200, "OK")
    assert list(wrapped["data"]) == list(plain)

    def same_order(data: dict[str, Any]) -> dict[str, Any]:  # producers come in any order
        return {**data, "producers": sorted(data["producers"], key=lambda n: n["id"])}

    assert same_order(wrapped["data"]) == same_order(plain)


def test_lookup_partition_filter(backend: Backend) -> None:
    """§5.2: ``partition=1`` restricts ``partitions`` and ``producers`` to that partition."""
    data = lookup(backend, {"topic": REP, "access": "r", "partition": "1"}).json()
    assert list(data["partitions"]) == ["1"]
    assert data["producers"] == [data["partitions"]["1"]]
    assert f"127.0.0.1:{data['partitions']['1']['tcp_port']}" == backend.leader(REP, 1)


UNKNOWN_META = (
    '{"channels":[],"meta":{"disable_channel_auto_create":false,"extend_support":false,'
    '"multi_part":false,"ordered":false,"partition_num":0,"replica":0},'
    '"partitions":{},"producers":[]}'
)


@pytest.mark.parametrize(
    ("params", "accept", "status", "body"),
    [
        pytest.param(
            {"topic": UNKNOWN_TOPIC, "access": "r", "metainfo": "true"},
            True,
            200,
            UNKNOWN_META,
            id="unknown-r-meta",
        ),
        pytest.param(
            {"topic": UNKNOWN_TOPIC, "access": "r"},
            False,
            200,
            '{"status_code":200,"status_txt":"OK","data":'
            '{"channels":[],"partitions":{},"producers":[]}}',
            id="unknown-r-wrapped",
        ),
        pytest.param(
            {"topic": "bad!name", "access": "r"},
            True,
            200,
            '{"channels":[],"partitions":{},"producers":[]}',
            id="invalid-name-r",
        ),
        pytest.param(
            {"topic": UNKNOWN_TOPIC, "access": "w", "metainfo": "true"},
            True,
            404,
            '{"message":"Key not found"}',
            id="unknown-w",
        ),
        pytest.param(
            {"topic": UNKNOWN_TOPIC, "access": "w"},
            False,
            500,
            '{"status_code":500,"status_txt":"Key not found","data":null}',
            id="unknown-w-wrapped",
        ),
        pytest.param({}, True, 400, '{"message":"MISSING_ARG_TOPIC"}', id="missing-topic"),
        pytest.param(
            {},
            False,
            500,
            '{"status_code":500,"status_txt":"MISSING_ARG_TOPIC","data":null}',
            id="missing-topic-wrapped",
        ),
        pytest.param(
            {"topic": PLAIN, "access": "x"},
            True,
            400,
            '{"message":"INVALID_ACCESS_MODE"}',
            id="bad-access",
        ),
    ],
)
def test_lookup_exact_answers(
    backend: Backend, params: dict[str, str], accept: bool, status: int, body: str
) -> None:
    """§5.1/§5.2: unknown topics, invalid names and bad arguments, byte for byte, with and
    without the ``Accept`` envelope (the v1 header only with it)."""
    resp = lookup(backend, params, accept=accept)
    assert (resp.status_code, resp.text) == (status, body)
    assert ("X-Nsq-Content-Type" in resp.headers) is accept


def test_lookupd_ping_and_info(backend: Backend) -> None:
    """§5.3: ``/ping`` is plain ``OK``; ``/info`` gives the version and ``ha_support``."""
    ping = http("GET", f"{backend.lookupd_http}/ping", accept=False)
    assert (ping.status_code, ping.text) == (200, "OK")
    info = http("GET", f"{backend.lookupd_http}/info")
    assert info.text == f'{{"version":"{FORK_VERSION}","ha_support":true}}'
    wrapped = http("GET", f"{backend.lookupd_http}/info", accept=False)
    assert wrapped.text == (
        f'{{"status_code":200,"status_txt":"OK","data":'
        f'{{"version":"{FORK_VERSION}","ha_support":true}}}}'
    )


@pytest.mark.parametrize("accept", [pytest.param(True, id="v1"), pytest.param(False, id="wrapped")])
def test_listlookup_shape(backend: Backend, accept: bool) -> None:
    """§5.3: ``lookupdleader`` first, then ``lookupdnodes``; capitalised keys; ports are
    strings; the leader is the lookupd we asked."""
    resp = http("GET", f"{backend.lookupd_http}/listlookup", accept=accept)
    assert resp.status_code == 200
    data = resp.json()
    if not accept:
        assert list(data) == ["status_code", "status_txt", "data"]
        assert (data["status_code"], data["status_txt"]) == (200, "OK")
        data = data["data"]
    assert list(data) == ["lookupdleader", "lookupdnodes"]
    leader = data["lookupdleader"]
    assert list(leader) == ["ID", "NodeIP", "TcpPort", "HttpPort", "RpcPort", "Epoch"]
    assert leader["NodeIP"] == "127.0.0.1"
    for key in ("TcpPort", "HttpPort", "RpcPort"):
        assert isinstance(leader[key], str)
        assert leader[key].isdigit()
    assert leader["HttpPort"] == str(port_of(backend.lookupd_http))
    assert leader["ID"] == f"127.0.0.1:{leader['RpcPort']}:{leader['TcpPort']}:nsqlookup"
    assert isinstance(leader["Epoch"], int)
    assert data["lookupdnodes"] == [leader]


# == §5.4 /topic/create =======================================================================


@pytest.mark.parametrize(
    ("params", "message"),
    [
        pytest.param({"partition_num": "1", "replicator": "1"}, "MISSING_ARG_TOPIC", id="no-topic"),
        pytest.param(
            {"topic": "bad!name", "partition_num": "1", "replicator": "1"},
            "INVALID_ARG_TOPIC",
            id="bad-name",
        ),
        pytest.param(
            {"topic": "cf_new", "replicator": "1"},
            "MISSING_ARG_TOPIC_PARTITION_NUM",
            id="no-partition-num",
        ),
        pytest.param(
            {"topic": "cf_new", "partition_num": "0", "replicator": "1"},
            "INVALID_ARG_TOPIC_PARTITION_NUM",
            id="partition-num-0",
        ),
        pytest.param(
            {"topic": "cf_new", "partition_num": "x", "replicator": "1"},
            "INVALID_ARG_TOPIC_PARTITION_NUM",
            id="partition-num-x",
        ),
        pytest.param(
            {"topic": "cf_new", "partition_num": "1"},
            "MISSING_ARG_TOPIC_REPLICATOR",
            id="no-replicator",
        ),
        pytest.param(
            {"topic": "cf_new", "partition_num": "1", "replicator": "6"},
            "INVALID_ARG_TOPIC_REPLICATOR",
            id="replicator-6",
        ),
        pytest.param(
            {"topic": PLAIN, "partition_num": "2", "replicator": "1", "multipart": "true"},
            "already exist",
            id="exists-different",
        ),
    ],
)
def test_topic_create_errors(backend: Backend, params: dict[str, str], message: str) -> None:
    """§5.4: ``/topic/create`` argument errors are 400 ``{"message":...}``."""
    resp = http("POST", f"{backend.lookupd_http}/topic/create", params)
    assert (resp.status_code, resp.json()) == (400, {"message": message})


def test_topic_create_identical_again_is_ok(backend: Backend) -> None:
    """§5.4: re-creating a topic with identical parameters is 200 with an empty body."""
    params = {"topic": PLAIN, "partition_num": "1", "replicator": "1", "multipart": "true"}
    resp = http("POST", f"{backend.lookupd_http}/topic/create", params)
    assert (resp.status_code, resp.text) == (200, "")


# == §5.6 nsqd HTTP ===========================================================================


def test_nsqd_ping(backend: Backend) -> None:
    """§5.6: every nsqd answers ``GET /ping`` with plain ``OK``."""
    addresses = backend.node_addresses()
    assert len(addresses) == 3  # both backends run three nsqd; the loop checks each
    for address in addresses:
        resp = http("GET", f"{backend.http_url(address)}/ping", accept=False)
        assert (resp.status_code, resp.text) == (200, "OK")


def test_nsqd_info(backend: Backend) -> None:
    """§5.6: ``/info`` keys; ports are those of the node."""
    address = backend.leader(PLAIN)
    info = http("GET", f"{backend.http_url(address)}/info").json()
    assert set(info) == {
        "version",
        "broadcast_address",
        "hostname",
        "http_port",
        "tcp_port",
        "start_time",
        "ha_support",
    }
    assert info["version"] == FORK_VERSION
    assert info["tcp_port"] == port_of(address)
    assert info["ha_support"] is True


TOPIC_STATS_KEYS = {
    "topic_name", "topic_full_name", "topic_partition", "channels", "channel_num", "depth",
    "backend_depth", "backend_start", "message_count", "is_leader", "hourly_pubsize",
    "client_pub_stats", "client_num", "msg_size_stats", "msg_write_latency_stats",
    "is_multi_ordered", "is_multi_part", "is_ext", "is_channel_auto_create_disabled",
    "statsd_name", "pub_failed_cnt", "e2e_processing_latency",
}  # fmt: skip
CHANNEL_STATS_KEYS = {
    "channel_name", "backlogs", "depth", "depth_size", "depth_ts", "depth_ts_nano",
    "backend_depth", "hourly_subsize", "in_flight_count", "deferred_count",
    "deferred_from_delay_count", "message_count", "requeue_count", "timeout_count", "clients",
    "client_num", "paused", "skipped", "zan_test_skipped", "delayed_queue_count",
    "delayed_queue_recent", "delayed_queue_recent_nano", "e2e_processing_latency",
    "msg_consume_latency_stats", "msg_delivery_latency_stats",
}  # fmt: skip
CLIENT_STATS_KEYS = {
    "name", "client_id", "hostname", "version", "remote_address", "state", "ready_count",
    "in_flight_count", "message_count", "finish_count", "requeue_count", "timeout_count",
    "deferred_count", "connect_ts", "sample_rate", "deflate", "snappy", "user_agent",
    "desired_tag", "tls", "tls_cipher_suite", "tls_version", "tls_negotiated_protocol",
    "tls_negotiated_protocol_is_mutual", "output_buffer_size", "output_buffer_timeout",
    "msg_timeout", "ext_filter", "limited_rdy",
}  # fmt: skip


def stats_partition(url: str, topic: str, partition: int) -> dict[str, Any] | None:
    data = http("GET", f"{url}/stats", {"format": "json", "topic": topic}).json()
    for entry in data["topics"]:
        if entry["topic_partition"] == str(partition):
            return dict(entry)
    return None


def test_nsqd_stats_keys_and_values(backend: Backend) -> None:
    """§5.6: ``/stats?format=json&topic=T``: the key sets of topic, channel and client
    objects, names per partition, and the counters of a fresh channel (2 messages of 6
    bytes, 1 in flight)."""
    address = backend.leader(REP, 0)
    url = backend.http_url(address)
    with subscribe(address, Sub(REP, "c_stats", ident={}, rdy=1)) as sub, Wire(address) as p:
        pub(p, REP, b"stat-1")
        pub(p, REP, b"stat-2")
        sub.read_message()
        top = http("GET", f"{url}/stats", {"format": "json", "topic": REP}).json()
        assert {"version", "health", "start_time", "topics"} <= set(top)
        assert top["version"] == FORK_VERSION
        # The fork's channel depth follows the topic's end only when the topic flushes its
        # write buffer to the channels (periodically, or when a channel runs dry), so right
        # after the PUBs it may still count 1 of the 2 messages: poll until it settles.
        expected = (2, 2 * (4 + 26 + 6), 1)
        seen: list[tuple[int, int, int]] = []

        def settled() -> tuple[dict[str, Any], dict[str, Any]] | None:
            entry = stats_partition(url, REP, 0)
            assert entry is not None
            (found,) = [c for c in entry["channels"] if c["channel_name"] == "c_stats"]
            seen.append((found["depth"], found["depth_size"], found["in_flight_count"]))
            return (entry, found) if seen[-1] == expected else None

        try:
            entry, channel = wait_for(settled, 10, f"channel counters {expected}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; (depth, depth_size, in flight) seen: {seen}") from None
        assert set(entry) == TOPIC_STATS_KEYS
        assert (entry["topic_name"], entry["topic_full_name"]) == (REP, f"{REP}-0")
        assert (entry["topic_partition"], entry["statsd_name"]) == ("0", f"{REP}.0")
        assert entry["is_leader"] is True
        assert set(channel) == CHANNEL_STATS_KEYS
        (client,) = channel["clients"]
        assert set(client) == CLIENT_STATS_KEYS
        assert (client["client_id"], client["hostname"], client["version"]) == (
            "conformance",
            "conformance-host",
            "V2",
        )
        assert (client["state"], client["ready_count"], client["in_flight_count"]) == (3, 1, 1)
        assert (client["output_buffer_size"], client["output_buffer_timeout"]) == (4096, 50000000)
        assert client["msg_timeout"] == 60000000000
        replica = stats_partition(backend.http_url(backend.replica(REP, 0)), REP, 0)
        assert replica is not None
        assert replica["is_leader"] is False
        assert stats_partition(backend.http_url(backend.non_host(REP, 0)), REP, 0) is None


def test_nsqd_stats_without_accept_is_wrapped(backend: Backend) -> None:
    """§5.1/§5.6: without the ``Accept`` header the stats object is wrapped."""
    url = backend.leader_http(PLAIN)
    data = http("GET", f"{url}/stats", {"format": "json", "topic": PLAIN}, accept=False).json()
    assert list(data) == ["status_code", "status_txt", "data"]
    assert data["data"]["topics"][0]["topic_name"] == PLAIN


def test_nsqd_http_pub_and_pubtrace(backend: Backend) -> None:
    """§5.6: ``/pub`` answers ``OK``; ``/pubtrace`` answers the trace JSON; the consumer gets
    both; an unknown topic is 404 ``E_TOPIC_NOT_EXIST``."""
    address = backend.leader(PLAIN)
    url = backend.http_url(address)
    with subscribe(address, Sub(PLAIN, "c_httppub", rdy=5)) as sub:
        resp = http("POST", f"{url}/pub", {"topic": PLAIN, "partition": "0"}, content=b"h-1")
        assert (resp.status_code, resp.text) == (200, "OK")
        traced = http(
            "POST",
            f"{url}/pubtrace",
            {"topic": PLAIN, "partition": "0", "trace_id": "123"},
            content=b"h-2",
        ).json()
        assert list(traced) == ["status", "id", "trace_id", "queue_offset", "rawsize"]
        assert (traced["status"], traced["trace_id"], traced["rawsize"]) == ("OK", "123", 33)
        first, second = sub.read_message(), sub.read_message()
        assert (first.body, second.body) == (b"h-1", b"h-2")
        assert (second.internal_id, second.trace_id) == (traced["id"], 123)
        assert second.internal_id == first.internal_id + 1
    missing = http("POST", f"{url}/pub", {"topic": UNKNOWN_TOPIC}, content=b"x")
    assert (missing.status_code, missing.json()) == (404, {"message": "E_TOPIC_NOT_EXIST"})


def test_nsqd_channel_create(backend: Backend) -> None:
    """§5.6: ``/channel/create`` answers 200 with an empty body; lookup then lists it."""
    url = backend.leader_http(PLAIN)
    params = {"topic": PLAIN, "partition": "0", "channel": "c_created"}
    resp = http("POST", f"{url}/channel/create", params)
    assert (resp.status_code, resp.text) == (200, "")
    wait_for(
        lambda: "c_created" in lookup(backend, {"topic": PLAIN}).json()["channels"],
        10.0,
        "the new channel in lookup",
    )


def setoffset(backend: Backend, topic: str, channel: str, body: bytes) -> httpx.Response:
    params = {"topic": topic, "partition": "0", "channel": channel}
    return http("POST", f"{backend.leader_http(topic)}/channel/setoffset", params, content=body)


def test_channel_setoffset_positions(backend: Backend) -> None:
    """§5.6/§2.3.1 on a fresh partition (5 records of 35 bytes at 0, 35, ... 140), everything
    consumed first: ``msgcount:3`` resumes at the third message, ``virtual_queue:0`` at the
    first, ``virtual_queue:36`` (inside a record) at the next record boundary, 70;
    ``special:-1`` at the end. Every accepted body answers 200, empty."""
    address = backend.leader(FRESH_OFFSET)
    spec = Sub(FRESH_OFFSET, "ch", command="SUB_ADVANCED", rdy=1)
    with subscribe(address, spec) as sub, Wire(address) as p:
        for i in range(5):
            assert pub_trace(p, FRESH_OFFSET, b"off-%d" % i, i + 1) == Traced(
                i + 2, i + 1, 35 * i, 35
            )

        def drain() -> list[int]:
            offsets = []
            while True:
                try:
                    msg = sub.read_message(detail=True, timeout=1.0)
                except NoFrame:
                    return offsets
                assert msg.body == b"off-%d" % ((msg.offset or 0) // 35)
                offsets.append(msg.offset or 0)
                fin(sub, msg.id)

        assert drain() == [0, 35, 70, 105, 140]
        for body, offsets in [
            (b"msgcount:3", [70, 105, 140]),
            (b"virtual_queue:0", [0, 35, 70, 105, 140]),
            (b"virtual_queue:36", [70, 105, 140]),
            (b"special:-1", []),
        ]:
            resp = setoffset(backend, FRESH_OFFSET, "ch", body)
            assert (resp.status_code, resp.text) == (200, ""), body
            assert drain() == offsets, body


def test_channel_setoffset_special_skips_the_backlog(backend: Backend) -> None:
    """§5.6/§2.3.1: ``special:-1`` jumps to the end: of three queued messages at most the
    first (the one the real nsqd has already read ahead) is delivered, never the others."""
    address = backend.leader(PLAIN)
    spec = Sub(PLAIN, "c_special", command="SUB_ADVANCED", rdy=0)
    with subscribe(address, spec) as sub, Wire(address) as p:
        for i in range(3):
            pub(p, PLAIN, b"skip-%d" % i)
        resp = setoffset(backend, PLAIN, "c_special", b"special:-1")
        assert (resp.status_code, resp.text) == (200, "")
        sub.command("RDY 5")
        bodies = []
        while True:
            try:
                bodies.append(sub.read_message(detail=True, timeout=1.0).body)
            except NoFrame:
                break
        assert bodies in ([], [b"skip-0"])
        pub(p, PLAIN, b"after-skip")
        assert sub.read_message(detail=True).body == b"after-skip"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        pytest.param(b"bogus:1", 400, "invalid consume offset:bogus:1", id="bogus"),
        pytest.param(b"", 406, "MSG_EMPTY", id="empty"),
    ],
)
def test_channel_setoffset_errors(backend: Backend, body: bytes, status: int, message: str) -> None:
    """§5.6: an unknown offset type is 400, an empty body 406."""
    with subscribe(backend.leader(PLAIN), Sub(PLAIN, "c_setoff_err", command="SUB_ADVANCED")):
        resp = setoffset(backend, PLAIN, "c_setoff_err", body)
        assert (resp.status_code, resp.json()) == (status, {"message": message})


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        pytest.param(b"virtual_queue:0", 500, "commit log end of file", id="virtual_queue"),
        pytest.param(b"msgcount:1", 500, "commit log end of file", id="msgcount"),
        pytest.param(b"timestamp:0", 500, "commit log end of file", id="timestamp"),
        pytest.param(b"special:-1", 200, None, id="special"),
    ],
)
def test_channel_setoffset_on_an_empty_partition(
    backend: Backend, body: bytes, status: int, message: str | None
) -> None:
    """§5.6, found by ``nsq-ha tail`` rewinding a new channel: on a partition that never had a
    message, seeking into the commit log fails with 500 ``commit log end of file``."""
    with subscribe(backend.leader(EMPTY), Sub(EMPTY, "c_empty", command="SUB_ADVANCED")):
        resp = setoffset(backend, EMPTY, "c_empty", body)
        got = (resp.status_code, resp.json() if resp.text else None)
        assert got == (status, None if message is None else {"message": message})


# == §11 leader move (changes the cluster: after every other case but the node stop) =========


@dataclass
class Moved:
    old: str
    new: str
    sub: Wire
    pub: Wire
    last_id: int


@pytest.fixture(scope="module")
def moved(backend: Backend) -> Iterator[Moved]:
    """A SUB and a PUB connection on the leader of REP/0, then its leadership moved.

    The connections are opened once the cluster is stable (the real lookupd refuses moves
    before), with the longest heartbeat interval, so that they outlive the move."""
    backend.wait_stable()
    old = backend.leader(REP, 0)
    with Wire(old) as sub, Wire(old) as p:
        identify(sub, heartbeat_interval=60000)
        sub.command(f"SUB {REP} c_move 0")
        sub.expect_ok()
        sub.command("RDY 1")
        identify(p, heartbeat_interval=60000)
        traced = pub_trace(p, REP, b"before-move", 1)
        msg = sub.read_message()
        assert msg.id == traced.id
        fin(sub, msg.id)
        prove_open_subscribed(sub)  # the FIN has been processed before the move
        new = backend.move_leader(REP, 0)
        assert new != old
        yield Moved(old, new, sub, p, traced.internal_id)


def test_move_old_leader_pub_is_not_leader_non_fatal(backend: Backend, moved: Moved) -> None:
    """§11: after the move, a PUB on the old leader's connection gets
    ``E_FAILED_ON_NOT_LEADER `` and the connection stays open."""
    moved.pub.command(f"PUB {REP} 0", b"after-move")
    moved.pub.expect_error("E_FAILED_ON_NOT_LEADER ")
    prove_open_init(moved.pub)


def test_move_old_sub_closed_without_error(backend: Backend, moved: Moved) -> None:
    """§11: the SUB connection on the old leader is closed by the server, no error frame."""
    moved.sub.expect_closed(timeout=10.0)


def test_move_lookup_names_the_new_leader(backend: Backend, moved: Moved) -> None:
    """§11: ``access=w`` (and ``access=r``) lookups name the new leader."""
    for access in ("w", "r"):
        data = lookup(backend, {"topic": REP, "access": access, "metainfo": "true"}).json()
        assert data["partitions"]["0"]["tcp_port"] == port_of(moved.new), access
        assert "c_move" in data["channels"]


def test_move_new_leader_serves_the_channel(backend: Backend, moved: Moved) -> None:
    """§11: the new leader accepts SUB (the channel is kept) and PUB; only new messages are
    delivered, with a larger internal id."""
    with subscribe(moved.new, Sub(REP, "c_move", rdy=5)) as sub, Wire(moved.new) as p:
        pub(p, REP, b"on-new-leader")
        msg = sub.read_message()
        assert msg.body == b"on-new-leader"
        assert msg.internal_id > moved.last_id
        fin(sub, msg.id)
        sub.expect_silence(0.5)


def test_move_old_leader_refuses_sub(backend: Backend, moved: Moved) -> None:
    """§2.3 row 12: after the move the old leader is a replica: SUB there is fatal."""
    with Wire(moved.old) as w:
        w.command(f"SUB {REP} c_move 0")
        w.expect_error_then_closed("E_FAILED_ON_NOT_LEADER ")


# == §11 node stop (last: the cluster stays degraded) =========================================


@dataclass
class Stopped:
    address: str
    sub: Wire


@pytest.fixture(scope="module")
def stopped(backend: Backend) -> Iterator[Stopped]:
    """The leader of the replica-1 topic STOP, stopped while a consumer is connected."""
    address = backend.leader(STOP, 0)
    with subscribe(address, Sub(STOP, "c_stop", rdy=1)) as sub:
        backend.stop_node(address)
        yield Stopped(address, sub)


def test_stop_closes_open_connections(backend: Backend, stopped: Stopped) -> None:
    """§11: connections to a stopped nsqd are closed."""
    stopped.sub.expect_closed(timeout=15.0)


def test_stop_hides_replica_1_partitions_from_writers(backend: Backend, stopped: Stopped) -> None:
    """§11: a replica-1 partition whose only node is down is missing from ``access=w``."""

    def gone() -> bool:
        resp = lookup(backend, {"topic": STOP, "access": "w", "metainfo": "true"})
        return resp.status_code != 200 or "0" not in (resp.json().get("partitions") or {})

    wait_for(gone, 30.0, f"{STOP}/0 to vanish from access=w")
    resp = lookup(backend, {"topic": STOP, "access": "w", "metainfo": "true"})
    if resp.status_code == 200:
        data = resp.json()
        assert data["partitions"] == {}
        assert data["meta"]["partition_num"] == 1


def test_stop_refuses_new_connections(backend: Backend, stopped: Stopped) -> None:
    """§11: a stopped nsqd no longer accepts TCP connections."""
    host, port = stopped.address.rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=2.0).close()
