"""Process spans of the handler modes: ``Consumer.run`` and ``Consumer.run_batches`` wrapped.

A CONSUMER span (``process {topic}``) around each handler call: one message (the publish span
is its parent when the message carries its context) or a batch (one span, linked to each
message's publish). The helpers here are shared with :mod:`nsq_ha.otel.pulling`.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode, Tracer

from nsq_ha.consumer import Consumer
from nsq_ha.otel import attributes as a
from nsq_ha.otel.propagation import extract
from nsq_ha.otel.state import State

if TYPE_CHECKING:
    from nsq_ha.consumer import Message

__all__ = [
    "consumer_client_id",
    "creation",
    "failed",
    "operation_attributes",
    "process_span",
    "remember_offsets",
    "run",
    "run_batches",
]


def consumer_client_id(consumer: Consumer) -> str:
    """``messaging.client.id`` of ``consumer`` (its IDENTIFY ``client_id``)."""
    return a.client_id(consumer.config.connection)


def operation_attributes(message: Message, operation: str) -> a.Attributes:
    """What every consumer-side span and metric of ``message``'s topic and channel carries."""
    return {
        a.SYSTEM: a.SYSTEM_NAME,
        a.DESTINATION: message.topic,
        a.CONSUMER_GROUP: message.channel,
        a.OPERATION_TYPE: operation,
        a.OPERATION_NAME: operation,
    }


def creation(message: Message) -> tuple[Context, SpanContext] | None:
    """The context ``message`` carries from its publish, and the publish span's (None when it
    carries none)."""
    context = extract(message)
    if context is None:
        return None
    span_context = trace.get_current_span(context).get_span_context()
    return (context, span_context) if span_context.is_valid else None


def failed(span: Span, exc: BaseException) -> a.Attributes:
    """Mark ``span`` failed by ``exc`` (when it is still open); return the error attributes."""
    found = a.error_attributes(exc)
    if span.is_recording():
        span.set_attributes(found)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__qualname__}: {exc}"))
    return found


def remember_offsets(state: State, messages: Sequence[Message]) -> None:
    """The queue offsets handlers got, for ``nsq.consumer.offset``."""
    for message in messages:
        if message.offset is not None and message.partition is not None:
            state.metrics.remember_offset(
                message.topic, message.channel, message.partition, message.offset
            )


@contextmanager
def process_span(
    tracer: Tracer, state: State | None, messages: Sequence[Message], client: str | None
) -> Iterator[Span]:
    """A CONSUMER span around the handling of ``messages`` (current in the block); the
    handler's duration recorded when instrumented."""
    first = messages[0]
    attrs = operation_attributes(first, "process")
    span_attrs = dict(attrs)
    if client is not None:
        span_attrs[a.CLIENT_ID] = client
    parent = None
    links: list[Link] = []
    if len(messages) == 1:
        span_attrs.update(a.message_attributes(first))
        found = creation(first)
        if found is not None:
            parent = found[0]
            links.append(Link(found[1]))
    else:
        span_attrs[a.BATCH_COUNT] = len(messages)
        for message in messages:
            found = creation(message)
            if found is not None:
                links.append(Link(found[1], a.message_attributes(message)))
    started = time.perf_counter()
    with tracer.start_as_current_span(
        f"process {first.topic}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=span_attrs,
        links=links,
    ) as span:
        try:
            yield span
        except Exception as exc:
            attrs.update(a.error_attributes(exc))
            span.set_attributes(a.error_attributes(exc))
            raise
        finally:
            if state is not None:
                state.metrics.process_duration.record(time.perf_counter() - started, attrs)
                remember_offsets(state, messages)


def _traced(
    state: State, handler: Callable[[Any], Any], batch: bool, client: str
) -> Callable[[Any], Any]:
    async def traced(argument: Any) -> None:
        messages: Sequence[Message] = argument if batch else [argument]
        if not messages:
            result = handler(argument)
            if inspect.isawaitable(result):
                await result
            return
        with process_span(state.tracer, state, messages, client):
            result = handler(argument)
            if inspect.isawaitable(result):
                await result

    return traced


def run(state: State, original: Any) -> Any:
    """``Consumer.run`` with a process span around each handler call."""

    async def run(self: Consumer, handler: Callable[[Any], Any], **kwargs: Any) -> None:
        client = consumer_client_id(self)
        await original(self, _traced(state, handler, False, client), **kwargs)

    return run


def run_batches(state: State, original: Any) -> Any:
    """``Consumer.run_batches`` with a process span around each handler call."""

    async def run_batches(self: Consumer, handler: Callable[[Any], Any], **kwargs: Any) -> None:
        client = consumer_client_id(self)
        await original(self, _traced(state, handler, True, client), **kwargs)

    return run_batches
