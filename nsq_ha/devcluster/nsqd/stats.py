"""The emulated nsqd's ``/stats`` (PROTOCOL.md §5.6): the key sets in Go's struct order.

Only partitions hosted on the node (``node in part.replicas``), sorted by full name.
``client_pub_stats`` lists the TCP publishers (nsqd's, by remote address, gone with the
connection; ``client_num`` counts them). Where the emulation approximates: histograms are zeros
except that every stored message counts as one fast write; a channel's ``depth`` counts unread,
requeued, deferred **and in-flight** messages (the real one counts everything not yet
confirmed: what is in flight from before a seek is left out), ``depth_size`` sums their raw
sizes and ``depth_ts`` is the timestamp of the message the channel read from the log last
(nsqd's ``waitingProcessMsgTs``, :attr:`~nsq_ha.devcluster.store.Channel.read_ts`), printed in
UTC; the text form is a short summary.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from ..http import go_time_string
from ..model import FORK_VERSION, ChannelHub, DevNode, DevPartition, DevTopic

__all__ = ["stats_answer"]

_EPOCH = "1970-01-01 00:00:00 +0000 UTC"
_TRUE = ("1", "t", "T", "TRUE", "true", "True")


def stats_answer(topics: Iterable[DevTopic], node: DevNode, query: Mapping[str, str]) -> object:
    """``/stats`` of ``node``: JSON with ``format=json``, else a short text summary."""
    topic_name = query.get("topic", "")
    partition = query.get("partition", "")
    channel = query.get("channel", "")
    need_clients = query.get("needClients", "")
    leader_only = query.get("leaderOnly", "") in _TRUE
    filter_clients = need_clients != "true" and not (topic_name and need_clients == "")
    parts = [
        p
        for t in topics
        if not topic_name or t.name == topic_name
        for p in t.partitions
        if node in p.replicas and (p.led_by(node) or not leader_only)
    ]
    parts.sort(key=lambda p: f"{p.topic.name}-{p.number}")
    found: list[dict[str, Any]] = []
    for part in parts:
        if partition and str(part.number) != partition:
            continue
        stats = _topic_stats(part, part.led_by(node), filter_clients, channel if topic_name else "")
        if channel:
            chosen = [c for c in stats["channels"] if c["channel_name"] == channel]
            stats["channels"] = chosen or stats["channels"]
        found.append(stats)
    if query.get("format") != "json":
        return _stats_text(node, found)
    return {
        "version": FORK_VERSION,
        "health": "OK",
        "start_time": int(node.started_at),
        "topics": found,
    }


def _size_bucket(size: int) -> int:
    if size < 100:
        return 0
    if size < 1024:
        return 1
    return min(15, int(math.log2(size // 1024)) + 2)


def _topic_stats(
    part: DevPartition, leader: bool, filter_clients: bool, client_channel: str
) -> dict[str, Any]:
    topic = part.topic
    log = part.store.log
    channels = [
        _channel_stats(part, part.hubs[name], not filter_clients and client_channel in ("", name))
        for name in sorted(part.hubs)
    ]
    sizes = [0] * 16
    for message in log:
        sizes[_size_bucket(len(message.body))] += 1
    latencies = [0] * 16
    latencies[0] = len(log)
    statsd = topic.name
    if topic.ordered or topic.multi_part:
        statsd += f".{part.number}"
    return {
        "topic_name": topic.name,
        "topic_full_name": f"{topic.name}-{part.number}",
        "topic_partition": str(part.number),
        "channels": channels,
        "channel_num": len(channels),
        "depth": part.store.end,
        "backend_depth": part.store.end,
        "backend_start": 0,
        "message_count": len(log),
        "is_leader": leader,
        "hourly_pubsize": 0,
        "client_pub_stats": None if filter_clients else list(part.store.publishers.values()),
        "client_num": len(part.store.publishers),
        "msg_size_stats": sizes,
        "msg_write_latency_stats": latencies,
        "is_multi_ordered": topic.ordered,
        "is_multi_part": topic.multi_part,
        "is_ext": topic.ext,
        "is_channel_auto_create_disabled": topic.disable_channel_auto_create,
        "statsd_name": statsd,
        "pub_failed_cnt": 0,
        "e2e_processing_latency": {"count": 0, "percentiles": None},
    }


def _channel_stats(part: DevPartition, hub: ChannelHub, with_clients: bool) -> dict[str, Any]:
    channel = hub.channel
    unacked = list(part.store.log[channel.cursor :])
    unacked += [message for message, _ in channel.requeued]
    unacked += [item.message for item in channel.deferred if not item.to_end]
    # what a seek left behind (the message read ahead, delivered after it) is below nsqd's
    # confirmed position, which its depth counts from
    unacked += [f.message for f in channel.in_flight.values() if f.message.offset >= channel.floor]
    read_ts = channel.read_ts
    # nsqd's Backlogs: an ordered channel's depth, else what is deferred in memory plus what
    # the pump has not read yet
    backlogs = len(unacked) if channel.ordered else channel.delayed_count + channel.not_read
    return {
        "channel_name": channel.name,
        "backlogs": backlogs,
        "depth": len(unacked),
        "depth_size": sum(m.raw_size for m in unacked),
        "depth_ts": go_time_string(read_ts),
        "depth_ts_nano": read_ts,
        "backend_depth": len(unacked),
        "hourly_subsize": 0,
        "in_flight_count": len(channel.in_flight) + channel.delayed_count,
        "deferred_count": channel.delayed_count,
        "deferred_from_delay_count": 0,
        "message_count": len(part.store.log),
        "requeue_count": channel.requeue_count,
        "timeout_count": channel.timeout_count,
        "clients": [_client_stats(c) for c in hub.clients] if with_clients else None,
        "client_num": len(hub.clients),
        "paused": hub.paused,
        "skipped": hub.skipped,
        "zan_test_skipped": False,
        "delayed_queue_count": channel.delayed_queue_count,
        "delayed_queue_recent": _EPOCH,
        "delayed_queue_recent_nano": 0,
        "e2e_processing_latency": {"count": 0, "percentiles": None},
        "msg_consume_latency_stats": [0] * 12,
        "msg_delivery_latency_stats": [0] * 12,
    }


def _client_stats(client: object) -> dict[str, Any]:
    """One subscriber as ``ClientStats`` (durations in nanoseconds, as Go marshals them)."""

    def get(name: str, default: Any) -> Any:
        return getattr(client, name, default)

    client_id = str(get("client_id", ""))
    return {
        "name": client_id,
        "client_id": client_id,
        "hostname": get("hostname", ""),
        "version": "V2",
        "remote_address": get("remote_address", ""),
        "state": int(get("state", 3)),
        "ready_count": int(get("rdy", 0)),
        "in_flight_count": int(get("in_flight_count", 0)),
        "message_count": int(get("message_count", 0)),
        "finish_count": int(get("finish_count", 0)),
        "requeue_count": int(get("requeue_count", 0)),
        "timeout_count": int(get("timeout_count", 0)),
        "deferred_count": int(get("deferred_count", 0)),
        "connect_ts": int(get("connect_ts", 0)),
        "sample_rate": int(get("sample_rate", 0)),
        "deflate": bool(get("deflate", False)),
        "snappy": bool(get("snappy", False)),
        "user_agent": get("user_agent", ""),
        "desired_tag": get("desired_tag", ""),
        "tls": bool(get("tls", False)),
        "tls_cipher_suite": "",
        "tls_version": "",
        "tls_negotiated_protocol": "",
        "tls_negotiated_protocol_is_mutual": False,
        "output_buffer_size": int(get("output_buffer_size", 0)),
        "output_buffer_timeout": int(get("output_buffer_timeout_ms", 0)) * 1_000_000,
        "msg_timeout": round(float(get("msg_timeout", 60.0)) * 1_000_000_000),
        "ext_filter": _ext_filter_json(get("ext_filter", None) or {}),
        "limited_rdy": 50000,
    }


def _ext_filter_json(raw: Mapping[str, Any]) -> dict[str, Any]:
    """An IDENTIFY ``ext_filter`` as Go marshals ``ExtFilterData`` (struct order, every field
    ``omitempty``)."""
    keys = ("type", "inverse", "filter_ext_key", "filter_data")
    out = {key: raw[key] for key in keys if raw.get(key)}
    terms = [
        {k: term[k] for k in ("filter_ext_key", "filter_data") if term.get(k)}
        for term in raw.get("filter_data_list") or []
    ]
    if terms:
        out["filter_data_list"] = terms
    return out


def _stats_text(node: DevNode, topics: list[dict[str, Any]]) -> str:
    """A short text form of ``/stats`` (the real one prints much more)."""
    lines = [f"nsqd v{FORK_VERSION} (devcluster node {node.index})", "Health: OK"]
    for t in topics:
        lines.append(f"[{t['topic_full_name']}] depth: {t['depth']} leader: {t['is_leader']}")
        lines.extend(
            f"  [{c['channel_name']}] depth: {c['depth']} inflt: {c['in_flight_count']} "
            f"clients: {c['client_num']}"
            for c in t["channels"]
        )
    return "\n".join(lines) + "\n"
