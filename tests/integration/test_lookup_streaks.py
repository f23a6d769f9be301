"""LookupClient's log during a lookupd outage: one warning when a streak of failures starts,
debug lines while it lasts, one info line when the lookupd answers again, for a lookupd and for
the periodic refresh of a watched topic alike, and how soon each is tried again (the waits of
:data:`nsq_ha.retry.LOOKUPD`, capped at the refresh interval). The outage is a relay in front
of the embedded broker's lookupd, taken down and brought back on the same port (a lookupd
restart).
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from nsq_ha.devcluster import DevCluster
from nsq_ha.errors import NsqError
from nsq_ha.lookup import LookupClient
from nsq_ha.testing.process import free_ports

from .log_waiter import waiting_for
from .lookupd_proxy import LookupdProxy
from .tcp_relay import TcpRelay

BOUND = 15.0  # seconds: every wait of this test


async def test_a_refresh_outage_logs_one_warning_and_one_recovery_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="nsq_ha")
    async with DevCluster(nodes=1) as cluster, LookupdProxy(cluster.lookupd_http) as proxy:
        cluster.create_topic("watched", partitions=1)
        async with (
            TcpRelay("127.0.0.1", int(proxy.url.rsplit(":", 1)[1])) as relay,
            LookupClient(
                f"http://127.0.0.1:{relay.port}", refresh_interval=0.05, max_backoff=0.05
            ) as client,
        ):
            await client.lookup("watched", "w")  # lookupd has answered
            client.watch("watched", "w")
            with (
                waiting_for("nsq_ha.lookup", "periodic lookup of watched", 5) as failures,
                waiting_for("nsq_ha.lookup", "works again") as recovered,
            ):
                await relay.down()
                caplog.clear()
                async with asyncio.timeout(BOUND):
                    await failures.event.wait()  # five refreshes failed
                await relay.up()
                async with asyncio.timeout(BOUND):
                    await recovered.event.wait()
    lines = [
        (r.levelno, r.getMessage()) for r in caplog.records if r.name.startswith("nsq_ha.lookup")
    ]
    warnings = [m for level, m in lines if level == logging.WARNING]
    assert len(warnings) == 2, warnings  # the lookupd's streak and the refresh's streak
    assert any("nsqlookupd" in w and "failed" in w for w in warnings), warnings
    assert any("periodic lookup of watched" in w for w in warnings), warnings
    infos = [m for level, m in lines if level == logging.INFO]
    assert any("answers again" in m for m in infos), infos
    assert any("periodic lookup of watched (access=w) works again" in m for m in infos), infos


async def test_a_failed_periodic_refresh_is_retried_before_the_next_round_with_growing_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="nsq_ha")
    async with DevCluster(nodes=1) as cluster, LookupdProxy(cluster.lookupd_http) as proxy:
        cluster.create_topic("watched", partitions=1)
        async with (
            TcpRelay("127.0.0.1", int(proxy.url.rsplit(":", 1)[1])) as relay,
            LookupClient(
                f"http://127.0.0.1:{relay.port}", refresh_interval=1.0, jitter=0
            ) as client,
        ):
            await client.lookup("watched", "w")
            client.watch("watched", "w")
            with (
                waiting_for("nsq_ha.lookup", "(access=w) failed on attempt 3") as third,
                waiting_for("nsq_ha.lookup", "works again") as recovered,
            ):
                await relay.down()
                caplog.clear()
                async with asyncio.timeout(5.0):  # the round at 1 s, then 0.5 s and 1 s waits
                    await third.event.wait()
                await relay.up()
                async with asyncio.timeout(BOUND):
                    await recovered.event.wait()
            assert client.cached("watched", "w") is not None
    lines = [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name.startswith("nsq_ha.lookup") and "periodic lookup of watched" in r.getMessage()
    ]
    assert lines[0][0] == logging.WARNING
    assert lines[0][1].startswith("periodic lookup of watched (access=w) failed on attempt 1 (")
    assert "next try in 0.50 s" in lines[0][1]
    assert lines[1][0] == logging.DEBUG
    assert lines[1][1].startswith("periodic lookup of watched (access=w) failed on attempt 2 (")
    assert lines[1][1].endswith("next try in 1.00 s")  # doubled, and capped at the interval
    assert lines[-1][0] == logging.INFO
    assert lines[-1][1].startswith("periodic lookup of watched (access=w) works again (after ")


async def test_a_lookupd_failing_again_and_again_is_skipped_for_at_most_the_refresh_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="nsq_ha")
    (port,) = free_ports(1)  # nothing listens: every request is refused at once
    async with LookupClient(f"http://127.0.0.1:{port}") as client:
        for _ in range(12):  # bounded: two failures for the first lookup, one for each other
            with pytest.raises(NsqError):
                await client.lookup("t", force=True)
            ((_, failures, skipped),) = client.lookupd_status()
            if failures >= 9:
                break
    assert failures >= 9  # 0.5 s doubled eight times is 128 s: the cap rules
    assert 0 < skipped <= client.refresh_interval + 0.5
    messages = [r.getMessage() for r in caplog.records if r.name == "nsq_ha.lookup.client"]
    assert messages[1].startswith(f"nsqlookupd http://127.0.0.1:{port} failed on attempt 2 (")
    assert " next try in " in messages[1]
