"""``nsq-ha lookup``, ``topic create``, ``pub`` and ``tail``.

Each command is an ``async def`` taking the parsed arguments and returning the exit code;
errors are raised (``nsq_ha`` exceptions, :class:`CliError`) and turned into one line by
:func:`nsq_ha.cli.main`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import codecs
import contextlib
import json
import logging
import secrets
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, TextIO

from nsq_ha.admin import LookupdAdmin
from nsq_ha.consumer import Consumer, Message
from nsq_ha.errors import (
    ConfigError,
    MessageAlreadyRespondedError,
    MessageConnectionGoneError,
    NsqError,
    PublishError,
    TopicNotFoundError,
)
from nsq_ha.lookup import LookupClient
from nsq_ha.lookup.wire import NodeInfo, PartitionMap
from nsq_ha.producer import Producer, PublishResult
from nsq_ha.protocol.names import validate_channel, validate_topic

from .output import print_table

__all__ = ["CliError", "cmd_lookup", "cmd_pub", "cmd_tail", "cmd_topic_create"]

log = logging.getLogger("nsq_ha.cli")


class CliError(Exception):
    """A failure to report in one line, with its exit code (2: bad input, 1: it did not work)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


# -- shared ----------------------------------------------------------------------------------


def _need_lookupd(args: argparse.Namespace, what: str) -> list[str]:
    if not args.lookupd:
        raise CliError(f"{what} needs --lookupd URL (nsqlookupd's HTTP address)", 2)
    return list(args.lookupd)


def _where(args: argparse.Namespace) -> dict[str, Any]:
    """``lookupd=`` or ``nsqd=`` for a Producer/Consumer, from --lookupd / --nsqd."""
    if args.lookupd and args.nsqd:
        raise CliError("give --lookupd or --nsqd, not both", 2)
    if args.lookupd:
        return {"lookupd": list(args.lookupd)}
    if args.nsqd:
        return {"nsqd": list(args.nsqd)}
    raise CliError("give --lookupd URL (fork or vanilla nsqlookupd) or --nsqd HOST:PORT", 2)


def _topic(args: argparse.Namespace) -> str:
    try:
        return validate_topic(args.topic)
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None


async def _existing(lookup: LookupClient, topic: str, access: str) -> PartitionMap:
    """The topic's map, or TopicNotFoundError when lookupd does not know it."""
    pmap = await lookup.lookup(topic, "w" if access == "w" else "r", force=True)
    if pmap.fork and not pmap.partitions and (pmap.meta is None or pmap.partition_num == 0):
        raise TopicNotFoundError(
            f"topic {topic!r} does not exist (create it: nsq-ha topic create --topic {topic} "
            "--partitions N --replicas R)"
        )
    if not pmap.fork and not pmap.producers:
        raise TopicNotFoundError(f"topic {topic!r} has no nsqd producing it")
    return pmap


def _node_json(node: NodeInfo) -> dict[str, Any]:
    return {
        "address": node.address,
        "http_port": node.http_port,
        "distributed_id": node.distributed_id,
        "version": node.version,
    }


def map_to_json(pmap: PartitionMap) -> dict[str, Any]:
    """A partition map as the JSON ``nsq-ha lookup --json`` prints."""
    meta = pmap.meta
    return {
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


def print_map(pmap: PartitionMap, out: TextIO, *, plain: bool = False) -> None:
    """The partition map as a table (fork) or the producer list (vanilla)."""
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
                rows.append([part, "(no leader listed)", "", ""])
            else:
                rows.append([part, node.address, node.distributed_id, node.version])
        print_table(
            title, ["partition", "nsqd", "node id", "version"], rows, stream=out, plain=plain
        )
    else:
        rows = [[n.address, n.http_port, n.version] for n in pmap.producers]
        title = f"{pmap.topic} (vanilla): {len(rows)} nsqd"
        print_table(title, ["nsqd", "http port", "version"], rows, stream=out, plain=plain)
    print(f"channels: {', '.join(pmap.channels) or '(none)'}", file=out)


# -- lookup ----------------------------------------------------------------------------------


async def cmd_lookup(args: argparse.Namespace) -> int:
    """``nsq-ha lookup``: print the partition map."""
    if args.nsqd:
        raise CliError("lookup asks nsqlookupd: give --lookupd URL, not --nsqd", 2)
    seeds = _need_lookupd(args, "lookup")
    topic = _topic(args)
    async with LookupClient(seeds) as lookup:
        pmap = await _existing(lookup, topic, args.access)
    if args.json:
        print(json.dumps(map_to_json(pmap), sort_keys=True))
    else:
        print_map(pmap, sys.stdout, plain=args.plain)
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
    topic = _topic(args)
    async with LookupdAdmin(seeds) as admin:
        pmap = await admin.create_topic(
            topic,
            args.partitions,
            args.replicas,
            ordered=args.ordered,
            ext=args.ext,
            sync_every=1 if args.durable else args.sync_every,
            retention_days=args.retention_days,
            channel_auto_create=not args.no_channel_auto_create,
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


# -- pub -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Line:
    number: int
    key: str | None
    body: bytes
    trace_id: int | None


def parse_ext(text: str | None) -> dict[str, Any] | None:
    """``--ext``: a JSON object of string values, or CliError (exit 2)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"--ext is not valid JSON: {exc.msg} at column {exc.colno}", 2) from None
    if not isinstance(value, dict):
        raise CliError(f"--ext must be a JSON object, got {type(value).__name__}", 2)
    return value


def parse_separator(text: str | None) -> bytes | None:
    r"""``--key-sep``: backslash escapes (``'\t'``, ``'\x1f'``) are decoded; never empty."""
    if text is None:
        return None
    try:
        sep = codecs.decode(text, "unicode_escape")
    except UnicodeDecodeError as exc:
        raise CliError(f"--key-sep {text!r}: {exc.reason}", 2) from None
    if not sep:
        raise CliError("--key-sep must not be empty", 2)
    return sep.encode()


async def read_lines(
    stream: Any, key: str | None, sep: bytes | None, trace: bool
) -> AsyncIterator[_Line | CliError]:
    """Messages from ``stream``'s lines (binary); a line without ``sep`` yields a CliError.

    Lines are read in a worker thread, so that a slow or interactive stdin does not stall the
    event loop (heartbeats, in-flight publishes) while it waits."""
    number = 0
    while raw := await asyncio.to_thread(stream.readline):
        number += 1
        line = raw[:-1] if raw.endswith(b"\n") else raw
        line = line[:-1] if line.endswith(b"\r") else line
        trace_id = secrets.randbits(63) if trace else None
        if sep is None:
            yield _Line(number, key, line, trace_id)
            continue
        head, found, body = line.partition(sep)
        if not found:
            yield CliError(f"line {number} has no key separator {sep!r}")
            continue
        try:
            line_key = head.decode()
        except UnicodeDecodeError:
            yield CliError(f"line {number}: the key is not UTF-8")
            continue
        yield _Line(number, line_key, body, trace_id)


def _result_json(line: _Line, result: PublishResult) -> dict[str, Any]:
    message_id = result.message_id
    return {
        "line": line.number,
        "ok": True,
        "key": line.key,
        "partition": result.partition,
        "offset": result.offset,
        "id": message_id.hex() if message_id else None,
        "trace_id": result.trace_id,
        "attempts": result.attempts,
        "nsqd": result.address,
    }


async def cmd_pub(args: argparse.Namespace) -> int:
    """``nsq-ha pub``: one message per stdin line; a JSON summary at the end."""
    where = _where(args)
    topic = _topic(args)
    ext = parse_ext(args.ext)
    sep = parse_separator(args.key_sep)
    if args.key is not None and sep is not None:
        raise CliError("give --key or --key-sep, not both", 2)
    if args.batch < 1:
        raise CliError("--batch must be at least 1", 2)
    lookup = LookupClient(where["lookupd"]) if "lookupd" in where else None
    summary: dict[str, Any] = {"topic": topic, "published": 0, "failed": 0, "partitions": {}}
    errors: Counter[str] = Counter()
    per_partition: Counter[str] = Counter()
    try:
        if lookup is not None:
            await _existing(lookup, topic, "w")  # fail fast on an unknown topic
        producer = Producer(lookup=lookup) if lookup is not None else Producer(nsqd=where["nsqd"])
        async with producer:
            batch: list[_Line] = []
            async for item in read_lines(sys.stdin.buffer, args.key, sep, args.trace):
                if isinstance(item, CliError):
                    summary["failed"] += 1
                    errors[str(item)] += 1
                    if args.json:
                        print(json.dumps({"ok": False, "error": str(item)}), flush=True)
                    continue
                batch.append(item)
                if len(batch) >= args.batch:
                    await _publish_batch(
                        producer, topic, batch, ext, args, summary, errors, per_partition
                    )
                    batch = []
            if batch:
                await _publish_batch(
                    producer, topic, batch, ext, args, summary, errors, per_partition
                )
    finally:
        if lookup is not None:
            await lookup.close()
    summary["partitions"] = dict(sorted(per_partition.items()))
    summary["errors"] = [{"error": e, "count": n} for e, n in errors.most_common(10)]
    print(json.dumps(summary, sort_keys=True), flush=True)
    return 1 if summary["failed"] else 0


async def _publish_batch(
    producer: Producer,
    topic: str,
    batch: list[_Line],
    ext: dict[str, Any] | None,
    args: argparse.Namespace,
    summary: dict[str, Any],
    errors: Counter[str],
    per_partition: Counter[str],
) -> None:
    """Publish ``batch``: one ``publish_many`` per key (in line order), keys concurrently."""
    groups: dict[str | None, list[_Line]] = {}
    for line in batch:
        groups.setdefault(line.key, []).append(line)

    async def one(key: str | None, lines: list[_Line]) -> list[PublishResult | BaseException]:
        try:
            results = await producer.publish_many(
                topic,
                [line.body for line in lines],
                sharding_key=key,
                trace_ids=[line.trace_id for line in lines] if args.trace else None,
                ext=ext,
            )
            return list(results)
        except PublishError as exc:
            if exc.results is not None and len(exc.results) == len(lines):
                return [
                    r if isinstance(r, PublishResult | BaseException) else exc for r in exc.results
                ]
            return [exc] * len(lines)
        except NsqError as exc:
            return [exc] * len(lines)

    outcomes = await asyncio.gather(*(one(k, ls) for k, ls in groups.items()))
    by_line: dict[int, tuple[_Line, PublishResult | BaseException]] = {}
    for lines, results in zip(groups.values(), outcomes, strict=True):
        for line, result in zip(lines, results, strict=True):
            by_line[line.number] = (line, result)
    for number in sorted(by_line):
        line, result = by_line[number]
        if isinstance(result, PublishResult):
            summary["published"] += 1
            per_partition["-" if result.partition is None else str(result.partition)] += 1
            if args.json:
                print(json.dumps(_result_json(line, result)), flush=True)
        else:
            summary["failed"] += 1
            errors[str(result)] += 1
            if args.json:
                print(
                    json.dumps(
                        {"line": number, "ok": False, "key": line.key, "error": str(result)}
                    ),
                    flush=True,
                )


# -- tail ------------------------------------------------------------------------------------


def message_json(message: Message) -> dict[str, Any]:
    """One delivered message as the JSON object ``nsq-ha tail --json`` prints."""
    try:
        body: str = message.body.decode("utf-8")
        is_b64 = False
    except UnicodeDecodeError:
        body, is_b64 = base64.b64encode(message.body).decode("ascii"), True
    try:
        ext: Any = dict(message.ext) if message.ext_version is not None else None
    except NsqError:
        ext = None
    return {
        "partition": message.partition,
        "offset": message.offset,
        "id": message.id.hex(),
        "trace_id": message.trace_id,
        "attempts": message.attempts,
        "timestamp": message.timestamp,
        "ext": ext,
        "body": body,
        "body_base64": is_b64,
    }


async def _start_new_channel(
    admin: LookupdAdmin, pmap: PartitionMap, channel: str, partitions: list[int] | None
) -> None:
    """A channel the fork does not know yet starts at the partitions' end when the first SUB
    makes it; ``tail --from start`` (the default) creates it first and rewinds it, so that it
    sees what the topic holds, as vanilla's first channel gets the topic's backlog."""
    if not pmap.fork or channel in pmap.channels:
        return
    done = await admin.create_channel(pmap.topic, channel, partitions=partitions, rewind=True)
    log.info("created channel %s on partitions %s, from their first message", channel, done)


def _print_message(message: Message, *, as_json: bool) -> None:
    """One line of ``tail``: JSON, or ``[partition@offset] body``."""
    if as_json:
        print(json.dumps(message_json(message)), flush=True)
        return
    where_from = "-" if message.partition is None else str(message.partition)
    offset = "" if message.offset is None else f"@{message.offset}"
    text = message.body.decode("utf-8", "backslashreplace")
    print(f"[{where_from}{offset}] {text}", flush=True)


async def cmd_tail(args: argparse.Namespace) -> int:
    """``nsq-ha tail``: print messages (finishing them); stop after ``-n`` or on Ctrl-C."""
    where = _where(args)
    topic = _topic(args)
    try:
        channel = validate_channel(args.channel)
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None
    if args.count is not None and args.count < 1:
        raise CliError("-n must be at least 1", 2)
    in_flight = min(args.count, 100) if args.count else 100
    consumer = Consumer(
        topic,
        channel,
        **where,
        ordered=True if args.ordered else None,
        partitions=args.partition or None,
        max_in_flight=in_flight,
    )
    # the arguments are checked (above) before a channel is made (here)
    if "lookupd" in where:
        async with LookupdAdmin(where["lookupd"]) as admin:
            pmap = await _existing(admin.lookup, topic, "r")
            if args.start == "start":
                await _start_new_channel(admin, pmap, channel, args.partition or None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    seen = 0
    #: the latest printed messages, by (partition, id): one nsqd sends again (its msg_timeout,
    #: or the fork re-sending a channel's in-flight messages when the first SUB_ORDERED turns
    #: it ordered) is finished, not printed or counted a second time, whether the copy comes
    #: before or after the first FIN
    printed = _RecentIds(_PRINTED_MEMORY)
    async with consumer:
        stopper = asyncio.ensure_future(stop.wait())
        try:
            while args.count is None or seen < args.count:
                getter = asyncio.ensure_future(consumer.get())
                done, _ = await asyncio.wait(
                    {getter, stopper}, timeout=args.timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if getter not in done:
                    getter.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await getter
                    if stopper in done:
                        break
                    raise CliError(
                        f"only {seen} of {args.count} messages arrived within {args.timeout:g}s"
                        if args.count
                        else f"no message within {args.timeout:g}s"
                    )
                message = getter.result()
                if message is None:
                    break
                if printed.add((message.partition, message.id)):
                    _print_message(message, as_json=args.json)
                    seen += 1
                else:
                    log.info("%r came again; it is not printed twice", message)
                try:
                    await message.finish()
                except (MessageAlreadyRespondedError, MessageConnectionGoneError) as exc:
                    # nsqd sent it again before the FIN landed: the copy comes next
                    log.info("%r comes again (%s)", message, exc)
        finally:
            stopper.cancel()
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError):
                    loop.remove_signal_handler(sig)
    return 0


#: how many printed messages ``tail`` remembers to print a copy nsqd sends again only once
_PRINTED_MEMORY = 65536


class _RecentIds:
    """The latest ``limit`` keys added, oldest forgotten first (bounded memory)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._keys: dict[tuple[int | None, bytes], None] = {}

    def add(self, key: tuple[int | None, bytes]) -> bool:
        """Add ``key``; False when it is already there."""
        if key in self._keys:
            return False
        self._keys[key] = None
        if len(self._keys) > self._limit:
            del self._keys[next(iter(self._keys))]
        return True
