"""IDENTIFY builder and response parsing (fork and vanilla), AUTH response."""

from __future__ import annotations

import contextlib
import json

import pytest
from golden_data import load
from hypothesis import given
from hypothesis import strategies as st

from nsq_ha.errors import InvalidArgumentError, NsqError, RemoteProtocolError
from nsq_ha.protocol import Identify
from nsq_ha.protocol.identify import (
    Negotiated,
    build_identify,
    parse_auth_response,
    parse_identify_response,
)

FORK_ANSWER = load("identify")["cases"][1]["answer_json"]
VANILLA_ANSWER = next(
    c["answer_json"]
    for c in load("identify")["cases"]
    if c["label"] == "vanilla: feature_negotiation true, defaults"
)


def test_build_identify_orders_keys_like_the_recordings() -> None:
    body = build_identify(
        client_id="conformance",
        hostname="conformance-host",
        heartbeat_interval=30,
        user_agent="conformance-probe/1.0",
        msg_timeout=4.0,
    )
    assert list(body) == [
        "client_id",
        "hostname",
        "feature_negotiation",
        "heartbeat_interval",
        "user_agent",
        "msg_timeout",
    ]
    assert body["heartbeat_interval"] == 30000
    assert body["msg_timeout"] == 4000


def test_build_identify_every_field() -> None:
    ext_filter = {"type": 1, "filter_ext_key": "k", "filter_data": "v"}
    body = build_identify(
        feature_negotiation=False,
        heartbeat_interval=-1,
        output_buffer_size=-1,
        output_buffer_timeout=-1,
        sample_rate=0,
        tls_v1=True,
        snappy=False,
        deflate=True,
        deflate_level=6,
        desired_tag="tag_A-1",
        extend_support=True,
        ext_filter=ext_filter,  # type: ignore[arg-type]
    )
    assert body == {
        "feature_negotiation": False,
        "heartbeat_interval": -1,
        "output_buffer_size": -1,
        "output_buffer_timeout": -1,
        "sample_rate": 0,
        "tls_v1": True,
        "snappy": False,
        "deflate": True,
        "deflate_level": 6,
        "desired_tag": "tag_A-1",
        "extend_support": True,
        "ext_filter": ext_filter,
    }
    assert build_identify(output_buffer_size=64, output_buffer_timeout=0.001) == {
        "feature_negotiation": True,
        "output_buffer_size": 64,
        "output_buffer_timeout": 1,
    }
    assert build_identify(desired_tag="") == {"feature_negotiation": True}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"heartbeat_interval": 0.5}, "heartbeat_interval"),
        ({"heartbeat_interval": 0}, "heartbeat_interval"),
        ({"heartbeat_interval": "1000"}, "heartbeat_interval"),
        ({"msg_timeout": 0.5}, "msg_timeout"),
        ({"msg_timeout": -1}, "msg_timeout"),
        ({"output_buffer_size": 10}, "output_buffer_size"),
        ({"output_buffer_size": 0}, "output_buffer_size"),
        ({"output_buffer_timeout": 0.0001}, "output_buffer_timeout"),
        ({"sample_rate": 100}, "sample_rate"),
        ({"sample_rate": -1}, "sample_rate"),
        ({"deflate_level": 0}, "deflate_level"),
        ({"deflate_level": 10}, "deflate_level"),
        ({"deflate_level": True}, "deflate_level"),
        ({"snappy": True, "deflate": True}, "snappy and deflate"),
        ({"desired_tag": "x" * 101}, "desired_tag"),
        ({"desired_tag": "a b"}, "desired_tag"),
        ({"client_id": 5}, "client_id"),
        ({"hostname": b"h"}, "hostname"),
        ({"user_agent": 1}, "user_agent"),
        ({"ext_filter": [1]}, "ext_filter"),
    ],
)
def test_build_identify_refuses(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        build_identify(**kwargs)  # type: ignore[arg-type]


def test_parse_fork_answer() -> None:
    request = build_identify(heartbeat_interval=1, extend_support=True)
    negotiated = parse_identify_response(json.dumps(FORK_ANSWER).encode(), request)
    assert negotiated.is_fork is True
    assert negotiated.feature_negotiation is True
    assert negotiated.version == "0.3.7-HA.1.13.0"
    assert negotiated.max_rdy_count == 2500
    assert negotiated.msg_timeout == 60.0
    assert negotiated.max_msg_timeout == 900.0
    assert negotiated.output_buffer_size == 100
    assert negotiated.output_buffer_timeout == 0.05
    assert (negotiated.deflate_level, negotiated.max_deflate_level) == (0, 6)
    assert not (negotiated.tls_v1)
    assert not (negotiated.snappy)
    assert not (negotiated.deflate)
    assert not negotiated.auth_required
    assert negotiated.sample_rate == 0
    assert negotiated.desired_tag is None
    assert negotiated.extend_support is True
    assert negotiated.heartbeat_interval == 1.0
    assert negotiated.raw == FORK_ANSWER


def test_parse_vanilla_answer_and_plain_ok() -> None:
    negotiated = parse_identify_response(json.dumps(VANILLA_ANSWER).encode())
    assert negotiated.is_fork is False
    assert negotiated.deflate_level == 6
    assert negotiated.output_buffer_timeout == 0.25
    assert negotiated.extend_support is False
    assert negotiated.heartbeat_interval == 30.0
    plain = parse_identify_response(b"OK", {"heartbeat_interval": -1})
    assert plain.feature_negotiation is False
    assert plain.is_fork is None
    assert plain.heartbeat_interval is None
    assert plain.raw is None
    assert parse_identify_response(b"OK", {"heartbeat_interval": 0}).heartbeat_interval == 30.0
    assert parse_identify_response(b"OK", {"heartbeat_interval": "x"}).heartbeat_interval == 30.0


def test_parse_tolerates_missing_and_unknown_keys() -> None:
    negotiated = parse_identify_response(b'{"version":"1.0.0","future":[1],"desired_tag":"t"}')
    assert negotiated.max_rdy_count is None
    assert negotiated.msg_timeout is None
    assert negotiated.desired_tag == "t"
    assert negotiated.raw == {"version": "1.0.0", "future": [1], "desired_tag": "t"}
    assert parse_identify_response(b"{}").is_fork is None


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "not valid JSON"),
        (b"{", "not valid JSON"),
        (b"\xff", "not valid JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"max_rdy_count":"2500"}', "max_rdy_count"),
        (b'{"max_rdy_count":true}', "max_rdy_count"),
        (b'{"msg_timeout":1.5}', "msg_timeout"),
        (b'{"tls_v1":1}', "tls_v1"),
        (b'{"version":3}', "version"),
    ],
)
def test_malformed_answers(data: bytes, match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        parse_identify_response(data)


@given(st.binary(max_size=80))
def test_garbage_answers_raise_only_nsq_errors(data: bytes) -> None:
    with contextlib.suppress(NsqError):
        parse_identify_response(data)


def test_fork_detection() -> None:
    for version, fork in (("0.3.7-HA.1.13.0", True), ("1.3.0", False), ("0.3.7", False)):
        assert Negotiated(feature_negotiation=True, version=version).is_fork is fork


def test_identify_builder_output_encodes() -> None:
    assert Identify.of(build_identify(client_id="c")).encode().startswith(b"IDENTIFY\n")


def test_auth_response() -> None:
    data = b'{"identity":"me","identity_url":"http://x","permission_count":2}'
    assert parse_auth_response(data) == {
        "identity": "me",
        "identity_url": "http://x",
        "permission_count": 2,
    }
    for bad in (
        b'{"identity":"me"}',
        b'{"identity":"me","identity_url":"u","permission_count":true}',
    ):
        with pytest.raises(RemoteProtocolError, match="AUTH response key"):
            parse_auth_response(bad)
    with pytest.raises(RemoteProtocolError, match="not valid JSON"):
        parse_auth_response(b"nope")
