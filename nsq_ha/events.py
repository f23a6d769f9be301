"""What the clients tell the application besides messages: leader moves, reconnects, give-ups.

Every event is a frozen dataclass (:data:`Event` is their union); a listener is a plain callable
taking one event. Listeners are process-wide::

    from nsq_ha import events

    def on_event(event: events.Event) -> None:
        match event:
            case events.LeaderChanged(topic=topic, partition=p, new=new):
                print(f"{topic}/{p} is now led by {new}")

    events.subscribe(on_event)                          # every kind
    events.subscribe(alert, events.PublishGaveUp)        # only these kinds
    ...
    events.unsubscribe(on_event)

One registry for the process, not an ``on_event=`` option per client, so that a tool watching
every client (:mod:`nsq_ha.otel`) needs no handle on each (``role``, topic, partition and channel
tell the clients apart). Listeners run synchronously on the client's event loop, in the order
they subscribed, and must not block; nothing one raises (``sys.exit()`` included) reaches the
client: it is logged, naming the listener (docs/operating.md). Events come on rare paths only,
never per message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = [
    "Event",
    "LeaderChanged",
    "Listener",
    "MessageGaveUp",
    "PublishGaveUp",
    "Reconnecting",
    "Role",
    "emit",
    "subscribe",
    "unsubscribe",
]

log = logging.getLogger(__name__)

Role = Literal["producer", "consumer"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderChanged:
    """A partition's leader moved: nsqlookupd now names ``new`` where it named ``old`` (the last
    leader the client saw, also across a time with none listed). Each client reports the moves it
    sees: a producer when the lookup it follows changes (the next publish goes to ``new``), a
    consumer when it re-reads the map (it leaves ``old`` and subscribes on ``new``)."""

    role: Role
    topic: str
    partition: int
    old: str
    new: str
    #: the consumer's channel; ``None`` for a producer
    channel: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Reconnecting:
    """A connection was lost or could not be made, and the client will make it again: a consumer
    after ``delay`` seconds (doubling up to ``max_reconnect_interval``) through a fresh lookup; a
    producer, which dropped it after ``error``, at the publish's next attempt (``delay`` is
    ``None``: the retry policy decides when)."""

    role: Role
    topic: str
    #: ``None`` on vanilla nsqd
    partition: int | None
    address: str
    #: the error, as text (secrets redacted)
    error: str
    #: consumers: failures in a row for this connection; producers: the publish attempt
    attempt: int
    delay: float | None = None
    channel: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishGaveUp:
    """A publish (or a lookup before it) failed through every retry the policy allows: the
    caller gets :class:`~nsq_ha.errors.PublishError`. Not emitted for errors that are not
    retried (bad input) nor when the producer closes before an answer."""

    topic: str
    #: the fixed partition of a keyed batch; ``None`` for an unkeyed one (or a lookup)
    partition: int | None
    attempts: int
    #: the last error, as text (secrets redacted)
    error: str
    #: what failed: ``"publish"`` or ``"lookup"``
    operation: Literal["publish", "lookup"] = "publish"
    role: Role = "producer"


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageGaveUp:
    """A consumer gave up on a message delivered more than ``max_attempts`` times: it goes to
    ``on_give_up`` (then is finished) instead of the handler."""

    topic: str
    channel: str
    partition: int | None
    #: the 16-byte message id, as hex
    message_id: str
    attempts: int
    max_attempts: int
    role: Role = "consumer"


Event = LeaderChanged | Reconnecting | PublishGaveUp | MessageGaveUp
Listener = Callable[[Event], object]

_ALL: tuple[type[Event], ...] = get_args(Event)

#: (listener, the kinds it wants); a new list on every change, so emit() iterates a snapshot
_listeners: list[tuple[Listener, tuple[type[Event], ...]]] = []


def subscribe(listener: Listener, *kinds: type[Event]) -> Listener:
    """Call ``listener(event)`` for every event of ``kinds`` (all when none given); subscribing
    it again replaces its kinds. Returns ``listener`` (a decorator); TypeError for a kind
    that is not an event class."""
    global _listeners
    if not callable(listener):
        raise TypeError(f"an event listener must be callable, not {listener!r}")
    for kind in kinds:
        if kind not in _ALL:
            names = ", ".join(k.__name__ for k in _ALL)
            raise TypeError(f"{kind!r} is not an nsq_ha event class (one of {names})")
    wanted = tuple(kinds) or _ALL
    _listeners = [(f, k) for f, k in _listeners if f != listener] + [(listener, wanted)]
    return listener


def unsubscribe(listener: Listener) -> bool:
    """Stop calling ``listener``; False if it was not subscribed."""
    global _listeners
    before, _listeners = _listeners, [(f, k) for f, k in _listeners if f != listener]
    return len(_listeners) != len(before)


def emit(event: Event) -> None:
    """Hand ``event`` to every listener of its kind (the clients call this)."""
    if not _listeners:
        return
    for listener, kinds in _listeners:
        if isinstance(event, kinds):
            try:
                listener(event)
            except BaseException as exc:  # nothing a listener does may stop a client
                _report(listener, event, exc)


def _report(listener: Listener, event: Event, exc: BaseException) -> None:
    """Log a listener's failure, naming it by ``module.qualname`` or else its repr."""
    qualname = getattr(listener, "__qualname__", None)
    module = getattr(listener, "__module__", None)
    if not isinstance(qualname, str):
        name = repr(listener)
    else:
        name = f"{module}.{qualname}" if isinstance(module, str) else qualname
    hint = ""
    if isinstance(exc, SystemExit | KeyboardInterrupt):  # it would stop every client on the loop
        hint = (
            f" ({type(exc).__name__}): a listener must not call sys.exit() or raise "
            "KeyboardInterrupt (it runs on the client's event loop); the clients keep running. To "
            "stop the program, act on the error the call raises, or signal the main thread"
        )
    log.error("event listener %s failed on %r%s", name, event, hint, exc_info=exc)
