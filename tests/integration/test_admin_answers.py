"""LookupdAdmin and NsqdAdmin against servers whose answers are huge or built to be costly:
each answer is read only up to its cap and parsed without stalling the event loop, so a lying
server cannot grow the client by more than 64 MiB or stall its loop for more than 100 ms."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from nsq_ha.admin import AdminError, LookupdAdmin, NsqdAdmin
from nsq_ha.errors import NsqError, RemoteProtocolError

from .lying_admin import routes, stats_entries
from .lying_http import Handler, LyingHttpServer, answer, flood
from .lying_nsqd import LoopLag

MEMORY_LIMIT = 64 << 20
LAG_LIMIT = 0.1
HUGE = 80 << 20

Call = Callable[[Any], Awaitable[object]]


async def _measured(
    handler: Handler, make: Callable[[str], Any], call: Call
) -> tuple[object, int, float]:
    """Run ``call`` on the client ``make(url)`` builds, against ``handler``, twice: once under
    a loop-lag ticker, once under tracemalloc (traced apart: tracing slows everything down).
    Returns what the first run returned or raised, the memory peak and the worst lag.

    The garbage left by earlier tests is collected first: else the objects a parse makes can
    set off a full collection of the whole test process (tens of ms per few 100,000 objects),
    a cost of what the process holds, not of this call."""
    gc.collect()
    async with LyingHttpServer(handler) as liar:
        client = make(liar.url)
        try:
            async with LoopLag() as lag:
                try:
                    outcome: object = await call(client)
                except NsqError as exc:
                    outcome = exc
                # a few ticks more: a stall at the very end is measured by the tick after it
                await asyncio.sleep(5 * lag.period)
            tracemalloc.start()
            try:
                tracemalloc.reset_peak()
                base = tracemalloc.get_traced_memory()[0]
                with contextlib.suppress(NsqError):
                    await call(client)
                peak = tracemalloc.get_traced_memory()[1] - base
            finally:
                tracemalloc.stop()
        finally:
            await client.close()
    return outcome, peak, lag.worst


LOOKUPD_PATHS: dict[str, tuple[str, Call]] = {
    "topics": ("/topics", lambda a: a.topics()),
    "nodes": ("/nodes", lambda a: a.nodes()),
    "leader": ("/listlookup", lambda a: a.leader()),
    "topic_create": ("/topic/create", lambda a: a.create_topic("t", wait=False)),
}


@pytest.mark.parametrize("name", LOOKUPD_PATHS)
async def test_a_huge_lookupd_admin_answer_is_cut_at_the_cap(name: str) -> None:
    """An 80 MiB answer (a JSON list that never closes) is refused at the cap, naming it."""
    path, call = LOOKUPD_PATHS[name]
    handler = routes({path: flood(b'{"topics": ["', total=HUGE)})
    outcome, peak, lag = await _measured(handler, lambda url: LookupdAdmin(url, timeout=30), call)
    assert isinstance(outcome, RemoteProtocolError), repr(outcome)[:300]
    assert "max_answer_bytes" in str(outcome)
    assert len(str(outcome)) < 1000
    assert peak < MEMORY_LIMIT // 4, f"peak {peak >> 20} MiB"
    assert lag < LAG_LIMIT, f"event loop stalled {lag * 1000:.0f} ms"


async def test_a_declared_huge_lookupd_answer_is_refused_before_reading() -> None:
    handler = routes({"/topics": flood(b'{"topics": [', total=1 << 20, length=HUGE)})
    outcome, peak, _ = await _measured(handler, LookupdAdmin, lambda a: a.topics())
    assert isinstance(outcome, RemoteProtocolError), repr(outcome)[:300]
    assert f"announced a {HUGE}-byte answer" in str(outcome)
    assert peak < 1 << 20


NSQD_CALLS: dict[str, Call] = {
    "stats": lambda n: n.stats(),
    "create_channel": lambda n: n.create_channel("t", "c", 0),
}


@pytest.mark.parametrize("name", NSQD_CALLS)
async def test_a_huge_nsqd_answer_is_cut_at_the_cap(name: str) -> None:
    outcome, peak, lag = await _measured(
        flood(b'{"topics": [', total=HUGE), lambda url: NsqdAdmin(url, timeout=30), NSQD_CALLS[name]
    )
    assert isinstance(outcome, AdminError), repr(outcome)[:300]
    assert "more than" in str(outcome)
    assert "bytes" in str(outcome)
    assert len(str(outcome)) < 1000
    assert peak < MEMORY_LIMIT // 4, f"peak {peak >> 20} MiB"
    assert lag < LAG_LIMIT, f"event loop stalled {lag * 1000:.0f} ms"


async def test_a_big_honest_stats_answer_is_parsed_without_stalling_the_loop() -> None:
    """3.2 MiB of real-looking fork /stats entries (some 1,300 topic partitions, just under
    the value limit): read whole, parsed in slices between which the loop runs."""
    body = stats_entries(int(3.2 * (1 << 20)))
    outcome, peak, lag = await _measured(
        answer(body), lambda url: NsqdAdmin(url, timeout=30), lambda n: n.stats()
    )
    assert isinstance(outcome, list), repr(outcome)[:300]
    assert len(outcome) > 1200
    assert outcome[7]["topic_name"] == "topic_7"
    assert outcome[7]["channels"][1]["channel_name"] == "other"
    assert peak < MEMORY_LIMIT, f"peak {peak >> 20} MiB"
    assert lag < LAG_LIMIT, f"event loop stalled {lag * 1000:.0f} ms"


@pytest.mark.parametrize(
    "unit",
    [b"{},", b"[],", b'"ab",', b"1.5,"],
    ids=["empty-objects", "empty-lists", "short-strings", "floats"],
)
async def test_a_stats_answer_built_to_expand_is_refused_in_bounded_memory(unit: bytes) -> None:
    """Under the byte cap, but millions of tiny values (each a Python object dozens of times
    its JSON size): refused before parsing, memory and loop unharmed."""
    count = (7 << 20) // len(unit)
    body = b'{"topics": [' + unit * count + b"0]}"
    outcome, peak, lag = await _measured(
        answer(body), lambda url: NsqdAdmin(url, timeout=30), lambda n: n.stats()
    )
    assert isinstance(outcome, AdminError), repr(outcome)[:300]
    assert "values" in str(outcome)
    assert peak < MEMORY_LIMIT, f"peak {peak >> 20} MiB"
    assert lag < LAG_LIMIT, f"event loop stalled {lag * 1000:.0f} ms"
