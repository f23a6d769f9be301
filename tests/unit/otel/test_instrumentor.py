"""``nsq_ha.otel.NsqHaInstrumentor``: found through the ``opentelemetry_instrumentor`` entry
point, idempotent whichever way it is called (the instrumentor or the ``instrument()`` shortcut),
a bad option instruments nothing; and the table of open process spans stays bounded."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
pytest.importorskip("opentelemetry.instrumentation", reason="the otel extra is not installed")

from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import INVALID_SPAN

from nsq_ha import events, otel
from nsq_ha.consumer import Consumer
from nsq_ha.consumer.message import answer_hook
from nsq_ha.otel.held import Held, Open
from nsq_ha.producer import Producer

PATCHED = [
    (Producer, "__init__"),
    (Producer, "close"),
    (Producer, "publish"),
    (Producer, "publish_many"),
    (Consumer, "start"),
    (Consumer, "close"),
    (Consumer, "run"),
    (Consumer, "run_batches"),
    (Consumer, "get"),
    (Consumer, "get_many"),
    (Consumer, "__anext__"),
]


def methods() -> list[Any]:
    return [cls.__dict__[name] for cls, name in PATCHED]


@pytest.fixture(autouse=True)
def not_instrumented() -> Iterator[None]:
    assert not otel.is_instrumented()
    yield
    otel.uninstrument()


def test_the_entry_point_names_the_instrumentor() -> None:
    [found] = entry_points(group="opentelemetry_instrumentor", name="nsq_ha")
    loaded = found.load()
    assert loaded is otel.NsqHaInstrumentor
    assert issubclass(loaded, BaseInstrumentor)
    assert loaded().instrumentation_dependencies() == ()  # it ships inside nsq-ha


def test_instrumenting_twice_changes_nothing_and_uninstrument_restores_every_method(
    caplog: pytest.LogCaptureFixture,
) -> None:
    originals = methods()
    assert answer_hook() is None
    otel.NsqHaInstrumentor().instrument(tracer_provider=TracerProvider(), lag_interval=None)
    assert otel.is_instrumented()
    patched = methods()
    hook = answer_hook()  # the settle spans: a hook, as Message's methods are not replaced
    assert hook is not None
    assert all(p is not o for p, o in zip(patched, originals, strict=True))
    assert Producer.publish.__doc__ == originals[2].__doc__
    with caplog.at_level(logging.WARNING):
        otel.instrument()  # the shortcut, as an app run by opentelemetry-instrument may call it
        otel.NsqHaInstrumentor().instrument()
    assert methods() == patched
    assert answer_hook() is hook
    assert "already instrumented" in caplog.text
    otel.uninstrument()
    assert not otel.is_instrumented()
    assert not events._listeners  # and stops listening
    assert methods() == originals
    assert answer_hook() is None
    otel.NsqHaInstrumentor().uninstrument()  # twice: nothing to undo
    otel.uninstrument()
    assert methods() == originals
    otel.instrument(lag_interval=None)  # and again after an uninstrument
    assert otel.NsqHaInstrumentor().is_instrumented_by_opentelemetry
    assert methods() != originals


@pytest.mark.parametrize(
    ("options", "error"),
    [({"lag_interval": 0}, ValueError), ({"lag_interval": "15"}, TypeError)],
)
def test_a_bad_option_instruments_nothing(options: dict[str, Any], error: type) -> None:
    originals = methods()
    with pytest.raises(error):
        otel.instrument(**options)
    assert not otel.is_instrumented()
    assert methods() == originals


class Delivered:
    """What the table reads of a message: whether it was answered (``outcome``)."""

    outcome: object = None


def delivered() -> Any:
    """A message, as far as the table is concerned."""
    return Delivered()


def test_open_process_spans_of_messages_answered_elsewhere_are_swept() -> None:
    held = Held()
    kept = [delivered() for _ in range(50)]
    for message in kept:
        held.add(message, Open(INVALID_SPAN, consumer=None))
    swept = 0
    for _ in range(10_000):
        gone = delivered()
        swept += len(held.add(gone, Open(INVALID_SPAN, consumer=None)))
        gone.outcome = "timed out"  # nsqd timed it out: no answer will come through nsq_ha
        assert len(held) <= 2 * len(kept) + Held.SWEEP_AT
    assert swept >= 10_000 - Held.SWEEP_AT
    assert all(held.get(message) is not None for message in kept)  # unanswered: kept


class Task:
    """Stands for an asyncio task (the table keys tasks weakly)."""


def test_a_tasks_next_get_pops_only_what_it_got_from_that_consumer() -> None:
    held = Held()
    first, second, third, fourth = delivered(), delivered(), delivered(), delivered()
    one, other = object(), object()
    task, elsewhere = Task(), Task()
    held.add(first, Open(INVALID_SPAN, consumer=one), task=task)
    held.add(second, Open(INVALID_SPAN, consumer=one))
    held.add(third, Open(INVALID_SPAN, consumer=other), task=task)
    held.add(fourth, Open(INVALID_SPAN, consumer=one), task=elsewhere)
    assert [m for m, _ in held.pop_task(task, one)] == [first]
    assert held.pop_task(task, one) == []
    assert held.keep(fourth) is not None  # the application delimits it: no task ends it
    assert held.pop_task(elsewhere, one) == []
    assert [m for m, _ in held.pop_consumer(one)] == [second, fourth]
    assert [m for m, _ in held.pop_all()] == [third]
    assert len(held) == 0


def test_opentelemetry_instrument_gets_the_defaults_of_instrument() -> None:
    """``opentelemetry-instrument`` calls the instrumentor with no option: what it installs
    has :func:`~nsq_ha.otel.instrument`'s defaults, the module's constants."""
    from nsq_ha.otel import instrumentor

    def defaults(function: Any) -> dict[str, Any]:
        return {p.name: p.default for p in inspect.signature(function).parameters.values()}

    assert defaults(instrumentor._install) == defaults(otel.instrument)
    assert defaults(otel.instrument) == {
        "tracer_provider": None,
        "meter_provider": None,
        "propagate": instrumentor.DEFAULT_PROPAGATE,
        "fork_trace_ids": instrumentor.DEFAULT_FORK_TRACE_IDS,
        "lag_interval": instrumentor.DEFAULT_LAG_INTERVAL,
    }
