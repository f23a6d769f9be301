"""``nsq-ha stats``, ``topic list|delete``, ``channel ...`` and ``leader move`` as a user runs
them (a subprocess each), on the embedded cluster and the real fork (the ``backend`` fixture),
and on real vanilla NSQ where vanilla has the call. Every effect is checked through the servers
(nsqd's ``/stats``, lookups, what a consumer receives), not only through exit codes."""

from __future__ import annotations

import asyncio
import json
import secrets
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from nsq_ha import Consumer, Producer
from nsq_ha.admin import NsqdAdmin, TopicSpec
from nsq_ha.lookup import LookupClient
from nsq_ha.testing.servers import VanillaCluster

from .backend import Backend, DevBackend, ForkBackend
from .cli_run import nsq_ha as run_cli
from .cli_run import ok, one_line_error

_SUFFIX = secrets.token_hex(3)
T_STATS = TopicSpec(f"cliadm_stats_{_SUFFIX}", partitions=2)
T_CHAN = TopicSpec(f"cliadm_chan_{_SUFFIX}")
T_MOVE = TopicSpec(f"cliadm_move_{_SUFFIX}", replicas=2)
T_DEL = TopicSpec(f"cliadm_del_{_SUFFIX}")


async def nsq_ha(*argv: str) -> subprocess.CompletedProcess[str]:
    """:func:`run_cli` off the event loop (a consumer may be open meanwhile)."""
    return await asyncio.to_thread(run_cli, *argv)


async def until(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 20.0) -> Any:  # noqa: ASYNC109
    """Poll ``check`` until it returns something true (the fork's counters lag a little)."""
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


#: a topic whose channels only nsqlookupd creates (``--no-channel-auto-create``)
T_REG = f"cliadm_reg_{_SUFFIX}"


@pytest.fixture(scope="module")
def cluster(backend: Backend) -> Backend:
    create = ["topic", "create", "--lookupd", backend.lookupd_http, "--topic", T_REG]
    ok(run_cli(*create, "--no-channel-auto-create", "--no-wait"))
    backend.ensure_topics([T_STATS, T_CHAN, T_MOVE, T_DEL])
    ok(run_cli(*create, "--no-channel-auto-create"))  # the same again: wait until writable
    return backend


async def _leaders(lookupd: str, topic: str) -> dict[int, Any]:
    async with LookupClient([lookupd]) as lookup:
        return dict((await lookup.lookup(topic, "w", force=True)).partitions)


async def _channel_stats(lookupd: str, topic: str, partition: int, channel: str) -> dict[str, Any]:
    """The channel's entry in the partition leader's ``/stats`` (straight from nsqd)."""
    node = (await _leaders(lookupd, topic))[partition]
    async with NsqdAdmin(node.http_url) as nsqd:
        for entry in await nsqd.stats(topic, partition):
            if entry.get("topic_partition") == str(partition) and entry.get("is_leader"):
                for ch in entry["channels"]:
                    if ch["channel_name"] == channel:
                        return dict(ch)
    raise AssertionError(f"{topic}/{partition} has no channel {channel}")


async def _has_channel(lookupd: str, topic: str, channel: str) -> bool:
    """Partition 0's leader lists ``channel`` in its ``/stats``."""
    try:
        await _channel_stats(lookupd, topic, 0, channel)
    except AssertionError:
        return False
    return True


async def _stats_rows(*where: str, topic: str) -> list[dict[str, Any]]:
    out = ok(await nsq_ha("stats", *where, "--topic", topic, "--json"))
    snapshot = json.loads(out)
    rows: list[dict[str, Any]] = snapshot["rows"]
    return rows


async def _consume_and_finish(count: int, **where: Any) -> None:
    """Receive and finish exactly ``count`` messages, one at a time, then close."""
    async with Consumer(max_in_flight=1, **where) as consumer:
        for _ in range(count):
            message = await consumer.get(timeout=30)
            assert message is not None
            await message.finish()
        await consumer.sync()


# -- topic list ------------------------------------------------------------------------------


async def test_topic_list_names_and_meta(cluster: Backend) -> None:
    where = ("--lookupd", cluster.lookupd_http)
    names = ok(await nsq_ha("topic", "list", *where)).split()
    for spec in (T_STATS, T_CHAN, T_MOVE, T_DEL):
        assert spec.name in names
    listed = json.loads(ok(await nsq_ha("topic", "list", *where, "--json")))["topics"]
    by_name = {t["topic"]: t for t in listed}
    stats, move = by_name[T_STATS.name], by_name[T_MOVE.name]
    assert (stats["partitions"], stats["replicas"], stats["ordered"], stats["ext"]) == (
        2,
        1,
        False,
        False,
    )
    assert (move["partitions"], move["replicas"], move["fork"]) == (1, 2, True)


# -- stats -----------------------------------------------------------------------------------


async def test_stats_lag_is_published_minus_consumed(cluster: Backend) -> None:
    lookupd, topic, channel = cluster.lookupd_http, T_STATS.name, "lagc"
    created = ok(
        await nsq_ha(
            "channel", "create", "--lookupd", lookupd, "--topic", topic, "--channel", channel
        )
    )
    assert created.count(f"created {topic}/{channel} partition") == 2, created
    async with Producer(lookupd=lookupd) as producer:
        for i in range(10):
            await producer.publish(topic, b"p0-%d" % i, partition=0)
        for i in range(3):
            await producer.publish(topic, b"p1-%d" % i, partition=1)
    await _consume_and_finish(4, topic=topic, channel=channel, lookupd=lookupd, partitions=[0])

    async def lags() -> dict[int, tuple[Any, Any]] | None:
        rows = await _stats_rows("--lookupd", lookupd, topic=topic)
        found = {r["partition"]: r for r in rows if r["channel"] == channel}
        got = {p: (r["lag_messages"], r["lag_bytes"]) for p, r in found.items()}
        return got if {p: m for p, (m, _) in got.items()} == {0: 6, 1: 3} else None

    got = await until(lags, "lag 6 on partition 0 and 3 on partition 1")
    assert got[0][1] > got[1][1] > 0  # bytes behind the end: 6 messages > 3 messages
    rows = await _stats_rows("--lookupd", lookupd, topic=topic)
    leaders = await _leaders(lookupd, topic)
    for row in rows:
        assert row["leader"] == leaders[row["partition"]].address
        assert row["topic"] == topic
    p0 = next(r for r in rows if r["channel"] == channel and r["partition"] == 0)
    assert p0["messages"] >= 10
    assert p0["consumers"] == 0
    table = ok(await nsq_ha("stats", "--lookupd", lookupd, "--topic", topic, "--plain"))
    assert "lag msgs" in table
    assert "lag bytes" in table
    cells = [x.split() for x in table.splitlines()]
    line = next(c for c in cells if c[:2] == [topic, "0"] and c[3] == channel)
    assert line[-2] == "6", line


async def test_stats_without_topic_lists_every_topic_and_watch_is_bounded(
    cluster: Backend,
) -> None:
    where = ("--lookupd", cluster.lookupd_http)
    rows = json.loads(ok(await nsq_ha("stats", *where, "--json")))["rows"]
    assert {T_STATS.name, T_CHAN.name, T_MOVE.name} <= {r["topic"] for r in rows}
    out = ok(
        await nsq_ha(
            "stats", *where, "--topic", T_STATS.name, "--json", "--watch", "0.2", "--count", "3"
        )
    )
    snapshots = [json.loads(line) for line in out.splitlines()]
    assert len(snapshots) == 3
    assert snapshots[0]["time"] <= snapshots[1]["time"] <= snapshots[2]["time"]


def test_stats_watch_ends_on_ctrl_c_with_exit_0(cluster: Backend) -> None:
    import signal
    import time

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nsq_ha",
            "stats",
            "--lookupd",
            cluster.lookupd_http,
            "--topic",
            T_STATS.name,
            "--watch",
            "0.2",
            "--plain",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the first table has started: the handler is set
        assert first.startswith("nsq-ha stats"), first
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert out.count("nsq-ha stats") >= 1


# -- channel ---------------------------------------------------------------------------------


async def test_channel_pause_unpause_and_empty(cluster: Backend) -> None:
    lookupd, topic, channel = cluster.lookupd_http, T_CHAN.name, "pausec"
    where = ("--lookupd", lookupd, "--topic", topic, "--channel", channel)
    ok(await nsq_ha("channel", "create", *where))
    summary = json.loads(ok(await nsq_ha("channel", "pause", *where, "--json")))
    assert summary["action"] == "pause"
    assert [d["partition"] for d in summary["done"]] == [0]
    assert (await _channel_stats(lookupd, topic, 0, channel))["paused"] is True
    async with Producer(lookupd=lookupd) as producer:
        for i in range(3):
            await producer.publish(topic, b"paused-%d" % i)
    async with Consumer(topic, channel, lookupd=lookupd, max_in_flight=10) as consumer:
        assert await consumer.get(timeout=1.5) is None, "a paused channel delivered"
        ok(await nsq_ha("channel", "unpause", *where))
        assert (await _channel_stats(lookupd, topic, 0, channel))["paused"] is False
        for _ in range(3):
            message = await consumer.get(timeout=30)
            assert message is not None
            await message.finish()
        await consumer.sync()

    async with Producer(lookupd=lookupd) as producer:
        for i in range(5):
            await producer.publish(topic, b"backlog-%d" % i)

    async def depth() -> int:
        return int((await _channel_stats(lookupd, topic, 0, channel))["depth"])

    await until(lambda: _is(depth, 5), "depth 5 before empty")
    ok(await nsq_ha("channel", "empty", *where))
    await until(lambda: _is(depth, 0), "depth 0 after empty")


async def _is(get: Callable[[], Awaitable[Any]], wanted: Any) -> bool:
    return bool(await get() == wanted)


async def test_channel_seek_positions_move_the_lag(cluster: Backend) -> None:
    lookupd, topic, channel = cluster.lookupd_http, T_CHAN.name, "seekc"
    where = ("--lookupd", lookupd, "--topic", topic, "--channel", channel)
    ok(await nsq_ha("channel", "create", *where, "--from", "start"))

    async def depth() -> int:
        return int((await _channel_stats(lookupd, topic, 0, channel))["depth"])

    async with Producer(lookupd=lookupd) as producer:
        for i in range(4):
            await producer.publish(topic, b"seek-%d" % i)
    ok(await nsq_ha("channel", "seek", *where, "latest"))
    await until(lambda: _is(depth, 0), "depth 0 at latest")
    ok(await nsq_ha("channel", "seek", *where, "earliest"))
    total = await until(depth, "depth > 0 at earliest")
    assert total >= 4
    ok(await nsq_ha("channel", "seek", *where, "count=3"))
    await until(lambda: _is(depth, total - 2), "the third message next")
    ok(await nsq_ha("channel", "seek", *where, "timestamp=0"))
    await until(lambda: _is(depth, total), "everything again from timestamp 0")
    ok(await nsq_ha("channel", "seek", *where, "--partition", "0", "offset=0"))
    await until(lambda: _is(depth, total), "offset 0 is the start")


async def test_channel_setorder_limits_in_flight_to_one(cluster: Backend) -> None:
    lookupd, topic, channel = cluster.lookupd_http, T_CHAN.name, "orderc"
    where = ("--lookupd", lookupd, "--topic", topic, "--channel", channel)
    ok(await nsq_ha("channel", "create", *where))
    async with Producer(lookupd=lookupd) as producer:
        for i in range(5):
            await producer.publish(topic, b"order-%d" % i)
    ok(await nsq_ha("channel", "setorder", *where, "on"))

    async def in_flight() -> int:
        return int((await _channel_stats(lookupd, topic, 0, channel))["in_flight_count"])

    async with Consumer(topic, channel, lookupd=lookupd, max_in_flight=10) as consumer:
        first = await consumer.get(timeout=30)
        assert first is not None
        await asyncio.sleep(1.0)
        assert await in_flight() == 1, "an ordered channel has one message in flight"
        # turning the order off disconnects the channel's consumers (nsqd's SetOrdered);
        # the consumer reconnects and then gets the rest at once
        ok(await nsq_ha("channel", "setorder", *where, "off"))
        await until(lambda: _at_least(in_flight, 2), "more than one in flight once unordered")


async def _at_least(get: Callable[[], Awaitable[int]], low: int) -> bool:
    return await get() >= low


async def test_channel_delete_removes_it_from_nsqd(cluster: Backend) -> None:
    lookupd, topic, channel = cluster.lookupd_http, T_CHAN.name, "deletec"
    where = ("--lookupd", lookupd, "--topic", topic, "--channel", channel)
    ok(await nsq_ha("channel", "create", *where))
    assert await _has_channel(lookupd, topic, channel)
    ok(await nsq_ha("channel", "delete", *where))

    async def gone() -> bool:
        return not await _has_channel(lookupd, topic, channel)

    await until(gone, "the channel gone from nsqd's /stats")


async def test_channels_of_a_topic_without_auto_create_go_through_lookupd(
    cluster: Backend,
) -> None:
    lookupd, channel = cluster.lookupd_http, "regc"
    where = ("--lookupd", lookupd, "--topic", T_REG, "--channel", channel)
    created = json.loads(ok(await nsq_ha("channel", "create", *where, "--from", "start", "--json")))
    assert created["registered_with_lookupd"] is True
    await until(lambda: _has_channel(lookupd, T_REG, channel), "the channel on its leader")
    ok(await nsq_ha("channel", "delete", *where))

    async def gone() -> bool:
        return not await _has_channel(lookupd, T_REG, channel)

    await until(gone, "the channel gone once nsqlookupd unregistered it", timeout=30)


async def test_bad_positions_and_a_missing_partition_are_one_line(cluster: Backend) -> None:
    where = ("--lookupd", cluster.lookupd_http, "--topic", T_STATS.name, "--channel", "x")
    line = one_line_error(await nsq_ha("channel", "seek", *where, "sideways"), 2)
    assert "bad position 'sideways'" in line
    line = one_line_error(await nsq_ha("channel", "seek", *where, "offset=5"), 2)
    assert "give --partition P" in line
    line = one_line_error(await nsq_ha("channel", "pause", *where, "--partition", "7"), 2)
    assert "no partition 7" in line


# -- leader move, topic delete ---------------------------------------------------------------


def _node_ids(cluster: Backend) -> dict[str, str]:
    """nsqd HTTP URL -> distributed id, from the cluster object itself."""
    if isinstance(cluster, ForkBackend):
        return {n.http_url: n.distributed_id for n in cluster.cluster.nodes}
    assert isinstance(cluster, DevBackend)
    return {n.http_url: n.distributed_id for n in cluster.dev.nodes}


async def _replica_id(cluster: Backend, topic: str) -> str:
    """The distributed id of the node holding partition 0 without leading it."""
    for url, node_id in _node_ids(cluster).items():
        async with NsqdAdmin(url) as nsqd:
            entries = await nsqd.stats(topic, 0)
        if any(e.get("topic_partition") == "0" and not e.get("is_leader") for e in entries):
            return node_id
    raise AssertionError(f"no replica of {topic}/0 found")


async def test_leader_move_to_the_replica_and_back(cluster: Backend) -> None:
    lookupd, topic = cluster.lookupd_http, T_MOVE.name
    argv = ["leader", "move", "--lookupd", lookupd, "--topic", topic, "--partition", "0", "--json"]
    old = (await _leaders(lookupd, topic))[0]
    replica = await _replica_id(cluster, topic)
    await asyncio.to_thread(cluster.wait_stable)  # the command would wait for lookupd's check
    moved = json.loads(ok(await nsq_ha(*argv, "--to", replica)))
    assert (moved["from"], moved["asked"]) == (old.address, replica)
    new = (await _leaders(lookupd, topic))[0]
    assert new.address == moved["to"] != old.address
    assert new.distributed_id == moved["to_id"] == replica
    await asyncio.to_thread(cluster.wait_stable)
    # without --to: lookupd's choice, any node but the leader
    back = json.loads(ok(await nsq_ha(*argv)))
    assert back["from"] == new.address
    assert (await _leaders(lookupd, topic))[0].distributed_id != replica


async def test_topic_delete_removes_the_topic(cluster: Backend) -> None:
    lookupd, topic = cluster.lookupd_http, T_DEL.name
    out = ok(await nsq_ha("topic", "delete", "--lookupd", lookupd, "--topic", topic))
    assert f"deleted topic {topic}" in out

    async def gone() -> bool:
        names = ok(await nsq_ha("topic", "list", "--lookupd", lookupd)).split()
        async with LookupClient([lookupd]) as lookup:
            pmap = await lookup.lookup(topic, "r", force=True)
        return topic not in names and not pmap.partitions

    await until(gone, "the topic gone from lookups", timeout=60)


# -- vanilla ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vanilla(vanilla_cluster: VanillaCluster) -> VanillaCluster:
    return vanilla_cluster


@pytest.mark.vanilla
async def test_vanilla_stats_channels_and_topic_delete(vanilla: VanillaCluster) -> None:
    lookupd, topic, channel = vanilla.lookupd_http, f"cliadm_v_{_SUFFIX}", "vc"
    vanilla.create_topic(topic)
    node = vanilla.nodes[0]
    where = ("--lookupd", lookupd, "--topic", topic, "--channel", channel)
    created = ok(await nsq_ha("channel", "create", *where))
    assert created.count(f"created {topic}/{channel} on") == len(vanilla.nodes), created
    async with Producer(nsqd=[node.tcp_address]) as producer:
        for i in range(8):
            await producer.publish(topic, b"v-%d" % i)
    await _consume_and_finish(3, topic=topic, channel=channel, nsqd=[node.tcp_address])

    async def row() -> dict[str, Any] | None:
        rows = await _stats_rows("--lookupd", lookupd, topic=topic)
        mine = [r for r in rows if r["channel"] == channel and r["leader"] == node.tcp_address]
        return mine[0] if mine and mine[0]["lag_messages"] == 5 else None

    found = await until(row, "lag 5 on the nsqd published to")
    assert found["partition"] is None
    assert found["lag_bytes"] is None
    # the same through --nsqd-http
    direct = await _stats_rows("--nsqd-http", node.http_url, topic=topic)
    assert [r["lag_messages"] for r in direct if r["channel"] == channel] == [5]

    async def paused() -> bool:
        async with NsqdAdmin(node.http_url) as nsqd:
            (entry,) = await nsqd.stats(topic)
        return bool(next(c for c in entry["channels"] if c["channel_name"] == channel)["paused"])

    ok(await nsq_ha("channel", "pause", *where))
    assert await paused() is True
    ok(await nsq_ha("channel", "unpause", *where))
    assert await paused() is False
    ok(await nsq_ha("channel", "empty", *where))
    await until(row_lag(lookupd, topic, channel, node.tcp_address, 0), "lag 0 after empty")

    for argv, why in (
        (["channel", "seek", *where, "earliest"], "no /channel/setoffset"),
        (["channel", "setorder", *where, "on"], "no ordered channels"),
        (["leader", "move", "--lookupd", lookupd, "--topic", topic, "--partition", "0"], "leaders"),
    ):
        line = one_line_error(await nsq_ha(*argv), 2)
        assert "vanilla NSQ" in line
        assert why in line

    assert topic in ok(await nsq_ha("topic", "list", "--lookupd", lookupd)).split()
    ok(await nsq_ha("channel", "delete", *where))
    ok(await nsq_ha("topic", "delete", "--lookupd", lookupd, "--topic", topic))

    async def gone() -> bool:
        async with NsqdAdmin(node.http_url) as nsqd:
            held = await nsqd.stats(topic)
        names = ok(await nsq_ha("topic", "list", "--lookupd", lookupd)).split()
        return not held and topic not in names

    await until(gone, "the topic gone from nsqd and nsqlookupd")


def row_lag(
    lookupd: str, topic: str, channel: str, leader: str, lag: int
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        rows = await _stats_rows("--lookupd", lookupd, topic=topic)
        return any(
            r["channel"] == channel and r["leader"] == leader and r["lag_messages"] == lag
            for r in rows
        )

    return check


@pytest.mark.vanilla
async def test_vanilla_nsqd_without_lookupd_through_nsqd_http(vanilla: VanillaCluster) -> None:
    node, topic, channel = vanilla.nodes[1], f"cliadm_direct_{_SUFFIX}", "dc"
    direct = ("--nsqd-http", node.http_url)
    async with Producer(nsqd=[node.tcp_address]) as producer:
        await producer.publish(topic, b"first")  # vanilla nsqd creates the topic
    assert topic in ok(await nsq_ha("topic", "list", *direct)).split()
    listed = json.loads(ok(await nsq_ha("topic", "list", *direct, "--json")))["topics"]
    assert {"topic": topic, "fork": False, "nsqd": [node.http_url]} in listed
    where = (*direct, "--topic", topic, "--channel", channel)
    ok(await nsq_ha("channel", "create", *where))
    async with Producer(nsqd=[node.tcp_address]) as producer:
        for i in range(4):
            await producer.publish(topic, b"d-%d" % i)
    rows = await _stats_rows(*direct, topic=topic)
    # vanilla's first channel of a topic also gets what the topic held before it: 1 + 4
    assert [(r["channel"], r["lag_messages"]) for r in rows] == [(channel, 5)]
    line = one_line_error(await nsq_ha("channel", "pause", *where, "--partition", "0"), 2)
    assert "vanilla topics have no partitions" in line
    ok(await nsq_ha("topic", "delete", *direct, "--topic", topic))
    async with NsqdAdmin(node.http_url) as nsqd:
        assert await nsqd.stats(topic) == []
