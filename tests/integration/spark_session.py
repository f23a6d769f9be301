"""What the Spark test modules share: a local session with the ``nsq`` source registered, and
waiting for a streaming query. Imported only by modules that ``importorskip`` pyspark."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pyspark.sql import SparkSession

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
