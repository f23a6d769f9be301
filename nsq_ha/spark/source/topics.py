"""The topics nsqlookupd lists, and the replayable stream's per-topic offsets.

:func:`list_topics` asks nsqlookupd (``GET /topics``) for ``topicPattern``'s candidates (the
option values are read in :mod:`nsq_ha.spark.topic_set`). Offsets: :func:`encode_offset` /
:func:`decode_offset` (the stream's JSON ``{"channel": C, "topics": {"a": {"0": 123}}}``; the
single-topic form an older release wrote, ``{"topic": T, "channel": C, "partitions":
{"0": 123}}``, is read as the same thing), :func:`flatten` and :func:`nest`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import LookupdUnavailableError, NsqError, RemoteProtocolError
from ...lookup.http import (
    ADMIN_TIMEOUT,
    Endpoint,
    get_answer,
    normalize_lookupd,
    tls_context,
)
from ...lookup.wire import unwrap

__all__ = [
    "TopicPartition",
    "decode_offset",
    "encode_offset",
    "flatten",
    "list_topics",
    "nest",
]

log = logging.getLogger("nsq_ha.spark")

#: a /topics answer larger than this is refused unread (a million short names fit)
_MAX_LIST_BYTES = 64 << 20

TopicPartition = tuple[str, int]


def encode_offset(channel: str, positions: Mapping[TopicPartition, int]) -> dict[str, Any]:
    """The stream's offset: ``{"channel": C, "topics": {"a": {"0": 123}}}``, sorted (Spark
    compares offsets by their JSON text)."""
    topics: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(positions.items()):
        topics.setdefault(topic, {})[str(partition)] = int(offset)
    return {"channel": channel, "topics": topics}


def decode_offset(offset: Mapping[str, Any]) -> tuple[str, dict[TopicPartition, int]]:
    """The channel and the positions of an offset :func:`encode_offset` wrote, or of the
    single-topic form of older releases (``{"topic": T, "channel": C, "partitions": {...}}``,
    as checkpoints written before several topics hold it)."""
    channel = str(offset["channel"])
    if "topics" in offset:
        return channel, {
            (str(t), int(p)): int(o)
            for t, parts in offset["topics"].items()
            for p, o in parts.items()
        }
    topic = str(offset["topic"])
    return channel, {(topic, int(p)): int(o) for p, o in offset["partitions"].items()}


def flatten(nested: Mapping[str, Mapping[int, int]]) -> dict[TopicPartition, int]:
    return {(t, p): o for t, parts in nested.items() for p, o in parts.items()}


def nest(flat: Mapping[TopicPartition, int]) -> dict[str, dict[int, int]]:
    result: dict[str, dict[int, int]] = {}
    for (topic, partition), offset in flat.items():
        result.setdefault(topic, {})[partition] = offset
    return result


# -- listing topics ---------------------------------------------------------------------------


async def list_topics(
    lookupd: Sequence[str],
    timeout: float = ADMIN_TIMEOUT,  # noqa: ASYNC109
) -> list[str]:
    """Every topic the nsqlookupds list (``GET /topics``, all of them asked at once, the
    answers merged: a vanilla nsqlookupd knows only its own nsqds' topics), sorted. Raises
    :class:`~nsq_ha.errors.LookupdUnavailableError` when none answers within ``timeout``."""
    import httpx

    endpoints = [Endpoint.parse(normalize_lookupd(a)) for a in lookupd]

    async def ask(http: httpx.AsyncClient, endpoint: Endpoint) -> list[str]:
        async with asyncio.timeout(timeout):
            answer = await get_answer(http, endpoint, "/topics", None, max_bytes=_MAX_LIST_BYTES)
        where = f"{endpoint.shown}/topics"
        data = unwrap(answer.status, answer.headers, answer.body, where)
        names = data.get("topics") if isinstance(data, dict) else None
        if names is None:
            return []
        if not isinstance(names, list):
            raise RemoteProtocolError(f"nsqlookupd {where}: 'topics' is not a list")
        return [n for n in names if isinstance(n, str)]

    async with httpx.AsyncClient(timeout=timeout, verify=tls_context()) as http:
        answers = await asyncio.gather(*(ask(http, e) for e in endpoints), return_exceptions=True)
    found: set[str] = set()
    errors: list[str] = []
    for endpoint, answer in zip(endpoints, answers, strict=True):
        if isinstance(answer, BaseException):
            if not isinstance(answer, NsqError | httpx.HTTPError | TimeoutError):
                raise answer
            errors.append(f"{endpoint.shown}: {answer!r}")
            continue
        found.update(answer)
    if errors and len(errors) == len(endpoints):
        raise LookupdUnavailableError("no nsqlookupd listed its topics: " + "; ".join(errors))
    for error in errors:
        log.warning("listing topics: %s", error)
    return sorted(found)
