"""``nsq-ha pub``: publish records of stdin or files; a JSON summary at the end.

A record is a line (the default), a ``--delimiter``-separated piece, or a whole file
(``--whole-file``); FILE ``-`` is stdin. ``--rate N/s`` spaces publishes with a token bucket
(a sleep until the next token, never a busy loop); ``--defer`` sends DPUB (vanilla only: the
fork has no DPUB); on a terminal a progress line is kept up to date on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import json
import secrets
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from nsq_ha.errors import NsqError, PublishError
from nsq_ha.lookup import LookupClient
from nsq_ha.producer import Producer, PublishResult

from .where import CliError, existing_map, json_object, topic_of, where_of

__all__ = [
    "TokenBucket",
    "add_pub_options",
    "parse_delimiter",
    "parse_ext",
    "parse_rate",
    "parse_separator",
    "read_records",
    "run_pub",
]

#: bytes read at once when records are not lines
_CHUNK = 64 * 1024
#: the progress line appears after this many seconds, then is refreshed this often
_PROGRESS_AFTER = 1.0


def add_pub_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``pub`` (after ``--topic``)."""
    parser.add_argument(
        "files", nargs="*", metavar="FILE", help="read these in turn ('-': stdin; default: stdin)"
    )
    split = parser.add_mutually_exclusive_group()
    split.add_argument(
        "-d",
        "--delimiter",
        metavar="SEP",
        help="records end with SEP instead of a newline (backslash escapes work: '\\0', "
        "'\\x1e'); a last record without it still counts",
    )
    split.add_argument(
        "--whole-file", action="store_true", help="each FILE (or all of stdin) is one message"
    )
    keys = parser.add_mutually_exclusive_group()
    keys.add_argument("--key", help="sharding key of every message")
    keys.add_argument(
        "--key-sep",
        metavar="SEP",
        help="the text before the first SEP is the record's sharding key, the rest its body "
        "(backslash escapes such as '\\t' work)",
    )
    keys.add_argument(
        "--partition", type=int, metavar="P", help="publish every message to partition P (fork)"
    )
    parser.add_argument(
        "--trace", action="store_true", help="PUB_TRACE with a random trace id each"
    )
    parser.add_argument("--ext", metavar="JSON", help="JSON header of every message (ext topics)")
    parser.add_argument(
        "--batch", type=int, default=100, metavar="N", help="records per round of MPUBs (100)"
    )
    parser.add_argument(
        "--rate", metavar="N/s", help="at most N messages a second (e.g. 50, 50/s, 3000/min)"
    )
    parser.add_argument(
        "--defer",
        type=float,
        metavar="SECONDS",
        help="deliver each message this much later (DPUB: vanilla nsqd only)",
    )
    parser.add_argument("--json", action="store_true", help="also one JSON line per publish result")


# -- parsing ---------------------------------------------------------------------------------


def parse_ext(text: str | None) -> dict[str, Any] | None:
    """``--ext``: a JSON object of string values, or CliError (exit 2)."""
    return json_object(text, "--ext")


def _escaped(text: str, option: str) -> bytes:
    try:
        sep = codecs.decode(text, "unicode_escape")
    except UnicodeDecodeError as exc:
        raise CliError(f"{option} {text!r}: {exc.reason}", 2) from None
    if not sep:
        raise CliError(f"{option} must not be empty", 2)
    return sep.encode()


def parse_separator(text: str | None) -> bytes | None:
    r"""``--key-sep``: backslash escapes (``'\t'``, ``'\x1f'``) are decoded; never empty."""
    return None if text is None else _escaped(text, "--key-sep")


def parse_delimiter(text: str | None) -> bytes:
    """``--delimiter`` (default: a newline)."""
    return b"\n" if text is None else _escaped(text, "--delimiter")


_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_rate(text: str | None) -> float | None:
    """``--rate``: ``N``, ``N/s``, ``N/min`` or ``N/h`` -> messages per second (> 0)."""
    if text is None:
        return None
    number, _, unit = text.strip().partition("/")
    try:
        count = float(number)
    except ValueError:
        count = -1.0
    per = _UNITS.get(unit.strip().lower() or "s")
    if per is None or not 0 < count < float("inf"):
        raise CliError(f"--rate {text!r}: give N/s, N/min or N/h with N above 0", 2)
    return count / per


class TokenBucket:
    """At most ``rate`` takes a second on average, bursts of up to ``burst``. :meth:`take`
    sleeps once, exactly until its token is due (no polling)."""

    def __init__(
        self,
        rate: float,
        burst: float = 1.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self._clock = clock
        self._sleep = sleep
        self._tokens = self.burst
        self._stamp = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def ready(self) -> bool:
        """True when :meth:`take` would not wait."""
        self._refill()
        return self._tokens >= 1.0

    async def take(self) -> None:
        """Take one token, waiting for it if none is left."""
        self._refill()
        if self._tokens < 1.0:
            await self._sleep((1.0 - self._tokens) / self.rate)
            self._refill()
        self._tokens -= 1.0


# -- reading ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Record:
    number: int
    key: str | None
    body: bytes
    trace_id: int | None


async def read_records(stream: BinaryIO, delimiter: bytes | None) -> AsyncIterator[bytes]:
    """The records of ``stream``: ``delimiter``-separated (a line's ``\\r\\n`` counts as its
    end), or the whole stream with ``None``. Reads in a worker thread, so that a slow or
    interactive stdin does not stall the event loop (heartbeats, publishes in flight)."""
    if delimiter is None:
        yield await asyncio.to_thread(stream.read)
        return
    if delimiter == b"\n":
        while raw := await asyncio.to_thread(stream.readline):
            line = raw[:-1] if raw.endswith(b"\n") else raw
            yield line[:-1] if line.endswith(b"\r") else line
        return
    read = getattr(stream, "read1", stream.read)
    pending = b""
    while chunk := await asyncio.to_thread(read, _CHUNK):
        pending += chunk
        *records, pending = pending.split(delimiter)
        for record in records:
            yield record
    if pending:
        yield pending


def _streams(files: Sequence[str]) -> list[str]:
    return list(files) or ["-"]


def _check_files(files: Sequence[str]) -> None:
    """Every FILE is there before anything is published (CliError, exit 2)."""
    if files.count("-") > 1:
        raise CliError("stdin ('-') can be read once", 2)
    for name in files:
        if name != "-" and not Path(name).is_file():
            raise CliError(f"cannot read {name!r}: no such file", 2)


def _open(name: str, stdin: BinaryIO) -> BinaryIO:
    if name == "-":
        return stdin
    try:
        return Path(name).open("rb")
    except OSError as exc:
        raise CliError(f"cannot read {name!r}: {exc.strerror or type(exc).__name__}", 2) from None


async def _records(
    args: argparse.Namespace, key: str | None, sep: bytes | None
) -> AsyncIterator[_Record | CliError]:
    """Every record of every FILE, numbered from 1, keyed (``--key-sep``) and traced."""
    delimiter = None if args.whole_file else parse_delimiter(args.delimiter)
    number = 0
    for name in _streams(args.files):
        stream = _open(name, sys.stdin.buffer)
        try:
            async for body in read_records(stream, delimiter):
                number += 1
                trace_id = secrets.randbits(63) if args.trace else None
                if sep is None:
                    yield _Record(number, key, body, trace_id)
                    continue
                head, found, rest = body.partition(sep)
                if not found:
                    yield CliError(f"line {number} has no key separator {sep!r}")
                    continue
                try:
                    record_key = head.decode()
                except UnicodeDecodeError:
                    yield CliError(f"line {number}: the key is not UTF-8")
                    continue
                yield _Record(number, record_key, rest, trace_id)
        finally:
            if stream is not sys.stdin.buffer:
                stream.close()


# -- progress --------------------------------------------------------------------------------


class _ProgressLine:
    """``published N, failed M (R/s)`` kept on one stderr line when stderr is a terminal and
    the input takes more than a second."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._on = out.isatty()
        self._started = time.monotonic()
        self._last = self._started
        self._shown = False

    def update(self, summary: dict[str, Any]) -> None:
        if not self._on:
            return
        now = time.monotonic()
        if now - self._started < _PROGRESS_AFTER or now - self._last < 0.25:
            return
        self._last = now
        rate = summary["published"] / max(now - self._started, 1e-9)
        text = f"published {summary['published']}, failed {summary['failed']} ({rate:,.0f}/s)"
        self._out.write(f"\r\x1b[K{text}")
        self._out.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self._out.write("\r\x1b[K")
            self._out.flush()


# -- the command -----------------------------------------------------------------------------


@dataclass(slots=True)
class _Tally:
    summary: dict[str, Any]
    errors: Counter[str]
    per_partition: Counter[str]

    def failed(self, number: int | None, key: str | None, error: object, as_json: bool) -> None:
        self.summary["failed"] += 1
        self.errors[str(error)] += 1
        if as_json:
            line: dict[str, Any] = {"ok": False, "error": str(error)}
            if number is not None:
                line = {"line": number, "ok": False, "key": key, "error": str(error)}
            print(json.dumps(line), flush=True)


def _check(args: argparse.Namespace, sep: bytes | None) -> None:
    if args.key is not None and sep is not None:
        raise CliError("give --key or --key-sep, not both", 2)
    if args.batch < 1:
        raise CliError("--batch must be at least 1", 2)
    if args.partition is not None and args.partition < 0:
        raise CliError("--partition must be 0 or more", 2)
    if args.defer is not None:
        if not 0 <= args.defer <= 3600:
            raise CliError("--defer must be 0..3600 seconds (nsqd's limit)", 2)
        if args.key is not None or sep is not None or args.partition is not None:
            raise CliError("--defer cannot be combined with --key, --key-sep or --partition", 2)
        if args.trace or args.ext is not None:
            raise CliError("--defer cannot be combined with --trace or --ext (DPUB has neither)", 2)


async def run_pub(args: argparse.Namespace) -> int:
    """``nsq-ha pub``: one message per record; a JSON summary at the end."""
    where = where_of(args)
    topic = topic_of(args)
    ext = parse_ext(args.ext)
    sep = parse_separator(args.key_sep)
    _check(args, sep)
    rate = parse_rate(args.rate)
    _check_files(args.files)
    bucket = None if rate is None else TokenBucket(rate)
    batch_size = 1 if args.defer is not None else args.batch
    lookup = LookupClient(where.lookupd) if where.lookupd else None
    tally = _Tally(
        {"topic": topic, "published": 0, "failed": 0, "partitions": {}}, Counter(), Counter()
    )
    progress = _ProgressLine(sys.stderr)
    try:
        if lookup is not None:
            pmap = await existing_map(lookup, topic, "w")  # fail fast on an unknown topic
            if args.defer is not None and pmap.fork:
                raise CliError("--defer: the fork has no DPUB (deferred publish is vanilla's)", 2)
            if args.partition is not None and not pmap.fork:
                raise CliError("--partition: vanilla topics have no partitions", 2)
            count = pmap.partition_num if pmap.meta is not None else len(pmap.partitions)
            if args.partition is not None and args.partition >= count:
                raise CliError(f"--partition {args.partition}: {topic!r} has {count} partitions", 2)
        kwargs = where.client_kwargs()
        if lookup is not None:
            kwargs = {"lookup": lookup, **{k: v for k, v in kwargs.items() if k != "lookupd"}}
        async with Producer(**kwargs) as producer:
            batch: list[_Record] = []
            async for item in _records(args, args.key, sep):
                if isinstance(item, CliError):
                    tally.failed(None, None, item, args.json)
                    continue
                if bucket is not None:
                    if batch and not bucket.ready():
                        await _publish_batch(producer, topic, batch, ext, args, tally)
                        batch = []
                    await bucket.take()
                batch.append(item)
                if len(batch) >= batch_size:
                    await _publish_batch(producer, topic, batch, ext, args, tally)
                    batch = []
                progress.update(tally.summary)
            if batch:
                await _publish_batch(producer, topic, batch, ext, args, tally)
    finally:
        progress.clear()
        if lookup is not None:
            await lookup.close()
    summary = tally.summary
    summary["partitions"] = dict(sorted(tally.per_partition.items()))
    summary["errors"] = [{"error": e, "count": n} for e, n in tally.errors.most_common(10)]
    print(json.dumps(summary, sort_keys=True), flush=True)
    return 1 if summary["failed"] else 0


def _result_json(record: _Record, result: PublishResult) -> dict[str, Any]:
    message_id = result.message_id
    return {
        "line": record.number,
        "ok": True,
        "key": record.key,
        "partition": result.partition,
        "offset": result.offset,
        "id": message_id.hex() if message_id else None,
        "trace_id": result.trace_id,
        "attempts": result.attempts,
        "nsqd": result.address,
    }


async def _publish_group(
    producer: Producer,
    topic: str,
    key: str | None,
    records: list[_Record],
    ext: dict[str, Any] | None,
    args: argparse.Namespace,
) -> list[PublishResult | BaseException]:
    try:
        if args.defer is not None:
            return [await producer.publish(topic, r.body, defer=args.defer) for r in records]
        results = await producer.publish_many(
            topic,
            [r.body for r in records],
            sharding_key=key,
            partition=args.partition,
            trace_ids=[r.trace_id for r in records] if args.trace else None,
            ext=ext,
        )
        return list(results)
    except PublishError as exc:
        if exc.results is not None and len(exc.results) == len(records):
            return [r if isinstance(r, PublishResult | BaseException) else exc for r in exc.results]
        return [exc] * len(records)
    except NsqError as exc:
        return [exc] * len(records)


async def _publish_batch(
    producer: Producer,
    topic: str,
    batch: list[_Record],
    ext: dict[str, Any] | None,
    args: argparse.Namespace,
    tally: _Tally,
) -> None:
    """Publish ``batch``: one ``publish_many`` per key (in record order), keys concurrently."""
    groups: dict[str | None, list[_Record]] = {}
    for record in batch:
        groups.setdefault(record.key, []).append(record)
    outcomes = await asyncio.gather(
        *(_publish_group(producer, topic, k, rs, ext, args) for k, rs in groups.items())
    )
    by_number: dict[int, tuple[_Record, PublishResult | BaseException]] = {}
    for records, results in zip(groups.values(), outcomes, strict=True):
        for record, result in zip(records, results, strict=True):
            by_number[record.number] = (record, result)
    for number in sorted(by_number):
        record, result = by_number[number]
        if isinstance(result, PublishResult):
            tally.summary["published"] += 1
            tally.per_partition["-" if result.partition is None else str(result.partition)] += 1
            if args.json:
                print(json.dumps(_result_json(record, result)), flush=True)
        else:
            tally.failed(number, record.key, result, args.json)
