"""The instrumentor: :class:`NsqHaInstrumentor`, and its shortcuts :func:`instrument` and
:func:`uninstrument`.

``opentelemetry-instrument python app.py`` finds it through the ``opentelemetry_instrumentor``
entry point ``nsq_ha`` and calls ``NsqHaInstrumentor().instrument()`` with no argument: the
global tracer and meter providers, the defaults below. ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=
nsq_ha`` leaves nsq_ha alone there.

What is wrapped (on the classes, so every instance, also the blocking ``nsq_ha.sync`` ones):

* ``Producer.publish`` and ``Producer.publish_many`` (:mod:`nsq_ha.otel.publishing`);
* ``Consumer.run`` and ``Consumer.run_batches`` (:mod:`nsq_ha.otel.consuming`);
* ``Consumer.get`` and ``Consumer.get_many`` (so ``async for`` and the blocking ``get()``)
  (:mod:`nsq_ha.otel.pulling`);
* ``Producer.__init__``/``close`` and ``Consumer.start``/``close``: which clients' counters
  the observable metrics read, whether the consumer-lag thread (:mod:`nsq_ha.otel.lag`) runs,
  and the end of the process spans of what a closing consumer handed out.

The answers of messages are not wrapped but hooked: :func:`nsq_ha.consumer.message.
set_answer_hook` puts :func:`nsq_ha.otel.pulling.settle` around ``Message.finish_nowait`` and
``Message.requeue_nowait`` (what ``finish()`` and ``requeue()`` call), since the compiled build's
``Message`` is a native class, whose methods cannot be replaced.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from typing import Any

from opentelemetry import trace

# the module opens with "# type: ignore": mypy sees none of its names
from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)
from opentelemetry.metrics import MeterProvider, get_meter
from opentelemetry.trace import TracerProvider

from nsq_ha import events
from nsq_ha._version import __version__
from nsq_ha.consumer import Consumer
from nsq_ha.consumer.message import set_answer_hook
from nsq_ha.otel import consuming, publishing, pulling
from nsq_ha.otel.lag import LagPoller, check_interval
from nsq_ha.otel.metrics import Metrics
from nsq_ha.otel.state import SCOPE, State, current, replace
from nsq_ha.producer import Producer

__all__ = ["NsqHaInstrumentor", "instrument", "is_instrumented", "uninstrument"]

#: :func:`instrument`'s ``propagate``, also what ``opentelemetry-instrument`` gets
DEFAULT_PROPAGATE = True
#: :func:`instrument`'s ``fork_trace_ids``, also what ``opentelemetry-instrument`` gets
DEFAULT_FORK_TRACE_IDS = True
#: :func:`instrument`'s ``lag_interval`` (seconds), also what ``opentelemetry-instrument`` gets
DEFAULT_LAG_INTERVAL = 15.0


class NsqHaInstrumentor(BaseInstrumentor):  # type: ignore[misc] # BaseInstrumentor is Any
    """OpenTelemetry's instrumentor of nsq_ha (one per process, as every instrumentor).

    ``NsqHaInstrumentor().instrument(**options)`` takes the options of :func:`instrument`;
    ``uninstrument()`` undoes it. Both are idempotent: instrumenting again while instrumented
    logs a warning and changes nothing (uninstrument first to change the options), and
    uninstrumenting when not instrumented does nothing.
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        """Nothing: the instrumentor ships inside the package it instruments."""
        return ()

    def _instrument(self, **kwargs: Any) -> None:
        _install(**kwargs)

    def _uninstrument(self, **kwargs: Any) -> None:
        _remove()


def instrument(
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    propagate: bool = DEFAULT_PROPAGATE,
    fork_trace_ids: bool = DEFAULT_FORK_TRACE_IDS,
    lag_interval: float | None = DEFAULT_LAG_INTERVAL,
) -> None:
    """Trace and measure every :class:`~nsq_ha.producer.Producer` and
    :class:`~nsq_ha.consumer.Consumer` of the process (the global providers unless given):
    ``NsqHaInstrumentor().instrument(...)``.

    ``propagate``: put the trace context into the ext header of messages to ext topics.
    ``fork_trace_ids``: publish to fork topics with the span's trace id (its low 64 bits) as
    the message's trace id, when the caller gave none. That makes every such publish a traced
    one (``PUB_TRACE``/``MPUB_TRACE``, answered with the message's id and queue offset, which
    the span records); turn it off to keep plain ``PUB``/``MPUB``.
    ``lag_interval``: read the consumers' lag (``nsq.consumer.lag``) from nsqd's ``/stats``
    every so many seconds, in a background thread while instrumented consumers run
    (:mod:`nsq_ha.otel.lag`); None turns it off. A positive finite number, else TypeError
    or ValueError (and nothing is instrumented).
    Instrumenting again while instrumented (also by ``opentelemetry-instrument``) logs a
    warning and changes nothing: :func:`uninstrument` first to change the options.
    """
    NsqHaInstrumentor().instrument(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        propagate=propagate,
        fork_trace_ids=fork_trace_ids,
        lag_interval=lag_interval,
    )


def uninstrument() -> None:
    """Undo :func:`instrument` (clients made meanwhile keep working, untraced; the process spans
    still open end). The consumer lag thread ends before it returns (a request under way is
    abandoned; it waits :data:`~nsq_ha.otel.lag.STOP_TIMEOUT` seconds at most). Does nothing
    when not instrumented."""
    instrumentor = NsqHaInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()


def is_instrumented() -> bool:
    """True between :func:`instrument` and :func:`uninstrument`."""
    return current() is not None


def _install(
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    propagate: bool = DEFAULT_PROPAGATE,
    fork_trace_ids: bool = DEFAULT_FORK_TRACE_IDS,
    lag_interval: float | None = DEFAULT_LAG_INTERVAL,
) -> None:
    interval = check_interval(lag_interval)
    tracer = trace.get_tracer(SCOPE, __version__, tracer_provider)
    metrics = Metrics(get_meter(SCOPE, __version__, meter_provider), lag_interval=interval)
    state = State(tracer, metrics, propagate, fork_trace_ids)
    if interval is not None:
        state.lag = LagPoller(metrics.consumers, metrics.lag, interval)
    _patch(state, Producer, "__init__", _producer_init)
    _patch(state, Producer, "close", _producer_close)
    _patch(state, Producer, "publish", publishing.publish_one)
    _patch(state, Producer, "publish_many", publishing.publish_many)
    _patch(state, Consumer, "start", _consumer_start)
    _patch(state, Consumer, "close", _consumer_close)
    _patch(state, Consumer, "run", consuming.run)
    _patch(state, Consumer, "run_batches", consuming.run_batches)
    _patch(state, Consumer, "get", pulling.get)
    _patch(state, Consumer, "__anext__", pulling.next_message)
    _patch(state, Consumer, "get_many", pulling.get_many)
    set_answer_hook(pulling.settler(state))
    events.subscribe(metrics.on_event)
    replace(state)


def _remove() -> None:
    state = replace(None)
    if state is None:
        return
    set_answer_hook(None)
    events.unsubscribe(state.metrics.on_event)
    state.metrics.active = False
    if state.lag is not None:
        state.lag.stop()
    for cls, name, original in reversed(state.originals):
        setattr(cls, name, original)
    pulling.end_all(state)


def _patch(state: State, cls: type, name: str, make: Callable[[State, Any], Any]) -> None:
    original = cls.__dict__[name]
    wrapper = make(state, original)
    functools.update_wrapper(wrapper, original)
    state.originals.append((cls, name, original))
    setattr(cls, name, wrapper)


# -- client registry ----------------------------------------------------------------------------


def _producer_init(state: State, original: Any) -> Any:
    def __init__(self: Producer, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        state.metrics.add_producer(self)

    return __init__


def _producer_close(state: State, original: Any) -> Any:
    async def close(self: Producer, *args: Any, **kwargs: Any) -> None:
        try:
            await original(self, *args, **kwargs)
        finally:
            state.metrics.producer_closed(self)

    return close


def _consumer_start(state: State, original: Any) -> Any:
    async def start(self: Consumer) -> None:
        state.metrics.add_consumer(self)
        if state.lag is not None:
            state.lag.start()
        await original(self)

    return start


def _consumer_close(state: State, original: Any) -> Any:
    async def close(self: Consumer, *args: Any, **kwargs: Any) -> None:
        try:
            await original(self, *args, **kwargs)
        finally:
            pulling.end_consumer(state, self)
            state.metrics.consumer_closed(self)
            if state.lag is not None and state.lag.forget():  # the last one: no poller left
                await state.lag.wait_ended()

    return close
