"""LookupdAdmin and NsqdAdmin against servers that trickle their answers (one byte every 0.5 s,
so no single read ever waits long): every call ends by its one overall deadline, connect, every
request and every read of the body included, with an NsqTimeoutError saying what to do."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from nsq_ha.admin import LookupdAdmin, NsqdAdmin
from nsq_ha.errors import ConfigError, NsqTimeoutError

from .lying_admin import routes
from .lying_http import LyingHttpServer, answer, trickler

TIMEOUT = 1.0
SLACK = 1.0  # seconds allowed past a deadline (a loaded machine)
#: how long a test waits before calling the call hung (bounded, far past the deadline)
HUNG = TIMEOUT + SLACK + 5

LOOKUPD_CALLS: dict[str, Callable[[LookupdAdmin], Awaitable[object]]] = {
    "leader": lambda a: a.leader(),
    "post": lambda a: a.post("/topic/create", {"topic": "t"}),
    "topics": lambda a: a.topics(),
    "nodes": lambda a: a.nodes(),
    "delete_topic": lambda a: a.delete_topic("t"),
    "channel_targets": lambda a: a.channel_targets("t"),
    "create_channel": lambda a: a.create_channel("t", "c"),
    "create_topic": lambda a: a.create_topic("t", 2, multi_part=True, timeout=TIMEOUT),
    "wait_stable": lambda a: a.wait_stable(TIMEOUT),
    "move_leader": lambda a: a.move_leader("t", 0, timeout=TIMEOUT),
    "expand_topic": lambda a: a.expand_topic("t", 3, timeout=TIMEOUT),
}

NSQD_CALLS: dict[str, Callable[[NsqdAdmin], Awaitable[object]]] = {
    "stats": lambda n: n.stats(),
    "topic_stats": lambda n: n.topic_stats("t", 0),
    "create_channel": lambda n: n.create_channel("t", "c", 0),
    "delete_channel": lambda n: n.delete_channel("t", "c", 0),
    "empty_channel": lambda n: n.empty_channel("t", "c", 0),
    "pause_channel": lambda n: n.pause_channel("t", "c", 0),
    "set_offset": lambda n: n.set_offset("t", "c", 0, "special:-1"),
    "set_order": lambda n: n.set_order("t", "c", 0, ordered=True),
    "delete_topic": lambda n: n.delete_topic("t"),
}


async def _ends_by_the_deadline(call: Awaitable[object], deadline: float) -> NsqTimeoutError:
    """Await ``call``; it must fail with NsqTimeoutError within ``deadline`` + SLACK seconds."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        async with asyncio.timeout(HUNG):
            with pytest.raises(NsqTimeoutError) as info:
                await call
    except TimeoutError:
        pytest.fail(f"still running {HUNG:g} s after a {deadline:g} s deadline")
    elapsed = loop.time() - start
    assert elapsed < deadline + SLACK, f"ended after {elapsed:.2f} s"
    assert elapsed > deadline * 0.8, f"ended after {elapsed:.2f} s: before its deadline?"
    return info.value


@pytest.mark.parametrize("name", LOOKUPD_CALLS)
async def test_every_lookupd_admin_call_ends_by_its_deadline(name: str) -> None:
    async with (
        LyingHttpServer(trickler(interval=0.5)) as slow,
        LookupdAdmin(slow.url, timeout=TIMEOUT) as admin,
    ):
        error = await _ends_by_the_deadline(LOOKUPD_CALLS[name](admin), TIMEOUT)
    text = str(error)
    assert f"within {TIMEOUT:g} s" in text
    assert "timeout" in text
    assert "check" in text
    assert slow.url.removeprefix("http://") in text


@pytest.mark.parametrize("name", NSQD_CALLS)
async def test_every_nsqd_admin_call_ends_by_its_deadline(name: str) -> None:
    async with (
        LyingHttpServer(trickler(interval=0.5)) as slow,
        NsqdAdmin(slow.url, timeout=TIMEOUT) as nsqd,
    ):
        error = await _ends_by_the_deadline(NSQD_CALLS[name](nsqd), TIMEOUT)
    text = str(error)
    assert f"within {TIMEOUT:g} s" in text
    assert "timeout" in text
    assert "check" in text
    assert slow.url in text


async def test_a_shared_http_client_does_not_lift_the_nsqd_deadline() -> None:
    """NsqdAdmin(http=shared) keeps its own deadline (the shared client's read timeout is
    longer and never fires on a trickle)."""
    import httpx

    async with (
        LyingHttpServer(trickler(interval=0.5)) as slow,
        httpx.AsyncClient(timeout=60) as http,
    ):
        await _ends_by_the_deadline(NsqdAdmin(slow.url, http=http, timeout=TIMEOUT).stats(), 1.0)


async def test_create_topics_deadline_counts_from_the_call_start() -> None:
    """The time taken to find the leader lookupd counts in create_topic's deadline, even when
    the client's own timeout is longer."""
    async with (
        LyingHttpServer(trickler(interval=0.5)) as slow,
        LookupdAdmin(slow.url, timeout=30) as admin,
    ):
        error = await _ends_by_the_deadline(admin.create_topic("t", timeout=TIMEOUT), TIMEOUT)
    assert "create_topic" in str(error)


async def test_a_slow_lookupd_after_the_leader_still_ends_by_create_topics_deadline() -> None:
    """The leader answers at once; the /topic/create answer trickles: the call ends by its
    deadline all the same."""
    handler = routes({"/listlookup": answer(None), "/topic/create": trickler(interval=0.5)})
    async with LyingHttpServer(handler) as liar, LookupdAdmin(liar.url, timeout=30) as admin:
        await _ends_by_the_deadline(admin.create_topic("t", 2, timeout=TIMEOUT), TIMEOUT)
    assert any("/topic/create" in r for r in liar.requests)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, 0.0, "3"])
async def test_bad_deadlines_are_refused_before_anything_is_sent(bad: object) -> None:
    async with LyingHttpServer(answer(None)) as liar:
        with pytest.raises(ConfigError, match="timeout"):
            LookupdAdmin(liar.url, timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="timeout"):
            NsqdAdmin(liar.url, timeout=bad)  # type: ignore[arg-type]
        async with LookupdAdmin(liar.url) as admin:
            with pytest.raises(ConfigError, match="timeout"):
                await admin.create_topic("t", timeout=bad)  # type: ignore[arg-type]
            with pytest.raises(ConfigError, match="timeout"):
                await admin.move_leader("t", 0, timeout=bad)  # type: ignore[arg-type]
            with pytest.raises(ConfigError, match="timeout"):
                await admin.wait_stable(timeout=bad)  # type: ignore[arg-type]
    assert liar.requests == []
