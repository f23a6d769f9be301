"""LookupClient options and the limits on lookupd answers (pure, no I/O)."""

from __future__ import annotations

import math

import pytest

from nsq_ha.errors import ConfigError, RemoteProtocolError
from nsq_ha.lookup import LookupClient, LookupdError, parse_listlookup, parse_lookup, unwrap

BAD_DURATIONS = [math.nan, math.inf, -math.inf, -1.0, 0, 0.0, "5", None, True]


@pytest.mark.parametrize("option", ["timeout", "refresh_interval", "max_backoff"])
@pytest.mark.parametrize("value", BAD_DURATIONS, ids=repr)
def test_duration_options_refuse_nan_inf_and_non_positive(option: str, value: object) -> None:
    with pytest.raises(ConfigError, match=option):
        LookupClient("127.0.0.1:4161", **{option: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [math.nan, math.inf, -0.1, 1.0, "0.1", None, True], ids=repr)
def test_jitter_must_be_a_fraction(value: object) -> None:
    with pytest.raises(ConfigError, match="jitter"):
        LookupClient("127.0.0.1:4161", jitter=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, -1, 1.5, math.nan, "1024", True, 1 << 40], ids=repr)
def test_max_answer_bytes_must_be_a_sane_int(value: object) -> None:
    with pytest.raises(ConfigError, match="max_answer_bytes"):
        LookupClient("127.0.0.1:4161", max_answer_bytes=value)  # type: ignore[arg-type]


# -- answers ------------------------------------------------------------------------------------


def _node(port: int = 4150) -> dict[str, object]:
    return {"broadcast_address": "127.0.0.1", "tcp_port": port, "http_port": port + 1}


def test_partition_keys_must_be_canonical_decimals() -> None:
    for key in ("00", "01", "+1", " 1", "1_0", "\u0661"):
        with pytest.raises(RemoteProtocolError, match="partition id"):
            parse_lookup("t", "w", {"partitions": {key: _node()}})
    pmap = parse_lookup("t", "w", {"partitions": {"0": _node(), "254": _node(4160)}})
    assert sorted(pmap.partitions) == [0, 254]


def test_more_partitions_than_the_fork_allows_are_refused() -> None:
    with pytest.raises(RemoteProtocolError, match="over the limit of 255"):
        parse_lookup("t", "w", {"partitions": {str(i): _node() for i in range(256)}})
    with pytest.raises(RemoteProtocolError, match="partition_num"):
        parse_lookup("t", "w", {"partitions": {}, "meta": {"partition_num": 256}})
    pmap = parse_lookup("t", "w", {"partitions": {}, "meta": {"partition_num": 255}})
    assert pmap.partition_num == 255


def test_too_many_lookupds_are_refused() -> None:
    nodes = [{"NodeIP": "127.0.0.1", "HttpPort": str(1000 + i)} for i in range(65)]
    with pytest.raises(RemoteProtocolError, match="lookupds"):
        parse_listlookup({"lookupdnodes": nodes})
    assert len(parse_listlookup({"lookupdnodes": nodes[:64]})) == 64


def test_error_texts_stay_short() -> None:
    """A huge answer never becomes a huge exception text."""
    huge = {"partitions": {"x" * 100_000: _node()}}
    with pytest.raises(RemoteProtocolError) as info:
        parse_lookup("t", "w", huge)
    assert len(str(info.value)) < 500
    with pytest.raises(RemoteProtocolError) as info:
        parse_lookup("t", "w", ["y" * 100_000])
    assert len(str(info.value)) < 500
    with pytest.raises(LookupdError) as err:
        unwrap(500, {}, b'{"message": "' + b"z" * 100_000 + b'"}')
    assert len(str(err.value)) < 1000
    assert err.value.message.startswith("zzz")


def test_too_many_json_containers_are_refused_before_parsing() -> None:
    body = b'{"producers": [' + b",".join([b"[{}]"] * 20_000) + b"]}"
    with pytest.raises(RemoteProtocolError, match="containers"):
        unwrap(200, {}, body)
