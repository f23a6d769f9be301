"""``nsq-ha lookup / topic create / pub / tail`` as a user runs them (a subprocess each), against
the embedded cluster and the real fork cluster; ``--nsqd`` against real vanilla nsqd; and the
one-line errors for bad input."""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Iterator

import httpx
import pytest

from nsq_ha.devcluster import DevClusterThread
from nsq_ha.testing.servers import VanillaCluster

from .cli_run import json_lines, nsq_ha, ok, one_line_error

ACCEPTANCE_LINES = b"k1\ta\nk2\tb\nk1\tc\n"


@pytest.fixture(scope="module", params=["devcluster", "fork"])
def lookupd(request: pytest.FixtureRequest) -> Iterator[str]:
    """nsqlookupd's HTTP URL of the embedded cluster or of the real fork cluster."""
    if request.param == "devcluster":
        with DevClusterThread(nodes=3) as dev:
            yield dev.lookupd_http
    else:
        yield request.getfixturevalue("fork_cluster").lookupd_http


def tail_json(lookupd: str, topic: str, channel: str, count: int) -> list[dict[str, object]]:
    """``nsq-ha tail --json -n COUNT`` on a fork lookupd: the messages it printed."""
    argv = ["--lookupd", lookupd, "--topic", topic, "--channel", channel, "-n", str(count)]
    return json_lines(ok(nsq_ha("tail", *argv, "--json", "--timeout", "60")))


def _name(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(3)}"


def create(lookupd: str, topic: str, *flags: str) -> dict[str, object]:
    out = ok(nsq_ha("topic", "create", "--lookupd", lookupd, "--topic", topic, *flags, "--json"))
    return json.loads(out)


def test_topic_create_lookup_pub_and_tail_keep_a_keys_order(lookupd: str) -> None:
    """The issue's pipeline: k1's two messages land on one partition and come back in order."""
    topic = _name("cli_orders")
    created = create(lookupd, topic, "--partitions", "4", "--replicas", "2", "--ordered")
    assert sorted(created["partitions"]) == ["0", "1", "2", "3"]  # type: ignore[arg-type]
    assert created["meta"]["ordered"] is True  # type: ignore[index]

    table = ok(nsq_ha("lookup", "--lookupd", lookupd, "--topic", topic, "--plain"))
    assert f"{topic} (access=w): 4 partitions, replicas 2, ordered" in table
    looked = json.loads(ok(nsq_ha("lookup", "--lookupd", lookupd, "--topic", topic, "--json")))
    assert looked["partitions"] == created["partitions"]

    pub = nsq_ha(
        "pub", "--lookupd", lookupd, "--topic", topic, "--key-sep", "\\t", stdin=ACCEPTANCE_LINES
    )
    summary = json.loads(ok(pub).splitlines()[-1])
    assert (summary["published"], summary["failed"], summary["errors"]) == (3, 0, [])
    assert sum(summary["partitions"].values()) == 3

    messages = tail_json(lookupd, topic, "c", 3)
    assert sorted(m["body"] for m in messages) == ["a", "b", "c"]
    k1 = [m for m in messages if m["body"] in ("a", "c")]
    assert [m["body"] for m in k1] == ["a", "c"], "k1's messages out of order"
    assert k1[0]["partition"] == k1[1]["partition"]
    assert k1[0]["offset"] < k1[1]["offset"]  # type: ignore[operator]
    for m in messages:
        assert set(m) == {
            "partition",
            "offset",
            "id",
            "trace_id",
            "attempts",
            "timestamp",
            "ext",
            "body",
            "body_base64",
        }
        assert len(str(m["id"])) == 32
        assert m["attempts"] == 1
        assert m["body_base64"] is False


def test_pub_json_and_trace_ids_reach_tail(lookupd: str) -> None:
    topic = _name("cli_traced")
    create(lookupd, topic, "--partitions", "2", "--replicas", "1")
    lines = b"".join(b"key%d:body-%d\n" % (i % 3, i) for i in range(20))
    pub = nsq_ha(
        "pub",
        "--lookupd",
        lookupd,
        "--topic",
        topic,
        "--key-sep",
        ":",
        "--trace",
        "--json",
        "--batch",
        "7",
        stdin=lines,
    )
    results = json_lines(ok(pub))
    summary, per_line = results[-1], results[:-1]
    assert summary["published"] == 20
    assert summary["failed"] == 0
    assert [r["line"] for r in per_line] == list(range(1, 21))
    by_key: dict[object, set[object]] = {}
    for r in per_line:
        by_key.setdefault(r["key"], set()).add(r["partition"])
        assert isinstance(r["trace_id"], int)
        assert r["trace_id"] > 0
        assert isinstance(r["id"], str)
        assert len(r["id"]) == 32
    assert all(len(parts) == 1 for parts in by_key.values()), by_key
    received = {m["trace_id"]: m for m in tail_json(lookupd, topic, "t", 20)}
    for r in per_line:
        got = received[r["trace_id"]]
        # tail reads fork topics with SUB_ADVANCED: every message carries the offset pub --trace got
        expected = (r["id"], r["partition"], r["offset"])
        assert (got["id"], got["partition"], got["offset"]) == expected


def test_binary_bodies_are_printed_as_base64(lookupd: str) -> None:
    topic = _name("cli_binary")
    create(lookupd, topic)
    ok(nsq_ha("pub", "--lookupd", lookupd, "--topic", topic, stdin=b"\xff\xfe\x00ok\n"))
    (message,) = tail_json(lookupd, topic, "b", 1)
    assert message["body_base64"] is True
    assert base64.b64decode(str(message["body"])) == b"\xff\xfe\x00ok"


def test_ext_headers_round_trip_and_plain_topics_refuse_them(lookupd: str) -> None:
    topic = _name("cli_ext")
    create(lookupd, topic, "--ext")
    header = '{"source":"cli","##client_dispatch_tag":"t1"}'
    ok(nsq_ha("pub", "--lookupd", lookupd, "--topic", topic, "--ext", header, stdin=b"x\n"))
    (message,) = tail_json(lookupd, topic, "e", 1)
    assert message["ext"] == json.loads(header)

    plain = _name("cli_noext")
    create(lookupd, plain)
    refused = nsq_ha("pub", "--lookupd", lookupd, "--topic", plain, "--ext", header, stdin=b"x\n")
    assert refused.returncode == 1
    summary = json.loads(refused.stdout.splitlines()[-1])
    assert (summary["published"], summary["failed"]) == (0, 1)
    assert "ext" in summary["errors"][0]["error"].lower()


def test_lines_without_the_separator_are_counted_as_errors(lookupd: str) -> None:
    topic = _name("cli_sep")
    create(lookupd, topic)
    proc = nsq_ha(
        "pub",
        "--lookupd",
        lookupd,
        "--topic",
        topic,
        "--key-sep",
        "=",
        "--json",
        stdin=b"a=1\nnoseparator\nb=2\n",
    )
    assert proc.returncode == 1
    *lines, summary = json_lines(proc.stdout)
    assert (summary["published"], summary["failed"]) == (2, 1)
    assert summary["errors"] == [{"error": "line 2 has no key separator b'='", "count": 1}]
    assert [line.get("ok") for line in lines] == [False, True, True]


@pytest.mark.vanilla
def test_pub_and_tail_against_vanilla_nsqd(vanilla_cluster: VanillaCluster) -> None:
    """``--nsqd``: vanilla nsqd, no partitions (``partition`` is null)."""
    address = vanilla_cluster.nodes[0].tcp_address
    topic = _name("cli_vanilla")
    summary = json.loads(
        ok(nsq_ha("pub", "--nsqd", address, "--topic", topic, stdin=b"one\ntwo\n")).splitlines()[-1]
    )
    assert summary["published"] == 2
    assert summary["partitions"] == {"-": 2}
    tail = nsq_ha(
        "tail",
        "--nsqd",
        address,
        "--topic",
        topic,
        "--channel",
        "v",
        "-n",
        "2",
        "--json",
        "--timeout",
        "30",
    )
    messages = json_lines(ok(tail))
    assert [m["body"] for m in messages] == ["one", "two"]
    assert all(m["partition"] is None for m in messages)


# -- bad input: one line on stderr, non-zero exit, no traceback ----------------------------------


@pytest.fixture(scope="module")
def dev() -> Iterator[DevClusterThread]:
    with DevClusterThread(nodes=3) as cluster:
        cluster.create_topic("known", 2, 1)
        yield cluster


DURABLE_FLAGS = (
    "--replicas",
    "2",
    "--durable",
    "--retention-days",
    "3",
    "--no-channel-auto-create",
)


def test_topic_create_durable_is_stored_with_its_options(lookupd: str) -> None:
    """``--durable`` (syncdisk=1), ``--retention-days`` and ``--no-channel-auto-create`` reach
    nsqlookupd: the lookup shows the topic and its meta, the identical create is accepted, and
    one that differs only in the sync interval is refused, because lookupd stored it."""
    topic = _name("cli_durable")
    created = create(lookupd, topic, *DURABLE_FLAGS)
    assert sorted(created["partitions"]) == ["0"]  # type: ignore[arg-type]
    assert created["meta"]["replica"] == 2  # type: ignore[index]
    assert created["meta"]["disable_channel_auto_create"] is True  # type: ignore[index]
    table = ok(nsq_ha("lookup", "--lookupd", lookupd, "--topic", topic, "--plain"))
    assert f"{topic} (access=w): 1 partitions, replicas 2" in table
    assert create(lookupd, topic, *DURABLE_FLAGS)["partitions"] == created["partitions"]
    other = [f for f in DURABLE_FLAGS if f != "--durable"]
    proc = nsq_ha(
        "topic", "create", "--lookupd", lookupd, "--topic", topic, *other, "--sync-every", "100"
    )
    assert "already exist" in one_line_error(proc, 1)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--sync-every", "4001"], "sync_every must be 1..4000"),
        (["--retention-days", "61"], "retention_days must be 1..60"),
    ],
)
def test_bad_durability_options_are_refused_before_any_request(
    flags: list[str], message: str
) -> None:
    proc = nsq_ha("topic", "create", "--lookupd", "http://127.0.0.1:1", "--topic", "t", *flags)
    assert message in one_line_error(proc, 2)  # not "unreachable": no request was made


def test_durable_and_a_sync_interval_are_exclusive() -> None:
    proc = nsq_ha(
        "topic",
        "create",
        "--lookupd",
        "http://127.0.0.1:1",
        "--topic",
        "t",
        "--durable",
        "--sync-every",
        "5",
    )
    assert proc.returncode == 2
    assert "argument --sync-every: not allowed with argument --durable" in proc.stderr


@pytest.mark.parametrize("command", ["lookup", "pub", "tail"])
def test_an_unknown_topic_is_one_line(dev: DevClusterThread, command: str) -> None:
    extra = ["--channel", "c", "-n", "1"] if command == "tail" else []
    proc = nsq_ha(command, "--lookupd", dev.lookupd_http, "--topic", "nope", *extra, stdin=b"x\n")
    line = one_line_error(proc, 1)
    assert "topic 'nope' does not exist" in line, line


@pytest.mark.parametrize("command", ["lookup", "pub", "tail", "topic"])
def test_an_unreachable_lookupd_is_one_line(command: str) -> None:
    argv = {
        "lookup": ["lookup"],
        "pub": ["pub"],
        "tail": ["tail", "--channel", "c"],
        "topic": ["topic", "create", "--partitions", "2"],
    }[command]
    proc = nsq_ha(*argv, "--lookupd", "http://127.0.0.1:1", "--topic", "t", stdin=b"x\n")
    line = one_line_error(proc, 1)
    assert "http://127.0.0.1:1" in line, line
    assert "unreachable" in line, line


@pytest.mark.parametrize(
    ("ext", "message"),
    [
        ("{bad", "--ext is not valid JSON: Expecting property name enclosed in double quotes"),
        ("[1, 2]", "--ext must be a JSON object, got list"),
    ],
)
def test_a_malformed_ext_is_one_line(dev: DevClusterThread, ext: str, message: str) -> None:
    proc = nsq_ha("pub", "--lookupd", dev.lookupd_http, "--topic", "known", "--ext", ext)
    assert message in one_line_error(proc, 2)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["lookup", "--topic", "bad topic!"], "topic name"),
        (["pub", "--topic", "known"], "give --lookupd URL"),
        (["tail", "--topic", "known", "--channel", "c", "-n", "0"], "-n must be at least 1"),
        (
            ["topic", "create", "--nsqd", "127.0.0.1:4150", "--topic", "t"],
            "goes through nsqlookupd",
        ),
    ],
)
def test_other_bad_input_is_one_line(dev: DevClusterThread, argv: list[str], message: str) -> None:
    if "--nsqd" not in argv and "give --lookupd URL" not in message:
        argv = [*argv, "--lookupd", dev.lookupd_http]
    proc = nsq_ha(*argv)
    assert message in one_line_error(proc, 2)


def test_a_plain_topic_larger_than_the_cluster_is_refused_with_the_rule(
    dev: DevClusterThread,
) -> None:
    proc = nsq_ha(
        "topic",
        "create",
        "--lookupd",
        dev.lookupd_http,
        "--topic",
        "toobig",
        "--partitions",
        "4",
        "--replicas",
        "2",
    )
    line = one_line_error(proc, 1)
    assert "No node is available" in line, line
    assert "nodes >= partitions x replicas" in line, line


def test_demo_verifies_its_story() -> None:
    """``nsq-ha demo`` (smaller): the per-partition table, the checks, exit 0."""
    proc = nsq_ha("demo", "--messages", "2000", "--plain")
    out = ok(proc)
    assert "demo_orders: ordered consumer, per partition" in out
    for check in ("nothing lost", "per-key order", "trace ids and message ids", "leader move"):
        assert any(check in line and " OK " in line for line in out.splitlines()), out
    assert out.strip().splitlines()[-1].startswith("PASSED in ")


def test_a_create_with_other_parameters_names_the_topic_that_exists(lookupd: str) -> None:
    """nsqlookupd answers only ``already exist``: the line says what exists, what was asked,
    and what to do."""
    topic = _name("cli_exists")
    create(lookupd, topic, "--partitions", "2", "--replicas", "2", "--ordered")
    argv = ["topic", "create", "--lookupd", lookupd, "--topic", topic]
    line = one_line_error(nsq_ha(*argv, "--partitions", "3", "--ordered"), 1)
    assert f"topic {topic!r} already exists with 2 partitions and 2 replicas (ordered)" in line
    assert "not the 3 partitions and 1 replica (ordered) asked for" in line, line
    assert f"nsq-ha lookup --topic {topic}" in line, line
    assert f"nsq-ha topic delete --topic {topic}" in line, line
    # more partitions x replicas than the cluster has nodes: lookupd says "No node is
    # available" before it compares; the topic that exists is still what the line names
    started = time.monotonic()
    line = one_line_error(nsq_ha(*argv, "--partitions", "4", "--replicas", "2"), 1)
    assert f"topic {topic!r} already exists with 2 partitions and 2 replicas (ordered)" in line
    assert "not the 4 partitions and 2 replicas asked for" in line, line
    assert time.monotonic() - started < 10, "retried as if nodes were missing"


def _replicas_from_the_servers(lookupd: str, topic: str) -> dict[str, set[str]]:
    """partition -> TCP addresses of the nodes holding it: the fork's coordinator (each nsqd's
    ``/coordinator/stats``, the in-sync replicas), else each nsqd's ``/stats`` (the embedded
    broker has no coordinator)."""
    v1 = {"Accept": "application/vnd.nsq; version=1.0"}
    nodes = httpx.get(f"{lookupd}/nodes", headers=v1, timeout=10).json()["producers"]
    found: dict[str, set[str]] = {}
    for node in nodes:
        base = f"http://{node['broadcast_address']}:{node['http_port']}"
        coord = httpx.get(f"{base}/coordinator/stats", params={"topic": topic}, timeout=10)
        if coord.status_code == 200:
            for part in coord.json()["topic_coord_stats"] or ():
                ids = [isr["node_id"].split(":") for isr in part["isr_stats"] or ()]
                found[str(part["partition"])] = {f"{i[0]}:{i[2]}" for i in ids}
            continue
        stats = httpx.get(f"{base}/stats", params={"format": "json", "topic": topic}, headers=v1)
        for entry in stats.json().get("topics") or ():
            address = f"{node['broadcast_address']}:{node['tcp_port']}"
            found.setdefault(str(entry["topic_partition"]), set()).add(address)
    return found


def test_lookup_shows_every_replica_of_each_partition(lookupd: str) -> None:
    topic = _name("cli_replicas")
    create(lookupd, topic, "--partitions", "2", "--replicas", "2", "--ordered")
    looked = json.loads(ok(nsq_ha("lookup", topic, "--lookupd", lookupd, "--json")))
    truth = _replicas_from_the_servers(lookupd, topic)
    assert sorted(truth) == ["0", "1"], truth
    for part in ("0", "1"):
        replicas = looked["replicas"][part]
        assert len(replicas) == 2, looked["replicas"]
        assert replicas[0] == {"address": looked["partitions"][part]["address"], "leader": True}
        assert replicas[1]["leader"] is False
        assert {r["address"] for r in replicas} == truth[part]
    table = ok(nsq_ha("lookup", topic, "--lookupd", lookupd, "--plain"))
    assert "replicas" in table.splitlines()[1]
    for part in ("0", "1"):
        addresses = [r["address"] for r in looked["replicas"][part]]
        row = next(x for x in table.splitlines() if x.split()[:1] == [part])
        assert ", ".join(addresses) in row, table
