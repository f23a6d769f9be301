"""Lying nsqlookupd and nsqd HTTP answers for the admin tests, built on :mod:`.lying_http`.

:func:`routes` answers each path with its own handler (a vanilla lookupd's 404 for the others,
so :class:`~nsq_ha.admin.LookupdAdmin` goes on to the path under test); :func:`stats_entries`
builds an honest ``/stats`` body of a given size.
"""

from __future__ import annotations

import asyncio
import json

from .lying_http import Handler, answer

NOT_FOUND = answer({"message": "NOT_FOUND"}, "404 Not Found")


def routes(table: dict[str, Handler], other: Handler = NOT_FOUND) -> Handler:
    """Answer a request for a path of ``table`` (query left out) with its handler, any other
    with ``other`` (404 by default: a vanilla nsqlookupd has no ``/listlookup``)."""

    async def handle(request_head: str, writer: asyncio.StreamWriter) -> None:
        parts = request_head.split(" ", 2)
        path = parts[1].split("?", 1)[0] if len(parts) > 2 else ""
        await table.get(path, other)(request_head, writer)

    return handle


def fork_stats_entry(i: int) -> dict[str, object]:
    """One topic partition of a fork nsqd's ``/stats`` (two channels, no clients), about
    2.5 KB of JSON: the shape and size a real answer has."""
    latency = {"percentiles": [{"quantile": q, "value": 1000 * q} for q in (0.5, 0.9, 0.99)]}
    channel = {
        "channel_name": "ch",
        "backlogs": 0,
        "depth": 12,
        "depth_size": 4096,
        "depth_ts": "",
        "depth_ts_nano": 0,
        "backend_depth": 4096,
        "hourly_subsize": [0] * 24,
        "in_flight_count": 1,
        "deferred_count": 0,
        "deferred_from_delay_count": 0,
        "message_count": 1000,
        "requeue_count": 0,
        "timeout_count": 0,
        "clients": None,
        "client_num": 2,
        "paused": False,
        "skipped": False,
        "zan_test_skipped": False,
        "delayed_queue_count": 0,
        "delayed_queue_recent": "",
        "delayed_queue_recent_nano": 0,
        "e2e_processing_latency": latency,
        "msg_consume_latency_stats": [0] * 16,
        "msg_delivery_latency_stats": [0] * 16,
    }
    return {
        "topic_name": f"topic_{i}",
        "topic_full_name": f"topic_{i}-0",
        "topic_partition": "0",
        "channels": [channel, {**channel, "channel_name": "other"}],
        "channel_num": 2,
        "depth": 4096,
        "backend_depth": 4096,
        "backend_start": 0,
        "message_count": 1000,
        "is_leader": True,
        "hourly_pubsize": [0] * 24,
        "client_pub_stats": None,
        "client_num": 0,
        "msg_size_stats": [0] * 16,
        "msg_write_latency_stats": [0] * 16,
        "is_multi_ordered": False,
        "is_multi_part": False,
        "is_ext": False,
        "is_channel_auto_create_disabled": False,
        "statsd_name": f"topic_{i}.0",
        "pub_failed_cnt": 0,
        "e2e_processing_latency": latency,
    }


def stats_entries(size: int) -> bytes:
    """A ``/stats`` answer of fork entries, as many as fit in ``size`` bytes."""
    one = len(json.dumps(fork_stats_entry(0))) + 2
    topics = [fork_stats_entry(i) for i in range(max(1, size // one))]
    return json.dumps({"version": "0.3.7-HA", "health": "OK", "topics": topics}).encode()
