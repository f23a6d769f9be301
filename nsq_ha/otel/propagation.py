"""How a trace goes from a publish to the handler of the message.

**Ext topics** (the fork's topics created with ext support) carry a JSON header with every
message. The publish puts the W3C ``traceparent`` (and ``tracestate``, and what else the global
propagator writes) into that header, beside the application's own keys (which win: a header
that already has a ``traceparent`` keeps it); the consumer reads it back, and the span of the
handler is a *child* of the publish span, across processes.

**Other fork topics** have no header, but every message carries the fork's 64-bit trace id
(``PUB_TRACE``). The publish sends the low 64 bits of its span's 128-bit trace id there (when
the caller gave no trace id of its own), and both spans carry it as ``nsq.trace_id``. That is an
attribute, not a span link or a parent: a link or a parent needs the whole 128-bit trace id and
the 64-bit span id, and from 64 bits one could only make up a context that points at no span
(backends would show a broken reference). Search by ``nsq.trace_id`` to find the publish of a
message; the fork's own tools (nsqadmin's message trace) know the same id.

**Vanilla nsqd** has neither: the handler's span has no tie to the publish.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING

from opentelemetry import propagate
from opentelemetry.context import Context
from opentelemetry.trace import Span

from nsq_ha.errors import RemoteProtocolError
from nsq_ha.protocol.message import EXT_VERSION_JSON
from nsq_ha.protocol.publish import TRACE_ID_HEADER

if TYPE_CHECKING:
    from nsq_ha.consumer import Message

__all__ = ["extract", "fork_trace_id", "has_trace_id", "with_context"]

_U64 = (1 << 64) - 1


def fork_trace_id(span: Span) -> int | None:
    """The low 64 bits of ``span``'s trace id (None for a span that is not recorded)."""
    context = span.get_span_context()
    if not context.is_valid:
        return None
    return (context.trace_id & _U64) or None


def with_context(header: object) -> object:
    """``header`` (an ext header: a mapping, JSON bytes, or None) with the current trace
    context added (a new object; the caller's is not changed). A raw header that is not a JSON
    object, and anything that is not a header (the publish refuses it), is left as it is."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return header
    if header is None:
        return carrier
    if isinstance(header, bytes):
        try:
            parsed = json.loads(header)
        except ValueError:
            return header
        if not isinstance(parsed, dict):
            return header
        return {**carrier, **parsed}
    if isinstance(header, Mapping):
        return {**carrier, **header}
    return header  # not a header: the publish refuses it as it would without tracing


def has_trace_id(header: object) -> bool:
    """True when ``header`` names a ``##trace_id`` of its own."""
    if header is None:
        return False
    if isinstance(header, bytes):
        return TRACE_ID_HEADER.encode() in header
    return isinstance(header, Mapping) and TRACE_ID_HEADER in header


def extract(message: Message) -> Context | None:
    """The trace context a message's ext header carries (None when it carries none)."""
    if message.ext_version != EXT_VERSION_JSON:
        return None
    try:
        header: Mapping[str, object] = message.ext
    except RemoteProtocolError:
        return None
    if "traceparent" not in header:
        return None
    carrier = {k: v for k, v in header.items() if isinstance(v, str)}
    return propagate.extract(carrier)
