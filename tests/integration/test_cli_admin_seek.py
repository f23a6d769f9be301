"""``nsq-ha channel seek`` on a topic whose partitions are not all alike, as a user runs it (a
subprocess each), on the embedded cluster and the real fork (the ``backend`` fixture).

A partition that never had a message is already at every position: nsqd refuses to seek it
(HTTP 500 ``commit log end of file``), and the command counts it as done and says so. A
partition that fails for another reason (its leader unreachable, or not answering in time) does
not stop the others; the command prints each partition's outcome and exits 1 with one line that
lists what moved and what did not. Every effect is checked through nsqd's ``/stats``.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from nsq_ha import Producer
from nsq_ha.admin import NsqdAdmin, TopicSpec
from nsq_ha.lookup import LookupClient
from nsq_ha.testing.process import free_ports

from .backend import Backend
from .cli_run import nsq_ha as run_cli
from .cli_run import ok, one_line_error
from .lying_http import Handler, LyingHttpServer, answer, by_path, trickler

_SUFFIX = secrets.token_hex(3)
#: messages on partitions 0 and 2, none ever on partition 1
T_GAPS = TopicSpec(f"cliseek_gaps_{_SUFFIX}", partitions=3)
#: messages on partition 0 only
T_ONE = TopicSpec(f"cliseek_one_{_SUFFIX}", partitions=2)
PUBLISHED = {T_GAPS.name: {0: 4, 2: 3}, T_ONE.name: {0: 5}}
PARTITIONS = {T_GAPS.name: 3, T_ONE.name: 2}


async def nsq_ha(*argv: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_cli, *argv)


@pytest.fixture(scope="module")
def cluster(backend: Backend) -> Backend:
    backend.ensure_topics([T_GAPS, T_ONE])

    async def publish() -> None:
        async with Producer(lookupd=backend.lookupd_http) as producer:
            for topic, counts in PUBLISHED.items():
                for partition, count in counts.items():
                    for i in range(count):
                        await producer.publish(topic, b"m%d" % i, partition=partition)

    asyncio.run(publish())
    return backend


async def until(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 20.0) -> Any:  # noqa: ASYNC109
    last: Any = None
    try:
        async with asyncio.timeout(timeout):
            while True:
                last = await check()
                if last:
                    return last
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(f"{what}: still {last!r} after {timeout}s") from None


async def _depths(lookupd: str, topic: str, channel: str) -> dict[int, int]:
    """Each partition's channel depth, from its leader's ``/stats``."""
    async with LookupClient([lookupd]) as lookup:
        leaders = dict((await lookup.lookup(topic, "w", force=True)).partitions)
    found: dict[int, int] = {}
    for partition, node in leaders.items():
        async with NsqdAdmin(node.http_url) as nsqd:
            for entry in await nsqd.stats(topic, partition, clients=False):
                if entry.get("topic_partition") != str(partition) or not entry.get("is_leader"):
                    continue
                for ch in entry.get("channels") or ():
                    if ch.get("channel_name") == channel:
                        found[partition] = int(ch["depth"])
    return found


async def _new_channel(lookupd: str, topic: str, channel: str) -> tuple[str, ...]:
    """A channel at the end of every partition (depth 0 everywhere); the seek arguments."""
    where = ("--lookupd", lookupd, "--topic", topic, "--channel", channel)
    ok(await nsq_ha("channel", "create", *where))
    zero = dict.fromkeys(range(PARTITIONS[topic]), 0)
    await until(lambda: _equal(_depths(lookupd, topic, channel), zero), "a new channel at the end")
    return where


async def _equal(got: Awaitable[Any], wanted: Any) -> bool:
    return bool(await got == wanted)


# -- an empty partition is already at every position ------------------------------------------


@pytest.mark.parametrize(
    "position", ["timestamp=2020-01-01T00:00", "timestamp=0", "earliest", "count=1"]
)
async def test_seek_counts_a_partition_that_never_had_a_message_as_done(
    cluster: Backend, position: str
) -> None:
    lookupd, topic = cluster.lookupd_http, T_ONE.name
    channel = "e" + secrets.token_hex(3)
    where = await _new_channel(lookupd, topic, channel)
    out = ok(await nsq_ha("channel", "seek", *where, position))
    lines = out.splitlines()
    assert any(line.startswith(f"moved {topic}/{channel} partition 0 ") for line in lines), out
    empty = [line for line in lines if f"{topic}/{channel} partition 1 " in line]
    assert len(empty) == 1, out
    assert "empty" in empty[0], out
    assert "already at any position" in empty[0], out
    await until(
        lambda: _equal(_depths(lookupd, topic, channel), {0: 5, 1: 0}), f"{position}: p0 at start"
    )


async def test_seek_json_lists_moved_and_empty_partitions(cluster: Backend) -> None:
    lookupd, topic = cluster.lookupd_http, T_ONE.name
    channel = "j" + secrets.token_hex(3)
    where = await _new_channel(lookupd, topic, channel)
    summary = json.loads(ok(await nsq_ha("channel", "seek", *where, "timestamp=0", "--json")))
    assert [d["partition"] for d in summary["done"]] == [0]
    assert [d["partition"] for d in summary["empty"]] == [1]
    assert summary["failed"] == []
    assert summary["not_tried"] == []


async def test_seek_to_a_byte_offset_of_an_empty_partition_is_done(cluster: Backend) -> None:
    lookupd, topic = cluster.lookupd_http, T_ONE.name
    channel = "o" + secrets.token_hex(3)
    where = await _new_channel(lookupd, topic, channel)
    for offset in ("offset=0", "offset=4096"):
        out = ok(await nsq_ha("channel", "seek", *where, "--partition", "1", offset))
        assert "already at any position" in out, out


# -- a failure in the middle lists what moved ----------------------------------------------------


async def _map_naming(lookupd: str, topic: str, partition: int, port: int) -> bytes:
    """The real lookup answer of ``topic``, with ``partition`` led by 127.0.0.1:``port``."""
    async with httpx.AsyncClient() as http:
        response = await http.get(
            f"{lookupd}/lookup",
            params={"topic": topic, "access": "r", "metainfo": "true"},
            headers={"Accept": "application/vnd.nsq; version=1.0"},
        )
    found = response.json()
    liar = dict(found["partitions"][str(partition)])
    liar.update(
        id=f"127.0.0.1:{port}",
        remote_address=f"127.0.0.1:{port}",
        broadcast_address="127.0.0.1",
        tcp_port=port,
        http_port=port,
        distributed_id=f"127.0.0.1:{port}:{port}:99",
    )
    found["partitions"][str(partition)] = liar
    found["producers"] = [*found["producers"], liar]
    return json.dumps(found).encode()


async def _seek_through(lookup_answer: bytes, *argv: str) -> subprocess.CompletedProcess[str]:
    """``nsq-ha channel seek ARGV`` through a lookupd that answers ``lookup_answer``."""
    routes: dict[str, Handler] = {"/listlookup": answer(None), "/lookup": answer(lookup_answer)}
    async with LyingHttpServer(by_path(routes)) as lookupd:
        return await nsq_ha("channel", "seek", "--lookupd", lookupd.url, *argv)


async def test_an_unreachable_leader_in_the_middle_does_not_stop_the_others(
    cluster: Backend,
) -> None:
    lookupd, topic = cluster.lookupd_http, T_GAPS.name
    channel = "f" + secrets.token_hex(3)
    await _new_channel(lookupd, topic, channel)
    (dead,) = free_ports(1)  # nothing listens there: the leader of partition 1 is down
    lying = await _map_naming(lookupd, topic, 1, dead)
    proc = await _seek_through(lying, "--topic", topic, "--channel", channel, "earliest")
    line = one_line_error(proc, 1)
    lines = proc.stdout.splitlines()
    assert any(x.startswith(f"moved {topic}/{channel} partition 0 ") for x in lines), proc.stdout
    assert any(x.startswith(f"moved {topic}/{channel} partition 2 ") for x in lines), proc.stdout
    failed = [x for x in lines if f"partition 1 on 127.0.0.1:{dead}" in x]
    assert len(failed) == 1, proc.stdout
    assert failed[0].startswith("failed "), proc.stdout
    assert "unreachable" in failed[0], proc.stdout
    assert "moved: 0, 2 (1 empty" not in line, line  # partition 1 was not found empty
    assert "moved: 0, 2;" in line, line
    assert "not moved: 1 (failed" in line, line
    await until(
        lambda: _equal(_depths(lookupd, topic, channel), {0: 4, 1: 0, 2: 3}),
        "partitions 0 and 2 back at their start",
    )


async def test_a_leader_that_does_not_answer_in_time_lists_what_moved_and_what_was_not_tried(
    cluster: Backend,
) -> None:
    lookupd, topic = cluster.lookupd_http, T_GAPS.name
    channel = "t" + secrets.token_hex(3)
    await _new_channel(lookupd, topic, channel)
    async with LyingHttpServer(trickler(interval=0.5)) as slow:
        port = int(slow.url.rsplit(":", 1)[1])
        lying = await _map_naming(lookupd, topic, 1, port)
        argv = ("--topic", topic, "--channel", channel, "earliest", "--timeout", "4", "--json")
        proc = await _seek_through(lying, *argv)
    line = one_line_error(proc, 1)
    summary = json.loads(proc.stdout)
    assert [d["partition"] for d in summary["done"]] == [0]
    assert [d["partition"] for d in summary["failed"]] == [1]
    assert "within 4 s" in summary["failed"][0]["error"]
    assert [d["partition"] for d in summary["not_tried"]] == [2]
    assert "moved: 0;" in line, line
    assert "not moved: 1 (failed" in line, line
    assert "2 (not tried" in line, line
    await until(
        lambda: _equal(_depths(lookupd, topic, channel), {0: 4, 1: 0, 2: 0}),
        "partition 0 at its start, partition 2 untouched",
    )
