"""The embedded broker's HTTP side: the h11 server, the lookupd and the nsqd HTTP APIs.

Handlers are called directly on a ``DevCluster`` that is not started (no TCP servers); the
server tests use real loopback sockets.  Expected shapes come from the golden recordings of the
real fork (tests/golden/lookup_fork.json, listlookup.json, lookup_nochannel.json) and, inline,
from /work/shared/golden/nsqd_http_fork.json and lookup_leader_move.json.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import time
from typing import Any

import httpx
import pytest
from golden_data import load

from nsq_ha.devcluster import DevCluster, DevNode, NodeState
from nsq_ha.devcluster.http import HttpServer, Request, Response, go_atoi, go_json
from nsq_ha.devcluster.lookupd import LookupdApi, make_lookupd_handler
from nsq_ha.devcluster.model import FORK_VERSION
from nsq_ha.devcluster.nsqd import http as nsqd_http
from nsq_ha.devcluster.nsqd.http import make_nsqd_handler
from nsq_ha.lookup.wire import parse_listlookup, parse_lookup, unwrap

V1 = {"accept": "application/vnd.nsq; version=1.0"}
NSQ_HEADER = ("X-Nsq-Content-Type", "nsq; version=1.0")
JSON_HEADER = ("Content-Type", "application/json; charset=utf-8")


def make_cluster(**kwargs: Any) -> DevCluster:
    """Three nodes on the golden recordings' ports, marked running but not started."""
    cluster = DevCluster(nodes=3, **kwargs)
    for node in cluster.nodes:
        node.tcp_port = 14150 + 10000 * node.index
        node.http_port = node.tcp_port + 1
        node.state = NodeState.RUNNING
        node.started_at = 1795273517.0
    cluster.lookupd_port = 14161
    return cluster


def req(
    path: str,
    query: dict[str, str] | None = None,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
) -> Request:
    all_headers = dict(headers or {})
    if method in ("POST", "PUT"):
        all_headers.setdefault("content-length", str(len(body)))
    return Request(method, path, dict(query or {}), all_headers, body)


def post(path: str, query: dict[str, str] | None = None, body: bytes = b"", **kw: Any) -> Request:
    return req(path, query, method="POST", body=body, **kw)


def as_json(response: Response) -> Any:
    return json.loads(response.body)


def mask_nodes(value: Any) -> Any:
    """Node objects (ports, addresses, hostnames vary) reduced to their keys and value types."""
    if isinstance(value, dict):
        if "distributed_id" in value:
            return [(k, type(v).__name__) for k, v in value.items()]
        return {k: mask_nodes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_nodes(v) for v in value]
    return value


def key_orders(value: Any) -> Any:
    """Every dict's key order, recursively (lists: their first element)."""
    if isinstance(value, dict):
        return [(k, key_orders(v)) for k, v in value.items()]
    if isinstance(value, list) and value:
        return [key_orders(value[0])]
    return None


def golden_pairs(name: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(request step, response step) of every HTTP exchange of a golden file."""
    steps = load(name)["steps"]
    pairs = []
    for i, step in enumerate(steps):
        if step["dir"] == "c2s" and step.get("ascii", "").startswith(("GET ", "POST ")):
            answer = next(
                s for s in steps[i + 1 :] if s["conn"] == step["conn"] and "http_status" in s
            )
            pairs.append((step, answer))
    return pairs


async def raw_exchange(port: int, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read until the server closes; (status, headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


class FakeClient:
    """What ``/stats`` reads of a ``ClientConnection`` (values of the golden recording)."""

    client_id = "conformance"
    hostname = "conformance-host"
    remote_address = "127.0.0.1:48914"
    user_agent = "conformance-probe/1.0"
    state = 3
    rdy = 1
    in_flight_count = 1
    message_count = 1
    finish_count = 0
    requeue_count = 0
    timeout_count = 0
    connect_ts = 1795273851
    sample_rate = 0
    deflate = snappy = tls = False
    desired_tag = ""
    output_buffer_size = 4096
    output_buffer_timeout_ms = 50
    msg_timeout = 60.0
    ext_filter = None
    node: DevNode | None = None
    dropped: str | None = None

    def drop(self, reason: str, *, abort: bool = False) -> None:
        self.dropped = reason


# -- the server ------------------------------------------------------------------------------


async def echo(request: Request) -> Response:
    payload = {
        "method": request.method,
        "path": request.path,
        "query": request.query,
        "headers": request.headers,
        "body": request.body.decode(),
    }
    return Response(200, json.dumps(payload).encode(), [("Content-Type", "application/json")])


async def test_server_passes_the_request_and_adds_date_and_length() -> None:
    server = HttpServer(echo, "127.0.0.1")
    port = await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            resp = await client.post(
                "/a%20b?x=1&x=2&blank=&t=%7B%22k%22%3A1%7D",
                content=b"payload",
                headers={"X-Nsqext-Tag": "v"},
            )
    finally:
        await server.close()
    assert resp.status_code == 200
    seen = resp.json()
    assert seen["method"] == "POST"
    assert seen["path"] == "/a b"
    assert seen["query"] == {"x": "2", "blank": "", "t": '{"k":1}'}
    assert seen["headers"]["x-nsqext-tag"] == "v"
    assert seen["headers"]["content-length"] == "7"
    assert seen["body"] == "payload"
    assert resp.headers["content-length"] == str(len(resp.content))
    assert "date" in resp.headers


async def test_server_keeps_the_connection_alive() -> None:
    seen: list[str] = []

    async def handler(request: Request) -> Response:
        seen.append(request.path)
        return Response(200, request.path.encode())

    server = HttpServer(handler, "127.0.0.1")
    port = await server.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for path in ("/one", "/two"):
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n")
            assert b"Content-Type: text/plain; charset=utf-8\r\n" in head
            assert await reader.readexactly(len(path)) == path.encode()
        assert seen == ["/one", "/two"]
    finally:
        writer.close()
        await writer.wait_closed()
        await server.close()


async def test_server_answers_expect_continue_and_pipelined_requests() -> None:
    server = HttpServer(echo, "127.0.0.1")
    port = await server.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"POST /a HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n"
        )
        await writer.drain()
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"abc")
        writer.write(b"GET /b HTTP/1.1\r\nHost: x\r\n\r\nGET /c HTTP/1.1\r\nHost: x\r\n")
        writer.write(b"Connection: close\r\n\r\n")
        await writer.drain()
        answers = (await asyncio.wait_for(reader.read(), 2)).split(b"HTTP/1.1 200 OK")
        paths = [json.loads(a[a.index(b"{") :])["path"] for a in answers[1:]]
        assert paths == ["/a", "/b", "/c"]
        assert b'"body": "abc"' in answers[1]
    finally:
        writer.close()
        await writer.wait_closed()
        await server.close()


async def test_server_reads_chunked_bodies_without_a_length() -> None:
    server = HttpServer(echo, "127.0.0.1")
    port = await server.start()

    async def chunks() -> Any:
        yield b"ab"
        yield b"cd"

    try:
        async with httpx.AsyncClient() as client:
            resp = await client.post(f"http://127.0.0.1:{port}/x", content=chunks())
    finally:
        await server.close()
    seen = resp.json()
    assert seen["body"] == "abcd"
    assert "content-length" not in seen["headers"]
    assert seen["headers"]["transfer-encoding"] == "chunked"


async def test_server_turns_a_handler_exception_into_500(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(request: Request) -> Response:
        raise RuntimeError("boom")

    server = HttpServer(broken, "127.0.0.1")
    port = await server.start()
    try:
        with caplog.at_level(logging.ERROR, logger="nsq_ha.devcluster.http"):
            async with httpx.AsyncClient() as client:
                resp = await client.get(f"http://127.0.0.1:{port}/x")
    finally:
        await server.close()
    assert resp.status_code == 500
    assert resp.content == b'{"message":"INTERNAL_ERROR"}'
    assert "HTTP handler failed on GET /x" in caplog.text


async def test_server_refuses_oversized_requests() -> None:
    server = HttpServer(echo, "127.0.0.1", max_request_size=10)
    port = await server.start()
    try:
        async with httpx.AsyncClient() as client:
            small = await client.post(f"http://127.0.0.1:{port}/x", content=b"0123456789")
            big = await client.post(f"http://127.0.0.1:{port}/x", content=b"x" * 11)
    finally:
        await server.close()
    assert small.status_code == 200
    assert big.status_code == 413


async def test_server_answers_garbage_with_400_and_head_without_body() -> None:
    server = HttpServer(echo, "127.0.0.1")
    port = await server.start()
    try:
        status, _, _ = await raw_exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
        assert status == 400
        status, headers, body = await raw_exchange(
            port, b"HEAD /h HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        assert status == 200
        assert body == b""
        assert int(headers["Content-Length"]) > 0
    finally:
        await server.close()


async def test_server_close_cuts_open_connections() -> None:
    gate = asyncio.Event()
    entered = asyncio.Event()

    async def slow(request: Request) -> Response:
        entered.set()
        await gate.wait()
        return Response(200)

    server = HttpServer(slow, "127.0.0.1")
    port = await server.start()
    idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
    busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", port)
    busy_writer.write(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
    await busy_writer.drain()
    await asyncio.wait_for(entered.wait(), 2)  # the busy request is in its handler
    await asyncio.wait_for(server.close(), 2)
    assert await asyncio.wait_for(idle_reader.read(), 2) == b""
    assert await asyncio.wait_for(busy_reader.read(), 2) == b""
    for writer in (idle_writer, busy_writer):
        writer.close()
        await writer.wait_closed()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_server_close_leaves_nothing_for_the_loops_exception_handler() -> None:
    """Connections cut by close() end quietly (Python 3.12.1 reported each cancelled one)."""

    async def ok(request: Request) -> Response:
        return Response(200)

    reported: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        server = HttpServer(ok, "127.0.0.1")
        port = await server.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        assert (await asyncio.wait_for(reader.readline(), 2)).startswith(b"HTTP/1.1 200")
        await asyncio.wait_for(server.close(), 2)  # the kept-alive connection waits for more
        await asyncio.wait_for(reader.read(), 2)  # to its end: the server closed it
        writer.close()
        await writer.wait_closed()
    finally:
        loop.set_exception_handler(None)
    assert [context.get("message") for context in reported] == []


def test_go_helpers() -> None:
    assert (
        go_json({"a": "<&>", "b": [1, None, True]})
        == b'{"a":"\\u003c\\u0026\\u003e","b":[1,null,true]}'
    )
    assert go_atoi("-12") == -12
    with pytest.raises(ValueError, match=r'^strconv.Atoi: parsing "x1": invalid syntax$'):
        go_atoi("x1")
    with pytest.raises(ValueError, match="value out of range"):
        go_atoi("9" * 20)


# -- lookupd: golden shapes -------------------------------------------------------------------


def golden_layout() -> DevCluster:
    """The topics of tests/golden/lookup_fork.json (channels where the recording had them)."""
    cluster = make_cluster()
    cluster.create_topic("cf_pubsub", 4, 1, multi_part=True)
    cluster.create_topic("cf_ext", 2, 1, ext=True, multi_part=False)
    cluster.create_topic("cf_ordered", 4, 1, ordered=True, multi_part=False)  # as recorded
    for name, channels, parts in (
        ("cf_pubsub", ("ch", "hbch"), (0, 1, 3)),
        ("cf_ext", ("ch", "ch2"), (0, 1)),
        ("cf_ordered", ("ch", "ch_req"), (0, 1, 2, 3)),
    ):
        for channel in channels:
            for part in parts:
                cluster.create_channel(name, channel, partition=part)
    return cluster


@pytest.mark.parametrize("pair", golden_pairs("lookup_fork"), ids=lambda p: p[0]["note"])
async def test_lookupd_replays_the_golden_lookups(pair: tuple[dict[str, Any], ...]) -> None:
    request, answer = pair
    cluster = golden_layout()
    server = HttpServer(make_lookupd_handler(cluster), "127.0.0.1")
    port = await server.start()
    try:
        status, headers, body = await raw_exchange(port, bytes.fromhex(request["hex"]))
    finally:
        await server.close()
    assert status == answer["http_status"]
    expected_headers = dict(answer["http_headers"])
    for varying in ("Date", "Content-Length"):
        assert varying in headers
        del expected_headers[varying], headers[varying]
    # h11 answers HTTP/1.0 requests with an HTTP/1.1 status line, so it says it will close
    assert headers.pop("Connection") == "close"
    assert headers == expected_headers
    if "distributed_id" not in answer["body_text"]:
        assert body.decode() == answer["body_text"]
        return
    mine = json.loads(body)
    assert mask_nodes(mine) == mask_nodes(answer["body_json"])
    assert key_orders(mine) == key_orders(answer["body_json"])


async def test_lookupd_listlookup_has_the_golden_shape() -> None:
    cluster = make_cluster()
    handler = make_lookupd_handler(cluster)
    pairs = dict((p[0]["note"], p[1]) for p in golden_pairs("listlookup"))
    v1 = await handler(req("/listlookup", headers=V1))
    wrapped = await handler(req("/listlookup"))
    golden_v1 = pairs["fork, Accept v1"]["body_json"]
    golden_plain = pairs["fork, no Accept"]["body_json"]
    assert key_orders(as_json(v1)) == key_orders(golden_v1)
    assert key_orders(as_json(wrapped)) == key_orders(golden_plain)
    node = as_json(v1)["lookupdleader"]
    assert node == {
        "ID": "127.0.0.1:14161:14161:nsqlookup",
        "NodeIP": "127.0.0.1",
        "TcpPort": "14161",
        "HttpPort": "14161",
        "RpcPort": "14161",
        "Epoch": 0,
    }
    assert as_json(v1)["lookupdnodes"] == [node]
    assert parse_listlookup(unwrap(200, dict(v1.headers), v1.body)) == ["http://127.0.0.1:14161"]


async def test_lookupd_for_real_in_both_envelopes() -> None:
    cluster = make_cluster()
    cluster.create_topic("orders", 3, 2, multi_part=True)
    server = HttpServer(make_lookupd_handler(cluster), "127.0.0.1")
    port = await server.start()
    params = {"topic": "orders", "access": "w", "metainfo": "true"}
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            v1 = await client.get("/lookup", params=params, headers=V1)
            wrapped = await client.get("/lookup", params=params)
            missing = await client.get("/lookup", params={"topic": "nope", "access": "w"})
    finally:
        await server.close()
    assert v1.headers["x-nsq-content-type"] == "nsq; version=1.0"
    assert v1.headers["content-type"] == "application/json; charset=utf-8"
    assert "x-nsq-content-type" not in wrapped.headers
    assert list(v1.json()) == ["channels", "meta", "partitions", "producers"]
    assert wrapped.json()["status_code"] == 200
    assert wrapped.json()["data"] == v1.json()
    node = v1.json()["partitions"]["0"]
    assert list(node) == [
        "id",
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
        "distributed_id",
    ]
    for resp in (v1, wrapped):
        lookup = parse_lookup("orders", "w", unwrap(resp.status_code, resp.headers, resp.content))
        assert sorted(lookup.partitions) == [0, 1, 2]
        assert lookup.meta is not None
    assert missing.status_code == 500
    assert missing.json() == {"status_code": 500, "status_txt": "Key not found", "data": None}


async def test_lookupd_without_write_nochannel_hides_topics_until_nsqd_creates_a_channel() -> None:
    # replays tests/golden/lookup_nochannel.json against a lookupd and the node's HTTP API
    cluster = make_cluster(allow_write_with_nochannels=False)
    cluster.create_topic("cf_nochan", 1, 1, multi_part=False)
    leader = cluster.leader_of("cf_nochan", 0)
    lookupd = HttpServer(make_lookupd_handler(cluster), "127.0.0.1")
    nsqd = HttpServer(make_nsqd_handler(cluster, leader), "127.0.0.1")
    ports = {14161: await lookupd.start(), 34151: await nsqd.start()}
    connections = load("lookup_nochannel")["connections"]
    try:
        for request, answer in golden_pairs("lookup_nochannel"):
            port = ports[connections[request["conn"]]["port"]]
            status, headers, body = await raw_exchange(port, bytes.fromhex(request["hex"]))
            assert status == answer["http_status"], request["note"]
            assert ("X-Nsq-Content-Type" in headers) == (
                "X-Nsq-Content-Type" in answer["http_headers"]
            )
            if "distributed_id" in answer["body_text"]:
                assert mask_nodes(json.loads(body)) == mask_nodes(answer["body_json"])
            else:
                assert body.decode() == answer["body_text"], request["note"]
    finally:
        await lookupd.close()
        await nsqd.close()


# -- lookupd: endpoints -----------------------------------------------------------------------


async def test_lookupd_ping_info_and_unknown_paths() -> None:
    handler = make_lookupd_handler(make_cluster())
    ping = await handler(req("/ping"))
    assert (ping.status, ping.body, ping.headers) == (200, b"OK", [])
    info = await handler(req("/info", headers=V1))
    assert info.body == b'{"version":"%s","ha_support":true}' % FORK_VERSION.encode()
    missing = await handler(req("/nope"))
    assert (missing.status, missing.body) == (404, b'{"message":"NOT_FOUND"}')
    assert NSQ_HEADER in missing.headers
    wrong = await handler(req("/lookup", method="POST"))
    assert (wrong.status, wrong.body) == (405, b'{"message":"METHOD_NOT_ALLOWED"}')
    assert ("Allow", "GET") in wrong.headers


async def test_lookupd_lookup_partition_and_access_rules() -> None:
    cluster = make_cluster()
    cluster.create_topic("t", 3, 1, multi_part=True)
    cluster.create_channel("t", "c", partition=1)
    handler = make_lookupd_handler(cluster)
    one = as_json(await handler(req("/lookup", {"topic": "t", "partition": "1"}, headers=V1)))
    assert list(one["partitions"]) == ["1"]
    assert one["channels"] == ["c"]
    assert "meta" not in one
    false_meta = await handler(req("/lookup", {"topic": "t", "metainfo": "false"}, headers=V1))
    assert as_json(false_meta)["meta"]["partition_num"] == 3
    cluster.partition("t", 2).leaderless = True
    write = as_json(await handler(req("/lookup", {"topic": "t", "access": "w"}, headers=V1)))
    read = as_json(await handler(req("/lookup", {"topic": "t", "access": "r"}, headers=V1)))
    assert sorted(write["partitions"]) == ["0", "1"]
    assert sorted(read["partitions"]) == ["0", "1", "2"]
    bad = await handler(req("/lookup", {"topic": "t", "access": "x"}))
    assert (bad.status, as_json(bad)["status_txt"]) == (500, "INVALID_ACCESS_MODE")


async def test_lookupd_partition_map_keys_sort_as_strings() -> None:
    cluster = make_cluster()
    cluster.create_topic("wide", 12, 1, multi_part=True)
    answer = as_json(
        await make_lookupd_handler(cluster)(req("/lookup", {"topic": "wide"}, headers=V1))
    )
    assert list(answer["partitions"])[:4] == ["0", "1", "10", "11"]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({}, "MISSING_ARG_TOPIC"),
        ({"topic": "bad!"}, "INVALID_ARG_TOPIC"),
        ({"topic": "t"}, "MISSING_ARG_TOPIC_PARTITION_NUM"),
        ({"topic": "t", "partition_num": "x"}, "INVALID_ARG_TOPIC_PARTITION_NUM"),
        ({"topic": "t", "partition_num": "256"}, "INVALID_ARG_TOPIC_PARTITION_NUM"),
        ({"topic": "t", "partition_num": "1"}, "MISSING_ARG_TOPIC_REPLICATOR"),
        ({"topic": "t", "partition_num": "1", "replicator": "6"}, "INVALID_ARG_TOPIC_REPLICATOR"),
        (
            {"topic": "t", "partition_num": "1", "replicator": "1", "suggestload": "10001"},
            "INVALID_ARG_TOPIC_LOAD_FACTOR",
        ),
        (
            {"topic": "t", "partition_num": "1", "replicator": "1", "syncdisk": "x"},
            "INVALID_ARG_TOPIC_SYNC_DISK",
        ),
        (
            {"topic": "t", "partition_num": "1", "replicator": "1", "retention": "x"},
            'strconv.Atoi: parsing "x": invalid syntax',
        ),
        (
            {"topic": "t", "partition_num": "255", "replicator": "1", "multipart": "true"},
            "max partition allowed exceed",
        ),
        (
            {"topic": "t", "partition_num": "2", "replicator": "4"},
            "ErrType:9 ErrCode:1 : No node is available for topic",
        ),
        (
            {"topic": "t", "partition_num": "4", "replicator": "1"},
            "ErrType:9 ErrCode:1 : No node is available for topic",
        ),
    ],
)
async def test_lookupd_topic_create_errors(query: dict[str, str], message: str) -> None:
    cluster = make_cluster()
    resp = await make_lookupd_handler(cluster)(post("/topic/create", query))
    assert (resp.status, resp.body.decode()) == (400, f'{{"message":"{message}"}}')
    assert NSQ_HEADER in resp.headers
    assert cluster.topics == {}


async def test_lookupd_topic_create_delete_and_recreate() -> None:
    cluster = make_cluster()
    handler = make_lookupd_handler(cluster)
    query = {
        "topic": "t",
        "partition_num": "2",
        "replicator": "2",
        "orderedmulti": "true",
        "extend": "true",
        "disable_channel_auto_create": "true",
    }
    created = await handler(req("/topic/create", query, method="PUT"))
    assert (created.status, created.body, created.headers) == (200, b"", [NSQ_HEADER])
    topic = cluster.topic("t")
    assert (topic.partition_num, topic.replica, topic.ordered, topic.ext) == (2, 2, True, True)
    assert topic.disable_channel_auto_create
    assert not topic.multi_part
    assert (await handler(post("/topic/create", query))).status == 200  # identical: no-op
    again = await handler(post("/topic/create", {**query, "partition_num": "1"}))
    assert as_json(again) == {"message": "already exist"}
    single = await handler(post("/topic/delete", {"topic": "t", "partition": "0"}))
    assert as_json(single) == {"message": "REMOVE_SINGLE_PARTITION_NOT_ALLOWED"}
    assert (await handler(post("/topic/delete", {"topic": "t", "partition": "**"}))).status == 200
    assert "t" not in cluster.topics
    gone = await handler(post("/topic/delete", {"topic": "t", "partition": "**"}))
    assert (gone.status, as_json(gone)) == (500, {"message": "Key not found"})
    assert [e.kind for e in cluster.events] == ["topic_created", "topic_deleted"]


async def test_lookupd_partition_move() -> None:
    cluster = make_cluster()
    cluster.create_topic("cf_move", 1, 3)
    handler = make_lookupd_handler(cluster)
    old = cluster.leader_of("cf_move", 0)
    others = [n for n in cluster.nodes if n is not old]

    def move(source: DevNode, target: DevNode, leader: str = "true") -> Request:
        return post(
            "/topic/partition/move",
            {
                "topic": "cf_move",
                "partition": "0",
                "move_leader": leader,
                "move_from": source.distributed_id,
                "move_to": target.distributed_id,
            },
            headers=V1,
        )

    bad = await handler(move(others[0], others[1]))
    # byte-exact as in /work/shared/golden/lookup_leader_move.json (step "mv_bad")
    assert (bad.status, bad.body) == (400, b'{"message":"move from not the topic leader"}')
    assert bad.headers == [JSON_HEADER, NSQ_HEADER]
    moved = await handler(move(old, others[1]))
    assert (moved.status, moved.body, moved.headers) == (200, b"", [NSQ_HEADER])
    assert cluster.leader_of("cf_move", 0) is others[1]
    assert cluster.events_of("leader_moved")[-1].detail["new"] == others[1].index
    lookup = as_json(await handler(req("/lookup", {"topic": "cf_move", "access": "w"}, headers=V1)))
    assert lookup["partitions"]["0"]["distributed_id"] == others[1].distributed_id
    same = await handler(move(others[1], others[1]))
    assert as_json(same) == {"message": "move to and from node can not be the same"}
    unknown = post("/topic/partition/move", {"topic": "nope", "partition": "0"})
    assert as_json(await handler(unknown)) == {
        "message": "move to and from node can not be the same"
    }
    missing = post("/topic/partition/move", {"topic": "cf_move", "partition": "x"})
    assert as_json(await handler(missing)) == {"message": "INVALID_ARG_TOPIC_PARTITION_NUM"}
    data_move = await handler(move(others[1], others[0], leader="false"))
    assert as_json(data_move) == {"message": "can not move leader without moveleader param"}


async def test_lookupd_replica_move() -> None:
    cluster = make_cluster()
    cluster.create_topic("r", 1, 2)
    part = cluster.partition("r", 0)
    follower = part.replicas[1]
    outsider = next(n for n in cluster.nodes if n not in part.replicas)
    handler = make_lookupd_handler(cluster)
    resp = await handler(
        post(
            "/topic/partition/move",
            {
                "topic": "r",
                "partition": "0",
                "move_from": follower.distributed_id,
                "move_to": outsider.distributed_id,
            },
        )
    )
    assert resp.status == 200
    assert part.replicas == [part.leader, outsider]
    assert cluster.events_of("replica_moved")


async def test_lookupd_channel_registration() -> None:
    cluster = make_cluster()
    cluster.create_topic("locked", 2, 1, multi_part=True, disable_channel_auto_create=True)
    cluster.create_topic("open", 1, 1)
    handler = make_lookupd_handler(cluster)
    created = await handler(post("/channel/create", {"topic": "locked", "channel": "c"}))
    assert created.status == 200
    assert cluster.topic("locked").registered_channels == {"c"}
    assert all("c" in p.hubs for p in cluster.topic("locked").partitions)
    twice = await handler(post("/channel/create", {"topic": "locked", "channel": "c"}))
    assert as_json(twice) == {"message": "channel c already registered"}
    opened = await handler(post("/channel/create", {"topic": "open", "channel": "c"}))
    assert as_json(opened) == {"message": "channel auto create NOT disabled in topic open"}
    nope = await handler(post("/channel/create", {"topic": "nope", "channel": "c"}))
    assert as_json(nope) == {"message": "Key not found"}
    no_channel = await handler(post("/channel/create", {"topic": "locked"}))
    assert as_json(no_channel) == {"message": "MISSING_ARG_CHANNEL"}
    subscriber = FakeClient()
    cluster.partition("locked", 0).hubs["c"].clients.append(subscriber)  # type: ignore[arg-type]
    deleted = await handler(post("/channel/delete", {"topic": "locked", "channel": "c"}))
    assert deleted.status == 200
    assert subscriber.dropped == "channel unregistered"
    assert not any("c" in p.hubs for p in cluster.topic("locked").partitions)
    again = await handler(post("/channel/delete", {"topic": "locked", "channel": "c"}))
    assert as_json(again) == {"message": "channel c not registered"}
    kinds = [e.kind for e in cluster.events]
    assert "channel_registered" in kinds
    assert "channel_unregistered" in kinds


async def test_lookupd_tombstone_hides_a_node_from_writers_only() -> None:
    cluster = make_cluster()
    cluster.create_topic("t", 3, 1, multi_part=True)
    handler = make_lookupd_handler(cluster)
    victim = cluster.leader_of("t", 1)
    node = f"{victim.host}:{victim.http_port}"
    resp = await handler(post("/topic/tombstone", {"topic": "t", "node": node}))
    assert resp.status == 200
    write = as_json(await handler(req("/lookup", {"topic": "t", "access": "w"}, headers=V1)))
    read = as_json(await handler(req("/lookup", {"topic": "t"}, headers=V1)))
    assert sorted(write["partitions"]) == ["0", "2"]
    assert all(p["http_port"] != victim.http_port for p in write["producers"])
    assert sorted(read["partitions"]) == ["0", "1", "2"]
    nodes = as_json(await handler(req("/nodes", headers=V1)))["producers"]
    entry = next(n for n in nodes if n["http_port"] == victim.http_port)
    assert entry["topics"] == ["t"]
    assert entry["tombstones"] == [True]
    assert entry["partitions"] == {"t": ["1"]}
    await handler(post("/topic/tombstone", {"topic": "t", "node": node, "restore": "true"}))
    write = as_json(await handler(req("/lookup", {"topic": "t", "access": "w"}, headers=V1)))
    assert sorted(write["partitions"]) == ["0", "1", "2"]
    missing = await handler(post("/topic/tombstone", {"topic": "t"}))
    assert as_json(missing) == {"message": "MISSING_ARG_NODE"}
    assert len(cluster.events_of("topic_tombstoned")) == 2


async def test_lookupd_disable_write() -> None:
    cluster = make_cluster()
    cluster.create_topic("plain", 1, 1)
    cluster.create_topic("seq", 1, 1, ordered=True)
    handler = make_lookupd_handler(cluster)

    async def lookup(topic: str, access: str = "w") -> dict[str, Any]:
        query = {"topic": topic, "access": access}
        return as_json(await handler(req("/lookup", query, headers=V1)))  # type: ignore[no-any-return]

    await handler(post("/disable/write", {"type": "all"}))
    closed = await lookup("plain")
    assert list(closed) == ["channels", "partitions", "producers"]
    assert closed["partitions"] is None
    assert closed["producers"] is None
    assert (await lookup("plain", "r"))["partitions"] is not None
    await handler(post("/disable/write", {"type": "ordered"}))
    plain, seq = await lookup("plain"), await lookup("seq")
    assert "meta" in plain
    assert plain["partitions"] is not None
    assert seq["meta"]["ordered"] is True
    assert seq["partitions"] is None
    await handler(post("/disable/write", {"type": "enable"}))
    assert (await lookup("seq"))["partitions"] is not None
    assert [e.detail["type"] for e in cluster.events_of("cluster_write_disabled")] == [
        "all",
        "ordered",
        "none",
    ]


async def test_lookupd_topics_channels_nodes_and_stats() -> None:
    cluster = make_cluster()
    cluster.create_topic("b", 2, 1, ext=True, multi_part=True)
    cluster.create_topic("a", 1, 1)
    cluster.create_channel("b", "c1", partition=1)
    handler = make_lookupd_handler(cluster)
    topics = await handler(req("/topics", headers=V1))
    assert topics.body == b'{"topics":["a","b"]}'
    meta = as_json(await handler(req("/topics", {"metaInfo": "true"}, headers=V1)))
    assert list(meta) == ["meta_info", "topics"]
    assert meta["meta_info"][1] == {
        "topic_name": "b",
        "extend_support": True,
        "ordered": False,
        "multi_part": True,
        "disable_channel_auto_create": False,
        "registered_channels": None,
    }
    channels = await handler(req("/channels", {"topic": "b"}, headers=V1))
    assert channels.body == b'{"channels":["c1"]}'
    none = await handler(req("/channels", {"topic": "b", "partition": "0"}, headers=V1))
    assert none.body == b'{"channels":[]}'
    nodes = as_json(await handler(req("/nodes", headers=V1)))["producers"]
    assert len(nodes) == 3
    assert list(nodes[0]) == [
        "remote_address",
        "hostname",
        "broadcast_address",
        "tcp_port",
        "http_port",
        "version",
        "tombstones",
        "topics",
        "partitions",
    ]
    cluster.nodes[2].state = NodeState.STOPPED
    assert len(as_json(await handler(req("/nodes", headers=V1)))["producers"]) == 2
    stats = await handler(req("/cluster/stats"))  # v1 even without the Accept header
    assert NSQ_HEADER in stats.headers
    assert as_json(stats)["stable"] is True


# -- lookupd: faults --------------------------------------------------------------------------


async def test_lookupd_injected_failures_count_down() -> None:
    cluster = make_cluster()
    handler = make_lookupd_handler(cluster)
    cluster.lookupd_fail(503, count=2)
    first = await handler(req("/ping"))
    second = await handler(req("/lookup", {"topic": "x"}))
    third = await handler(req("/ping"))
    assert (first.status, first.body) == (503, b'{"message":"INJECTED_FAULT"}')
    assert second.status == 503
    assert (third.status, third.body) == (200, b"OK")
    assert cluster.lookupd_faults.fail_status is None
    assert [e.detail["path"] for e in cluster.events_of("lookupd_fault_hit")] == [
        "/ping",
        "/lookup",
    ]
    cluster.lookupd_fail(500)
    for _ in range(3):
        assert (await handler(req("/ping"))).status == 500
    cluster.lookupd_fail(None)
    assert (await handler(req("/ping"))).status == 200


async def test_lookupd_delay_holds_each_request() -> None:
    """With a delay set, a request stays unanswered while the loop runs on (without it, one
    turn of the loop answers it); a delayed request is answered once its delay is over."""
    cluster = make_cluster()
    handler = make_lookupd_handler(cluster)
    undelayed = asyncio.ensure_future(handler(req("/ping")))
    await asyncio.sleep(0)
    assert undelayed.done()
    cluster.lookupd_faults.delay = 3600.0
    held = asyncio.ensure_future(handler(req("/ping")))
    for _ in range(10):
        await asyncio.sleep(0)
    assert not held.done()
    held.cancel()
    with pytest.raises(asyncio.CancelledError):
        await held
    cluster.lookupd_faults.delay = 0.01
    assert (await asyncio.wait_for(handler(req("/ping")), 2)).status == 200


async def test_lookupd_stale_answers_repeat_the_first_one() -> None:
    cluster = make_cluster()
    cluster.create_topic("t", 1, 2)
    handler = make_lookupd_handler(cluster)
    query = {"topic": "t", "access": "w"}
    before = cluster.leader_of("t", 0)
    cluster.lookupd_stale()
    first = as_json(await handler(req("/lookup", query, headers=V1)))
    cluster.move_leader("t", 0)
    stale = as_json(await handler(req("/lookup", {**query, "metainfo": "1"}, headers=V1)))
    assert stale["partitions"] == first["partitions"]
    assert stale["partitions"]["0"]["tcp_port"] == before.tcp_port
    assert stale["meta"]["replica"] == 2
    fresh_key = as_json(await handler(req("/lookup", {**query, "access": "r"}, headers=V1)))
    assert fresh_key["partitions"]["0"]["tcp_port"] != before.tcp_port
    cluster.lookupd_stale(False)
    fresh = as_json(await handler(req("/lookup", query, headers=V1)))
    assert fresh["partitions"]["0"]["tcp_port"] == cluster.leader_of("t", 0).tcp_port


async def test_lookupd_state_is_reachable_from_the_handler() -> None:
    handler = make_lookupd_handler(make_cluster())
    api = handler.__self__  # type: ignore[attr-defined]
    assert isinstance(api, LookupdApi)
    assert "write_disabled=no" in repr(api)


# -- nsqd HTTP: publishing --------------------------------------------------------------------


def node_api(cluster: DevCluster, topic: str, partition: int = 0) -> tuple[DevNode, Any]:
    node = cluster.leader_of(topic, partition)
    return node, make_nsqd_handler(cluster, node)


async def test_nsqd_ping_and_info() -> None:
    cluster = make_cluster()
    handler = make_nsqd_handler(cluster, cluster.nodes[1])
    assert (await handler(req("/ping"))).body == b"OK"
    info = as_json(await handler(req("/info", headers=V1)))
    assert info == {
        "version": FORK_VERSION,
        "broadcast_address": "127.0.0.1",
        "hostname": "devnode1",
        "http_port": 24151,
        "tcp_port": 24150,
        "start_time": 1795273517,
        "ha_support": True,
    }


async def test_nsqd_pub_and_pubtrace() -> None:
    cluster = make_cluster()
    cluster.create_topic("t", 1, 2)
    _, handler = node_api(cluster, "t")
    ok = await handler(post("/pub", {"topic": "t", "partition": "0"}, b"hello", headers=V1))
    assert (ok.status, ok.body, ok.headers) == (200, b"OK", [NSQ_HEADER])
    traced = await handler(
        post("/pubtrace", {"topic": "t", "trace_id": "1234605616436508552"}, b"body")
    )
    # v1 even without Accept; numbers as PROTOCOL.md §2.16 (second message: id 3, offset 35)
    assert traced.body == (
        b'{"status":"OK","id":3,"trace_id":"1234605616436508552","queue_offset":35,"rawsize":34}'
    )
    stored = cluster.partition("t", 0).store.log
    assert [(m.body, m.trace_id) for m in stored] == [
        (b"hello", 0),
        (b"body", 1234605616436508552),
    ]
    bad = await handler(post("/pubtrace", {"topic": "t", "trace_id": "-1"}, b"x"))
    assert (bad.status, bad.body) == (400, b'{"message":"INVALID_TRACE_ID"}')


@pytest.mark.parametrize(
    ("path", "query", "body", "headers", "status", "message"),
    [
        ("/pub", {"topic": "t"}, b"x" * 101, {}, 413, "MSG_TOO_BIG"),
        ("/pub", {"topic": "t"}, b"", {}, 406, "MSG_EMPTY"),
        ("/pub", {"topic": "t"}, b"x", {"content-length": ""}, 406, "MSG_EMPTY"),
        ("/pub", {"topic": "nope"}, b"x", {}, 404, "E_TOPIC_NOT_EXIST"),
        ("/pub", {"topic": "bad!"}, b"x", {}, 404, "E_TOPIC_NOT_EXIST"),
        ("/pub", {}, b"x", {}, 404, "E_TOPIC_NOT_EXIST"),
        ("/pub", {"topic": "t", "partition": "x"}, b"x", {}, 404, "E_TOPIC_NOT_EXIST"),
        ("/pub", {"topic": "t", "partition": "5"}, b"x", {}, 404, "E_TOPIC_NOT_EXIST"),
        ("/pub", {"topic": "t", "partition": "1"}, b"x", {}, 400, "E_FAILED_ON_NOT_LEADER"),
        ("/pubtrace", {"topic": "t"}, b"x", {}, 400, "INVALID_TRACE_ID"),
        ("/pub_ext", {"topic": "t"}, b"x", {}, 400, "E_INVALID_JSON_HEADER"),
        ("/pub_ext", {"topic": "t", "ext": "[1]"}, b"x", {}, 400, "E_INVALID_JSON_HEADER"),
        ("/pub_ext", {"topic": "t", "ext": "{bad"}, b"x", {}, 400, "E_INVALID_JSON_HEADER"),
        ("/pub_ext", {"topic": "t", "ext": '{"a":"100%"}'}, b"x", {}, 400, "E_INVALID_JSON_HEADER"),
        ("/pub_ext", {"topic": "t", "ext": '{"##trace_id":5}'}, b"x", {}, 400, "INVALID_TRACE_ID"),
        (
            "/pub_ext",
            {"topic": "t", "ext": '{"##trace_id":"a"}'},
            b"x",
            {},
            400,
            "INVALID_TRACE_ID",
        ),
        ("/pub_ext", {"topic": "plain", "ext": '{"a":"b"}'}, b"x", {}, 400, "E_EXT_NOT_SUPPORT"),
        ("/pub_ext", {"topic": "plain", "ext": '{"##k":"b"}'}, b"x", {}, 400, "E_EXT_NOT_SUPPORT"),
    ],
)
async def test_nsqd_publish_errors(
    path: str,
    query: dict[str, str],
    body: bytes,
    headers: dict[str, str],
    status: int,
    message: str,
) -> None:
    cluster = make_cluster(max_msg_size=100)
    cluster.create_topic("t", 2, 2, ext=True, multi_part=True)
    leader = cluster.leader_of("t", 0)
    plain = cluster.create_topic("plain", 1, 1)
    plain.partitions[0].leader = plain.partitions[0].replicas[0] = leader
    assert cluster.leader_of("t", 1) is not leader
    assert leader in cluster.partition("t", 1).replicas
    handler = make_nsqd_handler(cluster, leader)
    resp = await handler(post(path, query, body, headers={**headers, **V1}))
    assert (resp.status, resp.body.decode()) == (status, f'{{"message":"{message}"}}')
    wrapped = await handler(post(path, query, body, headers=headers))
    expected = 400 if path == "/pubtrace" else 500  # pubtrace is v1 only
    assert wrapped.status == (status if path == "/pubtrace" else expected)
    assert cluster.partition("t", 0).store.log == []


async def test_nsqd_pub_to_an_unwritable_partition() -> None:
    cluster = make_cluster()
    cluster.create_topic("t", 1, 1)
    _, handler = node_api(cluster, "t")
    cluster.set_writable("t", 0, False)
    resp = await handler(post("/pub", {"topic": "t"}, b"x", headers=V1))
    assert (resp.status, resp.body) == (400, b'{"message":"E_FAILED_ON_NOT_WRITABLE"}')


async def test_nsqd_pub_ignores_the_ordered_partition_rule() -> None:
    cluster = make_cluster()
    cluster.create_topic("seq", 1, 1, ordered=True)
    _, handler = node_api(cluster, "seq")
    assert (await handler(post("/pub", {"topic": "seq"}, b"x"))).body == b"OK"


async def test_nsqd_pub_ext_reserialises_the_header() -> None:
    cluster = make_cluster()
    cluster.create_topic("e", 1, 1, ext=True)
    _, handler = node_api(cluster, "e")
    ext = '{"z":"<1>","n":1.0,"big":1e21,"tiny":1e-7,"half":2.5,"a":{"y":1,"x":[true,null]}}'
    resp = await handler(
        post("/pub_ext", {"topic": "e", "ext": ext}, b"body", headers={"x-nsqext-tag-name": "v"})
    )
    assert resp.body == b"OK"
    stored = cluster.partition("e", 0).store.log[0]
    assert stored.ext_data == (
        b'{"a":{"x":[true,null],"y":1},"big":1e+21,"half":2.5,"n":1,"tag-name":"v",'
        b'"tiny":1e-7,"z":"\\u003c1\\u003e"}'
    )
    assert stored.ext_version == 4
    traced = await handler(
        post(
            "/pub_ext", {"topic": "e", "ext": '{"##trace_id":"999","k":"v"}'}, b"hello", headers=V1
        )
    )
    answer = as_json(traced)
    # PROTOCOL.md §2.16: header (28 bytes) and 5-byte body on an ext topic: 4+29+28+5
    assert answer == {
        "status": "OK",
        "id": 3,
        "trace_id": "999",
        "queue_offset": stored.end,
        "rawsize": 66,
    }
    plus = await handler(post("/pub_ext", {"topic": "e", "ext": '{"k":"a+b%2B"}'}, b"x"))
    assert plus.body == b"OK"
    assert cluster.partition("e", 0).store.log[-1].ext_data == b'{"k":"a b+"}'


async def test_nsqd_mpub_text_and_binary() -> None:
    cluster = make_cluster(max_msg_size=10, max_body_size=100)
    cluster.create_topic("t", 2, 2, multi_part=True)
    node, handler = node_api(cluster, "t")
    text = await handler(post("/mpub", {"topic": "t", "partition": "0"}, b"a\n\nbb\nccc"))
    assert text.body == b"OK"
    frames = struct.pack(">I", 2) + struct.pack(">I", 1) + b"x" + struct.pack(">I", 2) + b"yz"
    binary = await handler(post("/mpub", {"topic": "t", "partition": "0", "binary": ""}, frames))
    assert binary.body == b"OK"
    log = cluster.partition("t", 0).store.log
    assert [m.body for m in log] == [b"a", b"bb", b"ccc", b"x", b"yz"]

    async def error(query: dict[str, str], body: bytes) -> tuple[int, str]:
        resp = await handler(post("/mpub", query, body, headers=V1))
        text = resp.body.decode()
        assert text.startswith('{"message":"')
        assert text.endswith('"}')
        return resp.status, text[len('{"message":"') : -2]  # not JSON-escaped, as in Go

    target = {"topic": "t", "partition": "0"}
    assert await error(target, b"x" * 101) == (413, "BODY_TOO_BIG")
    assert await error(target, b"a\n" + b"x" * 11) == (413, "MSG_TOO_BIG")
    assert await error(target, b"\n\n") == (500, "INTERNAL_ERROR")
    assert await error({**target, "binary": "1"}, b"\x00\x00") == (413, "BAD_BODY")
    assert await error({**target, "binary": "1"}, struct.pack(">I", 0)) == (413, "BAD_BODY")
    short = struct.pack(">I", 2) + struct.pack(">I", 1) + b"x"
    assert await error({**target, "binary": "1"}, short) == (413, "BAD_MESSAGE")
    assert await error({}, b"x") == (400, "MISSING_ARG_TOPIC")
    assert await error({"topic": "t", "partition": "z"}, b"x") == (
        400,
        'strconv.Atoi: parsing "z": invalid syntax',
    )
    assert await error({"topic": "nope"}, b"x") == (404, "E_TOPIC_NOT_EXIST")
    replica = next(p for p in cluster.topic("t").partitions if p.leader is not node)
    assert node in replica.replicas
    assert await error({"topic": "t", "partition": str(replica.number)}, b"x") == (
        400,
        "E_FAILED_ON_NOT_LEADER",
    )
    assert len(log) == 5


# -- nsqd HTTP: stats -------------------------------------------------------------------------

#: /stats?format=json&topic=cf_stats on the node leading cf_stats/0, from
#: /work/shared/golden/nsqd_http_fork.json (step "stats_34151", Accept v1)
GOLDEN_STATS = json.loads(
    '{"version":"0.3.7-HA.1.13.0","health":"OK","start_time":1795273519,"topics":[{"topic_name":'
    '"cf_stats","topic_full_name":"cf_stats-0","topic_partition":"0","channels":[{"channel_name":'
    '"statch","backlogs":0,"depth":2,"depth_size":72,"depth_ts":"2026-11-21 15:10:51.310834588 '
    '+0000 UTC","depth_ts_nano":1795273851310834588,"backend_depth":2,"hourly_subsize":0,'
    '"in_flight_count":1,"deferred_count":0,"deferred_from_delay_count":0,"message_count":2,'
    '"requeue_count":0,"timeout_count":0,"clients":[{"name":"conformance","client_id":'
    '"conformance","hostname":"conformance-host","version":"V2","remote_address":'
    '"127.0.0.1:48914","state":3,"ready_count":1,"in_flight_count":1,"message_count":1,'
    '"finish_count":0,"requeue_count":0,"timeout_count":0,"deferred_count":0,"connect_ts":'
    '1795273851,"sample_rate":0,"deflate":false,"snappy":false,"user_agent":'
    '"conformance-probe/1.0","desired_tag":"","tls":false,"tls_cipher_suite":"","tls_version":"",'
    '"tls_negotiated_protocol":"","tls_negotiated_protocol_is_mutual":false,"output_buffer_size":'
    '4096,"output_buffer_timeout":50000000,"msg_timeout":60000000000,"ext_filter":{},'
    '"limited_rdy":50000}],"client_num":1,"paused":false,"skipped":false,"zan_test_skipped":false,'
    '"delayed_queue_count":0,"delayed_queue_recent":"1970-01-01 00:00:00 +0000 UTC",'
    '"delayed_queue_recent_nano":0,"e2e_processing_latency":{"count":0,"percentiles":null},'
    '"msg_consume_latency_stats":[0,0,0,0,0,0,0,0,0,0,0,0],"msg_delivery_latency_stats":'
    '[0,0,0,0,0,0,0,0,0,0,0,0]}],"channel_num":1,"depth":72,"backend_depth":72,"backend_start":0,'
    '"message_count":2,"is_leader":true,"hourly_pubsize":0,"client_pub_stats":[{"remote_address":'
    '"127.0.0.1:48922","user_agent":"","protocol":"tcp","pub_count":2,"err_count":0,'
    '"last_pub_ts":1795273851}],"client_num":1,"msg_size_stats":[2,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],'
    '"msg_write_latency_stats":[2,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0],"is_multi_ordered":false,'
    '"is_multi_part":true,"is_ext":false,"is_channel_auto_create_disabled":false,"statsd_name":'
    '"cf_stats.0","pub_failed_cnt":0,"e2e_processing_latency":{"count":0,"percentiles":null}}]}'
)


def stats_scenario() -> tuple[DevCluster, DevNode, Any, FakeClient]:
    """The golden scenario: 2 messages of 6 bytes on cf_stats/0, one in flight to a client."""
    cluster = make_cluster()
    cluster.create_topic("cf_stats", 2, 1, multi_part=True)
    part = cluster.partition("cf_stats", 0)
    hub = part.hub("statch")
    cluster.append(part, [(b"123456", 0, None), (b"abcdef", 0, None)])
    client = FakeClient()
    hub.clients.append(client)  # type: ignore[arg-type]
    hub.channel.take(client, 60.0, cluster.now())
    return cluster, part.leader, make_nsqd_handler(cluster, part.leader), client


async def test_nsqd_stats_match_the_golden_recording() -> None:
    cluster, _, handler, _ = stats_scenario()
    resp = await handler(req("/stats", {"format": "json", "topic": "cf_stats"}, headers=V1))
    mine = as_json(resp)
    golden = json.loads(json.dumps(GOLDEN_STATS))
    assert mine["topics"][0]["client_pub_stats"] == []
    golden["topics"][0]["client_pub_stats"] = []
    assert key_orders(mine) == key_orders(golden)
    # what varies run to run, and the publisher statistics the emulation does not keep
    for data in (mine, golden):
        data["start_time"] = 0
        topic = data["topics"][0]
        topic["client_pub_stats"] = topic["client_num"] = None
        channel = topic["channels"][0]
        channel["depth_ts"] = channel["depth_ts_nano"] = None
    assert mine == golden
    # the first message is in flight: the pump has read the second ahead (depth_ts_nano)
    ts = cluster.partition("cf_stats", 0).store.log[1].timestamp
    channel = as_json(resp)["topics"][0]["channels"][0]
    assert channel["depth_ts_nano"] == ts
    assert channel["depth_ts"].startswith(
        time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts // 10**9))
    )
    assert channel["depth_ts"].endswith(" +0000 UTC")


async def test_nsqd_stats_filters() -> None:
    cluster, node, handler, _ = stats_scenario()
    cluster.create_topic("other", 3, 3)
    part = cluster.partition("cf_stats", 0)
    part.hub("zzz")

    async def stats(**query: str) -> dict[str, Any]:
        resp = await handler(req("/stats", {"format": "json", **query}, headers=V1))
        return as_json(resp)  # type: ignore[no-any-return]

    everything = await stats()
    names = [t["topic_full_name"] for t in everything["topics"]]
    assert names == ["cf_stats-0", "other-0", "other-1", "other-2"]
    assert [t["is_leader"] for t in everything["topics"]] == [
        True,
        *(cluster.leader_of("other", p) is node for p in range(3)),
    ]
    first = everything["topics"][0]
    assert first["client_pub_stats"] is None
    assert [c["clients"] for c in first["channels"]] == [None, None]
    leaders = await stats(leaderOnly="true")
    assert all(t["is_leader"] for t in leaders["topics"])
    one = await stats(topic="other", partition="1")
    assert [t["topic_full_name"] for t in one["topics"]] == ["other-1"]
    channel = (await stats(topic="cf_stats", channel="statch"))["topics"][0]
    assert [c["channel_name"] for c in channel["channels"]] == ["statch"]
    assert channel["channel_num"] == 2
    unknown = (await stats(topic="cf_stats", channel="nope"))["topics"][0]
    assert [c["channel_name"] for c in unknown["channels"]] == ["statch", "zzz"]
    hidden = (await stats(topic="cf_stats", needClients="false"))["topics"][0]
    assert hidden["channels"][0]["clients"] is None
    assert hidden["channels"][0]["client_num"] == 1
    wanted = (await stats(needClients="true"))["topics"][0]
    assert len(wanted["channels"][0]["clients"]) == 1
    assert wanted["channels"][1]["clients"] == []
    text = await handler(req("/stats", headers=V1))
    assert text.body.decode().startswith(f"nsqd v{FORK_VERSION}")
    wrapped = as_json(await handler(req("/stats", {"format": "json"})))
    assert wrapped["status_code"] == 200
    assert wrapped["data"]["health"] == "OK"


# -- nsqd HTTP: channels ----------------------------------------------------------------------


def offset_scenario() -> tuple[DevCluster, Any, Any]:
    """cf_offset: five 5-byte messages at offsets 0, 35, 70, 105, 140 and a channel ``ch``."""
    cluster = make_cluster()
    cluster.create_topic("cf_offset", 1, 2)
    part = cluster.partition("cf_offset", 0)
    hub = part.hub("ch")
    cluster.append(part, [(b"msg-%d" % i, 0, None) for i in range(5)])
    return cluster, hub, make_nsqd_handler(cluster, part.leader)


@pytest.mark.parametrize(
    ("body", "cursor"),
    [
        (b"virtual_queue:0", 0),
        (b"msgcount:3", 2),
        (b"timestamp:1", 0),
        (b"special:-1", 5),
        (b"virtual_queue:36", 2),
        (b"virtual_queue:999999", 5),
    ],
)
async def test_nsqd_setoffset_moves_the_cursor(body: bytes, cursor: int) -> None:
    cluster, hub, handler = offset_scenario()
    hub.channel.cursor = 3
    query = {"topic": "cf_offset", "partition": "0", "channel": "ch"}
    resp = await handler(post("/channel/setoffset", query, body, headers=V1))
    assert (resp.status, resp.body, resp.headers) == (200, b"", [NSQ_HEADER])
    assert hub.channel.cursor == cursor
    assert cluster.events_of("channel_offset_set")[-1].detail["offset"] == body.decode()


async def test_nsqd_setoffset_errors() -> None:
    cluster, hub, handler = offset_scenario()
    query = {"topic": "cf_offset", "partition": "0", "channel": "ch"}

    async def answer(body: bytes, **changes: str) -> tuple[int, bytes]:
        resp = await handler(post("/channel/setoffset", {**query, **changes}, body))
        return resp.status, resp.body

    # the last two as in /work/shared/golden/nsqd_http_fork.json
    assert await answer(b"bogus:1") == (400, b'{"message":"invalid consume offset:bogus:1"}')
    assert await answer(b"") == (406, b'{"message":"MSG_EMPTY"}')
    assert await answer(b"msgcount:x") == (
        400,
        b'{"message":"strconv.ParseInt: parsing "x": invalid syntax"}',
    )
    assert await answer(b"special:3") == (500, b'{"message":"not supported offset type"}')
    assert await answer(b"msgcount:1", channel="nope") == (
        404,
        b'{"message":"CHANNEL_NOT_FOUND"}',
    )
    assert await answer(b"msgcount:1", topic="nope") == (404, b'{"message":"E_TOPIC_NOT_EXIST"}')
    assert await answer(b"msgcount:1", channel="") == (400, b'{"message":"MISSING_ARG_CHANNEL"}')
    part = cluster.partition("cf_offset", 0)
    replica = make_nsqd_handler(cluster, part.replicas[1])
    resp = await replica(post("/channel/setoffset", query, b"msgcount:1"))
    assert (resp.status, resp.body) == (400, b'{"message":"E_FAILED_ON_NOT_LEADER"}')
    assert hub.channel.cursor == 0  # untouched by every refused request


async def test_nsqd_channel_admin() -> None:
    cluster, hub, handler = offset_scenario()
    query = {"topic": "cf_offset", "channel": "ch"}
    part = hub.partition
    created = await handler(post("/channel/create", {**query, "channel": "new"}))
    assert created.status == 200
    assert "new" in part.hubs
    assert cluster.events_of("channel_created")[-1].detail["partition"] == 0
    hub.channel.cursor = 0
    paused = await handler(post("/channel/pause", query))
    assert paused.status == 200
    assert hub.paused
    assert (await handler(post("/channel/unpause", query))).status == 200
    assert not hub.paused
    ordered = await handler(post("/channel/setorder", {**query, "order": "true"}))
    assert ordered.status == 200
    assert hub.channel.ordered
    bad_order = await handler(post("/channel/setorder", {**query, "order": "yes"}))
    assert as_json(bad_order) == {"message": "INVALID_OPTION"}
    assert (await handler(post("/channel/empty", query))).status == 200
    assert hub.channel.depth == 0
    subscriber = FakeClient()
    hub.clients.append(subscriber)
    assert (await handler(post("/channel/delete", query))).status == 200
    assert "ch" not in part.hubs
    assert "ch" not in part.store.channels
    assert subscriber.dropped == "channel deleted"
    assert (await handler(post("/channel/delete", query))).status == 200
    kinds = {e.kind for e in cluster.events}
    assert {
        "channel_paused",
        "channel_unpaused",
        "channel_order_set",
        "channel_emptied",
        "channel_deleted",
    } <= kinds
    replica = make_nsqd_handler(cluster, part.replicas[1])
    refused = await replica(post("/channel/create", {**query, "partition": "0"}))
    assert as_json(refused) == {"message": "E_FAILED_ON_NOT_LEADER"}
    # the default partition of a node that leads none is missing
    assert (await replica(post("/channel/create", query))).status == 404


async def test_nsqd_channels_of_topics_without_auto_create() -> None:
    cluster = make_cluster()
    cluster.create_topic("locked", 1, 1, disable_channel_auto_create=True)
    cluster.topic("locked").registered_channels.add("c")
    _, handler = node_api(cluster, "locked")
    created = await handler(post("/channel/create", {"topic": "locked", "channel": "c"}))
    assert (created.status, as_json(created)) == (
        403,
        {"message": "channel c not registered. channel should be initialized before use."},
    )
    cluster.partition("locked", 0).hub("c")
    deleted = await handler(post("/channel/delete", {"topic": "locked", "channel": "c"}))
    assert deleted.status == 403
    assert "cuold not be deleted localy in nsqd" in as_json(deleted)["message"]


async def test_nsqd_paused_node_hangs_until_resumed(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = make_cluster()
    node = cluster.nodes[0]
    handler = make_nsqd_handler(cluster, node)
    cluster.pause_node(node)
    pending = asyncio.ensure_future(handler(req("/ping")))
    # letting time pass is the point: the handler polls the node every PAUSE_POLL (50 ms) and
    # must still hang after a few polls
    await asyncio.sleep(0.15)
    assert not pending.done()
    cluster.resume_node(node)
    assert (await asyncio.wait_for(pending, 1)).body == b"OK"
    monkeypatch.setattr(nsqd_http, "PAUSE_LIMIT", 0.1)
    cluster.pause_node(node)
    timed_out = await asyncio.wait_for(handler(req("/ping")), 1)
    assert (timed_out.status, timed_out.body) == (503, b'{"message":"NODE_PAUSED"}')


async def test_nsqd_unknown_path_and_method() -> None:
    cluster = make_cluster()
    handler = make_nsqd_handler(cluster, cluster.nodes[0])
    assert (await handler(req("/topic/create", method="POST"))).status == 404
    assert (await handler(req("/pub"))).status == 405
