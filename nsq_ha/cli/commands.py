"""``nsq-ha lookup``, ``topic create``, ``pub`` and ``tail`` (those two in :mod:`.pub` and
:mod:`.tail`).

Each command is an ``async def`` taking the parsed arguments and returning the exit code;
errors are raised (``nsq_ha`` exceptions, :class:`CliError`) and turned into one line by
:func:`nsq_ha.cli.main`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, TextIO

from nsq_ha.admin import LookupdAdmin
from nsq_ha.lookup import LookupClient
from nsq_ha.lookup.wire import NodeInfo, PartitionMap

from .deadline import command_deadline
from .output import print_table
from .replicas import Replicas, find_replicas
from .where import CliError, existing_map, topic_of

__all__ = ["CliError", "cmd_lookup", "cmd_pub", "cmd_tail", "cmd_topic_create"]

log = logging.getLogger("nsq_ha.cli")


# -- shared ----------------------------------------------------------------------------------


def _need_lookupd(args: argparse.Namespace, what: str) -> list[str]:
    if not args.lookupd:
        raise CliError(f"{what} needs --lookupd URL (nsqlookupd's HTTP address)", 2)
    return list(args.lookupd)


def _node_json(node: NodeInfo) -> dict[str, Any]:
    return {
        "address": node.address,
        "http_port": node.http_port,
        "distributed_id": node.distributed_id,
        "version": node.version,
    }


def map_to_json(pmap: PartitionMap, replicas: Replicas | None = None) -> dict[str, Any]:
    """A partition map as the JSON ``nsq-ha lookup --json`` prints (with ``replicas``: each
    partition's holders, leader first, and ``replicas_unknown``)."""
    meta = pmap.meta
    extra = {} if replicas is None else replicas.to_json()
    return {
        **extra,
        "topic": pmap.topic,
        "access": pmap.access,
        "fork": pmap.fork,
        "meta": None
        if meta is None
        else {
            "partition_num": meta.partition_num,
            "replica": meta.replica,
            "ordered": meta.ordered,
            "extend_support": meta.extend_support,
            "multi_part": meta.multi_part,
            "disable_channel_auto_create": meta.disable_channel_auto_create,
        },
        "partitions": {str(p): _node_json(n) for p, n in sorted(pmap.partitions.items())},
        "producers": [_node_json(n) for n in pmap.producers],
        "channels": list(pmap.channels),
    }


def print_map(
    pmap: PartitionMap, out: TextIO, *, plain: bool = False, replicas: Replicas | None = None
) -> None:
    """The partition map as a table (fork; with ``replicas``, a column of each partition's
    holders, leader first) or the producer list (vanilla)."""
    meta = pmap.meta
    if pmap.fork and meta is not None:
        flags = [f for f, on in (("ordered", meta.ordered), ("ext", meta.extend_support)) if on]
        title = (
            f"{pmap.topic} (access={pmap.access}): {meta.partition_num} partitions, "
            f"replicas {meta.replica}{', ' + ', '.join(flags) if flags else ''}"
        )
        rows: list[list[object]] = []
        for part in range(max(meta.partition_num, max(pmap.partitions, default=-1) + 1)):
            node = pmap.partitions.get(part)
            if node is None:
                row: list[object] = [part, "(no leader listed)", "", ""]
            else:
                row = [part, node.address, node.distributed_id, node.version]
            rows.append(row if replicas is None else [*row, replicas.cell(part)])
        columns = ["partition", "nsqd", "node id", "version"]
        if replicas is not None:
            columns.append("replicas (leader first)")
        print_table(title, columns, rows, stream=out, plain=plain)
        for why in replicas.unknown if replicas is not None else ():
            print(f"replicas unknown for {why}", file=out)
    else:
        rows = [[n.address, n.http_port, n.version] for n in pmap.producers]
        title = f"{pmap.topic} (vanilla): {len(rows)} nsqd"
        print_table(title, ["nsqd", "http port", "version"], rows, stream=out, plain=plain)
    print(f"channels: {', '.join(pmap.channels) or '(none)'}", file=out)


# -- lookup ----------------------------------------------------------------------------------


async def cmd_lookup(args: argparse.Namespace) -> int:
    """``nsq-ha lookup``: print the partition map, and (fork) each partition's replicas."""
    if args.nsqd:
        raise CliError("lookup asks nsqlookupd: give --lookupd URL, not --nsqd", 2)
    seeds = _need_lookupd(args, "lookup")
    topic = topic_of(args)
    async with (
        command_deadline(args, f"no map of {topic!r}"),
        LookupClient(seeds, timeout=args.timeout) as lookup,
    ):
        pmap = await existing_map(lookup, topic, args.access)
        # the replicas come from the nodes: at most half the deadline, the map is printed anyway
        replicas = await find_replicas(seeds, topic, args.timeout / 2) if pmap.fork else None
    if args.json:
        print(json.dumps(map_to_json(pmap, replicas), sort_keys=True))
    else:
        print_map(pmap, sys.stdout, plain=args.plain, replicas=replicas)
    return 0


# -- topic create ----------------------------------------------------------------------------


async def cmd_topic_create(args: argparse.Namespace) -> int:
    """``nsq-ha topic create``: create through the leader nsqlookupd, wait until writable."""
    if args.nsqd:
        raise CliError(
            "topic create goes through nsqlookupd (--lookupd); vanilla nsqd creates a topic on "
            "its first PUB, which nsq-ha pub --nsqd does",
            2,
        )
    seeds = _need_lookupd(args, "topic create")
    topic = topic_of(args)
    what = f"topic {topic!r} was not created" + ("" if args.no_wait else " and writable")
    async with command_deadline(args, what), LookupdAdmin(seeds, timeout=args.timeout) as admin:
        pmap = await admin.create_topic(
            topic,
            args.partitions,
            args.replicas,
            # an option not given is None: TopicSpec's default
            ordered=True if args.ordered else None,
            ext=True if args.ext else None,
            sync_every=1 if args.durable else args.sync_every,
            retention_days=args.retention_days,
            channel_auto_create=False if args.no_channel_auto_create else None,
            wait=not args.no_wait,
            timeout=args.timeout,
        )
    if pmap is None:
        print(f"topic {topic!r} created" + (" (not waiting)" if args.no_wait else ""))
    elif args.json:
        print(json.dumps(map_to_json(pmap), sort_keys=True))
    else:
        print_map(pmap, sys.stdout, plain=args.plain)
    return 0


# -- pub and tail (their own modules) -------------------------------------------------------


async def cmd_pub(args: argparse.Namespace) -> int:
    """``nsq-ha pub``: see :mod:`nsq_ha.cli.pub`."""
    from .pub import run_pub

    return await run_pub(args)


async def cmd_tail(args: argparse.Namespace) -> int:
    """``nsq-ha tail``: see :mod:`nsq_ha.cli.tail`."""
    from .tail import run_tail

    return await run_tail(args)
