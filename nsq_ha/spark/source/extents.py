"""The replayable source's extents, without pyspark: what each partition retains, the
offsets a batch may read within ``maxBytesPerTrigger``, and what is lost when they are not
retained (``failOnDataLoss``); the topics a read resolves to, and whether they are the fork's.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from ..._sync_runtime import loop_thread
from ...admin import NsqdAdmin
from ...errors import (
    DiscoveryError,
    LookupdUnavailableError,
    NsqError,
    UnsupportedByServerError,
)
from ...lookup import LookupClient
from ...lookup.http import ADMIN_TIMEOUT, tls_context
from ...lookup.wire import NodeInfo
from ..options import Endpoint
from ..topic_set import TopicSet
from .topics import list_topics

__all__ = [
    "DataLossError",
    "Extent",
    "apply_byte_limit",
    "check_ending",
    "check_planned_end",
    "check_retained",
    "fetch_extents",
    "fetch_topic_extents",
    "resolve_topics",
]

log = logging.getLogger("nsq_ha.spark")


class DataLossError(NsqError):
    """The offsets a query must read next are no longer retained by nsqd."""


def _run(coro: Any, timeout: float | None = None) -> Any:
    # the blocking clients' loop (nsq_ha.sync.shared_loop), without importing them: a read
    # task's worker has no use for the producer
    return asyncio.run_coroutine_threadsafe(coro, loop_thread().loop).result(timeout)


# -- replayable source: extents, limits, ranges ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Extent:
    """What a partition retains: ``[start, end)`` in queue bytes (``backend_start``,
    ``backend_depth`` of its leader's ``/stats``)."""

    start: int
    end: int


async def _leaders(lookupd: Sequence[str], topic: str) -> tuple[bool, dict[int, NodeInfo]]:
    async with LookupClient(list(lookupd)) as lookup:
        pmap = await lookup.lookup(topic, "w", force=True)
    return pmap.fork, dict(pmap.partitions)


def is_fork(endpoint: Endpoint, topic: str | None = None) -> bool:
    """Whether ``topic`` (default: the endpoint's) is on the fork in cluster mode (found
    through lookupd)."""
    if not endpoint.lookupd:
        return False
    fork, _ = _run(_leaders(endpoint.lookupd, endpoint.topic if topic is None else topic), 30.0)
    return bool(fork)


def resolve_topics(endpoint: Endpoint, topics: TopicSet, timeout: float = 30.0) -> list[str]:
    """The topics ``topics`` names now: its names, or those nsqlookupd lists that match its
    pattern (one ``GET /topics`` per nsqlookupd)."""
    if topics.fixed:
        return list(topics.names)
    listed = _run(list_topics(endpoint.lookupd, timeout), timeout + 5.0)
    return [t for t in listed if topics.matches(t)]


async def _extents(lookupd: Sequence[str], topic: str) -> dict[int, Extent]:
    return (await _leaders_and_extents(lookupd, topic))[1]


async def _leaders_and_extents(
    lookupd: Sequence[str], topic: str, only: int | None = None
) -> tuple[dict[int, NodeInfo], dict[int, Extent]]:
    """Each partition's leader (one lookup) and retained range (its leader's ``/stats``, one
    request per partition); with ``only``, that partition's range alone (one request)."""
    fork, leaders = await _leaders(lookupd, topic)
    if not fork:
        raise UnsupportedByServerError(
            f"{topic!r} is not on the fork in cluster mode: the replayable source needs "
            "partition offsets (use mode=driver)"
        )
    result: dict[int, Extent] = {}
    wanted = (
        sorted(leaders.items())
        if only is None
        else [(only, leaders[only])]
        if only in leaders
        else []
    )
    async with httpx.AsyncClient(timeout=ADMIN_TIMEOUT, verify=tls_context()) as http:
        for partition, node in wanted:
            entries = await NsqdAdmin(node.http_url, http=http).topic_stats(topic, partition)
            for entry in entries:
                if entry.get("topic_name") == topic and entry.get("topic_partition") == str(
                    partition
                ):
                    start = int(entry["backend_start"])
                    end = int(entry["backend_depth"])
                    result[partition] = Extent(start, max(start, end))
                    break
            else:
                raise DiscoveryError(
                    f"the leader {node.address} of {topic}/{partition} does not list it in /stats"
                )
    return leaders, result


def fetch_extents(endpoint: Endpoint) -> dict[int, Extent]:
    """Each partition's retained range, from its leader (raises if the topic is not on the
    fork in cluster mode)."""
    return dict(_run(_extents(endpoint.lookupd, endpoint.topic), 60.0))


def fetch_topic_extents(
    endpoint: Endpoint, topics: Sequence[str], *, skip_missing: bool = False
) -> dict[str, dict[int, Extent]]:
    """Each partition's retained range of each topic (the topics asked at once). A topic
    that is not there, not yet writable, or not on the fork raises, or with ``skip_missing``
    (topics a pattern found: one may be deleted or still being made) is left out and logged;
    nsqlookupd not answering raises either way."""

    async def one(topic: str) -> dict[int, Extent] | None:
        try:
            return await _extents(endpoint.lookupd, topic)
        except LookupdUnavailableError:
            raise
        except (DiscoveryError, UnsupportedByServerError) as exc:
            if not skip_missing:
                raise
            log.info("%s: left out for now: %s", topic, exc)
            return None

    async def every() -> list[dict[int, Extent] | None]:
        gate = asyncio.Semaphore(16)  # a pattern may match many topics: 16 at a time

        async def gated(topic: str) -> dict[int, Extent] | None:
            async with gate:
                return await one(topic)

        return await asyncio.gather(*(gated(t) for t in topics))

    if not topics:
        return {}
    found = _run(every(), 60.0 + 10.0 * (len(topics) // 16))
    return {t: e for t, e in zip(topics, found, strict=True) if e is not None}


#: a partition of the byte limit: a partition number, or a (topic, partition)
K = TypeVar("K", int, tuple[str, int])


def apply_byte_limit(
    start: Mapping[K, int], ends: Mapping[K, int], max_bytes: int | None
) -> dict[K, int]:
    """The end offsets of the next batch: all of ``ends``, or, with ``max_bytes``, at most that
    many bytes shared fairly between the partitions that have data (water-filling: a partition
    with little data leaves its share to the others). An end may fall inside a message: the
    message that starts before it belongs to this batch."""
    wanted = {p: max(0, end - start.get(p, end)) for p, end in ends.items()}
    if max_bytes is None or sum(wanted.values()) <= max_bytes:
        return dict(ends)
    grant = dict.fromkeys(wanted, 0)
    left = max_bytes
    open_parts = sorted(p for p, w in wanted.items() if w > 0)
    while left > 0 and open_parts:
        share = max(1, left // len(open_parts))
        for p in list(open_parts):
            take = min(share, wanted[p] - grant[p], left)
            grant[p] += take
            left -= take
            if grant[p] >= wanted[p]:
                open_parts.remove(p)
            if left <= 0:
                break
    return {p: start.get(p, ends[p]) + grant[p] for p in ends}


def check_retained(
    start: Mapping[int, int],
    extents: Mapping[int, Extent],
    *,
    fail: bool,
    topic: str,
    what: str = "offset",
) -> dict[int, int]:
    """``start`` with every offset nsqd does not hold moved to the partition's first retained
    one, or :class:`DataLossError` when ``fail`` (``failOnDataLoss``, as in Kafka's connector).

    Two cases: an offset before the first retained one (retention deleted those messages),
    and one past the partition's end (the topic was deleted and re-created: the offset counts
    bytes of a queue that is gone, and what the new one holds would never be read). ``what``
    names the offset in the messages (``startingOffsets`` for a batch read)."""
    result = dict(start)
    for p, offset in start.items():
        extent = extents.get(p)
        if extent is None or extent.start <= offset <= extent.end:
            continue
        if offset < extent.start:
            gone = extent.start - offset
            text = (
                f"{topic}/{p}: offsets {offset}..{extent.start} ({gone} bytes) are no longer "
                f"retained by nsqd"
            )
            if fail:
                raise DataLossError(
                    f"{text}; set failOnDataLoss=false to skip to the first retained message"
                )
            log.warning("%s; skipping them (failOnDataLoss=false)", text)
        else:
            text = (
                f"{topic}/{p}: {what} {offset} is past the partition's end {extent.end}: the "
                "topic was deleted and re-created (or the offset is not of this cluster), so "
                f"what it holds now ({extent.start}..{extent.end}) would never be read"
            )
            if fail:
                raise DataLossError(
                    f"{text}; set failOnDataLoss=false to read the partition from its first "
                    f"retained offset {extent.start}"
                )
            log.warning(
                "%s; reading it from its first retained offset %d (failOnDataLoss=false)",
                text,
                extent.start,
            )
        result[p] = extent.start
    return result


def check_ending(
    stop: Mapping[int, int], extents: Mapping[int, Extent], *, fail: bool, topic: str
) -> dict[int, int]:
    """A batch read's ``endingOffsets`` given as positions, checked as :func:`check_retained`
    checks a start: an end past the partition's end (never written there: the topic was
    re-created, or the offset is not of this cluster) or before its first retained offset
    (the range is no longer retained) raises :class:`DataLossError` when ``fail``; otherwise
    it is logged and the range ends at the partition's end (or is empty)."""
    result = dict(stop)
    for p, offset in stop.items():
        extent = extents.get(p)
        if extent is None or extent.start <= offset <= extent.end:
            continue
        if offset > extent.end:
            text = (
                f"{topic}/{p}: endingOffsets {offset} is past the partition's end "
                f"{extent.end} (the topic was deleted and re-created, or those messages were "
                "never written)"
            )
            result[p] = extent.end
            advice, doing = "read up to it", f"reading up to {extent.end}"
        else:
            text = (
                f"{topic}/{p}: endingOffsets {offset} is before the first retained offset "
                f"{extent.start}: the messages up to it are no longer retained by nsqd"
            )
            result[p] = extent.start
            advice, doing = "read nothing of the partition", "nothing of it is read"
        if fail:
            raise DataLossError(f"{text}; set failOnDataLoss=false to {advice}")
        log.warning("%s; %s (failOnDataLoss=false)", text, doing)
    return result


def check_planned_end(
    stop: Mapping[int, int], extents: Mapping[int, Extent], *, fail: bool, topic: str
) -> list[int]:
    """The partitions of a planned stream batch run again (planned before a restart, never
    committed) whose end lies past the partition's end now: the topic was deleted and
    re-created shorter, so the range is of a queue that is gone and can never be read whole.
    :class:`DataLossError` when ``fail``; otherwise logged, and those partitions are returned
    to be skipped: the next batch starts at that end, past the
    partition's, and so reads the partition from its first retained offset, once."""
    skipped: list[int] = []
    for p, offset in sorted(stop.items()):
        extent = extents.get(p)
        if extent is None or offset <= extent.end:
            continue
        text = (
            f"{topic}/{p}: the batch planned up to {offset} before the restart ends past the "
            f"partition's end {extent.end}: the topic was deleted and re-created, so its "
            "messages are not those the batch planned"
        )
        if fail:
            raise DataLossError(
                f"{text}; set failOnDataLoss=false to skip the batch and read the partition "
                f"from its first retained offset {extent.start} in the next one"
            )
        log.warning(
            "%s; skipping the batch's range, the next batch reads the partition from its first "
            "retained offset %d (failOnDataLoss=false)",
            text,
            extent.start,
        )
        skipped.append(p)
    return skipped


def new_channel_name() -> str:
    """A channel for one query (kept in its offsets, so a restart reuses it)."""
    return f"spark_{uuid.uuid4().hex[:16]}"
