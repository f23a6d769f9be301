"""``nsq-ha topic list|delete``, ``nsq-ha channel ...`` and ``nsq-ha leader move``: nsqadmin's
daily chores from a shell.

Every command finds the nsqd to ask through nsqlookupd (``--lookupd``; the fork's or vanilla's)
or, for vanilla nsqd without a lookupd, through ``--nsqd-http URL`` (nsqd's HTTP address: the
``--nsqd`` TCP address does not say where nsqd's HTTP API is). On the fork a channel call goes to
the leader of each partition (all, or ``--partition P``). What vanilla NSQ has no call for
(``channel seek``, ``channel setorder``, ``leader move``, ``channel create --from start``) fails
with one line saying so (exit 2). ``--timeout`` bounds each command, every request included.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nsq_ha.admin import AdminError, LookupdAdmin, NsqdAdmin, seek_position
from nsq_ha.admin.lookupd import EXPAND_TOPIC_TIMEOUT, MOVE_LEADER_TIMEOUT
from nsq_ha.admin.nsqd import PartitionEmptyError
from nsq_ha.errors import ConfigError, NsqTimeoutError
from nsq_ha.lookup.wire import NodeInfo
from nsq_ha.protocol.names import validate_channel, validate_topic

from .channel_report import DONE, ChannelReport
from .commands import CliError
from .deadline import add_timeout_option, command_deadline
from .parser import add_topic_argument

__all__ = [
    "Addresses",
    "add_nsqd_http_option",
    "add_parsers",
    "add_topic_parsers",
    "addresses",
    "cmd_channel",
    "cmd_leader_move",
    "cmd_topic_delete",
    "cmd_topic_list",
    "parse_position",
]

#: the channel actions and what each does, for ``--help`` and the printed lines
CHANNEL_ACTIONS = {
    "create": "create the channel on every partition (fork: on each leader)",
    "delete": "delete the channel and what it has not consumed",
    "pause": "stop delivering to its consumers (messages keep accumulating)",
    "unpause": "resume delivering",
    "empty": "drop everything not delivered yet (fork: move it to the partitions' end)",
    "seek": "move the channel to a position (fork)",
    "setorder": "switch the channel's ordered mode on or off (fork)",
}
#: how long a channel nsqlookupd registered may take to appear on the nodes
_SYNC_WAIT = 15.0


@dataclass(frozen=True, slots=True)
class Addresses:
    """Where the admin commands send their requests."""

    lookupd: list[str]
    #: vanilla nsqd HTTP base URLs, when there is no nsqlookupd to ask
    nsqd_http: list[str]


def addresses(args: argparse.Namespace) -> Addresses:
    """The cluster's addresses from the parsed arguments (the one place that reads them)."""
    lookupd = list(getattr(args, "lookupd", None) or [])
    nsqd_http = [_http_url(u) for u in getattr(args, "nsqd_http", None) or []]
    if lookupd and nsqd_http:
        raise CliError("give --lookupd or --nsqd-http, not both", 2)
    if lookupd or nsqd_http:
        return Addresses(lookupd, nsqd_http)
    if getattr(args, "nsqd", None):
        raise CliError(
            "admin commands use nsqd's HTTP API: give --lookupd URL, or --nsqd-http URL "
            "(vanilla nsqd's HTTP address) instead of --nsqd",
            2,
        )
    raise CliError("give --lookupd URL (fork or vanilla nsqlookupd) or --nsqd-http URL", 2)


def _http_url(text: str) -> str:
    url = text if "://" in text else f"http://{text}"
    return url.rstrip("/")


def _name(check: Any, value: str) -> str:
    try:
        return str(check(value))
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None


# -- parsers ---------------------------------------------------------------------------------


def add_nsqd_http_option(parser: argparse.ArgumentParser) -> None:
    """``--nsqd-http URL`` (repeatable), what :func:`addresses` reads besides ``--lookupd``."""
    parser.add_argument(
        "--nsqd-http",
        action="append",
        default=[],
        metavar="URL",
        help="vanilla nsqd's HTTP address, instead of --lookupd (repeatable)",
    )


def _http_parent() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    add_nsqd_http_option(parent)
    return parent


def add_topic_parsers(topic_sub: Any, where: argparse.ArgumentParser) -> None:
    """``topic list``, ``topic delete`` and ``topic expand`` under the existing ``topic``
    subparsers."""
    parents = [where, _http_parent()]
    listing = topic_sub.add_parser(
        "list",
        parents=parents,
        help="list the topics nsqlookupd knows",
        description="List topic names (nsqlookupd /topics); --json adds each topic's "
        "partitions, replicas, ordered and ext flags and channels.",
    )
    listing.add_argument("--json", action="store_true", help="one JSON object with the meta")
    add_timeout_option(listing)
    listing.set_defaults(run=cmd_topic_list, cli_name="topic list")
    delete = topic_sub.add_parser(
        "delete",
        parents=parents,
        help="delete a topic with its channels and data",
        description="Delete a topic: the fork's nsqlookupd /topic/delete (every partition), "
        "or vanilla nsqd's /topic/delete on every nsqd producing it.",
    )
    add_topic_argument(delete, what="the topic to delete")
    add_timeout_option(delete)
    delete.set_defaults(run=cmd_topic_delete, cli_name="topic delete")
    expand = topic_sub.add_parser(
        "expand",
        parents=[where],
        help="add partitions to a fork topic and wait until they are writable",
        description="Grow a fork topic to --partitions N (nsqlookupd /topic/partition/expand), "
        "then wait until every partition has a leader and say so. The fork cannot take "
        "partitions away; keys move to the new partitions (see the docs on expansion), and an "
        "ordered topic loses its order while it grows.",
    )
    add_topic_argument(expand, what="the topic to grow")
    expand.add_argument(
        "--partitions", type=int, required=True, metavar="N", help="the new partition count"
    )
    expand.add_argument("--json", action="store_true", help="the writable map as JSON")
    expand.add_argument(
        "--no-wait", action="store_true", help="return once lookupd accepted the new count"
    )
    add_timeout_option(expand, EXPAND_TOPIC_TIMEOUT, "the expansion and the wait")
    expand.set_defaults(run=cmd_topic_expand, cli_name="topic expand")


def add_parsers(sub: Any, where: argparse.ArgumentParser) -> None:
    """``channel ACTION`` and ``leader move``."""
    parents = [where, _http_parent()]
    channel = sub.add_parser("channel", help="channel administration (pause, seek, ...)")
    actions = channel.add_subparsers(dest="channel_command", metavar="ACTION", required=True)
    for action, text in CHANNEL_ACTIONS.items():
        one = actions.add_parser(action, parents=parents, help=text, description=text + ".")
        add_topic_argument(one)
        one.add_argument("--channel", required=True)
        one.add_argument(
            "--partition", type=int, action="append", metavar="P", help="only these (repeatable)"
        )
        one.add_argument("--json", action="store_true", help="print a JSON summary")
        add_timeout_option(one)
        one.set_defaults(run=cmd_channel, cli_name=f"channel {action}")
        if action == "create":
            one.add_argument(
                "--from",
                dest="start",
                choices=["start", "end"],
                default="end",
                help="where the new channel begins on the fork: the partitions' end (end, "
                "what the fork does) or their first retained message (start)",
            )
        elif action == "seek":
            one.add_argument(
                "position",
                metavar="POSITION",
                help="earliest | latest | offset=N (a partition's byte offset) | "
                "timestamp=T (Unix seconds or ISO 8601) | count=N (the N-th message, from 1)",
            )
        elif action == "setorder":
            one.add_argument("order", choices=["on", "off"], help="ordered delivery on or off")
    leader = sub.add_parser("leader", help="partition leaders (fork)")
    leader_sub = leader.add_subparsers(dest="leader_command", metavar="ACTION", required=True)
    move = leader_sub.add_parser(
        "move",
        parents=parents,
        help="move a partition's leader to another replica (fork)",
        description="Move a partition's leadership (nsqlookupd /topic/partition/move) and wait "
        "until lookups name the new leader. nsqlookupd may pick another replica than --to.",
    )
    add_topic_argument(move)
    move.add_argument("--partition", type=int, required=True)
    move.add_argument(
        "--to", metavar="NODE", help="the node wanted: TCP host:port, HTTP URL or distributed id"
    )
    add_timeout_option(
        move, MOVE_LEADER_TIMEOUT, "the whole command", included="the wait for the new leader"
    )
    move.add_argument("--json", action="store_true", help="print a JSON summary")
    move.set_defaults(run=cmd_leader_move, cli_name="leader move")


# -- positions -------------------------------------------------------------------------------


def parse_position(text: str) -> str:
    """``channel seek POSITION`` as the ``/channel/setoffset`` body; CliError (exit 2) when
    it is none of earliest, latest, offset=N, timestamp=T, count=N."""
    word, _, value = text.partition("=")
    word = word.strip().lower()
    try:
        if word in ("earliest", "latest") and not value:
            return seek_position(offset=0) if word == "earliest" else seek_position(end=True)
        if word == "offset":
            return seek_position(offset=int(value))
        if word == "count":
            return seek_position(count=int(value))
        if word == "timestamp":
            return seek_position(timestamp=_timestamp(value))
    except (ValueError, ConfigError) as exc:
        raise CliError(f"bad position {text!r}: {exc}", 2) from None
    raise CliError(
        f"bad position {text!r}: use earliest, latest, offset=N, timestamp=T or count=N", 2
    )


def _timestamp(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        moment = datetime.fromisoformat(value)  # ValueError when it is not ISO 8601 either
        return moment.timestamp()
    if not math.isfinite(number):
        raise ValueError(f"not a time: {value}")
    return number


# -- targets ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Target:
    partition: int | None
    http_url: str
    address: str


@contextlib.asynccontextmanager
async def _admin(where: Addresses, limit: float) -> AsyncIterator[LookupdAdmin | None]:
    """A LookupdAdmin for --lookupd (each call within ``limit`` seconds), None for --nsqd-http
    (vanilla nsqd)."""
    if not where.lookupd:
        yield None
        return
    async with LookupdAdmin(where.lookupd, timeout=limit) as admin:
        await admin.leader()
        yield admin


def _refuse_on_vanilla(what: str, why: str) -> CliError:
    return CliError(f"{what} is the fork's: vanilla NSQ {why}", 2)


async def _targets(
    admin: LookupdAdmin | None, where: Addresses, topic: str, partitions: list[int] | None
) -> list[_Target]:
    if admin is None:
        found = [_Target(None, url, url.split("://", 1)[-1]) for url in where.nsqd_http]
    else:
        pairs: list[tuple[int | None, NodeInfo]] = await admin.channel_targets(topic)
        found = [_Target(p, n.http_url, n.address) for p, n in pairs]
    if partitions:
        if admin is None or admin.vanilla:
            raise CliError("--partition is the fork's: vanilla topics have no partitions", 2)
        missing = sorted(set(partitions) - {t.partition for t in found})
        if missing:
            raise CliError(f"topic {topic!r} has no partition {missing[0]} with a leader", 2)
        found = [t for t in found if t.partition in partitions]
    return found


# -- topic list / delete -----------------------------------------------------------------------


async def cmd_topic_list(args: argparse.Namespace) -> int:
    """``nsq-ha topic list``: topic names, one per line; ``--json`` with their meta."""
    where = addresses(args)
    async with command_deadline(args, "no topic list"), _admin(where, args.timeout) as admin:
        if admin is None:
            names = sorted(
                {
                    str(entry.get("topic_name"))
                    for url in where.nsqd_http
                    for entry in await _node_stats(url, args.timeout)
                }
            )
            infos = [{"topic": n, "fork": False, "nsqd": where.nsqd_http} for n in names]
        else:
            names = await admin.topics()
            infos = list(await asyncio.gather(*(_topic_info(admin, n) for n in names)))
    if args.json:
        print(json.dumps({"topics": infos}, sort_keys=True))
    else:
        for name in names:
            print(name)
    return 0


async def _node_stats(url: str, limit: float) -> list[dict[str, Any]]:
    async with NsqdAdmin(url, timeout=limit) as nsqd:
        return await nsqd.stats(clients=False)


async def _topic_info(admin: LookupdAdmin, topic: str) -> dict[str, Any]:
    pmap = await admin.lookup.lookup(topic, "r", force=True)
    meta = pmap.meta
    info: dict[str, Any] = {
        "topic": topic,
        "fork": pmap.fork,
        "partitions": None,
        "replicas": None,
        "ordered": False,
        "ext": False,
        "channels": list(pmap.channels),
        "nsqd": sorted({n.address for n in pmap.producers}),
    }
    if meta is not None:
        info.update(
            partitions=meta.partition_num,
            replicas=meta.replica,
            ordered=meta.ordered,
            ext=meta.extend_support,
            multi_part=meta.multi_part,
            channel_auto_create=not meta.disable_channel_auto_create,
        )
    return info


async def cmd_topic_delete(args: argparse.Namespace) -> int:
    """``nsq-ha topic delete``: the fork's lookupd /topic/delete, or vanilla nsqd's."""
    where = addresses(args)
    topic = _name(validate_topic, args.topic)
    deadline = command_deadline(args, f"topic {topic!r} was not deleted")
    async with deadline, _admin(where, args.timeout) as admin:
        if admin is not None:
            done = await admin.delete_topic(topic)
        else:
            done = []
            for url in where.nsqd_http:
                async with NsqdAdmin(url, timeout=args.timeout) as nsqd:
                    await nsqd.delete_topic(topic)
                done.append(url)
    print(f"deleted topic {topic} (via {', '.join(done) or 'nothing: no nsqd had it'})")
    return 0


async def cmd_topic_expand(args: argparse.Namespace) -> int:
    """``nsq-ha topic expand``: :meth:`LookupdAdmin.expand_topic`, then the writable map."""
    from .commands import map_to_json, print_map

    where = addresses(args)
    topic = _name(validate_topic, args.topic)
    what = f"topic {topic!r} did not grow to {args.partitions} partitions" + (
        "" if args.no_wait else " and become writable"
    )
    async with (
        command_deadline(args, what),
        LookupdAdmin(where.lookupd, timeout=args.timeout) as admin,
    ):
        pmap = await admin.expand_topic(
            topic, args.partitions, wait=not args.no_wait, timeout=args.timeout
        )
    if pmap is None:
        print(f"topic {topic!r} now has {args.partitions} partitions (not waiting for leaders)")
    elif args.json:
        print(json.dumps(map_to_json(pmap), sort_keys=True))
    else:
        print(f"topic {topic!r} has {len(pmap.partitions)} partitions, every one writable:")
        print_map(pmap, sys.stdout)
    return 0


# -- channel ---------------------------------------------------------------------------------


async def cmd_channel(args: argparse.Namespace) -> int:
    """``nsq-ha channel ACTION``: the action on every partition's leader (or every nsqd), each
    in turn; one that fails does not stop the others, and the command then exits 1 with a
    line saying what was done and what was not (:class:`ChannelReport`)."""
    action: str = args.channel_command
    where = addresses(args)
    topic = _name(validate_topic, args.topic)
    channel = _name(validate_channel, args.channel)
    position = parse_position(args.position) if action == "seek" else None
    report = ChannelReport(action, topic, channel, as_json=args.json)
    registered = False
    try:
        async with (
            command_deadline(args, f"channel {action} did not finish"),
            _admin(where, args.timeout) as admin,
        ):
            targets = await _channel_targets(admin, where, args, topic, position)
            registered = await _registration(admin, topic, channel, action)
            report.places.extend(targets)
            for target in targets:
                await report.run(
                    target, _one_target(args, action, topic, channel, target, position, registered)
                )
    except NsqTimeoutError:
        if not report.places:
            raise
        report.out_of_time(args.timeout)
    extra = {"registered_with_lookupd": True} if registered else {}
    report.finish(**extra)
    if registered and not report.places and not args.json:
        print(f"{DONE[action]} {topic}/{channel} in nsqlookupd")
    return 0


async def _channel_targets(
    admin: LookupdAdmin | None,
    where: Addresses,
    args: argparse.Namespace,
    topic: str,
    position: str | None,
) -> list[_Target]:
    """Where the action goes; the actions vanilla lacks, and a byte offset for several
    partitions, are refused (exit 2) before anything is changed."""
    action: str = args.channel_command
    vanilla = admin is None or bool(admin.vanilla)
    if vanilla and action == "seek":
        raise _refuse_on_vanilla(
            "channel seek", "has no /channel/setoffset (channel empty drops the backlog)"
        )
    if vanilla and action == "setorder":
        raise _refuse_on_vanilla("channel setorder", "has no ordered channels")
    if vanilla and action == "create" and args.start == "start":
        raise _refuse_on_vanilla("channel create --from start", "cannot rewind a channel")
    targets = await _targets(admin, where, topic, args.partition)
    byte_offset = position is not None and position.startswith("virtual_queue:")
    if byte_offset and position != "virtual_queue:0" and len(targets) > 1:
        raise CliError("offset=N is one partition's byte offset: give --partition P", 2)
    return targets


async def _one_target(
    args: argparse.Namespace,
    action: str,
    topic: str,
    channel: str,
    target: _Target,
    position: str | None,
    registered: bool,
) -> None:
    async with NsqdAdmin(target.http_url, timeout=args.timeout) as nsqd:
        if not registered:
            await _channel_call(nsqd, args, action, topic, channel, target, position)
        elif action == "create" and args.start == "start" and target.partition is not None:
            # nsqlookupd has the nodes create it: wait for that, then rewind it
            await _seek_when_there(nsqd, topic, channel, target.partition)


async def _registration(admin: LookupdAdmin | None, topic: str, channel: str, action: str) -> bool:
    """A fork topic that disables channel auto-creation: its nsqd refuse ``/channel/create``
    and ``/channel/delete`` (403); nsqlookupd registers (create) or unregisters (delete) the
    channel and the nodes follow. True when nsqlookupd was asked (the nsqd calls are then
    left out)."""
    if admin is None or admin.vanilla or action not in ("create", "delete"):
        return False
    pmap = await admin.lookup.lookup(topic, "r", force=True)
    if pmap.meta is None or not pmap.meta.disable_channel_auto_create:
        return False
    await admin.post(f"/channel/{action}", {"topic": topic, "channel": channel})
    return True


async def _channel_call(
    nsqd: NsqdAdmin,
    args: argparse.Namespace,
    action: str,
    topic: str,
    channel: str,
    target: _Target,
    position: str | None,
) -> None:
    part = target.partition
    if action == "create":
        await nsqd.create_channel(topic, channel, part)
        if args.start == "start" and part is not None:
            await _seek(nsqd, topic, channel, part, seek_position(offset=0))
    elif action == "delete":
        await nsqd.delete_channel(topic, channel, part)
    elif action in ("pause", "unpause"):
        await nsqd.pause_channel(topic, channel, part, paused=action == "pause")
    elif action == "empty":
        await nsqd.empty_channel(topic, channel, part)
    elif action == "seek" and position is not None and part is not None:
        await nsqd.set_offset(topic, channel, part, position)  # PartitionEmptyError: empty
    elif action == "setorder":
        await nsqd.set_order(topic, channel, part, ordered=args.order == "on")


async def _seek_when_there(nsqd: NsqdAdmin, topic: str, channel: str, partition: int) -> None:
    deadline = asyncio.get_running_loop().time() + _SYNC_WAIT
    while True:
        try:
            await _seek(nsqd, topic, channel, partition, seek_position(offset=0))
            return
        except AdminError as exc:
            if "CHANNEL_NOT_FOUND" not in str(exc):
                raise
            if asyncio.get_running_loop().time() > deadline:
                raise AdminError(f"{exc} ({_SYNC_WAIT:g}s after nsqlookupd registered it)") from exc
        await asyncio.sleep(0.2)


async def _seek(nsqd: NsqdAdmin, topic: str, channel: str, partition: int, body: str) -> None:
    # a partition that never had a message: its start is its end already
    with contextlib.suppress(PartitionEmptyError):
        await nsqd.set_offset(topic, channel, partition, body)


# -- leader move -----------------------------------------------------------------------------


async def cmd_leader_move(args: argparse.Namespace) -> int:
    """``nsq-ha leader move``: move a partition's leader and wait until lookups name it."""
    where = addresses(args)
    topic = _name(validate_topic, args.topic)
    if args.partition < 0:
        raise CliError("--partition must be >= 0", 2)
    deadline = command_deadline(args, f"the leader of {topic}/{args.partition} did not move")
    async with deadline, _admin(where, args.timeout) as admin:
        if admin is None or admin.vanilla:
            raise _refuse_on_vanilla("leader move", "has no partition leaders or replicas")
        before = (await admin.lookup.lookup(topic, "w", force=True)).leader(args.partition)
        if before is None:
            raise CliError(f"{topic}/{args.partition} has no leader (no such partition?)")
        new = await admin.move_leader(topic, args.partition, to=args.to, timeout=args.timeout)
    if args.json:
        summary = {
            "topic": topic,
            "partition": args.partition,
            "from": before.address,
            "to": new.address,
            "to_id": new.distributed_id,
            "asked": args.to,
        }
        print(json.dumps(summary, sort_keys=True))
    else:
        print(f"moved the leader of {topic}/{args.partition}: {before.address} -> {new.address}")
    return 0
