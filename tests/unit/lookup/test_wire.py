"""Lookup answers recorded from the real lookupds (tests/golden) parsed into partition maps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_ha.errors import NsqError, RemoteProtocolError
from nsq_ha.lookup.wire import (
    LookupdError,
    NodeInfo,
    PartitionMap,
    TopicMeta,
    merge_maps,
    parse_listlookup,
    parse_lookup,
    unwrap,
)

GOLDEN = Path(__file__).resolve().parents[2] / "golden"


def _http_answers(name: str) -> dict[str, tuple[int, dict[str, str], bytes]]:
    """note of the request -> (status, headers, body) of its recorded answer."""
    steps = json.loads((GOLDEN / name).read_text())["steps"]
    out: dict[str, tuple[int, dict[str, str], bytes]] = {}
    pending: dict[str, str] = {}
    for step in steps:
        if step["dir"] == "c2s":
            pending[step["conn"]] = step["note"]
        elif step["dir"] == "s2c" and step["conn"] in pending:
            raw = bytes.fromhex(step["hex"])
            head, _, body = raw.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            status = int(lines[0].split()[1])
            headers = dict(line.split(": ", 1) for line in lines[1:])
            out[pending.pop(step["conn"])] = (status, headers, body)
    return out


FORK = _http_answers("lookup_fork.json")
VANILLA = _http_answers("lookup_vanilla.json")
LISTLOOKUP = _http_answers("listlookup.json")
NOCHANNEL = _http_answers("lookup_nochannel.json")


def _result(answer: tuple[int, dict[str, str], bytes]) -> Any:
    return unwrap(*answer)


def test_fork_v1_and_wrapped_answers_parse_alike() -> None:
    v1 = parse_lookup("cf_pubsub", "r", _result(FORK["r+meta, Accept v1"]))
    wrapped = parse_lookup("cf_pubsub", "r", _result(FORK["r+meta, no Accept"]))
    assert v1 == wrapped
    assert v1.fork
    assert v1.partition_num == 4
    assert sorted(v1.partitions) == [0, 1, 2, 3]
    assert v1.meta == TopicMeta(partition_num=4, replica=1, multi_part=True)
    assert v1.channels == ("ch", "hbch")
    routes = v1.routes()
    assert [r.partition for r in routes] == [0, 1, 2, 3]
    assert all(r.node.is_fork for r in routes)
    assert all(r.node.address.startswith("127.0.0.1:") for r in routes)
    assert all(r.node.distributed_id.count(":") == 3 for r in routes)
    assert len({n.address for n in v1.producers}) == len(v1.producers) == 3


def test_fork_write_lookup_and_topic_kinds() -> None:
    w = parse_lookup("cf_pubsub", "w", _result(FORK["w+meta, Accept v1"]))
    assert len(w.routes()) == 4
    ext = parse_lookup("cf_ext", "w", _result(FORK["ext topic meta"]))
    assert ext.extend_support
    assert not ext.ordered
    ordered = parse_lookup("cf_ordered", "w", _result(FORK["ordered topic meta"]))
    assert ordered.ordered
    assert ordered.partition_num == 4


def test_fork_lookup_without_meta_still_counts_partitions() -> None:
    w = parse_lookup("cf_pubsub", "w", _result(FORK["w, no metainfo, Accept v1"]))
    assert w.meta is None
    assert w.fork
    assert w.partition_num == 4  # highest listed id + 1
    single = parse_lookup("cf_pubsub", "r", _result(FORK["single partition"]))
    assert list(single.partitions) == [2]


def test_fork_unknown_topic() -> None:
    r = parse_lookup("x", "r", _result(FORK["unknown topic, access=r, Accept v1"]))
    assert r.fork
    assert r.partition_num == 0
    assert r.routes() == []
    with pytest.raises(LookupdError) as exc:
        _result(FORK["unknown topic, access=w, Accept v1"])
    assert (exc.value.status, exc.value.message) == (404, "Key not found")
    with pytest.raises(LookupdError) as exc:
        _result(FORK["unknown topic, access=w, no Accept"])
    assert (exc.value.status, exc.value.message) == (500, "Key not found")


def test_fork_request_errors_in_both_envelopes() -> None:
    for note, status in [("missing topic, Accept v1", 400), ("missing topic, no Accept", 500)]:
        with pytest.raises(LookupdError) as exc:
            _result(FORK[note])
        assert (exc.value.status, exc.value.message) == (status, "MISSING_ARG_TOPIC")
    assert _result(FORK["ping"]) == "OK"


def test_no_channel_answer() -> None:
    with pytest.raises(LookupdError, match="Topic has no channel"):
        _result(NOCHANNEL["access=w, no channel yet, Accept v1"])


def test_vanilla_lookup_becomes_unpartitioned_routes() -> None:
    v1 = parse_lookup("cf_vps", "w", _result(VANILLA["lookup, Accept v1"]))
    wrapped = parse_lookup("cf_vps", "w", _result(VANILLA["lookup, no Accept"]))
    assert v1 == wrapped
    assert not v1.fork
    assert v1.meta is None
    assert v1.partition_num == 0
    (route,) = v1.routes()
    assert route.partition is None
    assert route.node.version == "1.3.0"
    assert not route.node.is_fork
    assert str(route) == f"-@{route.node.address}"


def test_listlookup_fork_and_vanilla() -> None:
    fork = {k: v for k, v in LISTLOOKUP.items() if k.startswith("fork")}
    vanilla = {k: v for k, v in LISTLOOKUP.items() if k.startswith("vanilla")}
    assert fork
    assert vanilla
    for answer in fork.values():
        assert parse_listlookup(_result(answer)) == ["http://127.0.0.1:14161"]
    for answer in vanilla.values():
        with pytest.raises(LookupdError) as exc:
            _result(answer)
        assert exc.value.status == 404


def test_listlookup_null_and_ipv6() -> None:
    assert parse_listlookup(None) == []
    node = {"NodeIP": "::1", "HttpPort": "4161"}
    assert parse_listlookup({"lookupdleader": node, "lookupdnodes": [node]}) == [
        "http://[::1]:4161"
    ]


def test_merge_prefers_the_first_answer_and_unions_the_rest() -> None:
    a = NodeInfo("10.0.0.1", 4150, 4151, "0.3.7-HA.1.13.0")
    b = NodeInfo("10.0.0.2", 4150, 4151, "0.3.7-HA.1.13.0")
    m1 = PartitionMap("t", "w", {0: a}, (a,), ("c1",), TopicMeta(2), fork=True)
    m2 = PartitionMap("t", "w", {0: b, 1: b}, (b,), ("c2",), TopicMeta(2), fork=True)
    merged = merge_maps([m1, m2])
    assert merged.partitions == {0: a, 1: b}
    assert merged.producers == (a, b)
    assert merged.channels == ("c1", "c2")
    with pytest.raises(ValueError, match="at least one"):
        merge_maps([])


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"partitions": []},
        {"partitions": {"x": {}}},
        {"partitions": {"300": {"broadcast_address": "h", "tcp_port": 1}}},
        {"partitions": {"0": {"tcp_port": 1}}},
        {"partitions": {"0": {"broadcast_address": "", "tcp_port": 1}}},
        {"partitions": {"0": {"broadcast_address": "h", "tcp_port": "1"}}},
        {"partitions": {"0": {"broadcast_address": "h", "tcp_port": 70000}}},
        {"partitions": {"0": "node"}},
        {"producers": {}},
        {"channels": "c"},
        {"meta": []},
        {"meta": {"partition_num": -1}},
        {"meta": {"partition_num": 1, "replica": "3"}},
    ],
)
def test_malformed_lookups_raise_remote_protocol_errors(bad: object) -> None:
    with pytest.raises(RemoteProtocolError):
        parse_lookup("t", "r", bad)


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"lookupdnodes": {"a": 1}},
        {"lookupdnodes": [{"NodeIP": "h"}]},
        {"lookupdnodes": [{"NodeIP": "h", "HttpPort": "x"}]},
    ],
)
def test_malformed_listlookups_raise(bad: object) -> None:
    with pytest.raises(RemoteProtocolError):
        parse_listlookup(bad)


def test_unwrap_edge_cases() -> None:
    assert unwrap(200, {}, b"") is None
    with pytest.raises(LookupdError, match="answered 502: bad gateway"):
        unwrap(502, {}, b"bad gateway", "http://l")
    with pytest.raises(LookupdError) as exc:
        unwrap(200, {}, b'{"status_code":"x","status_txt":"odd","data":null}')
    assert exc.value.status == 200


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=5)
    ),
    max_leaves=20,
)


@given(
    result=st.fixed_dictionaries(
        {},
        optional={
            "partitions": json_values,
            "producers": json_values,
            "channels": json_values,
            "meta": json_values,
        },
    )
)
def test_any_json_parses_or_raises_an_nsq_error(result: dict[str, object]) -> None:
    try:
        parse_lookup("t", "w", result)
        parse_listlookup(result)
    except NsqError:
        pass


def test_leader_and_null_results() -> None:
    w = parse_lookup("cf_pubsub", "w", _result(FORK["w+meta, Accept v1"]))
    leader = w.leader(0)
    assert leader is not None
    assert leader.distributed_id
    assert w.leader(9) is None
    empty = parse_lookup("t", "r", None)
    assert empty.routes() == []
    assert not empty.fork


@pytest.mark.parametrize(
    ("host", "url"),
    [("10.0.0.2", "http://10.0.0.2:4151"), ("fe80::1", "http://[fe80::1]:4151")],
)
def test_node_http_url_brackets_ipv6(host: str, url: str) -> None:
    node = NodeInfo.from_wire({"broadcast_address": host, "tcp_port": 4150, "http_port": 4151})
    assert node.http_url == url
