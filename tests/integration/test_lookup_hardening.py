"""LookupClient against lying nsqlookupds: slow, huge or malformed answers, and credentials.

Every lying lookupd is a small HTTP server in the test (:mod:`.lying_http`); the good lookupd
is the session's real vanilla nsqlookupd.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import tracemalloc

import pytest

from nsq_ha.admin import LookupdAdmin
from nsq_ha.consumer import Consumer
from nsq_ha.errors import (
    ConfigError,
    DiscoveryError,
    LookupdUnavailableError,
    NsqError,
    RemoteProtocolError,
)
from nsq_ha.lookup import LookupClient, normalize_lookupd
from nsq_ha.producer import Producer
from nsq_ha.testing.process import free_ports
from nsq_ha.testing.servers import ForkCluster, VanillaCluster
from tests.integration.lying_http import Handler, LyingHttpServer, answer, flood, trickler

SLACK = 2.0  # seconds allowed past a deadline (a loaded machine)
MEMORY_LIMIT = 64 << 20
LAG_LIMIT = 0.1
SECRET = "s3cr3t-Pa55word"  # noqa: S105 - a test credential


@pytest.fixture(scope="module")
def topic(vanilla_cluster: VanillaCluster) -> str:
    vanilla_cluster.create_topic("lookup_hardening")
    return "lookup_hardening"


# -- 5: a trickling lookupd ---------------------------------------------------------------------


async def test_a_trickling_lookupd_does_not_hold_back_a_good_one(
    vanilla_cluster: VanillaCluster, topic: str
) -> None:
    """The trickler is asked first (discovery and lookup); the good answer still comes promptly."""
    timeout = 3.0
    async with (
        LyingHttpServer(trickler()) as slow,
        LookupClient([slow.url, vanilla_cluster.lookupd_http], timeout=timeout) as client,
    ):
        start = time.monotonic()
        try:
            async with asyncio.timeout(timeout + SLACK):
                pmap = await client.writable(topic)
        except TimeoutError:
            pytest.fail(f"lookup still blocked after {time.monotonic() - start:.1f}s")
        assert len(pmap.routes()) == 2
        assert slow.requests, "the trickler was asked"
        # asked again, the good answer still comes at once (the trickler is skipped or late)
        async with asyncio.timeout(timeout + SLACK):
            again = await client.writable(topic, force=True)
        assert again == pmap


async def test_a_trickling_seed_does_not_hold_back_the_fork(
    fork_cluster: ForkCluster, fork_topic4: str
) -> None:
    """On the fork, /listlookup names the real lookupds; the trickling seed stays last."""
    timeout = 3.0
    async with (
        LyingHttpServer(trickler()) as slow,
        LookupClient([slow.url, fork_cluster.lookupd_http], timeout=timeout) as client,
    ):
        start = time.monotonic()
        try:
            async with asyncio.timeout(timeout + SLACK):
                pmap = await client.writable(fork_topic4)
        except TimeoutError:
            pytest.fail(f"lookup still blocked after {time.monotonic() - start:.1f}s")
        assert client.lookupds == [fork_cluster.lookupd_http, slow.url]
        assert [r.partition for r in pmap.routes()] == [0, 1, 2, 3]


async def test_a_lookup_against_only_a_trickler_fails_within_its_deadline() -> None:
    timeout = 1.0
    async with (
        LyingHttpServer(trickler()) as slow,
        LookupClient(slow.url, timeout=timeout) as client,
    ):
        start = time.monotonic()
        try:
            async with asyncio.timeout(timeout + SLACK):
                with pytest.raises(LookupdUnavailableError, match=r"within 1\.0 s"):
                    await client.lookup("lookup_hardening")
        except TimeoutError:
            pytest.fail(f"lookup still blocked after {time.monotonic() - start:.1f}s")
        status = client.lookupd_status()
        assert status[0][1] >= 1, "the trickler is counted as failed (backoff)"


async def test_publish_and_consumer_start_are_not_blocked_by_a_trickler(
    vanilla_cluster: VanillaCluster, topic: str
) -> None:
    """Producer and Consumer (default lookup timeout 5 s) with a trickler first in the list."""
    async with LyingHttpServer(trickler()) as slow:
        lookupd = [slow.url, vanilla_cluster.lookupd_http]
        try:
            async with asyncio.timeout(5.0 + SLACK):
                async with Producer(lookupd=lookupd) as producer:
                    result = await producer.publish(topic, b"through a trickler")
            assert result is not None
            async with asyncio.timeout(5.0 + SLACK):
                consumer = Consumer(topic, "hardening", lookupd=lookupd)
                await consumer.start()
                await consumer.close(drain_timeout=1.0)
        except TimeoutError:
            pytest.fail("publish() or Consumer.start() blocked by a trickling lookupd")


# -- 14: answers of any size --------------------------------------------------------------------


async def _refused(handler: Handler) -> tuple[NsqError, int, float]:
    """Look a topic up from the lying lookupd ``handler``, twice: once for the event-loop lag
    (the worst extra delay of a 5 ms ticker), once for the tracemalloc peak (traced apart:
    tracing slows everything down). Server and client are set up outside the measures.

    Returns the error of the first lookup, the memory peak (bytes) and the lag (seconds).
    """
    loop = asyncio.get_running_loop()
    worst = 0.0

    async def ticker() -> None:
        nonlocal worst
        for _ in range(100_000):  # bounded: ~10 minutes at most
            before = loop.time()
            await asyncio.sleep(0.005)
            worst = max(worst, loop.time() - before - 0.005)

    async with LyingHttpServer(handler) as liar, LookupClient(liar.url, timeout=30) as client:
        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.02)
        try:
            with pytest.raises(NsqError) as info:
                await client.lookup("lookup_hardening", force=True)
        finally:
            tick.cancel()
            await asyncio.gather(tick, return_exceptions=True)
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            with pytest.raises(NsqError):
                await client.lookup("lookup_hardening", force=True)
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
    return info.value, peak, worst


@pytest.mark.parametrize(
    ("declared", "total"),
    [(None, 96 << 20), (181 << 20, 181 << 20)],
    ids=["endless-body", "declared-181MiB"],
)
async def test_a_huge_answer_is_cut_at_the_cap(declared: int | None, total: int) -> None:
    """A body that never ends (or declares 181 MiB) stops being read at the cap, typed error."""
    error, peak, lag = await _refused(flood(b'{"channels": ["', total=total, length=declared))
    assert peak < MEMORY_LIMIT, f"peak {peak >> 20} MiB"
    assert lag < LAG_LIMIT, f"event loop stalled {lag * 1000:.0f} ms"
    assert isinstance(error, RemoteProtocolError), repr(error)[:300]
    assert "over the limit" in str(error)
    assert len(str(error)) < 1000


def _node(port: int) -> dict[str, object]:
    return {"broadcast_address": "127.0.0.1", "tcp_port": port, "http_port": port + 1}


@pytest.mark.parametrize(
    "body",
    [
        # 300 keys that all name partitions 0..254, spelled with leading zeros
        {"partitions": {"0" * (i // 255) + str(i % 255): _node(4150) for i in range(300)}},
        {"partitions": {"0": _node(4150)}, "meta": {"partition_num": 1_000_000}},
        # as many keys as fit under the size cap
        {"partitions": {str(i): 0 for i in range(42_000)}},
    ],
    ids=["300-keys", "meta-million", "42k-keys"],
)
async def test_too_many_partitions_is_refused(body: dict[str, object]) -> None:
    error, peak, lag = await _refused(answer(json.dumps(body).encode()))
    assert peak < MEMORY_LIMIT, f"peak {peak >> 20} MiB"
    assert lag < LAG_LIMIT, f"event loop stalled {lag * 1000:.0f} ms"
    assert isinstance(error, RemoteProtocolError), repr(error)[:300]
    assert "partition" in str(error)
    assert len(str(error)) < 1000


async def test_a_bad_answer_does_not_spoil_the_good_ones(
    vanilla_cluster: VanillaCluster, topic: str
) -> None:
    """A lookupd whose answer is refused is skipped; the good lookupd's answer is used."""
    bad = {"partitions": {"0": _node(4150)}, "meta": {"partition_num": 1_000_000}}
    async with (
        LyingHttpServer(answer(bad)) as liar,
        LookupClient([liar.url, vanilla_cluster.lookupd_http], timeout=5) as client,
    ):
        pmap = await client.writable(topic)
        assert not pmap.fork
        assert len(pmap.routes()) == 2
        assert client.lookupd_status()[0][1] >= 1


# -- 16: credentials in a lookupd URL -----------------------------------------------------------


def _texts(exc: BaseException) -> str:
    """str and repr of ``exc`` and of every exception it chains to."""
    parts: list[str] = []
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            break
        parts += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(parts)


async def test_credentials_never_appear_in_reprs_logs_or_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    (dead_port,) = free_ports(1)
    texts: list[str] = []
    refused = answer({"message": "INTERNAL_ERROR"}, "500 Internal Server Error")
    async with LyingHttpServer(refused) as failing:
        seeds = [
            f"http://user:{SECRET}@127.0.0.1:{dead_port}",
            failing.url.replace("http://", f"http://user:{SECRET}@"),
        ]
        async with LookupClient(seeds, timeout=2) as client:
            for _ in range(2):
                with pytest.raises(NsqError) as info:
                    await client.lookup("lookup_hardening", force=True)
                texts.append(_texts(info.value))
            texts += [repr(client), str(client.lookupds), str(client.lookupd_status())]
        # the credentials were still sent, as HTTP basic auth
        token = base64.b64encode(f"user:{SECRET}".encode()).decode()
        assert failing.requests
        assert all(f"authorization: basic {token}".lower() in r.lower() for r in failing.requests)
        producer = Producer(lookupd=seeds)
        texts.append(repr(producer))
        await producer.close()
    with pytest.raises(ConfigError) as bad:
        normalize_lookupd(f"ftp://user:{SECRET}@127.0.0.1:4161")
    texts.append(_texts(bad.value))
    texts.append(caplog.text)
    texts += [str(r.args) for r in caplog.records]
    for text in texts:
        assert SECRET not in text
    assert any("user:***@127.0.0.1" in t for t in texts)


async def test_a_token_only_userinfo_is_hidden_too(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    (dead_port,) = free_ports(1)
    async with LookupClient(f"http://{SECRET}@127.0.0.1:{dead_port}", timeout=2) as client:
        with pytest.raises(DiscoveryError) as info:
            await client.lookup("lookup_hardening")
        shown = [repr(client), str(client.lookupds), _texts(info.value), caplog.text]
    for text in shown:
        assert SECRET not in text
    assert f"http://***@127.0.0.1:{dead_port}" in client.lookupds


async def test_the_admin_client_keeps_lookupd_credentials_out_of_urls_logs_and_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """LookupdAdmin sends a seed's password as HTTP basic auth, and shows it nowhere: not in
    httpx's request log lines, not in its errors (unreachable or refused)."""
    caplog.set_level(logging.DEBUG)
    (dead_port,) = free_ports(1)
    refused = answer({"message": "INTERNAL_ERROR"}, "500 Internal Server Error")
    texts: list[str] = []
    async with LyingHttpServer(refused) as failing:
        for seed in (
            f"http://user:{SECRET}@127.0.0.1:{dead_port}",
            failing.url.replace("http://", f"http://user:{SECRET}@"),
        ):
            async with LookupdAdmin(seed, timeout=2) as admin:
                with pytest.raises(NsqError) as info:
                    await admin.create_topic("admin_hardening", wait=False)
                texts += [_texts(info.value), repr(admin)]
        token = base64.b64encode(f"user:{SECRET}".encode()).decode()
        assert failing.requests
        assert all(f"authorization: basic {token}".lower() in r.lower() for r in failing.requests)
        assert all(SECRET not in r.split("\r\n", 1)[0] for r in failing.requests)  # not in URLs
    texts += [caplog.text, *(str(r.args) for r in caplog.records)]
    for text in texts:
        assert SECRET not in text
    assert any("user:***@127.0.0.1" in t for t in texts)
