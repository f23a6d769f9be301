"""One message published on one NsqdConnection the way the producer does it: a typed
:class:`~nsq_ha.protocol.publish.Publish` through ``command()`` (the connection's one publish
path), the message checked first as the producer checks it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from nsq_ha.connection import NsqdConnection
from nsq_ha.errors import RemoteProtocolError
from nsq_ha.protocol.frames import OK
from nsq_ha.protocol.publish import Publish, PublishMessage, encode_ext_header
from nsq_ha.protocol.trace import TracedResponse, parse_traced_response


def pub_command(
    topic: str,
    body: bytes,
    partition: int | None = None,
    *,
    trace_id: int | None = None,
    header: Mapping[str, object] | None = None,
) -> Publish:
    """PUB, PUB_TRACE (``trace_id``) or PUB_EXT (``header``) of one message."""
    ext = None if header is None else encode_ext_header(header)
    name = b"PUB_TRACE" if trace_id is not None else b"PUB" if ext is None else b"PUB_EXT"
    return Publish(name, topic, partition, [PublishMessage(body, trace_id, ext)])


async def publish(
    conn: NsqdConnection,
    topic: str,
    body: bytes,
    partition: int | None = None,
    *,
    trace_id: int | None = None,
    header: Mapping[str, object] | None = None,
) -> TracedResponse | None:
    """Publish one message; the traced answer for a traced publish, else None."""
    answer = await conn.command(
        pub_command(topic, body, partition, trace_id=trace_id, header=header)
    )
    if answer == OK:
        return None
    return parse_traced_response(answer)  # anything else raises RemoteProtocolError


async def publish_many(
    conn: NsqdConnection, topic: str, bodies: Iterable[bytes], partition: int | None = None
) -> None:
    """Publish several messages in one MPUB."""
    messages = [PublishMessage(body) for body in bodies]
    answer = await conn.command(Publish(b"MPUB", topic, partition, messages))
    if answer != OK:
        raise RemoteProtocolError(f"unexpected answer to MPUB: {answer[:64]!r}")
