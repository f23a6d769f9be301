"""``nsq-ha pub``: publish records of stdin or files; a summary at the end.

A record is a line (the default), a ``--delimiter``-separated piece, or a whole file
(``--whole-file``); FILE ``-`` is stdin. ``--rate N/s`` spaces publishes with a token bucket
(a sleep until the next token, never a busy loop); ``--defer`` sends DPUB (vanilla only: the
fork has no DPUB); on a terminal a progress line is kept up to date on stderr. A keyed record
(``--key``, ``--key-sep``) goes to the partition ``--strategy`` picks (one of
:data:`nsq_ha.routing.STRATEGIES`; murmur3 by default): every producer of a topic must use the
same strategy, or a key's messages are split between partitions and lose their order.

Records are published in rounds (``--batch``; a round also goes as soon as the input pauses, so
``tail -f log | nsq-ha pub`` publishes each line as it comes). Every record gets its own verdict:
one refused by the client's checks (too long, empty) or by nsqd (its ``--max-msg-size``) does
not stop the others of its round, and none is published twice.

The summary goes to stdout: one line for a person when stdout is a terminal, else (a pipe, a
file: what scripts parse) one JSON object, as with ``--json``, which also prints a JSON line per
record before it. Exit 0: all published; 1: some record failed; 130: Ctrl-C, which stops
reading at once (even from a stdin that stays open), lets what the producer holds be
acknowledged (or reported as not published) and prints the summary first.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import contextlib
import json
import secrets
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from nsq_ha.lookup import LookupClient
from nsq_ha.producer import Producer
from nsq_ha.routing import DEFAULT_STRATEGY, STRATEGIES

from .arguments import wait
from .records import Oversized, read_records
from .rounds import Record, Rounds, Tally, summary_line
from .where import CliError, existing_map, json_object, topic_of, where_of

__all__ = [
    "DESCRIPTION",
    "TokenBucket",
    "add_pub_options",
    "parse_delimiter",
    "parse_ext",
    "parse_rate",
    "parse_separator",
    "run_pub",
]

#: the progress line appears after this many seconds, then is refreshed this often
_PROGRESS_AFTER = 1.0


#: ``nsq-ha pub --help``'s description
DESCRIPTION = (
    "Publish each line (or each --delimiter separated record, or each whole file) of the "
    "FILEs, or of stdin, as one message to TOPIC (nsq-ha pub TOPIC [FILE...]; with --topic T "
    "every argument is a FILE). Keyed records (--key, --key-sep) go to the partition "
    "--strategy picks: every producer of a topic must use the same strategy, or a key's "
    "messages lose their order. At the end a summary goes to stdout (published, failed, "
    "per-partition counts, errors): one line when stdout is a terminal; one JSON object when "
    "it is not a terminal (a pipe or a file: scripts parse it) or with --json. "
    "Exit status 0: every record published; 1: some record failed (each gets its own error, "
    "the others are still published); 2: bad input, nothing sent; 130: Ctrl-C, after the "
    "summary of what was published."
)


def _strategy_help() -> str:
    named = "; ".join(f"{s.name}: {s.description}" for s in STRATEGIES.values())
    text = f"how a key picks its partition ({named}; default: {DEFAULT_STRATEGY.name})"
    return text.replace("%", "%%")  # argparse formats help with %


def add_pub_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``pub`` (after ``--topic``), and its description."""
    parser.description = DESCRIPTION
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
        "--strategy",
        choices=list(STRATEGIES),
        default=DEFAULT_STRATEGY.name,
        help=_strategy_help(),
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
        type=wait,
        metavar="SECONDS",
        help="deliver each message this much later (DPUB: vanilla nsqd only)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="one JSON line per record, and the summary as JSON even on a terminal (when "
        "stdout is not a terminal the summary is JSON anyway)",
    )


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


@dataclass(frozen=True, slots=True)
class _Refused:
    """A record refused before it reached the producer (too long, no key, ...)."""

    number: int
    error: str


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


def _too_long(piece: Oversized) -> str:
    return (
        f"the record is {piece.size} bytes, over the message size limit of {piece.limit} "
        "bytes: not published (split it into smaller records)"
    )


async def _records(
    args: argparse.Namespace,
    key: str | None,
    sep: bytes | None,
    *,
    max_size: int,
    stop: asyncio.Event,
    on_idle: Callable[[], Awaitable[None]],
) -> AsyncGenerator[Record | _Refused, None]:
    """Every record of every FILE, numbered from 1, keyed (``--key-sep``) and traced; nothing
    more once ``stop`` is set (Ctrl-C)."""
    delimiter = None if args.whole_file else parse_delimiter(args.delimiter)
    number = 0
    for name in _streams(args.files):
        if stop.is_set():
            return
        stream = _open(name, sys.stdin.buffer)
        pieces = read_records(
            stream,
            delimiter,
            max_size=max_size,
            stop=stop,
            on_idle=on_idle,
            close=stream is not sys.stdin.buffer,
        )
        async with contextlib.aclosing(pieces):
            async for body in pieces:
                number += 1
                if isinstance(body, Oversized):
                    yield _Refused(number, _too_long(body))
                    continue
                trace_id = secrets.randbits(63) if args.trace else None
                if sep is None:
                    yield Record(number, key, body, trace_id)
                    continue
                head, found, rest = body.partition(sep)
                if not found:
                    yield _Refused(number, f"line {number} has no key separator {sep!r}")
                    continue
                try:
                    record_key = head.decode()
                except UnicodeDecodeError:
                    yield _Refused(number, f"line {number}: the key is not UTF-8")
                    continue
                yield Record(number, record_key, rest, trace_id)


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

#: seconds the publishes in flight at Ctrl-C get to be acknowledged; then they are reported as
#: not published (and a second Ctrl-C ends at once, without a summary)
INTERRUPT_GRACE = 3.0


def _check(args: argparse.Namespace, sep: bytes | None) -> None:
    if args.key is not None and sep is not None:
        raise CliError("give --key or --key-sep, not both", 2)
    if args.batch < 1:
        raise CliError("--batch must be at least 1", 2)
    if args.partition is not None and args.partition < 0:
        raise CliError("--partition must be 0 or more", 2)
    if args.defer is not None:
        if args.defer > 3600:
            raise CliError("--defer must be 0..3600 seconds (nsqd's limit)", 2)
        if args.key is not None or sep is not None or args.partition is not None:
            raise CliError("--defer cannot be combined with --key, --key-sep or --partition", 2)
        if args.trace or args.ext is not None:
            raise CliError("--defer cannot be combined with --trace or --ext (DPUB has neither)", 2)


async def run_pub(args: argparse.Namespace) -> int:
    """``nsq-ha pub``: one message per record; a summary at the end (one line on a terminal,
    else JSON).

    Exit 0: every record published; 1: some record failed (each has its own error); 130:
    interrupted (Ctrl-C), after the summary of what was published.
    """
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
    tally = Tally(
        {"topic": topic, "published": 0, "failed": 0, "partitions": {}}, Counter(), Counter()
    )
    progress = _ProgressLine(sys.stderr)
    stop = asyncio.Event()
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
        kwargs = {**where.client_kwargs(), "strategy": args.strategy}
        if lookup is not None:
            kwargs = {"lookup": lookup, **{k: v for k, v in kwargs.items() if k != "lookupd"}}
        async with Producer(**kwargs) as producer, _ctrl_c(stop, producer):
            rounds = Rounds(producer, topic, ext, args, tally, stop)
            records = _records(
                args,
                args.key,
                sep,
                max_size=producer.config.connection.max_msg_size,
                stop=stop,
                on_idle=rounds.flush,
            )
            async with contextlib.aclosing(records):
                async for item in records:
                    if isinstance(item, _Refused):
                        tally.failed(item.number, None, item.error, args.json)
                        continue
                    if bucket is not None:
                        if rounds.batch and not bucket.ready():
                            await rounds.flush()
                        if not await _unless_stopped(stop, bucket.take()):
                            rounds.batch.append(item)  # its turn had not come: not sent
                            break
                    rounds.batch.append(item)
                    if len(rounds.batch) >= batch_size:
                        await rounds.flush()
                    progress.update(tally.summary)
            if stop.is_set():
                rounds.drop()
            else:
                await rounds.flush()
    finally:
        progress.clear()
        if lookup is not None:
            await lookup.close()
    summary = tally.final(interrupted=stop.is_set())
    if args.json or not sys.stdout.isatty():
        print(json.dumps(summary, sort_keys=True), flush=True)
    else:
        print(summary_line(summary), flush=True)
    if stop.is_set():
        print("nsq-ha pub: interrupted", file=sys.stderr, flush=True)
        return 130
    return 1 if summary["failed"] else 0


@contextlib.asynccontextmanager
async def _ctrl_c(stop: asyncio.Event, producer: Producer) -> AsyncIterator[None]:
    """While inside, Ctrl-C (SIGINT) sets ``stop`` (reading ends, even a read waiting on an
    open stdin) and closes ``producer`` with :data:`INTERRUPT_GRACE`: what it holds is then
    acknowledged or failed, and nothing new is accepted. A second Ctrl-C interrupts at once."""
    loop = asyncio.get_running_loop()
    closing: list[asyncio.Task[None]] = []

    def interrupted() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)
        closing.append(loop.create_task(producer.close(timeout=INTERRUPT_GRACE)))

    try:
        loop.add_signal_handler(signal.SIGINT, interrupted)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or Windows
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        await asyncio.gather(*closing, return_exceptions=True)


async def _unless_stopped(stop: asyncio.Event, waiting: Awaitable[None]) -> bool:
    """Await ``waiting`` unless ``stop`` is set first (then it is cancelled): True if done."""
    if stop.is_set():
        if asyncio.iscoroutine(waiting):
            waiting.close()
        return False
    task = asyncio.ensure_future(waiting)
    stopper = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    for pending in (task, stopper):
        pending.cancel()
    if task in done:
        task.result()
        return True
    return False
