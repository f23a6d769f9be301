"""Consumer lag without a server: the lag of a ``/stats`` entry (fork and vanilla), the
``lag_interval`` check, the cache's staleness, the gauges reading it, and the poller's thread."""

from __future__ import annotations

import logging
import math
import socket
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from nsq_ha import otel
from nsq_ha.admin import ChannelLag, channel_lag, entry_lag
from nsq_ha.cli.stats import rows_from_stats
from nsq_ha.consumer import Consumer
from nsq_ha.otel.lag import LagCache, LagPoller, check_interval, lags_from_stats
from nsq_ha.otel.metrics import Metrics


@pytest.fixture(autouse=True)
def not_instrumented() -> Iterator[None]:
    assert not otel.is_instrumented()
    yield
    otel.uninstrument()


def fork_entry(
    partition: int, *, leader: bool = True, **channels: dict[str, Any]
) -> dict[str, Any]:
    return {
        "topic_name": "t",
        "topic_partition": str(partition),
        "is_leader": leader,
        "channels": [{"channel_name": name, **numbers} for name, numbers in channels.items()],
    }


def vanilla_entry(**channels: dict[str, Any]) -> dict[str, Any]:
    return {
        "topic_name": "t",
        "channels": [{"channel_name": name, **numbers} for name, numbers in channels.items()],
    }


# -- the lag of a /stats entry ------------------------------------------------------------------


def test_fork_lag_is_depth_and_depth_size() -> None:
    channel = {"depth": 6, "depth_size": 420, "in_flight_count": 1, "deferred_count": 2}
    assert channel_lag(channel, fork=True) == ChannelLag(6, 420)
    # nsqd writes some numbers as strings
    assert channel_lag({"depth": "7", "depth_size": "99"}, fork=True) == ChannelLag(7, 99)
    assert channel_lag({"depth": 3}, fork=True) == ChannelLag(3, None)


def test_vanilla_lag_is_unfinished_messages_and_no_bytes() -> None:
    channel = {"depth": 6, "depth_size": 420, "in_flight_count": 1, "deferred_count": 2}
    assert channel_lag(channel, fork=False) == ChannelLag(9, None)
    assert channel_lag({"depth": 6, "in_flight_count": 1}, fork=False) == ChannelLag(None, None)
    assert channel_lag({"depth": True, "in_flight_count": 0, "deferred_count": 0}, fork=False) == (
        ChannelLag(None, None)
    )


def test_entry_lag_finds_the_channel_on_the_leader_only() -> None:
    entry = fork_entry(0, a={"depth": 2, "depth_size": 20}, b={"depth": 5, "depth_size": 50})
    assert entry_lag(entry, "b") == ChannelLag(5, 50)
    assert entry_lag(entry, "c") is None
    assert entry_lag(fork_entry(0, leader=False, b={"depth": 5}), "b") is None
    assert entry_lag(vanilla_entry(b={"depth": 1, "in_flight_count": 2, "deferred_count": 3}), "b")
    assert entry_lag({"topic_name": "t"}, "b") is None


def test_cli_rows_use_the_same_lag() -> None:
    numbers = {"depth": 4, "depth_size": 40, "in_flight_count": 1, "deferred_count": 1}
    for entry, fork in ((fork_entry(1, c=numbers), True), (vanilla_entry(c=numbers), False)):
        (row,) = rows_from_stats(entry, "n:4150")
        assert (row.lag_messages, row.lag_bytes) == ((4, 40) if fork else (6, None))
        lag = entry_lag(entry, "c")
        assert lag is not None
        assert (row.lag_messages, row.lag_bytes) == (lag.messages, lag.bytes)


def test_lags_from_stats_keeps_the_wanted_partitions_this_node_leads() -> None:
    entries = [
        fork_entry(0, c={"depth": 1, "depth_size": 10}),
        fork_entry(1, leader=False, c={"depth": 2, "depth_size": 20}),
        fork_entry(2, c={"depth": 3, "depth_size": 30}),
        fork_entry(3, other={"depth": 4, "depth_size": 40}),
    ]
    assert lags_from_stats(entries, "c", [0, 1, 3]) == {0: ChannelLag(1, 10)}
    assert lags_from_stats(entries, "c", [0, 1, 2, 3]) == {
        0: ChannelLag(1, 10),
        2: ChannelLag(3, 30),
    }
    vanilla = [vanilla_entry(c={"depth": 1, "in_flight_count": 1, "deferred_count": 0})]
    assert lags_from_stats(vanilla, "c", None) == {None: ChannelLag(2, None)}
    assert lags_from_stats(vanilla, "c", [0]) == {}  # a vanilla answer for a fork map: nothing
    assert lags_from_stats(entries, "c", None) == {}


# -- lag_interval -------------------------------------------------------------------------------


def test_check_interval() -> None:
    assert check_interval(None) is None
    assert check_interval(0.2) == 0.2
    assert check_interval(15) == 15.0
    assert isinstance(check_interval(15), float)
    for bad_type in (True, "15", [1.0]):
        with pytest.raises(TypeError):
            check_interval(bad_type)
    for bad_value in (0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="lag_interval"):
            check_interval(bad_value)


@pytest.mark.parametrize(
    ("value", "error"), [(0, ValueError), (math.inf, ValueError), ("1", TypeError)]
)
def test_instrument_refuses_a_bad_lag_interval(value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        otel.instrument(meter_provider=MeterProvider(), lag_interval=value)  # type: ignore[arg-type]
    assert not otel.is_instrumented()


# -- the cache and the gauges ------------------------------------------------------------------


def test_cache_drops_values_older_than_max_age() -> None:
    cache = LagCache(max_age=3.0)
    cache.put("t", "c", {0: ChannelLag(5, 50), 1: ChannelLag(1, 10)}, now=100.0)
    cache.put("t", "c", {1: ChannelLag(2, 20)}, now=102.0)
    assert dict(cache.fresh(103.0)) == {
        ("t", "c", 0): ChannelLag(5, 50),
        ("t", "c", 1): ChannelLag(2, 20),
    }
    assert dict(cache.fresh(103.5)) == {("t", "c", 1): ChannelLag(2, 20)}
    assert len(cache) == 1  # dropped, not only hidden
    assert cache.fresh(105.5) == []
    assert len(cache) == 0


def test_cache_retain_forgets_groups_no_consumer_has() -> None:
    cache = LagCache(max_age=3.0)
    cache.put("t", "c", {0: ChannelLag(5, 50)}, now=10.0)
    cache.put("t", "d", {None: ChannelLag(1, None)}, now=12.0)
    cache.retain([("t", "d"), ("t", "x")], now=12.0)
    assert dict(cache.fresh(12.0)) == {("t", "d", None): ChannelLag(1, None)}
    cache.retain([("t", "d")], now=15.5)  # stale by now
    assert len(cache) == 0


def lag_points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], int]]]:
    found: dict[str, list[tuple[dict[str, Any], int]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for m in scope.metrics:
                if m.name.startswith("nsq.consumer.lag"):
                    found[m.name] = sorted(
                        ((dict(p.attributes), p.value) for p in m.data.data_points),
                        key=lambda x: str(x[0]),
                    )
    return found


def test_gauges_report_the_fresh_values_of_the_cache() -> None:
    reader = InMemoryMetricReader()
    metrics = Metrics(MeterProvider(metric_readers=[reader]).get_meter("test"), lag_interval=1.0)
    now = time.monotonic()
    metrics.lag.put("t", "c", {0: ChannelLag(6, 60), 1: ChannelLag(3, 30)}, now)
    metrics.lag.put("v", "c", {None: ChannelLag(9, None)}, now)
    metrics.lag.put("old", "c", {0: ChannelLag(1, 1)}, now - 10)  # older than 3 intervals
    base = {"messaging.system": "nsq", "messaging.consumer.group.name": "c"}
    t = {**base, "messaging.destination.name": "t"}
    part = "messaging.destination.partition.id"
    assert lag_points(reader) == {
        "nsq.consumer.lag": [
            ({**t, part: "0"}, 6),
            ({**t, part: "1"}, 3),
            ({**base, "messaging.destination.name": "v"}, 9),
        ],
        "nsq.consumer.lag.bytes": [({**t, part: "0"}, 60), ({**t, part: "1"}, 30)],
    }
    metrics.active = False
    assert lag_points(reader) == {}


# -- the poller ---------------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def wait_until(check: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_poller_thread_runs_while_consumers_live_and_ends_without_them() -> None:
    consumers: weakref.WeakSet[Consumer] = weakref.WeakSet()
    poller = LagPoller(consumers, LagCache(max_age=0.3), interval=0.1)
    poller.start()
    wait_until(lambda: not poller.running)  # nobody to poll for: it ends by itself
    consumer = Consumer("t", "c", nsqd="127.0.0.1:4150")  # nsqd=: nothing to ask, no lag
    consumers.add(consumer)
    poller.start()
    assert poller.running
    consumers.discard(consumer)
    poller.forget()
    wait_until(lambda: not poller.running)
    consumers.add(consumer)
    poller.start()
    assert poller.running
    poller.stop()
    assert not poller.running
    poller.start()  # stopped for good
    assert not poller.running
    assert len(poller.cache) == 0


async def test_a_failing_poll_is_logged_once_per_streak_without_secrets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import httpx

    cache = LagCache(max_age=30.0)
    poller = LagPoller(weakref.WeakSet(), cache, interval=10.0)
    seed = f"http://user:s3cret@127.0.0.1:{closed_port()}"
    cache.put("t", "c", {0: ChannelLag(4, 40)}, time.monotonic())
    caplog.set_level(logging.DEBUG, logger="nsq_ha.otel.lag")
    async with httpx.AsyncClient(timeout=2.0) as http:
        for _ in range(3):
            await poller.poll(http, {("t", "c"): (seed,)})
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    debugs = [r for r in caplog.records if r.levelno == logging.DEBUG and "still" in r.message]
    assert len(warnings) == 1
    assert "t/c" in warnings[0].message
    assert len(debugs) == 2
    assert "s3cret" not in caplog.text
    assert dict(cache.fresh(time.monotonic())) == {("t", "c", 0): ChannelLag(4, 40)}  # kept
    assert cache.fresh(time.monotonic() + 30.1) == []  # for 3 intervals at most
