"""LookupClient's log during a lookupd outage: one warning when a streak of failures starts,
debug lines while it lasts, one info line when the lookupd answers again, for a lookupd and for
the periodic refresh of a watched topic alike. The outage is a relay in front of the embedded
broker's lookupd, taken down and brought back on the same port (a lookupd restart).
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from nsq_ha.devcluster import DevCluster
from nsq_ha.lookup import LookupClient

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
