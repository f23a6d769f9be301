"""``nsq-ha stats``: per topic, partition and channel, what nsqadmin's topic page and
``nsq_stat`` show, plus each channel's lag.

The numbers come from every nsqd's ``/stats?format=json`` (the nodes nsqlookupd's ``/nodes``
lists, or ``--nsqd-http``). On the fork each partition is read from its leader (the entry with
``is_leader``), and the lag is what the channel has not confirmed: ``depth`` messages and
``depth_size`` bytes behind the partition's end (nsqd computes both from the channel's confirmed
offset). Vanilla nsqd has no offsets: a channel's lag there is its unfinished messages (``depth``
+ in flight + deferred, as the fork counts them) and the bytes are unknown (null, ``?``). The lag
is :func:`nsq_ha.admin.channel_lag`'s, which :mod:`nsq_ha.otel` reports too.

``--watch [SECONDS]`` refreshes every SECONDS (2) until Ctrl-C (exit 0) or ``--count N``
tables, with each partition's msgs/s since the last refresh: on a terminal one table redrawn
in place, else one table (``--json``: one object) per refresh (:mod:`.stats_watch`).
``--timeout`` bounds each table (every request to lookupd and the nsqd
included); the nodes are asked without their client lists, which the table does not need.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from nsq_ha.admin import LookupdAdmin, NsqdAdmin, channel_lag
from nsq_ha.admin.lag import is_fork_entry, stat_int
from nsq_ha.protocol.names import validate_topic

from .admin_commands import Addresses, add_nsqd_http_option, addresses
from .arguments import duration
from .commands import CliError
from .deadline import DEFAULT_TIMEOUT, add_timeout_option, command_deadline
from .output import print_table
from .parser import add_topic_argument
from .stats_watch import Rates, display_for

__all__ = [
    "COLUMNS",
    "WATCH_COLUMNS",
    "StatsRow",
    "add_parsers",
    "cmd_stats",
    "rows_from_stats",
    "table_rows",
]

COLUMNS = [
    "topic",
    "partition",
    "leader",
    "channel",
    "depth",
    "in flight",
    "deferred",
    "requeued",
    "timeouts",
    "consumers",
    "lag msgs",
    "lag bytes",
]
#: the columns of ``--watch``: the partition's msgs/s since the last refresh after its leader
WATCH_COLUMNS = [*COLUMNS[:3], "msgs/s", *COLUMNS[3:]]


@dataclass(frozen=True, slots=True)
class StatsRow:
    """One channel of one partition (``channel`` None: a topic partition without channels)."""

    topic: str
    #: None on vanilla nsqd
    partition: int | None
    #: the nsqd the numbers come from (``host:tcp_port`` when known, else its HTTP address)
    leader: str
    channel: str | None
    #: messages in the partition (the topic's ``message_count`` on that nsqd)
    messages: int | None = None
    depth: int | None = None
    in_flight: int | None = None
    deferred: int | None = None
    requeued: int | None = None
    timeouts: int | None = None
    consumers: int | None = None
    paused: bool | None = None
    lag_messages: int | None = None
    #: None where unknown (vanilla)
    lag_bytes: int | None = None
    #: with ``--watch``: ``messages`` added per second since the last refresh (None at first)
    msgs_per_s: float | None = None


def add_parsers(sub: Any, where: argparse.ArgumentParser) -> None:
    """``nsq-ha stats``."""
    stats = sub.add_parser(
        "stats",
        parents=[where],
        help="depth, in flight, consumers and lag per topic, partition and channel",
        description="Per topic, partition and channel: the leader, depth, in flight, deferred, "
        "requeued, timeouts, consumers and lag (messages and bytes behind the partition's end; "
        "vanilla: unfinished messages, bytes unknown), from every nsqd's /stats.",
    )
    add_topic_argument(
        stats, required=False, what="only this topic (default: all topics nsqlookupd lists)"
    )
    add_nsqd_http_option(stats)
    stats.add_argument(
        "--watch",
        type=_interval,
        nargs="?",
        const=2.0,
        metavar="SECONDS",
        help="refresh every SECONDS (2) until Ctrl-C",
    )
    stats.add_argument("--count", type=int, metavar="N", help="with --watch: stop after N tables")
    stats.add_argument("--json", action="store_true", help="one JSON object per refresh")
    add_timeout_option(stats, what="each refresh")
    stats.set_defaults(run=cmd_stats, cli_name="stats")


def _interval(text: str) -> float:
    value = duration(text)  # a finite number first (nan, inf refused in the library's words)
    if not 0.05 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"must be 0.05..86400 seconds, got {text}")
    return value


# -- numbers ---------------------------------------------------------------------------------


def _consumers(channel: dict[str, Any]) -> int | None:
    for key in ("client_num", "client_count"):  # the fork's, vanilla's
        if (count := stat_int(channel.get(key))) is not None:
            return count
    clients = channel.get("clients")
    return len(clients) if isinstance(clients, list) else None


def rows_from_stats(entry: dict[str, Any], leader: str) -> list[StatsRow]:
    """The rows of one ``/stats`` topic entry (one partition of the fork, or vanilla's topic
    on one nsqd)."""
    fork = is_fork_entry(entry)
    topic = str(entry.get("topic_name", ""))
    partition = stat_int(entry.get("topic_partition")) if fork else None
    messages = stat_int(entry.get("message_count"))
    channels = [c for c in entry.get("channels") or () if isinstance(c, dict)]
    if not channels:
        return [StatsRow(topic, partition, leader, None, messages)]
    rows = []
    for ch in sorted(channels, key=lambda c: str(c.get("channel_name", ""))):
        lag = channel_lag(ch, fork=fork)
        rows.append(
            StatsRow(
                topic,
                partition,
                leader,
                str(ch.get("channel_name", "")),
                messages,
                stat_int(ch.get("depth")),
                stat_int(ch.get("in_flight_count")),
                stat_int(ch.get("deferred_count")),
                stat_int(ch.get("requeue_count")),
                stat_int(ch.get("timeout_count")),
                _consumers(ch),
                bool(ch.get("paused")),
                lag.messages,
                lag.bytes,
            )
        )
    return rows


def table_rows(rows: list[StatsRow], *, rates: bool = False) -> list[list[object]]:
    """The cells of the table (``?``: unknown, ``-``: no channel); with ``rates`` a msgs/s
    cell after the leader's (blank when unknown), for :data:`WATCH_COLUMNS`."""
    cells: list[list[object]] = []
    for r in rows:
        where: list[object] = [r.topic, _part(r.partition), r.leader]
        if rates:
            where.append(r.msgs_per_s)
        if r.channel is None:
            cells.append([*where, "(no channel)", *[""] * 8])
            continue
        name = r.channel + (" (paused)" if r.paused else "")
        numbers = [r.depth, r.in_flight, r.deferred, r.requeued, r.timeouts, r.consumers]
        lag = [r.lag_messages, "?" if r.lag_bytes is None else r.lag_bytes]
        cells.append([*where, name, *numbers, *lag])
    return cells


def _part(partition: int | None) -> object:
    return "-" if partition is None else partition


# -- collecting ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Node:
    http_url: str
    shown: str


async def _nodes(admin: LookupdAdmin | None, where: Addresses) -> list[_Node]:
    if admin is None:
        return [_Node(u, u.split("://", 1)[-1]) for u in where.nsqd_http]
    return [_Node(n.http_url, n.address) for n in await admin.nodes()]


async def collect(
    admin: LookupdAdmin | None,
    where: Addresses,
    topic: str | None,
    limit: float = DEFAULT_TIMEOUT,
) -> list[StatsRow]:
    """Every row of one refresh, sorted by topic, partition and channel; every nsqd is asked
    within ``limit`` seconds."""
    names = None if topic is not None or admin is None else set(await admin.topics())
    nodes = await _nodes(admin, where)

    async def one(node: _Node) -> list[tuple[_Node, dict[str, Any]]]:
        async with NsqdAdmin(node.http_url, timeout=limit) as nsqd:
            return [(node, e) for e in await nsqd.stats(topic, clients=False)]

    answers = await asyncio.gather(*(one(n) for n in nodes))
    #: (topic, partition) -> (is leader, rows); vanilla: (topic, node) -> rows
    chosen: dict[tuple[str, object], tuple[bool, list[StatsRow]]] = {}
    for node, entry in (pair for answer in answers for pair in answer):
        name = str(entry.get("topic_name", ""))
        if (topic is not None and name != topic) or (names is not None and name not in names):
            continue
        fork = is_fork_entry(entry)
        key = (name, entry.get("topic_partition") if fork else node.http_url)
        leads = bool(entry.get("is_leader", True))
        if key in chosen and (chosen[key][0] or not leads):
            continue
        chosen[key] = (leads, rows_from_stats(entry, node.shown))
    rows = [row for _, found in chosen.values() for row in found]
    rows.sort(key=lambda r: (r.topic, -1 if r.partition is None else r.partition, r.leader))
    return rows


def _snapshot(rows: list[StatsRow]) -> dict[str, Any]:
    return {"time": round(time.time(), 3), "rows": [asdict(r) for r in rows]}


def _print(rows: list[StatsRow], args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(_snapshot(rows), sort_keys=True), flush=True)
        return
    title = f"nsq-ha stats {time.strftime('%H:%M:%S')}"
    if not rows:
        print(f"{title}: no topic" + (f" {args.topic!r}" if args.topic else "s"), flush=True)
        return
    print_table(title, COLUMNS, table_rows(rows), plain=args.plain)
    sys.stdout.flush()


async def cmd_stats(args: argparse.Namespace) -> int:
    """``nsq-ha stats``: one table (or JSON object), or one per ``--watch`` interval."""
    where = addresses(args)
    topic = None
    if args.topic is not None:
        try:
            topic = validate_topic(args.topic)
        except ValueError as exc:
            raise CliError(str(exc), 2) from None
    if args.count is not None and (args.count < 1 or args.watch is None):
        raise CliError("--count needs --watch and must be at least 1", 2)
    admin = LookupdAdmin(where.lookupd, timeout=args.timeout) if where.lookupd else None
    try:
        if args.watch is None:
            _print(await _refresh(admin, where, topic, args), args)
            return 0
        await _watch(admin, where, topic, args)
    finally:
        if admin is not None:
            await admin.close()
    return 0


async def _refresh(
    admin: LookupdAdmin | None, where: Addresses, topic: str | None, args: argparse.Namespace
) -> list[StatsRow]:
    """One table's rows, within ``--timeout``."""
    async with command_deadline(args, "no stats"):
        return await collect(admin, where, topic, args.timeout)


async def _watch(
    admin: LookupdAdmin | None, where: Addresses, topic: str | None, args: argparse.Namespace
) -> None:
    """A table every ``--watch`` seconds until Ctrl-C / SIGTERM (then exit 0) or ``--count``."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    shown = 0
    rates = Rates()
    try:
        with display_for(plain=args.plain) as display:
            while not stop.is_set():
                rows = await _refresh(admin, where, topic, args)
                counts = [((r.topic, r.partition, r.leader), r.messages) for r in rows]
                per_s = rates.apply(counts, loop.time())
                rows = [replace(r, msgs_per_s=x) for r, x in zip(rows, per_s, strict=True)]
                if args.json:
                    print(json.dumps(_snapshot(rows), sort_keys=True), flush=True)
                else:
                    title = f"nsq-ha stats {time.strftime('%H:%M:%S')}"
                    title += f" (every {args.watch:g} s; Ctrl-C stops)"
                    if not rows:
                        title += ": no topic" + (f" {args.topic!r}" if args.topic else "s")
                    display.show(title, WATCH_COLUMNS, table_rows(rows, rates=True))
                shown += 1
                if args.count is not None and shown >= args.count:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), args.watch)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.remove_signal_handler(sig)
