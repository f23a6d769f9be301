"""Shared helpers of the scenarios: arguments, the cluster, unique names, waiting, the report.

Every scenario is ``python scenarios/<name>.py [--lookupd URL] [--messages N] [-v]``. Without
``--lookupd`` it starts the embedded 3-node fork cluster in-process; with it, it uses that real
cluster. Either way topics are created through :class:`nsq_ha.admin.LookupdAdmin` under unique
names, consumers are subscribed before anything is published, and the last line printed is
``PASSED`` or ``FAILED: <why>`` (exit status 0 only for ``PASSED``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import secrets
import sys
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from nsq_ha.consumer import Consumer, Message

__all__ = [
    "Report",
    "cluster",
    "consume",
    "parse_args",
    "print_table",
    "run",
    "unique",
    "wait_connected",
    "wait_progress",
]

#: how long a consumer may go without receiving anything new before the scenario gives up
IDLE_TIMEOUT = 60.0
#: how long to keep consuming after everything arrived, so late duplicates are seen too
LINGER = 1.0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(doc: str, messages: int, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The common command line; ``doc`` is the scenario's docstring (its help text)."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--lookupd",
        metavar="URL",
        help="HTTP URL of a real fork nsqlookupd (default: start the embedded 3-node cluster)",
    )
    parser.add_argument(
        "--messages", type=_positive, default=messages, help=f"how many (default {messages})"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log the client's INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return args


@contextlib.asynccontextmanager
async def cluster(args: argparse.Namespace) -> AsyncIterator[str]:
    """Yield the lookupd HTTP URL: ``--lookupd``, or an embedded cluster started here."""
    if args.lookupd:
        print(f"cluster: {args.lookupd} (given)")
        yield args.lookupd
        return
    from nsq_ha.devcluster import DevCluster

    async with DevCluster(nodes=3) as dev:
        print(f"cluster: embedded, lookupd {dev.lookupd_http}, {len(dev.nodes)} nsqd")
        yield dev.lookupd_http


def unique(prefix: str) -> str:
    """``prefix`` with a random suffix, so reruns against a real cluster never collide."""
    return f"{prefix}_{secrets.token_hex(3)}"


async def wait_connected(
    consumer: Consumer,
    partitions: Collection[int],
    timeout: float = 60.0,  # noqa: ASYNC109 - a deadline for the whole wait
) -> None:
    """Wait until ``consumer`` is subscribed to every partition in ``partitions``.

    On the fork a channel made by its first SUB starts at the partition's end, so nothing may
    be published before this returns."""
    deadline = time.monotonic() + timeout
    while True:
        connected = {partition for _, partition in consumer.connections}
        missing = set(partitions) - connected
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{consumer.topic}/{consumer.channel}: partitions {sorted(missing)} not "
                f"subscribed after {timeout:.0f}s (connected: {sorted(connected)})"
            )
        await asyncio.sleep(0.05)


async def consume(consumer: Consumer, on_message: Callable[[Message], object]) -> None:
    """Hand every message to ``on_message`` and finish it, until cancelled or closed."""
    async for message in consumer:
        on_message(message)
        await message.finish()


async def wait_progress(
    count: Callable[[], int],
    target: int,
    tasks: Sequence[asyncio.Task[None]],
    idle_timeout: float = IDLE_TIMEOUT,
) -> bool:
    """Wait until ``count()`` reaches ``target`` (then linger briefly), or until it stops
    growing for ``idle_timeout`` s; then cancel ``tasks``. True if the target was reached.
    A task that failed re-raises its error here."""
    last, last_change = count(), time.monotonic()
    try:
        while count() < target:
            for task in tasks:
                if task.done():
                    task.result()  # raises what the task failed with
                    raise RuntimeError(f"{task.get_name()} stopped before everything arrived")
            now = time.monotonic()
            if count() != last:
                last, last_change = count(), now
            elif now - last_change > idle_timeout:
                return False
            await asyncio.sleep(0.05)
        await asyncio.sleep(LINGER)
        return True
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A plain text table."""
    cells = [[str(h) for h in headers], *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [all(isinstance(row[i], int | float) for row in rows) for i in range(len(headers))]
    print(f"\n{title}")
    for n, row in enumerate(cells):
        aligned = zip(row, widths, numeric, strict=True)
        print("  " + "  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in aligned).rstrip())
        if n == 0:
            print("  " + "  ".join("-" * w for w in widths))


@dataclass
class Report:
    """The checks of one run; :meth:`finish` prints them and the final verdict line."""

    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((name, ok, detail))
        return ok

    def finish(self) -> int:
        print_table(
            "checks",
            ["check", "result", "detail"],
            [[name, "OK" if ok else "FAILED", detail] for name, ok, detail in self.checks],
        )
        failed = [f"{name} ({detail})" for name, ok, detail in self.checks if not ok]
        if not self.checks:
            failed = ["no check ran"]
        print(f"\nfinished in {time.monotonic() - self.started:.1f}s")
        print("PASSED" if not failed else f"FAILED: {'; '.join(failed)}", flush=True)
        return 0 if not failed else 1


def run(
    story: Callable[[argparse.Namespace, Report], Awaitable[None]], doc: str, messages: int
) -> NoReturn:
    """Parse the arguments, run ``story`` and exit with the report's verdict. An exception
    (a timeout, a refused admin request) fails the run with its message."""
    args = parse_args(doc, messages)
    report = Report()

    async def main() -> None:
        await story(args, report)

    try:
        asyncio.run(main())
    except Exception as exc:  # any error fails the scenario, with its message
        traceback.print_exc(file=sys.stderr)
        report.check("ran to the end", False, f"{type(exc).__name__}: {exc}")
    sys.exit(report.finish())
