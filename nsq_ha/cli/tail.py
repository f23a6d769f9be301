"""``nsq-ha tail``: print a topic's messages, finishing each.

By default tail reads on a channel of its own, ``tail<6 digits>#ephemeral``: nsqd (vanilla and
the fork) deletes an ephemeral channel when its last consumer leaves, it is never replicated nor
registered as a durable channel, and tail also deletes it itself on every partition leader when
it exits (the embedded cluster does not delete ephemeral channels), so nothing is left behind.
``--channel`` names a durable channel instead (it stays).

Where it starts (``--from``): on the fork a channel is positioned on each partition's leader
before the first SUB (``/channel/create`` + ``/channel/setoffset``, the positions of
:func:`~nsq_ha.admin.seek_position`). Vanilla nsqd has no start position: a new channel gets the
topic's buffered messages only when it is the topic's first channel, and later ones get only
new messages; tail refuses a ``--from`` vanilla cannot honour, saying why.

``--exit-at-end``: stop once the channel's depth and in-flight count are 0 on every partition
(nsqd's ``/stats``, polled while messages are printed), i.e. once the backlog is printed and
finished.

Offsets: on the fork every line has its message's partition and queue offset: tail subscribes
plain topics with ``SUB_ADVANCED`` (``with_offsets=True``; ordered topics get ``SUB_ORDERED``,
which carries them too). Vanilla nsqd has neither: ``--format`` prints ``-`` for them, ``--json``
``null``, and the default line is ``[-] body``.

Output (:class:`~nsq_ha.cli.stdout.Stdout`): a message is finished only once its line is
written. Lines are written from a thread, so a stdout nobody reads never blocks the event loop:
Ctrl-C then gives the message being printed back (REQ) and exits 130. A reader that goes away
(``tail | head -1``) ends tail at once with status 0: the message being printed is given back
and the consumer closes cleanly (the ephemeral channel goes with it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import secrets
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from nsq_ha.admin import AdminError, LookupdAdmin, NsqdAdmin, seek_position
from nsq_ha.consumer import Consumer, ConsumerConfig, Message
from nsq_ha.errors import (
    ConfigError,
    MessageAlreadyRespondedError,
    MessageConnectionGoneError,
    NsqError,
)
from nsq_ha.lookup.http import ADMIN_TIMEOUT, tls_context
from nsq_ha.lookup.wire import NodeInfo, PartitionMap
from nsq_ha.protocol.names import validate_channel

from .arguments import duration, field_default
from .stdout import Stdout
from .tail_format import FIELDS, check_template, format_message, message_fields, message_json
from .where import CliError, existing_map, json_object, topic_of, where_of

__all__ = [
    "FIELDS",
    "Start",
    "add_tail_options",
    "check_template",
    "max_in_flight",
    "message_fields",
    "message_json",
    "parse_start",
    "run_tail",
    "wants_offsets",
]

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("nsq_ha.cli")

#: how often ``--exit-at-end`` asks nsqd's /stats (seconds)
_AT_END_POLL = 0.2
#: how many printed messages tail remembers to print a copy nsqd sends again only once
_PRINTED_MEMORY = 65536


def add_tail_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``tail`` (after ``--topic``)."""
    parser.add_argument(
        "--channel",
        help="a durable channel to read (it stays); default: an ephemeral channel of tail's "
        "own, deleted when tail exits",
    )
    parser.add_argument("--ordered", action="store_true", help="subscribe with SUB_ORDERED")
    parser.add_argument("-n", dest="count", type=int, metavar="N", help="exit after N messages")
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per message (null for what it lacks, e.g. vanilla's offset)",
    )
    shape.add_argument(
        "--format",
        dest="template",
        metavar="TEMPLATE",
        help="a Python format string per message over the fields "
        f"{', '.join(FIELDS)}, e.g. '{{partition}}@{{offset}} {{body}}'; a field the message "
        "lacks prints '-' (vanilla nsqd: partition, offset, trace_id; tag, ext without a header)",
    )
    parser.add_argument(
        "--partition", type=int, action="append", metavar="P", help="only these (repeatable)"
    )
    parser.add_argument(
        "--from",
        dest="start",
        metavar="POSITION",
        help="where the channel starts: earliest (the first retained message), latest (new "
        "messages only), offset=N (a queue offset of one partition, fork), timestamp=T (Unix "
        "seconds, or ISO 8601: UTC without a zone; fork); 'start' and 'end' are earliest and "
        "latest. Default: a new channel starts at earliest, an existing one where it is",
    )
    parser.add_argument(
        "--exit-at-end",
        action="store_true",
        help="exit 0 once the backlog is printed (the channel's depth is 0 on every partition)",
    )
    parser.add_argument("--tag", dest="desired_tag", help="desired_tag (fork ext topics)")
    parser.add_argument(
        "--ext-filter",
        metavar="JSON",
        help="ext_filter (fork ext topics), e.g. "
        '\'{"type": 1, "filter_ext_key": "k", "filter_data": "v"}\'',
    )
    parser.add_argument(
        "--timeout", type=duration, default=None, help="fail if a message takes longer (seconds)"
    )


# -- parsing ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    """A ``--from`` position: ``kind`` is earliest, latest, offset or timestamp."""

    kind: str
    value: float | int | None = None

    def position(self) -> str:
        """The ``/channel/setoffset`` body of this position."""
        if self.kind == "earliest":
            return seek_position(offset=0)
        if self.kind == "latest":
            return seek_position(end=True)
        if self.kind == "offset":
            return seek_position(offset=int(self.value or 0))
        return seek_position(timestamp=float(self.value or 0))


def parse_start(text: str | None) -> Start | None:
    """``--from``; a CliError (exit 2) for anything else."""
    if text is None:
        return None
    word = text.strip().lower()
    aliases = {"earliest": "earliest", "start": "earliest", "latest": "latest", "end": "latest"}
    if word in aliases:
        return Start(aliases[word])
    kind, sep, value = text.strip().partition("=")
    if sep and kind == "offset":
        if value.isdigit():
            return Start("offset", int(value))
    elif sep and kind == "timestamp":
        return Start("timestamp", _timestamp(value))
    raise CliError(
        f"--from {text!r}: give earliest, latest, offset=N or timestamp=T (start and end "
        "mean earliest and latest)",
        2,
    )


def _timestamp(value: str) -> float:
    try:
        stamp = float(value)
    except ValueError:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise CliError(
                f"--from timestamp={value}: not Unix seconds nor an ISO 8601 time", 2
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        stamp = moment.timestamp()
    if not 0 <= stamp < 2**62:
        raise CliError(f"--from timestamp={value}: out of range", 2)
    return stamp


def _ext_filter(text: str | None) -> dict[str, Any] | None:
    return json_object(text, "--ext-filter")


# -- positions and cleanup (nsqd's HTTP admin API) -------------------------------------------


def _wanted(pmap: PartitionMap, partitions: list[int] | None) -> dict[int, NodeInfo]:
    return {
        p: node
        for p, node in sorted(pmap.partitions.items())
        if partitions is None or p in partitions
    }


def _check_vanilla_start(
    start: Start | None, pmap: PartitionMap | None, channel: str, named: bool
) -> None:
    """Refuse a ``--from`` that vanilla nsqd cannot honour (CliError, exit 2)."""
    if start is None:
        return
    if start.kind in ("offset", "timestamp"):
        raise CliError(
            f"--from {start.kind}=... needs the fork: vanilla nsqd has no start position "
            "(SUB_ADVANCED and /channel/setoffset are the fork's)",
            2,
        )
    if pmap is None:
        raise CliError(
            f"--from {start.kind} on vanilla nsqd depends on the topic's channels, which only "
            "nsqlookupd lists: give --lookupd, or leave --from out",
            2,
        )
    others = sorted(c for c in pmap.channels if c != channel)
    if named and channel in pmap.channels:
        raise CliError(
            f"--from {start.kind}: vanilla nsqd cannot move the existing channel {channel!r} "
            "(it has no setoffset); leave --from out to read it where it is",
            2,
        )
    if start.kind == "earliest" and others:
        raise CliError(
            "--from earliest: vanilla nsqd gives a new channel only messages published after "
            f"it exists, and the topic already has channels {', '.join(others)}; read one of "
            "them with --channel, or leave --from out",
            2,
        )
    if start.kind == "latest" and not others:
        raise CliError(
            "--from latest: vanilla nsqd hands a topic's first channel everything the topic "
            "holds, and this topic has no channel yet; leave --from out",
            2,
        )


async def _position(
    http: httpx.AsyncClient,
    pmap: PartitionMap,
    channel: str,
    partitions: list[int] | None,
    start: Start | None,
) -> None:
    """Create the channel on each wanted partition's leader if new and move it to ``start``
    (a new one without ``--from``: to earliest)."""
    new = channel not in pmap.channels
    if start is None and not new:
        return
    chosen = start or Start("earliest")
    wanted = _wanted(pmap, partitions)
    if chosen.kind == "offset" and len(wanted) != 1:
        raise CliError(
            "--from offset=N is a queue offset of one partition: give --partition P "
            f"({pmap.topic!r} has partitions {', '.join(map(str, wanted)) or 'none listed'})",
            2,
        )
    for partition, node in wanted.items():
        nsqd = NsqdAdmin(node.http_url, http=http)
        if new:
            await nsqd.create_channel(pmap.topic, channel, partition)
        try:
            await nsqd.set_offset(pmap.topic, channel, partition, chosen.position())
        except AdminError as exc:
            # a partition that never had a message: its start is its end already
            if not (chosen.kind == "earliest" and "commit log end of file" in str(exc)):
                raise
    log.info("channel %s on partitions %s: at %s", channel, list(wanted), chosen.position())


async def _delete(admin: LookupdAdmin, http: httpx.AsyncClient, topic: str, channel: str) -> None:
    """Delete ``channel`` on every partition's leader (nsqd may have done it already)."""
    try:
        pmap = await admin.lookup.lookup(topic, "r", force=True)
        for partition, node in sorted(pmap.partitions.items()):
            nsqd = NsqdAdmin(node.http_url, http=http)
            with contextlib.suppress(AdminError):
                await nsqd.delete_channel(topic, channel, partition)
    except NsqError as exc:
        log.warning("could not delete the ephemeral channel %s: %s", channel, exc)


async def _backlog(
    http: httpx.AsyncClient, pmap: PartitionMap, channel: str, partitions: list[int] | None
) -> int | None:
    """Messages of ``channel`` not yet finished (depth + in flight, and vanilla topics' not yet
    copied to channels), summed over nodes; None while the channel is not on every node."""
    targets: list[tuple[NodeInfo, int | None]]
    if pmap.fork:
        targets = [(n, p) for p, n in _wanted(pmap, partitions).items()]
    else:
        targets = [(n, None) for n in pmap.producers]
    total = 0
    for node, partition in targets:
        topics = await NsqdAdmin(node.http_url, http=http).topic_stats(pmap.topic, partition)
        found = False
        for topic in topics:
            if not pmap.fork:
                total += int(topic.get("depth") or 0)
            for chan in topic.get("channels") or ():
                if isinstance(chan, Mapping) and chan.get("channel_name") == channel:
                    found = True
                    total += int(chan.get("depth") or 0) + int(chan.get("in_flight_count") or 0)
        if not found:
            return None
    return total


async def _watch_end(
    http: httpx.AsyncClient,
    pmap: PartitionMap,
    channel: str,
    partitions: list[int] | None,
    consumer: Consumer,
    at_end: asyncio.Event,
) -> None:
    """Set ``at_end`` once nothing of the channel is left to print (polling /stats)."""
    while True:
        with contextlib.suppress(NsqError):
            await consumer.sync()  # every FIN so far processed: in-flight counts are current
        left = await _backlog(http, pmap, channel, partitions)
        if left == 0:
            at_end.set()
            return
        await asyncio.sleep(_AT_END_POLL)


def wants_offsets(pmap: PartitionMap | None, *, ordered: bool) -> bool:
    """Whether tail subscribes with ``SUB_ADVANCED``: on every fork topic, so each line has its
    message's queue offset (``SUB_ORDERED`` carries it anyway, and an ordered topic gets that
    whatever tail asks); never on vanilla nsqd (it has no offsets and refuses the command) nor
    when nothing says the nsqd is the fork (``--nsqd`` gives no partition map)."""
    return pmap is not None and pmap.fork and not ordered


def max_in_flight(count: int | None) -> int:
    """The consumer's ``max_in_flight``: its default, lowered to ``-n N`` (no more messages
    out at once than tail prints)."""
    default: int = field_default(ConsumerConfig, "max_in_flight")
    return min(count, default) if count else default


def _http_client() -> httpx.AsyncClient:
    import httpx

    return httpx.AsyncClient(timeout=ADMIN_TIMEOUT, verify=tls_context())


# -- the command -----------------------------------------------------------------------------


async def run_tail(args: argparse.Namespace) -> int:
    """``nsq-ha tail``: print messages (finishing them); stop after ``-n``, at the end of the
    backlog (``--exit-at-end``) or on Ctrl-C."""
    where = where_of(args)
    topic = topic_of(args)
    named = args.channel is not None
    try:
        channel = validate_channel(
            args.channel if named else f"tail{secrets.randbelow(10**6):06d}#ephemeral"
        )
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None
    if args.count is not None and args.count < 1:
        raise CliError("-n must be at least 1", 2)
    check_template(args.template)
    start = parse_start(args.start)
    ext_filter = _ext_filter(args.ext_filter)
    partitions: list[int] | None = args.partition or None
    if args.exit_at_end and not where.lookupd:
        raise CliError(
            "--exit-at-end reads the channel's depth from nsqd's HTTP /stats, which only "
            "--lookupd tells (--nsqd is a TCP address): give --lookupd",
            2,
        )
    pmap: PartitionMap | None = None
    admin = LookupdAdmin(where.lookupd) if where.lookupd else None
    http = _http_client() if admin is not None else None
    made = False
    try:
        if admin is not None:
            pmap = await existing_map(admin.lookup, topic, "r")
        if pmap is None or not pmap.fork:
            _check_vanilla_start(start, pmap, channel, named)
        consumer = Consumer(
            topic,
            channel,
            **where.client_kwargs(),
            ordered=True if args.ordered else None,
            with_offsets=wants_offsets(pmap, ordered=args.ordered),
            partitions=partitions,
            max_in_flight=max_in_flight(args.count),
            desired_tag=args.desired_tag,
            ext_filter=ext_filter,  # type: ignore[arg-type]
        )
        # every argument is checked (above) before a channel is made (here)
        if http is not None and pmap is not None and pmap.fork:
            made = not named or channel not in pmap.channels
            await _position(http, pmap, channel, partitions, start)
        return await _consume(args, consumer, topic, channel, http, pmap, partitions)
    finally:
        if made and not named and admin is not None and http is not None:
            await _delete(admin, http, topic, channel)
        if http is not None:
            await http.aclose()
        if admin is not None:
            await admin.close()


async def _consume(
    args: argparse.Namespace,
    consumer: Consumer,
    topic: str,
    channel: str,
    http: httpx.AsyncClient | None,
    pmap: PartitionMap | None,
    partitions: list[int] | None,
) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    seen = 0
    #: the latest printed messages, by (partition, id): one nsqd sends again (its msg_timeout,
    #: or the fork re-sending a channel's in-flight messages when the first SUB_ORDERED turns
    #: it ordered) is finished, not printed or counted a second time
    printed = _RecentIds(_PRINTED_MEMORY)
    at_end = asyncio.Event()
    async with Stdout() as out, consumer:
        stopper = asyncio.ensure_future(stop.wait())
        ender = asyncio.ensure_future(at_end.wait())
        leaver = asyncio.ensure_future(out.gone.wait())  # stdout's reader went away
        watcher = None
        if args.exit_at_end and http is not None and pmap is not None:
            watcher = asyncio.ensure_future(
                _watch_end(http, pmap, channel, partitions, consumer, at_end)
            )
        try:
            while args.count is None or seen < args.count:
                getter = asyncio.ensure_future(consumer.get())
                waiting = {getter, stopper, ender, leaver} | ({watcher} if watcher else set())
                done, _ = await asyncio.wait(
                    waiting, timeout=args.timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if watcher is not None and watcher in done and not at_end.is_set():
                    watcher.result()  # it failed: raise why
                if getter not in done:
                    getter.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await getter
                    if stop.is_set() or at_end.is_set() or out.gone.is_set():
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
                    line = format_message(message, args, topic, channel)
                    if not await _print(out, line, message, stopper):
                        break  # the reader is gone; the message was given back
                    seen += 1
                else:
                    log.info("%r came again; it is not printed twice", message)
                try:
                    await message.finish()
                except (MessageAlreadyRespondedError, MessageConnectionGoneError) as exc:
                    log.info("%r comes again (%s)", message, exc)
        finally:
            for task in (stopper, ender, leaver, watcher):
                if task is not None:
                    task.cancel()
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError):
                    loop.remove_signal_handler(sig)
    return 0


async def _print(out: Stdout, line: str, message: Message, stopper: asyncio.Future[Any]) -> bool:
    """Print ``line`` for ``message``: True once written; False once stdout's reader is gone.

    Whatever stops the write (the reader gone, Ctrl-C while nobody reads, a write error) gives
    the message back to nsqd (REQ, no delay) instead of leaving it held until the drain's
    timeout: another consumer of a durable channel gets it. Ctrl-C raises CliError (130).
    """
    writer = asyncio.ensure_future(out.write(line + "\n"))
    try:
        await asyncio.wait({writer, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if writer.done() and writer.result():
            return True
    except BaseException:
        writer.cancel()
        _give_back(message)
        raise
    writer.cancel()  # Ctrl-C: the write stays blocked in its thread
    _give_back(message)
    if out.gone.is_set():
        return False
    raise CliError(
        "interrupted while stdout was not read; the message being printed was given back", 130
    )


def _give_back(message: Message) -> None:
    try:
        message.requeue_nowait(0, backoff=False)
    except (MessageAlreadyRespondedError, MessageConnectionGoneError) as exc:
        log.info("%r is not given back: %s", message, exc)


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
