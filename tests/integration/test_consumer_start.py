"""Where a consumer's channel starts (``start=``) and :meth:`Consumer.seek` of every partition
at once, on the embedded broker and on the real fork (the ``backend`` fixture), and against a
lying nsqd for a seek that only partly succeeds.

Every test writes bodies carrying a token of its own: the topics are shared by the module's
tests (and, on the fork, by a session), so a channel that starts early also gets other tests'
messages; only the test's own are counted.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import time
import uuid
from datetime import UTC, datetime

import httpx
import pytest

from nsq_ha.admin import AdminError, TopicSpec
from nsq_ha.consumer import Consumer
from nsq_ha.errors import ConfigError
from nsq_ha.producer import Producer, PublishResult

from .backend import Backend
from .lying_http import LyingHttpServer, head

PLAIN = "cs_plain"  # 4 partitions
START = "cs_start"  # 4 partitions; nothing is ever published to partition 3
ORDERED = "cs_ordered"  # 2 partitions, ordered
HELD = "cs_held"  # 1 partition, ordered
TOPICS = [
    TopicSpec(PLAIN, partitions=4),
    TopicSpec(START, partitions=4),
    TopicSpec(ORDERED, partitions=2, ordered=True),
    TopicSpec(HELD, partitions=1, ordered=True),
]


@pytest.fixture(scope="module")
def cluster(backend: Backend) -> Backend:
    """The backend with this module's topics created and writable."""
    backend.ensure_topics(TOPICS)
    return backend


def _channel() -> str:
    return f"c{uuid.uuid4().hex[:8]}"


def _token() -> bytes:
    return uuid.uuid4().hex[:8].encode()


async def publish(
    lookupd: str, topic: str, bodies: dict[int, list[bytes]], *, traced: bool = False
) -> dict[int, list[PublishResult]]:
    """Publish each partition's bodies, one PUB each, in order (traced: the offsets known)."""
    results: dict[int, list[PublishResult]] = collections.defaultdict(list)
    async with Producer(lookupd=lookupd) as producer:
        for partition, items in bodies.items():
            for index, body in enumerate(items):
                trace = index + 1 if traced else None
                result = await producer.publish(topic, body, partition=partition, trace_id=trace)
                results[partition].append(result)
    return results


async def read_until(consumer: Consumer, wanted: set[bytes], within: float = 30.0) -> list[bytes]:
    """Every body received (each finished) until all of ``wanted`` came, or ``within`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    got: list[bytes] = []
    while not wanted <= set(got) and loop.time() < deadline:
        message = await consumer.get(timeout=max(0.0, deadline - loop.time()))
        if message is None:
            break
        got.append(message.body)
        await message.finish()
    missing = wanted - set(got)
    assert not missing, f"{len(missing)} of {len(wanted)} never came, e.g. {sorted(missing)[:3]}"
    return got


async def markers(lookupd: str, topic: str, partitions: range, token: bytes) -> set[bytes]:
    """One message per partition, published now: once a consumer got every one, anything it
    was going to get from before them in the same partition came first."""
    bodies = {p: [token + b"-marker-%d" % p] for p in partitions}
    await publish(lookupd, topic, bodies)
    return {b for items in bodies.values() for b in items}


def flat(bodies: dict[int, list[bytes]]) -> list[bytes]:
    return [b for items in bodies.values() for b in items]


# -- start= ----------------------------------------------------------------------------------


async def test_a_new_channel_with_start_earliest_gets_everything_the_topic_holds(
    cluster: Backend,
) -> None:
    """Partition 3 never had a message (the fork refuses to seek into an empty commit log):
    it is already at its start."""
    token = _token()
    old = {p: [token + b"-old-%d-%d" % (p, i) for i in range(5)] for p in range(3)}
    await publish(cluster.lookupd_http, START, old)
    channel = _channel()
    async with Consumer(START, channel, lookupd=cluster.lookupd_http, start="earliest") as c:
        assert {key[1] for key in c.connections} == {0, 1, 2, 3}
        got = await read_until(c, set(flat(old)))
        got += await read_until(c, await markers(cluster.lookupd_http, START, range(4), token))
    mine = collections.Counter(b for b in got if b.startswith(token + b"-old"))
    assert sorted(mine) == sorted(flat(old))
    assert set(mine.values()) == {1}


async def test_a_new_channel_without_start_gets_none_of_the_old_messages(
    cluster: Backend,
) -> None:
    token = _token()
    old = {p: [token + b"-old-%d" % p] for p in range(4)}
    await publish(cluster.lookupd_http, PLAIN, old)
    async with Consumer(PLAIN, _channel(), lookupd=cluster.lookupd_http) as consumer:
        got = await read_until(
            consumer, await markers(cluster.lookupd_http, PLAIN, range(4), token)
        )
    assert not set(got) & set(flat(old))


async def test_a_restarted_consumer_with_start_earliest_does_not_rewind_its_channel(
    cluster: Backend,
) -> None:
    token = _token()
    first = {p: [token + b"-first-%d" % p] for p in range(4)}
    await publish(cluster.lookupd_http, PLAIN, first)
    channel = _channel()
    lookupd = cluster.lookupd_http
    async with Consumer(PLAIN, channel, lookupd=lookupd, start="earliest") as consumer:
        await read_until(consumer, set(flat(first)))
    second = {p: [token + b"-second-%d" % p] for p in range(4)}
    await publish(lookupd, PLAIN, second)
    async with Consumer(PLAIN, channel, lookupd=lookupd, start="earliest") as consumer:
        wanted = set(flat(second)) | await markers(lookupd, PLAIN, range(4), token)
        got = await read_until(consumer, wanted)
    assert not set(got) & set(flat(first))


async def test_start_at_a_time_skips_what_was_published_before_it(cluster: Backend) -> None:
    token = _token()
    before = {p: [token + b"-before-%d" % p] for p in range(4)}
    await publish(cluster.lookupd_http, PLAIN, before)
    boundary = math.floor(time.time()) + 1  # start= is applied to the second
    for _ in range(30):  # a wall-clock wait (nothing to wait on), at most 1.5 s
        if time.time() >= boundary:
            break
        await asyncio.sleep(0.05)
    after = {p: [token + b"-after-%d" % p] for p in range(4)}
    await publish(cluster.lookupd_http, PLAIN, after)
    start = datetime.fromtimestamp(boundary, UTC)
    async with Consumer(PLAIN, _channel(), lookupd=cluster.lookupd_http, start=start) as c:
        got = await read_until(c, set(flat(after)))
    assert not set(got) & set(flat(before))


async def test_start_at_offsets_per_partition(cluster: Backend) -> None:
    """Partition 1 starts at its third message's offset; the others, not named, start where a
    new channel starts (the end)."""
    token = _token()
    lookupd = cluster.lookupd_http
    bodies = {1: [token + b"-p1-%d" % i for i in range(5)], 2: [token + b"-p2"]}
    results = await publish(lookupd, PLAIN, bodies, traced=True)
    third = results[1][2].offset
    assert third is not None
    async with Consumer(PLAIN, _channel(), lookupd=lookupd, start={1: third}) as consumer:
        got = await read_until(consumer, await markers(lookupd, PLAIN, range(4), token))
    assert [b for b in got if b.startswith(token + b"-p")] == bodies[1][2:]


async def test_start_earliest_on_an_ordered_topic_delivers_the_backlog_once_in_order(
    cluster: Backend,
) -> None:
    """Eight new channels at once, each partition's backlog exactly once and in order: the
    channel is made ordered before it moves (SUB_ORDERED turning a plain channel ordered resets
    its reader, and the fork may then send the partition's first message twice)."""
    token = _token()
    old = {p: [token + b"-%d-%d" % (p, i) for i in range(6)] for p in range(2)}
    await publish(cluster.lookupd_http, ORDERED, old)

    async def one_channel() -> list[bytes]:
        channel = _channel()
        async with Consumer(
            ORDERED, channel, lookupd=cluster.lookupd_http, start="earliest"
        ) as consumer:
            assert consumer.is_ordered
            got = await read_until(consumer, set(flat(old)))
            wanted = await markers(
                cluster.lookupd_http, ORDERED, range(2), token + channel.encode()
            )
            got += await read_until(consumer, wanted)
        return got

    for got in await asyncio.gather(*(one_channel() for _ in range(8))):
        for partition in range(2):
            prefix = token + b"-%d-" % partition
            assert [b for b in got if b.startswith(prefix)] == old[partition]


async def test_a_message_published_while_a_new_ordered_channel_moves_comes_after_the_backlog(
    cluster: Backend,
) -> None:
    """A message published between the channel's creation and its move to ``start`` is read at
    once by nsqd's channel pump, which holds it across the move and would send it before the
    backlog. A proxy in front of lookupd and the partition's leader publishes one there (after
    forwarding ``/channel/create``): it comes after the backlog, and nothing comes twice."""
    token = _token()
    old = [token + b"-old-%d" % i for i in range(3)]
    held = token + b"-held"
    await publish(cluster.lookupd_http, HELD, {0: old})
    leader_tcp = cluster.leader(HELD, 0)
    leader_http = await _http_of(cluster, leader_tcp)

    async def handle(request_head: str, writer: asyncio.StreamWriter) -> None:
        method, target = request_head.split(" ", 2)[:2]
        path = target.split("?", 1)[0]
        port = writer.get_extra_info("sockname")[1]
        v1 = {"Accept": "application/vnd.nsq; version=1.0"}
        async with httpx.AsyncClient(timeout=10, headers=v1) as http:
            if path == "/listlookup":
                status, body = 404, b"{}"
            elif path == "/lookup":
                got = await http.get(cluster.lookupd_http + target)
                answer = got.json()
                for node in [*answer.get("partitions", {}).values(), *answer["producers"]]:
                    node["http_port"] = port  # the channel calls come here
                status, body = got.status_code, json.dumps(answer).encode()
            else:
                got = await http.request(method, leader_http + target, content=server.body(writer))
                status, body = got.status_code, got.content
                if path == "/channel/create" and got.status_code == 200:
                    pub = await http.post(
                        f"{leader_http}/pub?topic={HELD}&partition=0", content=held
                    )
                    assert pub.status_code == 200, pub.text
                    await asyncio.sleep(0.2)  # the pump reads it (at once on the fork)
        writer.write(head(f"{status} X", length=len(body)) + body)
        await writer.drain()

    async with (
        LyingHttpServer(handle) as server,
        Consumer(HELD, _channel(), lookupd=server.url, start="earliest") as consumer,
    ):
        got = await read_until(consumer, {*old, held})
        again = await consumer.get(timeout=0.5)
    assert [*got, again] == [*old, held, None]
    assert any("/channel/create" in r for r in server.requests)


async def _http_of(cluster: Backend, tcp_address: str) -> str:
    """The HTTP URL of the nsqd listening on ``tcp_address`` (``/info``'s TCP port)."""
    async with httpx.AsyncClient(timeout=10) as http:
        for url in cluster.http_urls():
            info = (await http.get(f"{url}/info")).json()
            if tcp_address.endswith(f":{info.get('data', info)['tcp_port']}"):
                return url
    raise AssertionError(f"no nsqd listens on {tcp_address}")


async def test_a_start_naming_a_partition_the_topic_lacks_is_refused_at_start(
    cluster: Backend,
) -> None:
    consumer = Consumer(PLAIN, _channel(), lookupd=cluster.lookupd_http, start={0: 0, 9: 0})
    with pytest.raises(ConfigError, match=r"start= names \[9\]"):
        await consumer.start()
    assert consumer.connections == {}
    await consumer.close()


# -- seek() of every partition ---------------------------------------------------------------


async def test_seek_without_a_partition_moves_every_partition_and_an_empty_one_is_done(
    cluster: Backend,
) -> None:
    """A timestamp seek of partition 3, which never had a message, is not an error."""
    token = _token()
    lookupd = cluster.lookupd_http
    since = math.floor(time.time())
    async with Consumer(START, _channel(), lookupd=lookupd) as consumer:
        bodies = {p: [token + b"-%d-%d" % (p, i) for i in range(3)] for p in range(3)}
        await publish(lookupd, START, bodies)
        await read_until(consumer, set(flat(bodies)))
        await consumer.seek(timestamp=since)
        again = await read_until(consumer, set(flat(bodies)))
    for partition in range(3):
        prefix = token + b"-%d-" % partition
        assert [b for b in again if b.startswith(prefix)] == bodies[partition]


def _fork_node(port: int) -> dict[str, object]:
    return {
        "broadcast_address": "127.0.0.1",
        "tcp_port": port,
        "http_port": port,
        "version": "0.3.7-HA.1.12.1",
    }


async def test_a_seek_of_every_partition_that_fails_on_one_says_which_moved() -> None:
    """One server plays nsqlookupd and the leaders of 3 partitions: partition 1 refuses the
    seek, partition 2 never had a message (``commit log end of file``: already there)."""
    refusals = {
        "1": ("500 Internal Server Error", {"message": "E_DISK_FULL"}),
        "2": ("500 Internal Server Error", {"message": "commit log end of file"}),
    }

    async def handle(request_head: str, writer: asyncio.StreamWriter) -> None:
        target = request_head.split(" ", 2)[1]
        port = writer.get_extra_info("sockname")[1]
        status, body = "200 OK", b""
        if target.startswith("/lookup"):
            node = _fork_node(port)
            answer = {
                "channels": [],
                "meta": {"partition_num": 3, "replica": 1},
                "partitions": {"0": node, "1": node, "2": node},
                "producers": [node],
            }
            body = json.dumps(answer).encode()
        elif target.startswith("/channel/setoffset"):
            partition = target.split("partition=", 1)[1].split("&", 1)[0]
            status, refusal = refusals.get(partition, ("200 OK", None))
            body = b"" if refusal is None else json.dumps(refusal).encode()
        else:  # /listlookup: a standalone nsqlookupd
            status, body = "404 Not Found", b"{}"
        writer.write(head(status, length=len(body)) + body)
        await writer.drain()

    async with LyingHttpServer(handle) as server:
        consumer = Consumer("t", "c", lookupd=server.url)
        try:
            with pytest.raises(AdminError) as caught:
                await consumer.seek(timestamp=1_700_000_000)
        finally:
            await consumer.close()
    text = str(caught.value)
    assert "partitions 0, 2 moved" in text
    assert "partition 1" in text
    assert "E_DISK_FULL" in text
    seeks = [r for r in server.requests if r.startswith("POST /channel/setoffset")]
    assert len(seeks) == 3


async def test_a_start_that_cannot_be_applied_fails_start_and_leaves_no_channel_behind() -> None:
    """The leader creates the new channel but refuses to move it: start() raises, and the
    channel made is deleted, so the next start finds it new again (not at the end)."""

    async def handle(request_head: str, writer: asyncio.StreamWriter) -> None:
        target = request_head.split(" ", 2)[1]
        port = writer.get_extra_info("sockname")[1]
        status, body = "200 OK", b""
        if target.startswith("/lookup"):
            node = _fork_node(port)
            answer = {
                "channels": [],
                "meta": {"partition_num": 1, "replica": 1},
                "partitions": {"0": node},
                "producers": [node],
            }
            body = json.dumps(answer).encode()
        elif target.startswith("/stats"):
            body = json.dumps({"topics": [{"topic_name": "t", "channels": []}]}).encode()
        elif target.startswith("/channel/setoffset"):
            status, body = "500 Internal Server Error", b'{"message":"E_DISK_FULL"}'
        elif not target.startswith(("/channel/create", "/channel/delete")):
            status, body = "404 Not Found", b"{}"
        writer.write(head(status, length=len(body)) + body)
        await writer.drain()

    async with LyingHttpServer(handle) as server:
        consumer = Consumer("t", "c", lookupd=server.url, start="earliest")
        try:
            with pytest.raises(AdminError, match="E_DISK_FULL"):
                await consumer.start()
        finally:
            await consumer.close()
    calls = [r.split(" ", 2)[1].split("?", 1)[0] for r in server.requests if r.startswith("POST")]
    assert calls == ["/channel/create", "/channel/setoffset", "/channel/delete"]
