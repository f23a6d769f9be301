"""What the Spark test modules share: a local session with the ``nsq`` source registered,
waiting for a streaming query, and reading back what a write stored. Imported only by
modules that ``importorskip`` pyspark."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import SparkSession

from nsq_ha import Consumer
from nsq_ha.spark import register


@contextmanager
def local_spark(
    app: str, master: str = "local[2]", conf: dict[str, str] | None = None
) -> Iterator[SparkSession]:
    """A Spark session for one test module: no UI, quiet logs, the ``nsq`` source registered,
    Python workers on this interpreter; stopped afterwards."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = SparkSession.builder.master(master).appName(app).config("spark.ui.enabled", "false")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


def run_until(query: Any, done: Callable[[], bool], timeout: float) -> None:
    """Poll ``done`` until it holds (the query failing, or ``timeout`` s, fails the test);
    stop the query either way."""
    deadline = time.monotonic() + timeout
    try:
        while not done():
            if query.exception() is not None:
                raise AssertionError(f"the query failed: {query.exception()}")
            assert time.monotonic() < deadline, "the query did not get there in time"
            time.sleep(0.2)
    finally:
        query.stop()


async def consume_stored(
    topic: str, channel: str, count: int, limit: float, **where: Any
) -> list[Any]:
    """Every stored message of ``topic`` on ``channel`` until ``count`` arrived and nothing
    more comes for a second (so duplicates written to the topic are seen too), finished one
    by one.

    A message nsqd delivers again (same partition, same id) is the same stored message, not a
    second write: it is finished and left out. The fork does this on its own: the first
    ``SUB_ORDERED`` on a channel turns it ordered and resets its reader to the confirmed
    offset, so a message already sent may be sent again (its first ``FIN`` then fails with
    "not in flight"). Only the writes are under test here."""
    got: list[Any] = []
    seen: set[tuple[int | None, bytes]] = set()
    redelivered = 0
    deadline = time.monotonic() + limit
    async with Consumer(topic, channel, max_in_flight=200, **where) as consumer:
        while time.monotonic() < deadline:
            wait = 1.0 if len(got) >= count else deadline - time.monotonic()
            message = await consumer.get(timeout=max(0.1, wait))
            if message is None:
                if len(got) >= count:
                    break
                continue
            stored = (message.partition, message.id)
            if stored in seen:
                redelivered += 1
            else:
                seen.add(stored)
                got.append(message)
            await message.finish()
    if redelivered:
        print(f"\n{topic}/{channel}: nsqd delivered {redelivered} message(s) again (left out)")
    return got
