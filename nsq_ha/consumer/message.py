"""A delivered message, as consumers see it: :class:`Message`."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from nsq_ha.consumer.checks import check_requeue_delay
from nsq_ha.errors import (
    ConfigError,
    MessageAlreadyRespondedError,
    RemoteProtocolError,
)
from nsq_ha.protocol.message import EXT_VERSION_JSON, EXT_VERSION_TAG, DecodedMessage

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["AnswerHook", "Message", "Outcome", "answer_hook", "set_answer_hook"]

#: Key of the dispatch tag in an ext JSON header (PROTOCOL.md §4.3).
TAG_KEY = "##client_dispatch_tag"

#: Called instead of answering: ``hook(message, "finish" or "requeue", answer)``; the hook calls
#: ``answer()`` (the whole answer, checks included) once, around what it adds (the OpenTelemetry
#: settle span of :mod:`nsq_ha.otel.pulling`).
AnswerHook = Callable[["Message", str, Callable[[], None]], None]

# a hook rather than the class's methods patched, which the compiled build refuses (a native
# class), costing one look-up per answer while unset
_answer_hook: AnswerHook | None = None


def set_answer_hook(hook: AnswerHook | None) -> AnswerHook | None:
    """Put ``hook`` in force for every message's ``finish*`` and ``requeue*`` (``None``
    removes it); return the hook it replaces."""
    global _answer_hook
    previous, _answer_hook = _answer_hook, hook
    return previous


def answer_hook() -> AnswerHook | None:
    """The hook in force (:func:`set_answer_hook`), if any."""
    return _answer_hook


class Outcome(enum.Enum):
    """How a message was answered."""

    FINISHED = "finished"
    REQUEUED = "requeued"
    #: the delivering connection closed before an answer; nsqd redelivers it
    ABANDONED = "abandoned"
    #: nsqd timed it out and delivered it again (a newer Message object) before an answer
    TIMED_OUT = "timed out"


class _Owner(Protocol):
    """What a message needs from its consumer (the consumer's connection slot)."""

    topic: str
    channel: str
    partition: int | None
    address: str
    ordered: bool

    def finish(self, message: Message) -> None: ...

    def requeue(self, message: Message, delay: float | None, backoff: bool) -> None: ...

    def touch(self, message: Message) -> None: ...

    def gone(self, message: Message, action: str) -> NoReturn: ...


class Message:
    """One delivered message; answer it with :meth:`finish` or :meth:`requeue`.

    nsqd accepts an answer only on the connection that delivered the message; once that is gone,
    answering raises :class:`~nsq_ha.errors.MessageConnectionGoneError` (nsqd redelivers it)."""

    __slots__ = ("_decoded", "_ext", "_owner", "outcome")

    def __init__(self, decoded: DecodedMessage, owner: _Owner) -> None:
        self._decoded = decoded
        self._owner = owner
        self._ext: Mapping[str, Any] | None = None
        #: ``None`` until answered
        self.outcome: Outcome | None = None

    def __repr__(self) -> str:
        where = self.topic if self.partition is None else f"{self.topic}/{self.partition}"
        extra = f" offset={self.offset}" if self.offset is not None else ""
        state = self.outcome.value if self.outcome else "in flight"
        return (
            f"<Message {where} id={self.id.hex()} attempts={self.attempts}{extra} "
            f"{len(self.body)}B {state}>"
        )

    @property
    def body(self) -> bytes:
        """The message body."""
        return self._decoded.body

    @property
    def id(self) -> bytes:
        """The 16-byte id (fork: u64 internal id + u64 trace id; vanilla: 16 hex characters)."""
        return self._decoded.id

    @property
    def internal_id(self) -> int | None:
        """Fork: the partition's message number (ids repeat across partitions)."""
        return self._decoded.internal_id

    @property
    def trace_id(self) -> int | None:
        """Fork: the publisher's trace id (0 when it gave none); vanilla: ``None``."""
        return self._decoded.trace_id

    @property
    def attempts(self) -> int:
        """Deliveries so far, this one included."""
        return self._decoded.attempts

    @property
    def timestamp(self) -> int:
        """When nsqd stored the message, Unix nanoseconds."""
        return self._decoded.timestamp

    @property
    def offset(self) -> int | None:
        """Queue byte offset in the partition (ordered/advanced subscriptions): checkpoint it."""
        return self._decoded.offset

    @property
    def raw_size(self) -> int | None:
        """Stored size in bytes (ordered/advanced subscriptions); next offset = offset + this."""
        return self._decoded.raw_size

    @property
    def ext_version(self) -> int | None:
        """Ext topics: 0 (none), 2 (tag) or 4 (JSON header)."""
        return self._decoded.ext_version

    @property
    def ext_data(self) -> bytes | None:
        """Ext topics: the raw ext bytes."""
        return self._decoded.ext_data

    @property
    def ext(self) -> Mapping[str, Any]:
        """The ext JSON header (``{}`` without one). Raises RemoteProtocolError if malformed."""
        if self._ext is None:
            self._ext = self._decoded.json_header()
        return self._ext

    @property
    def tag(self) -> str | None:
        """The dispatch tag (``##client_dispatch_tag``, or a version-2 ext), if any."""
        if self.ext_version == EXT_VERSION_TAG and self.ext_data:
            return self.ext_data.decode("utf-8", errors="replace")
        if self.ext_version == EXT_VERSION_JSON:
            try:
                value = self.ext.get(TAG_KEY)
            except RemoteProtocolError:
                return None
            return value if isinstance(value, str) else None
        return None

    @property
    def decoded(self) -> DecodedMessage:
        """The frame as decoded by :mod:`nsq_ha.protocol`."""
        return self._decoded

    @property
    def topic(self) -> str:
        """The topic."""
        return self._owner.topic

    @property
    def channel(self) -> str:
        """The channel."""
        return self._owner.channel

    @property
    def partition(self) -> int | None:
        """The partition (``None`` on vanilla nsqd)."""
        return self._owner.partition

    @property
    def address(self) -> str:
        """The nsqd that delivered it."""
        return self._owner.address

    @property
    def ordered(self) -> bool:
        """True when it came through an ordered (SUB_ORDERED) subscription."""
        return self._owner.ordered

    @property
    def responded(self) -> bool:
        """True once finished, requeued or abandoned."""
        return self.outcome is not None

    def check_answerable(self, action: str) -> None:
        """Raise what ``action`` (finish, requeue, touch) would meet now: MessageConnectionGoneError
        once the delivering connection went away, MessageAlreadyRespondedError once answered."""
        if self.outcome is Outcome.ABANDONED:
            self._owner.gone(self, action)
        if self.outcome is not None:
            raise MessageAlreadyRespondedError(
                f"cannot {action} {self!r}: it was already {self.outcome.value}"
            )

    async def finish(self) -> None:
        """Acknowledge: nsqd forgets the message (FIN on the delivering connection)."""
        self.finish_nowait()

    def finish_nowait(self) -> None:
        """:meth:`finish` from plain code on the consumer's loop (a callback, the blocking
        facade): the FIN is written before it returns, as with :meth:`finish`."""
        hook = _answer_hook
        if hook is None:
            self._finish()
        else:
            hook(self, "finish", self._finish)

    def _finish(self) -> None:
        if self.outcome is not None:
            self.check_answerable("finish")
        self._owner.finish(self)

    async def requeue(self, delay: object = None, *, backoff: object = True) -> None:
        """Give the message back for redelivery after ``delay`` seconds.

        ``delay=None`` uses the consumer's ``requeue_delay`` (ordered channels requeue with 0).
        ``backoff=True`` counts as a failure for the consumer's backoff (every connection
        pauses); ``False`` requeues quietly.

        A ``backoff`` other than ``True``/``False``, or a ``delay`` that is not a finite number
        of seconds in ``0 ..`` :data:`~nsq_ha.consumer.checks.MAX_REQUEUE_DELAY`, raises
        :class:`~nsq_ha.errors.ConfigError` before anything changes (the message is still held).
        """
        self.requeue_nowait(delay, backoff=backoff)

    def requeue_nowait(self, delay: object = None, *, backoff: object = True) -> None:
        """:meth:`requeue` from plain code on the consumer's loop (see :meth:`finish_nowait`)."""
        hook = _answer_hook
        if hook is None:
            self._requeue(delay, backoff)
        else:
            hook(self, "requeue", lambda: self._requeue(delay, backoff))

    def _requeue(self, delay: object, backoff: object) -> None:
        # objects: compiled, a ``float | None`` or ``bool`` parameter would raise mypyc's TypeError
        if not isinstance(backoff, bool):
            raise ConfigError(f"requeue backoff must be True or False, not {backoff!r}")
        checked = None if delay is None else check_requeue_delay(delay)
        self.check_answerable("requeue")
        self._owner.requeue(self, checked, backoff)

    async def touch(self) -> None:
        """Reset the message's timeout on nsqd (keep it while a slow handler works)."""
        self.check_answerable("touch")
        self._owner.touch(self)
