"""Spans of the consumers that pull: ``async for``, ``Consumer.get()``, ``Consumer.get_many()``
(and so the blocking ``nsq_ha.sync.Consumer.get()``, which fetches with ``get_many()``), with
no code in the application.

* **receive** (``receive {topic}``, kind CLIENT, as the messaging conventions give pull-based
  receives): one per message handed out, from the call to its return, a child of the caller's
  current span, linked to the message's publish span when the message carries its context (ext
  topics). ``get_many()`` makes one per message too, all over the same call: the blocking
  facade's ``get()`` hands out one by one what it fetched with one ``get_many()``, and each
  ``get()`` is a receive to its caller. A call that returns nothing (a timeout, the consumer
  closing) makes no span.
* **process** (``process {topic}``, kind CONSUMER): one per message, from the hand-out until the
  message is settled (``finish()``/``requeue()``, also the blocking facade's), until the task
  that got it from ``get()``/``async for`` asks that consumer for another message, or until the
  consumer closes, whichever comes first. Its parent is the publish span when the message
  carries that context (as the handler spans of ``run()`` have it), linked too, with a link to
  the receive span; otherwise the receive span is its parent. A message handed out alone by
  ``get()`` / ``async for`` has its process span made *current* in the task until that span
  ends, so the spans the loop body makes (HTTP calls, queries) are its children. The span
  records how the message was answered (``nsq.message.outcome``) and the handling time
  (``messaging.process.duration``).
* **settle** (``finish {topic}`` / ``requeue {topic}``, kind CLIENT): the answer given while the
  process span is open, as its child.

Give a message to another task and its span still ends at the loop's next ``__anext__``: for
concurrent handling use :meth:`Consumer.run` (``concurrency=``), or delimit it yourself with
:func:`processing`, which takes the message's open process span over. The blocking facade's
``get()`` hands out, one by one, messages it fetched in a batch: there the receive and the
process spans start when the batch was fetched.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind

from nsq_ha._version import __version__
from nsq_ha.consumer import Consumer, Message, Outcome
from nsq_ha.consumer.message import AnswerHook
from nsq_ha.otel import attributes as a
from nsq_ha.otel.consuming import (
    consumer_client_id,
    creation,
    failed,
    operation_attributes,
    process_span,
    remember_offsets,
)
from nsq_ha.otel.held import Open, Popped
from nsq_ha.otel.state import SCOPE, State, current

__all__ = [
    "end_all",
    "end_consumer",
    "get",
    "get_many",
    "next_message",
    "processing",
    "settle",
    "settler",
]


def get(state: State, original: Any) -> Any:
    """``Consumer.get`` (and so ``async for``) with receive and process spans."""

    async def get(self: Consumer, *args: Any, **kwargs: Any) -> Message | None:
        task = asyncio.current_task()
        _next(state, self, task)
        started = time.time_ns()
        message: Message | None = await original(self, *args, **kwargs)
        if message is not None:
            _handed_out(state, self, [message], started, task)
        return message

    return get


def next_message(state: State, original: Any) -> Any:
    """``Consumer.__anext__`` through the instrumented :func:`get` (the original skips
    ``get()`` to save a coroutine per message)."""

    async def __anext__(self: Consumer) -> Message:
        message: Message | None = await self.get()
        if message is None:
            raise StopAsyncIteration
        return message

    return __anext__


def get_many(state: State, original: Any) -> Any:
    """``Consumer.get_many`` with a receive span and a process span per message."""

    async def get_many(self: Consumer, *args: Any, **kwargs: Any) -> list[Message]:
        _next(state, self, asyncio.current_task())
        started = time.time_ns()
        messages: list[Message] = await original(self, *args, **kwargs)
        if messages:
            _handed_out(state, self, messages, started, None)
        return messages

    return get_many


#: the outcome each answer gives the process span (``nsq.message.outcome``)
_OUTCOMES = {"finish": Outcome.FINISHED.value, "requeue": Outcome.REQUEUED.value}


def settler(state: State) -> AnswerHook:
    """The answer hook of ``state`` (:func:`nsq_ha.consumer.message.set_answer_hook`) around
    ``Message.finish_nowait`` / ``requeue_nowait`` (which ``finish()``/``requeue()`` and the
    blocking facade call): :func:`settle`."""

    def hook(message: Message, action: str, answer: Callable[[], None]) -> None:
        settle(state, message, action, answer)

    return hook


def settle(state: State, message: Message, action: str, answer: Callable[[], None]) -> None:
    """``answer()`` ``message`` (``action``: finish or requeue) in a settle span in the
    message's open process span, which it ends; just ``answer()`` without one."""
    entry = state.held.get(message)
    if entry is None:
        answer()
        return
    attrs = operation_attributes(message, "settle")
    attrs[a.OPERATION_NAME] = action
    if entry.client is not None:
        attrs[a.CLIENT_ID] = entry.client
    attrs.update(a.message_attributes(message))
    span = state.tracer.start_span(
        f"{action} {message.topic}",
        context=trace.set_span_in_context(entry.span),
        kind=SpanKind.CLIENT,
        attributes=attrs,
    )
    try:
        answer()
    except Exception as exc:
        failed(span, exc)
        raise
    finally:
        span.end()
    if state.held.pop(message) is entry:
        _end(state, message, entry, _OUTCOMES[action])


def end_consumer(state: State, consumer: Consumer) -> None:
    """``consumer`` closed: end the process spans of what it handed out."""
    _end_each(state, state.held.pop_consumer(consumer))


def end_all(state: State) -> None:
    """Uninstrumented: end every open process span."""
    _end_each(state, state.held.pop_all())


@contextmanager
def processing(message: Message) -> Iterator[Span]:
    """Delimit the processing of ``message`` yourself: its process span is current in the
    block, ends when the block does (or at the message's settle, if that comes first) and
    records an exception the block raises (``error.type``).

    With ``async for`` / ``get()`` / ``get_many()`` instrumented this takes over the span the
    hand-out opened (the task's next ``get()`` no longer ends it): enter it before the loop asks
    for the next message, e.g. before handing the message to another task. Otherwise (that span
    has ended already, a handler of :meth:`Consumer.run`, or not instrumented: then the global
    tracer, and no metric) it makes a process span of its own, a child of the publish span when
    the message's ext header carries its context."""
    state = current()
    entry = state.held.keep(message) if state is not None else None
    if state is None or entry is None:
        tracer = state.tracer if state is not None else trace.get_tracer(SCOPE, __version__)
        with process_span(tracer, state, [message], None) as span:
            yield span
        return
    try:
        with trace.use_span(
            entry.span, record_exception=False, set_status_on_exception=False
        ) as span:
            yield span
    except Exception as exc:
        entry.attrs.update(failed(entry.span, exc))
        raise
    finally:
        if state.held.pop(message) is entry:
            _end(state, message, entry, None)


def _handed_out(
    state: State,
    consumer: Consumer,
    messages: list[Message],
    started: int,
    task: asyncio.Task[Any] | None,
) -> None:
    """``messages`` were handed out by a call that began at ``started`` (ns): a receive span
    and a process span per message (made current in ``task`` when given: one message)."""
    client = consumer_client_id(consumer)
    for message in messages:
        origin = creation(message)
        attrs = operation_attributes(message, "receive")
        attrs[a.CLIENT_ID] = client
        attrs.update(a.message_attributes(message))
        receive = state.tracer.start_span(
            f"receive {message.topic}",
            kind=SpanKind.CLIENT,
            attributes=attrs,
            links=[] if origin is None else [Link(origin[1])],
            start_time=started,
        )
        receive.end()
        entry = _open(state, consumer, client, message, origin, receive)
        if task is not None:
            entry.previous = otel_context.get_current()
            entry.context = trace.set_span_in_context(entry.span, entry.previous)
            otel_context.attach(entry.context)
        _end_each(state, state.held.add(message, entry, task))


def _open(
    state: State,
    consumer: Consumer,
    client: str,
    message: Message,
    origin: tuple[otel_context.Context, trace.SpanContext] | None,
    receive: Span,
) -> Open:
    attrs = operation_attributes(message, "process")
    span_attrs = {**attrs, a.CLIENT_ID: client, **a.message_attributes(message)}
    if origin is not None:
        parent = origin[0]
        links = [Link(origin[1]), Link(receive.get_span_context())]
    else:
        parent = trace.set_span_in_context(receive)
        links = []
    span = state.tracer.start_span(
        f"process {message.topic}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes=span_attrs,
        links=links,
    )
    return Open(span, consumer, client, attrs)


def _next(state: State, consumer: Consumer, task: asyncio.Task[Any] | None) -> None:
    """``task`` asks ``consumer`` for more: it is done with what its last ``get()`` returned."""
    if task is None:
        return
    _end_each(state, state.held.pop_task(task, consumer))
    last = state.held.attached(task)
    if last is not None and last.ended:
        _restore(last)


def _restore(entry: Open) -> None:
    """Make current again what was before ``entry``'s span, when the caller's context still
    has that span current (a settle or a close from another task changes nothing there)."""
    if entry.context is not None and otel_context.get_current() is entry.context:
        otel_context.attach(entry.previous or otel_context.Context())


def _end_each(state: State, entries: Popped) -> None:
    for message, entry in entries:
        _end(state, message, entry, None)


def _end(state: State, message: Message, entry: Open, outcome: str | None) -> None:
    entry.ended = True
    _restore(entry)
    if outcome is None and message.outcome is not None:
        outcome = message.outcome.value
    if outcome is not None and entry.span.is_recording():
        entry.span.set_attribute(a.NSQ_OUTCOME, outcome)
    state.metrics.process_duration.record(time.perf_counter() - entry.started, entry.attrs)
    remember_offsets(state, [message])
    entry.span.end()
