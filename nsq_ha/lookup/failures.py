"""What a failed lookup raises, and what its message tells the user to do next.

An address that answered something that is not HTTP is asked once more, in NSQ's own protocol
(:func:`looks_like_nsqd`): nsqd's TCP port (4150, given for lookupd's HTTP port 4161, the usual
mix-up) answers anything but its magic with ``E_BAD_PROTOCOL``, and the message then says so.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from nsq_ha.errors import (
    LookupdNeverAnsweredError,
    LookupdUnavailableError,
    NsqError,
    RemoteProtocolError,
    TopicNotFoundError,
    TopicNotWritableError,
)
from nsq_ha.lookup.wire import Access, LookupdError, PartitionMap

__all__ = [
    "NSQD_TCP_PORT",
    "looks_like_nsqd",
    "lookup_failure",
    "missing_on_fork",
    "never_answered",
    "not_http",
    "unwritable",
]

#: What an address that answers with nsqd's E_BAD_PROTOCOL is told.
NSQD_TCP_PORT = "this looks like nsqd's TCP port (4150): lookupd's HTTP port is usually 4161"
_CHECK = (
    "check the address: nsqlookupd's HTTP port (usually 4161), that nsqlookupd runs there and "
    "is reachable from here"
)
_CHECK_PORT = (
    "check the port (nsqlookupd's HTTP port, usually 4161, not nsqd's TCP port 4150) and the "
    "scheme (http:// or https://)"
)
#: The most of a probe's answer read: nsqd's whole E_BAD_PROTOCOL frame is 22 bytes.
_PROBE_BYTES = 256


def missing_on_fork(topic: str, detail: str = "") -> TopicNotFoundError:
    """A fork topic nsqlookupd does not know (``detail``: lookupd's own words)."""
    said = f" ({detail})" if detail else ""
    return TopicNotFoundError(
        f"topic {topic!r} does not exist in the cluster{said}: on the fork, topics are created "
        f"by an operator, with nsq-ha topic create --lookupd URL --topic {topic} --partitions N "
        f"--replicas R or nsq_ha.admin.LookupdAdmin.create_topic({topic!r}, partitions=N, "
        "replicas=R)"
    )


def lookup_failure(topic: str, access: Access, errors: Sequence[object]) -> NsqError:
    """The error of a lookup no lookupd answered with a map, from what each one raised."""
    for err in errors:
        # matched on the message: the wrapped envelope reports these as HTTP 500
        msg = err.message if isinstance(err, LookupdError) else ""
        if "no channel" in msg:
            return TopicNotWritableError(
                f"topic {topic!r} has no channel yet, so nsqlookupd hides it from writers: "
                "subscribe a consumer (or nsqd POST /channel/create) first, or run nsqlookupd "
                "with --allow-write-with-nochannels=true"
            )
        if msg == "TOPIC_NOT_FOUND":
            return TopicNotFoundError(
                f"topic {topic!r} is not known to nsqlookupd (vanilla): it is created by the "
                "first publish to an nsqd (use nsqd= addresses, or nsq-ha pub --nsqd HOST:4150)"
            )
        if msg == "Key not found":
            return missing_on_fork(topic, msg)
    for kind in (LookupdError, RemoteProtocolError):
        for err in errors:
            if isinstance(err, kind):
                return err
    detail = "; ".join(str(e) for e in errors) or "no nsqlookupd to ask"
    return LookupdUnavailableError(f"lookup of {topic!r} (access={access}) failed: {detail}")


def unwritable(pmap: PartitionMap) -> NsqError:
    """The error of an ``access=w`` map without a route."""
    topic = pmap.topic
    if pmap.fork and (pmap.meta is None or pmap.partition_num == 0):
        return missing_on_fork(topic)
    if pmap.fork:
        return TopicNotWritableError(
            f"topic {topic!r} has {pmap.partition_num} partitions but none is writable now "
            "(new topic not yet checked by nsqlookupd, writes disabled, or leaders failing "
            "over): retry later"
        )
    return TopicNotFoundError(
        f"no nsqd has topic {topic!r} (vanilla): publish through nsqd= addresses to create it"
    )


def never_answered(tried: Sequence[tuple[str, str]]) -> LookupdNeverAnsweredError:
    """No lookupd has answered since the client started: ``tried`` is (address, what it did)."""
    what = "; ".join(f"{shown}: {reason}" for shown, reason in tried) or "none given"
    reasons = " ".join(reason for _, reason in tried)
    if NSQD_TCP_PORT in reasons:
        advice = "give nsqlookupd's HTTP address"
    elif "not HTTP" in reasons:
        advice = _CHECK_PORT
    else:
        advice = _CHECK
    return LookupdNeverAnsweredError(
        f"no nsqlookupd has answered yet (tried {what}): {advice}. A lookupd that never "
        "answered is taken for a wrong address and not retried; one that answered once is "
        "retried through outages"
    )


def not_http(detail: str, nsqd: bool) -> str:
    """Why an address whose answer was not HTTP failed (``nsqd``: it spoke NSQ's protocol)."""
    if nsqd:
        return f"it answered nsqd's E_BAD_PROTOCOL, not HTTP: {NSQD_TCP_PORT}"
    return f"its answer is not HTTP ({detail})"


async def looks_like_nsqd(url: str) -> bool:
    """Whether ``url``'s host and port answer like nsqd's TCP port: a request that is not
    NSQ's magic gets ``E_BAD_PROTOCOL``. The caller bounds the time; any failure is False."""
    import httpx

    parsed = httpx.URL(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        reader, writer = await asyncio.open_connection(parsed.host, port)
    except OSError:
        return False
    try:
        writer.write(b"GET / HTTP/1.1\r\n\r\n")  # what an HTTP client sends first
        await writer.drain()
        answer = await reader.read(_PROBE_BYTES)
    except OSError:
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return b"E_BAD_PROTOCOL" in answer
