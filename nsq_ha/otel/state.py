"""What :func:`~nsq_ha.otel.instrument` set up, shared by the wrappers of :mod:`nsq_ha.otel`.

One :class:`State` at a time per process: :func:`current` is ``None`` while nothing is
instrumented.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Tracer

from nsq_ha.otel.held import Held
from nsq_ha.otel.lag import LagPoller
from nsq_ha.otel.metrics import Metrics

__all__ = ["SCOPE", "State", "current", "replace"]

#: the instrumentation scope of nsq_ha's tracer and meter
SCOPE = "nsq_ha"


@dataclass
class State:
    """The tracer, the metrics and the options of one :func:`~nsq_ha.otel.instrument`."""

    tracer: Tracer
    metrics: Metrics
    propagate: bool
    fork_trace_ids: bool
    lag: LagPoller | None = None
    #: (class, attribute, original) of every method replaced, in the order replaced
    originals: list[tuple[type, str, Any]] = field(default_factory=list)
    #: the process spans of messages handed out by ``get()``/``get_many()``, still open
    held: Held = field(default_factory=Held)


_current: State | None = None


def current() -> State | None:
    """The instrumentation in force (``None``: not instrumented)."""
    return _current


def replace(state: State | None) -> State | None:
    """Put ``state`` in force; return the one it replaces."""
    global _current
    previous, _current = _current, state
    return previous
