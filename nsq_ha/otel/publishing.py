"""Publish spans: ``Producer.publish`` and ``Producer.publish_many`` wrapped.

A PRODUCER span per call (``publish {topic}``), the trace context put into the message where the
topic takes it (:mod:`nsq_ha.otel.propagation`), publish latency, messages sent and errors by
code recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Span, SpanKind

from nsq_ha.otel import attributes as a
from nsq_ha.otel.propagation import fork_trace_id, has_trace_id, with_context
from nsq_ha.otel.state import State
from nsq_ha.producer import Producer

if TYPE_CHECKING:
    from nsq_ha.producer import PublishResult
    from nsq_ha.producer.routes import Routes

__all__ = ["publish_many", "publish_one"]


def publish_one(state: State, original: Any) -> Any:
    async def publish(self: Producer, topic: str, body: bytes, **kwargs: Any) -> PublishResult:
        async def call(span: Span) -> list[PublishResult]:
            options = await _carry(state, self, span, topic, 1, kwargs, many=False)
            return [await original(self, topic, body, **options)]

        size = len(body) if isinstance(body, bytes | bytearray) else None
        return (await _publishing(state, self, topic, 1, size, call))[0]

    return publish


def publish_many(state: State, original: Any) -> Any:
    async def publish_many(
        self: Producer, topic: str, bodies: Sequence[bytes], **kwargs: Any
    ) -> list[PublishResult]:
        count = len(bodies) if isinstance(bodies, Sequence) else 0

        async def call(span: Span) -> list[PublishResult]:
            options = await _carry(state, self, span, topic, count, kwargs, many=True)
            results: list[PublishResult] = await original(self, topic, bodies, **options)
            return results

        return await _publishing(state, self, topic, count, None, call)

    return publish_many


async def _publishing(
    state: State,
    producer: Producer,
    topic: str,
    count: int,
    size: int | None,
    call: Callable[[Span], Any],
) -> list[PublishResult]:
    """Run ``call(span)`` in a PRODUCER span; record its results, or its error, and metrics."""
    attrs: a.Attributes = {
        a.SYSTEM: a.SYSTEM_NAME,
        a.DESTINATION: topic,
        a.OPERATION_TYPE: "send",
        a.OPERATION_NAME: "publish",
    }
    span_attrs = {**attrs, a.CLIENT_ID: a.client_id(producer.config.connection)}
    if count != 1:
        span_attrs[a.BATCH_COUNT] = count
    elif size is not None:
        span_attrs[a.BODY_SIZE] = size
    started = time.perf_counter()
    with state.tracer.start_as_current_span(
        f"publish {topic}", kind=SpanKind.PRODUCER, attributes=span_attrs
    ) as span:
        try:
            results: list[PublishResult] = await call(span)
        except Exception as exc:
            failed = {**attrs, **a.error_attributes(exc)}
            span.set_attributes(failed)
            metrics = state.metrics
            metrics.duration.record(time.perf_counter() - started, failed)
            metrics.sent.add(count, failed)
            metrics.errors.add(1, failed)
            raise
        partitions = {r.partition for r in results}
        if len(partitions) == 1 and None not in partitions:
            attrs[a.PARTITION] = str(partitions.pop())
        if results:
            found = a.result_attributes(results[0])
            if count != 1:  # per-message values only for one message
                for name in (a.MESSAGE_ID, a.NSQ_OFFSET, a.NSQ_TRACE_ID):
                    found.pop(name, None)
            span.set_attributes(found)
        state.metrics.duration.record(time.perf_counter() - started, attrs)
        state.metrics.sent.add(count, attrs)
        return results


async def _carry(
    state: State,
    producer: Producer,
    span: Span,
    topic: str,
    count: int,
    kwargs: dict[str, Any],
    *,
    many: bool,
) -> dict[str, Any]:
    """The publish's keyword arguments with the trace context added where the topic takes it:
    ext topics get it in the header, fork topics the trace id (see
    :mod:`nsq_ha.otel.propagation`)."""
    if not (state.propagate or state.fork_trace_ids) or count < 1:
        return kwargs
    routes: Routes = await producer.topic_routes(topic)
    if routes.fork is not True:
        return kwargs  # vanilla, or nsqd= addresses whose kind is not known yet
    options = dict(kwargs)
    headers = options.get("exts") if many else None
    if headers is not None and not (isinstance(headers, Sequence) and len(headers) == count):
        return kwargs  # the publish refuses it as it would without tracing
    if state.propagate and routes.ext is True:
        if headers is not None:
            if options.get("ext") is None:  # both given: refused by the publish
                options["exts"] = [with_context(h) for h in headers]
        else:
            options["ext"] = with_context(options.get("ext"))
    trace_id = fork_trace_id(span) if state.fork_trace_ids else None
    if trace_id is not None:
        if not many:
            if options.get("trace_id") is None and not has_trace_id(options.get("ext")):
                options["trace_id"] = trace_id
        else:
            given = options.get("trace_ids")
            headers = options.get("exts")
            if (
                given is None or (isinstance(given, Sequence) and len(given) == count)
            ) and not has_trace_id(options.get("ext")):
                ids = list(given) if given is not None else [None] * count
                for i in range(count):
                    if ids[i] is None and not has_trace_id(None if headers is None else headers[i]):
                        ids[i] = trace_id
                options["trace_ids"] = ids
    return options
