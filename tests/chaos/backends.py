"""The clusters a chaos run can target, each with the nemeses it can really inflict.

* :func:`devcluster_backend`: the embedded broker and its fault API (leader move, graceful
  stop, kill, pause, lookupd down, stale lookups, unwritable partition, delayed, dropped and
  cut responses).  Runs anywhere, in seconds.
* :func:`vanilla_backend`: real vanilla nsqd (2 nodes), reached through a :class:`FaultProxy`
  each: graceful restart, SIGSTOP/SIGCONT, and the proxy's cut mid-frame, stall and slow
  reads.  Not ``kill -9``: vanilla nsqd keeps in-flight messages only in memory (its own
  documented durability limit), so a crash loses them whatever the client does.
* :func:`fork_backend`: the real fork (etcd + nsqlookupd + 3 nsqd, replica-3 topics): leader
  move through lookupd's admin API, graceful stop and restart, ``kill -9`` and restart,
  SIGSTOP/SIGCONT longer than the heartbeat timeout, nsqlookupd restart, etcd pause.  The
  fork's nsqd registers its own listening port with lookupd (no broadcast port option), so
  the TCP proxy cannot sit on its data path; its wire faults run on the other two backends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from nsq_ha.connection import ConnectionConfig
from nsq_ha.consumer import Consumer
from nsq_ha.devcluster import DevCluster
from nsq_ha.producer import Producer, RetryPolicy
from nsq_ha.testing.servers import ForkCluster, VanillaCluster

from .history import Fault, History
from .proxy import FaultProxy
from .runner import Backend, Nemesis

__all__ = ["ORDERED", "PLAIN", "devcluster_backend", "fork_backend", "vanilla_backend"]

log = logging.getLogger("nsq_ha.chaos")
_now = time.monotonic

ORDERED, PLAIN, CHANNEL = "chaos_ord", "chaos_plain", "chaos"

#: nsqd heartbeats every second, so a silent peer is declared dead after 2 s
CONFIG = ConnectionConfig(heartbeat_interval=1.0, command_timeout=5.0)
#: retries ride out the longest fault a run holds (plus a fork failover)
RETRY = RetryPolicy(attempts=1000, deadline=120.0, max_backoff=0.5, attempt_timeout=5.0)


def _consumer(topic: str, **where: Any) -> Consumer:
    return Consumer(
        topic,
        CHANNEL,
        max_in_flight=200,
        connection=CONFIG,
        lookup_interval=1.0,
        reconnect_interval=0.2,
        max_reconnect_interval=2.0,
        backoff=None,
        **where,
    )


async def _held(
    h: History,
    name: str,
    target: str,
    seconds: float,
    inject: Callable[[], object],
    heal: Callable[[], object],
) -> Fault:
    """Record fault ``name`` on ``target``, ``inject`` it, hold it ``seconds``, ``heal`` it."""
    event = h.fault(name, target)
    inject()
    await asyncio.sleep(seconds)
    heal()
    event.healed = _now()
    return event


def _fork_like(
    name: str,
    lookupd: str,
    nemeses: dict[str, Nemesis],
    heal_all: Callable[[], Awaitable[None]],
    topics: tuple[str, str] = (ORDERED, PLAIN),
) -> Backend:
    """A backend found through lookupd: an ordered and a plain topic, traced publishes."""
    ordered, plain = topics
    return Backend(
        name=name,
        topics={ordered: True, plain: False},
        make_producer=lambda: Producer(lookupd=lookupd, trace=True, connection=CONFIG, retry=RETRY),
        make_consumer=lambda topic: _consumer(topic, lookupd=lookupd),
        nemeses=nemeses,
        heal_all=heal_all,
    )


# -- the embedded broker ----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def devcluster_backend(partitions: int = 3) -> AsyncIterator[Backend]:
    """The embedded 3-node cluster with an ordered and a plain replica-3 topic."""
    async with DevCluster(nodes=3, failover_delay=1.0) as cluster:
        cluster.create_topic(ORDERED, partitions, replicas=3, ordered=True)
        cluster.create_topic(PLAIN, partitions, replicas=3)
        lookupd = cluster.lookupd_http

        def node(rng: random.Random) -> int:
            return rng.randrange(len(cluster.nodes))

        def part(rng: random.Random) -> tuple[str, int]:
            return rng.choice([ORDERED, PLAIN]), rng.randrange(partitions)

        async def leader_move(rng: random.Random, h: History, hold: float) -> None:
            topic, p = part(rng)
            event = h.fault("leader_move", f"{topic}/{p}")
            cluster.move_leader(topic, p)
            event.healed = event.started

        async def stop_start(rng: random.Random, h: History, hold: float, kill: bool) -> None:
            i = node(rng)
            event = h.fault("kill9" if kill else "stop", f"node{i}")
            await cluster.stop_node(i, kill=kill)
            await asyncio.sleep(hold)
            await cluster.start_node(i)
            event.healed = _now()

        async def pause(rng: random.Random, h: History, hold: float) -> None:
            i = node(rng)
            # longer than 2 heartbeat intervals: the client must declare the peer dead
            await _held(
                h,
                "pause",
                f"node{i}",
                max(hold, 2.5),
                lambda: cluster.pause_node(i),
                lambda: cluster.resume_node(i),
            )

        async def lookupd_down(rng: random.Random, h: History, hold: float) -> None:
            await _held(
                h,
                "lookupd_down",
                "lookupd",
                hold,
                lambda: cluster.lookupd_fail(500),
                lambda: cluster.lookupd_fail(None),
            )

        async def stale_lookup(rng: random.Random, h: History, hold: float) -> None:
            topic, p = part(rng)

            def stale_then_move() -> None:
                cluster.lookupd_stale(True)
                cluster.move_leader(topic, p)

            await _held(
                h,
                "stale_lookup+leader_move",
                f"{topic}/{p}",
                hold,
                stale_then_move,
                lambda: cluster.lookupd_stale(False),
            )

        async def unwritable(rng: random.Random, h: History, hold: float) -> None:
            topic, p = part(rng)
            await _held(
                h,
                "unwritable",
                f"{topic}/{p}",
                hold,
                lambda: cluster.set_writable(topic, p, False),
                lambda: cluster.set_writable(topic, p, True),
            )

        async def delay(rng: random.Random, h: History, hold: float) -> None:
            i = node(rng)
            seconds = rng.uniform(0.05, 0.5)
            await _held(
                h,
                "delay_responses",
                f"node{i}",
                hold,
                lambda: cluster.delay_responses(i, seconds),
                lambda: cluster.delay_responses(i, 0.0),
            )

        async def drop(rng: random.Random, h: History, hold: float) -> None:
            i = node(rng)
            await _held(
                h,
                "drop_response",
                f"node{i}",
                hold,
                lambda: cluster.drop_responses(i, 1),
                lambda: cluster.drop_responses(i, 0),
            )

        async def cut(rng: random.Random, h: History, hold: float) -> None:
            i = node(rng)
            nbytes = rng.randrange(1, 4096)
            await _held(
                h,
                "cut_mid_frame",
                f"node{i}",
                min(hold, 0.5),
                lambda: cluster.cut_after(i, nbytes),
                lambda: cluster.cut_after(i, None),
            )

        async def heal_all() -> None:
            cluster.clear_faults()
            for i in range(len(cluster.nodes)):
                cluster.resume_node(i)
                await cluster.start_node(i)

        nemeses: dict[str, Nemesis] = {
            "leader_move": leader_move,
            "stop": functools.partial(stop_start, kill=False),
            "kill9": functools.partial(stop_start, kill=True),
            "pause": pause,
            "lookupd_down": lookupd_down,
            "stale_lookup": stale_lookup,
            "unwritable": unwritable,
            "delay_responses": delay,
            "drop_response": drop,
            "cut_mid_frame": cut,
        }
        yield _fork_like("devcluster", lookupd, nemeses, heal_all)


# -- vanilla nsqd behind fault proxies --------------------------------------------------------


@contextlib.asynccontextmanager
async def vanilla_backend(cluster: VanillaCluster, rng: random.Random) -> AsyncIterator[Backend]:
    """Every nsqd of ``cluster`` behind its own :class:`FaultProxy`; two plain topics."""
    proxies = [FaultProxy("127.0.0.1", n.tcp_port, rng) for n in cluster.nodes]
    for proxy in proxies:
        await proxy.start()
    addresses = [p.address for p in proxies]
    topics = {ORDERED: False, PLAIN: False}  # vanilla has no ordered channels
    for topic in topics:
        await asyncio.to_thread(cluster.create_topic, topic)

    def pick(rng: random.Random) -> int:
        return rng.randrange(len(cluster.nodes))

    async def restart(rng: random.Random, h: History, hold: float) -> None:
        i = pick(rng)
        event = h.fault("stop", f"nsqd{i}")
        await asyncio.to_thread(cluster.stop_node, i)
        await asyncio.sleep(hold)
        await asyncio.to_thread(cluster.start_node, i)
        event.healed = _now()

    async def pause(rng: random.Random, h: History, hold: float) -> None:
        i = pick(rng)
        proc = cluster.nodes[i].process
        # longer than 2 heartbeat intervals: the client must declare the peer dead
        await _held(h, "sigstop", f"nsqd{i}", max(hold, 2.5), proc.pause, proc.resume)

    async def cut(rng: random.Random, h: History, hold: float) -> None:
        i = pick(rng)
        event = h.fault("proxy_cut_mid_frame", f"nsqd{i}")
        proxies[i].cut()
        await asyncio.sleep(0.4)
        event.healed = _now()

    async def stall(rng: random.Random, h: History, hold: float) -> None:
        i = pick(rng)
        await _held(h, "proxy_stall", f"nsqd{i}", hold + 1.0, proxies[i].stall, proxies[i].heal)

    async def slow(rng: random.Random, h: History, hold: float) -> None:
        i = pick(rng)
        piece = rng.choice([1, 7, 64])
        await _held(
            h,
            "proxy_slow_reads",
            f"nsqd{i}",
            hold,
            lambda: proxies[i].slow(piece=piece, pause=0.005),
            proxies[i].heal,
        )

    async def heal_all() -> None:
        for proxy in proxies:
            proxy.heal()
        for node in cluster.nodes:
            node.process.resume()
            if not node.process.running:
                await asyncio.to_thread(cluster.start_node, node.index)

    nemeses: dict[str, Nemesis] = {
        "stop": restart,
        "sigstop": pause,
        "proxy_cut_mid_frame": cut,
        "proxy_stall": stall,
        "proxy_slow_reads": slow,
    }
    try:
        yield Backend(
            name="vanilla",
            topics=topics,
            make_producer=lambda: Producer(nsqd=addresses, connection=CONFIG, retry=RETRY),
            make_consumer=lambda topic: _consumer(topic, nsqd=addresses),
            nemeses=nemeses,
            heal_all=heal_all,
            traced=False,
        )
    finally:
        for proxy in proxies:
            await proxy.close()


# -- the real fork ----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def fork_backend(
    cluster: ForkCluster, partitions: int = 2, *, durable: bool = True
) -> AsyncIterator[Backend]:
    """The fork cluster with an ordered and a plain replica-3 topic (created here).

    ``durable`` topics fsync every write before nsqd acknowledges it (``syncdisk=1``); without
    it the topics keep nsqd's default (sync every 2500 writes), which loses acknowledged
    writes on a leader crash: ``make chaos`` runs both and prints them side by side.  The two
    kinds use different topic names (``chaos_ord``/``chaos_plain`` and ``..._default``).
    """
    suffix = "" if durable else "_default"
    ordered_topic, plain_topic = f"{ORDERED}{suffix}", f"{PLAIN}{suffix}"
    for topic, ordered in ((ordered_topic, True), (plain_topic, False)):
        if topic not in cluster.topics:
            await asyncio.to_thread(
                functools.partial(
                    cluster.create_topic,
                    topic,
                    partitions,
                    3,
                    ordered,
                    durable=durable,
                    timeout=180.0,
                )
            )
    lookupd = cluster.lookupd_http
    procs = {p.name: p for p in cluster.processes}

    def pick(rng: random.Random) -> int:
        return rng.randrange(len(cluster.nodes))

    async def writable(event: Fault | None = None) -> None:
        """Wait (up to 2 min) until every partition of both topics has a writable leader; after
        a heal, record that moment as the ``event``'s server failover."""
        for topic in (ordered_topic, plain_topic):
            await asyncio.to_thread(cluster.wait_writable, topic, 120.0)
        if event is not None:
            event.server_ready = _now()

    async def leader_move(rng: random.Random, h: History, hold: float) -> None:
        topic, p = rng.choice([ordered_topic, plain_topic]), rng.randrange(partitions)
        # lookupd refuses a move while it deems the cluster unstable, which it re-evaluates
        # about once a minute: give up after 90 s (a nemesis error, not an event)
        await asyncio.to_thread(cluster.wait_stable, 90.0)
        event = h.fault("leader_move", f"{topic}/{p}")
        new = await asyncio.to_thread(cluster.move_leader, topic, p, 60.0)
        event.target += f"->nsqd{new.index}"
        event.healed = event.server_ready = _now()  # move_leader waited for the new leader

    async def stop_start(rng: random.Random, h: History, hold: float, kill: bool) -> None:
        i = pick(rng)
        await writable()
        event = h.fault("kill9" if kill else "stop", f"nsqd{i}")
        await asyncio.to_thread(cluster.stop_node, i, kill)
        await asyncio.sleep(hold)
        await asyncio.to_thread(cluster.start_node, i)
        event.healed = _now()
        await writable(event)

    async def pause(rng: random.Random, h: History, hold: float) -> None:
        i = pick(rng)
        await writable()
        proc = cluster.nodes[i].process
        event = await _held(h, "sigstop", f"nsqd{i}", max(hold, 2.5), proc.pause, proc.resume)
        await writable(event)

    async def lookupd_restart(rng: random.Random, h: History, hold: float) -> None:
        proc = procs["nsqlookupd"]
        event = h.fault("lookupd_restart", "nsqlookupd")
        await asyncio.to_thread(proc.stop)
        await asyncio.sleep(hold)
        await asyncio.to_thread(proc.start)
        await asyncio.to_thread(proc.wait_until, cluster.lookupd_is_leader, "leader", 60.0)
        event.healed = _now()
        await writable(event)

    async def etcd_pause(rng: random.Random, h: History, hold: float) -> None:
        proc = procs["etcd"]
        event = await _held(h, "etcd_pause", "etcd", hold, proc.pause, proc.resume)
        await writable(event)

    async def heal_all() -> None:
        for proc in procs.values():
            proc.resume()
        for i, node in enumerate(cluster.nodes):
            if not node.process.running:
                await asyncio.to_thread(cluster.start_node, i)
        if not procs["nsqlookupd"].running:
            await asyncio.to_thread(procs["nsqlookupd"].start)

    nemeses: dict[str, Nemesis] = {
        "leader_move": leader_move,
        "stop": functools.partial(stop_start, kill=False),
        "kill9": functools.partial(stop_start, kill=True),
        "sigstop": pause,
        "lookupd_restart": lookupd_restart,
        "etcd_pause": etcd_pause,
    }
    name = "fork" if durable else "fork-default-topics"
    backend = _fork_like(name, lookupd, nemeses, heal_all, (ordered_topic, plain_topic))
    backend.settle_between_faults = True
    yield backend
