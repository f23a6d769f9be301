"""The blocking consumer's per-message work, compiled with the hot modules: handing each
message out in the calling thread (:func:`hand_out`), and queuing its answer for the loop.

:class:`Message`'s read-only properties are written out, not made after import: a native class
takes no attribute set on it later (``tests/unit/test_sync_handout.py`` checks none is missing).
"""

from __future__ import annotations

import collections
import functools
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, final

from nsq_ha.consumer import Message as AsyncMessage
from nsq_ha.consumer.checks import check_requeue_delay
from nsq_ha.errors import MessageAlreadyRespondedError, MessageConnectionGoneError

if TYPE_CHECKING:
    from nsq_ha._sync_runtime import LoopThread
    from nsq_ha.consumer import Outcome
    from nsq_ha.protocol.message import DecodedMessage

log = logging.getLogger("nsq_ha.sync")


class _Source(Protocol):
    """What :func:`hand_out` needs of the blocking consumer."""

    def _live(self) -> LoopThread: ...

    def _fetch(self, runner: LoopThread, limit: float | None) -> bool: ...


@final
class Answers:
    """One consumer's answers (finish, requeue) given in blocking threads, queued in ``queue`` and
    written on the loop together: the first of a burst calls :meth:`wake` (one wake-up for all)."""

    __slots__ = ("_flushing", "queue", "runner")

    def __init__(self, runner: LoopThread) -> None:
        self.runner = runner
        #: a message to finish, or a call (a requeue), in the order given
        self.queue: collections.deque[AsyncMessage | Callable[[], object]] = collections.deque()
        self._flushing = False

    def wake(self) -> None:
        """Have the loop :meth:`flush` soon (the queue has answers)."""
        self._flushing = True
        self.runner.loop.call_soon_threadsafe(self.flush)

    def flush(self) -> None:
        """On the loop: write every queued answer, in order; what one raises is logged."""
        self._flushing = False  # before taking any: an answer queued from now on wakes again
        queue = self.queue
        while queue:
            answer = queue.popleft()
            try:
                if isinstance(answer, AsyncMessage):
                    answer.finish_nowait()
                else:
                    answer()
            except Exception:  # the answers after it are still written
                log.warning("an answer given in a blocking caller failed", exc_info=True)


def hand_out(
    source: _Source,
    runner: LoopThread,
    fetched: collections.deque[AsyncMessage],
    answers: Answers,
    make: Callable[[], Message] | None = None,
) -> Iterator[Message]:
    """The blocking consumer's iteration: each fetched message, handed out, until closed
    (``make`` replaces :class:`Message`: the interrupt tests' stand-in raises once)."""
    while True:
        if runner.stale:
            source._live()  # raises
        handed = hand_one(fetched, answers, make)
        if handed is not None:
            yield handed
        elif not source._fetch(runner, None):
            return


def hand_one(
    fetched: collections.deque[AsyncMessage],
    answers: Answers,
    make: Callable[[], Message] | None = None,
) -> Message | None:
    """The next fetched message, handed out (None: none is fetched); one interrupted (Ctrl-C)
    before it is handed out stays first in ``fetched``."""
    message = None
    try:
        message = fetched.popleft()
        handed = Message() if make is None else make()
        handed._message = message
        handed._answers = answers
        handed._answered = None
    except IndexError:
        return None
    except BaseException:
        if message is not None:
            fetched.appendleft(message)
        raise
    return handed


def gone(runner: LoopThread) -> str:
    """Why objects bound to ``runner`` cannot work in this process."""
    if runner.pid != os.getpid():
        return f"its connections belong to process {runner.pid} and this is a child forked from it"
    return "its event loop thread has ended"


@final
class Message:
    """Blocking view of a consumed :class:`nsq_ha.consumer.Message`: the same attributes.

    :meth:`finish` and :meth:`requeue` hand the answer to the consumer's loop and return
    without waiting for it (answers given together leave in one loop turn). Answering twice
    raises MessageAlreadyRespondedError at once; :meth:`touch` blocks until written.
    """

    __slots__ = ("_answered", "_answers", "_message")

    # No ``__init__``: made by hand_out (and Consumer.get), one per message; ``Message()`` then
    # setting the three attributes costs a Python call less (pure Python)
    _message: AsyncMessage
    _answers: Answers
    #: what this handle answered, before the loop has written it (None: not answered)
    _answered: str | None

    def __repr__(self) -> str:
        return repr(self._message)

    @property
    def aio(self) -> AsyncMessage:
        """The asyncio message underneath."""
        return self._message

    @property
    def responded(self) -> bool:
        """True once finished or requeued here (or answered otherwise: abandoned)."""
        return self._answered is not None or self._message.responded

    def _live(self) -> LoopThread:
        runner = self._answers.runner
        if runner.stale:
            raise MessageConnectionGoneError(
                f"{self._message!r} cannot be answered here: {gone(runner)}"
            )
        return runner

    def _answer(self, action: str) -> None:
        self._live()
        if self._answered is not None:
            raise MessageAlreadyRespondedError(
                f"cannot {action} {self._message!r}: it was already {self._answered}"
            )
        self._message.check_answerable(action)

    def finish(self) -> None:
        """Acknowledge the message (FIN on the connection that delivered it)."""
        answers = self._answers
        message = self._message
        if self._answered is not None or message.outcome is not None or answers.runner.stale:
            self._answer("finish")  # raises what applies (unless it changed meanwhile)
        self._answered = "finished"
        answers.queue.append(message)
        if not answers._flushing:
            answers.wake()

    def requeue(self, delay: object = None, *, backoff: object = True) -> None:
        """Give the message back (see :meth:`nsq_ha.consumer.Message.requeue`)."""
        # ``delay`` and ``backoff`` are any object: a bad delay raises ConfigError here, also
        # compiled (mypyc would raise its TypeError first for a ``float | None`` parameter)
        if delay is not None:
            delay = check_requeue_delay(delay, "requeue delay")
        self._answer("requeue")
        self._answered = "requeued"
        requeue: Callable[..., None] = self._message.requeue_nowait
        answers = self._answers
        answers.queue.append(functools.partial(requeue, delay, backoff=backoff))
        if not answers._flushing:
            answers.wake()

    def touch(self) -> None:
        """Reset the message's timeout on nsqd."""
        self._live().run(self._message.touch())

    # The asyncio message's other attributes, read-only (the same names as dir() lists)

    @property
    def body(self) -> bytes:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.body`."""
        return self._message.body

    @property
    def id(self) -> bytes:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.id`."""
        return self._message.id

    @property
    def internal_id(self) -> int | None:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.internal_id`."""
        return self._message.internal_id

    @property
    def trace_id(self) -> int | None:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.trace_id`."""
        return self._message.trace_id

    @property
    def attempts(self) -> int:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.attempts`."""
        return self._message.attempts

    @property
    def timestamp(self) -> int:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.timestamp`."""
        return self._message.timestamp

    @property
    def offset(self) -> int | None:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.offset`."""
        return self._message.offset

    @property
    def raw_size(self) -> int | None:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.raw_size`."""
        return self._message.raw_size

    @property
    def ext_version(self) -> int | None:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.ext_version`."""
        return self._message.ext_version

    @property
    def ext_data(self) -> bytes | None:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.ext_data`."""
        return self._message.ext_data

    @property
    def ext(self) -> Mapping[str, Any]:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.ext`."""
        return self._message.ext

    @property
    def tag(self) -> str | None:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.tag`."""
        return self._message.tag

    @property
    def decoded(self) -> DecodedMessage:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.decoded`."""
        return self._message.decoded

    @property
    def topic(self) -> str:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.topic`."""
        return self._message.topic

    @property
    def channel(self) -> str:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.channel`."""
        return self._message.channel

    @property
    def partition(self) -> int | None:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.partition`."""
        return self._message.partition

    @property
    def address(self) -> str:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.address`."""
        return self._message.address

    @property
    def ordered(self) -> bool:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.ordered`."""
        return self._message.ordered

    @property
    def outcome(self) -> Outcome | None:
        """The asyncio message's :attr:`~nsq_ha.consumer.Message.outcome`."""
        return self._message.outcome

    @property
    def check_answerable(self) -> Callable[[str], None]:
        """The asyncio message's :meth:`~nsq_ha.consumer.Message.check_answerable`."""
        return self._message.check_answerable

    @property
    def finish_nowait(self) -> Callable[[], None]:
        """The asyncio message's :meth:`~nsq_ha.consumer.Message.finish_nowait`."""
        return self._message.finish_nowait

    @property
    def requeue_nowait(self) -> Callable[..., None]:
        """The asyncio message's :meth:`~nsq_ha.consumer.Message.requeue_nowait`."""
        return self._message.requeue_nowait
