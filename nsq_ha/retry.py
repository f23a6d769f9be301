"""The one place that turns an error into what to do next.

:func:`decide` reads the flags ``errors.py`` puts on every error (``retriable``,
``refresh_lookup``; a broker error's ``fatal``, set by the connection from the command that
failed) and nothing else, so the producer, the consumer and the tools cannot disagree::

    error                                   retry  refresh lookup  reconnect
    ------------------------------------    -----  --------------  ---------
    not an NsqError (a bug, cancellation)   no     no              no
    NsqConnectionError, NsqTimeoutError,    flag   yes             yes
      RemoteProtocolError (the stream broke)
    BrokerError                             flag   flag or fatal   fatal or refresh_lookup
    any other NsqError                      flag   flag            no

A broker error that says the partition moved (``refresh_lookup``) also drops the connection
even when nsqd keeps it open: connections are per (node, partition), and that node no longer
leads the partition. Whether the caller may still retry (a producer that is closing does not)
is the caller's business.

**Retry loops** (:func:`retry_after`) are tenacity's, built in one place so that every loop
stops, waits, logs and gives up the same way (ARCHITECTURE.md, "retry", tells how); the first
attempt is the caller's, so an operation that succeeds never builds a retry object.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NoReturn, TypeVar, cast

from tenacity import AsyncRetrying, RetryCallState, wait_exponential, wait_random
from tenacity.retry import retry_if_exception
from tenacity.wait import wait_base

from .errors import BrokerError, NsqConnectionError, NsqError, NsqTimeoutError, RemoteProtocolError

__all__ = [
    "GIVE_UP",
    "LOOKUPD",
    "PUBLISH",
    "RECONNECT",
    "Backoff",
    "Decision",
    "Failure",
    "decide",
    "log_failure",
    "retry_after",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do after an error."""

    #: Trying the same operation again may succeed (after the retry policy's wait).
    retry: bool
    #: Ask nsqlookupd again before the next try: the partition map is stale.
    refresh_lookup: bool
    #: Drop the connection the error came from and open a new one for the next try.
    reconnect: bool


#: The decision for an error nothing can be done about.
GIVE_UP = Decision(retry=False, refresh_lookup=False, reconnect=False)

_BROKEN_STREAM = (NsqConnectionError, NsqTimeoutError, RemoteProtocolError)


def decide(exc: BaseException) -> Decision:
    """Turn ``exc``'s flags into retry / refresh the lookup / reconnect / give up."""
    if not isinstance(exc, NsqError):
        return GIVE_UP
    if isinstance(exc, _BROKEN_STREAM):
        return Decision(retry=exc.retriable, refresh_lookup=True, reconnect=True)
    if isinstance(exc, BrokerError):
        reconnect = exc.fatal or exc.refresh_lookup  # a stale map or a lost connection: ask again
        return Decision(retry=exc.retriable, refresh_lookup=reconnect, reconnect=reconnect)
    return Decision(retry=exc.retriable, refresh_lookup=exc.refresh_lookup, reconnect=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """The waits of one kind of retry: ``initial`` seconds after the first failure, doubling
    after each failure up to ``cap``, plus up to ``jitter`` seconds at random (tenacity's
    ``wait_exponential`` plus ``wait_random``; a ``cap`` below ``initial`` is every wait)."""

    initial: float
    cap: float
    jitter: float = 0.0

    def capped(self, cap: float, *, jitter: bool = True) -> Backoff:
        """This family with waits of at most ``cap`` (the initial wait and the jitter lowered
        to fit it); ``jitter=False``: without jitter."""
        return Backoff(
            initial=min(self.initial, cap), cap=cap, jitter=min(self.jitter, cap) if jitter else 0.0
        )

    def wait(self) -> wait_base:
        exponential = wait_exponential(multiplier=self.initial, max=self.cap)
        return exponential + wait_random(0, self.jitter) if self.jitter else exponential

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` failures in a row (1 for the first), for a timer."""
        state = RetryCallState(_CLOCK, fn=None, args=(), kwargs={})
        state.attempt_number = max(1, failures)
        return float(self.wait()(state))


#: a retry object that only lends its clock to :meth:`Backoff.delay`'s call state
_CLOCK = AsyncRetrying()

#: A publish (or its lookup), its caller waiting: short waits, as a fork's failover lists a new
#: leader within seconds; ``RetryPolicy``'s deadline bounds the whole, the jitter spreads producers.
PUBLISH = Backoff(initial=0.05, cap=1.0, jitter=0.1)
#: A consumer's lost connection (``ConsumerConfig``'s ``reconnect_interval`` and its max): each
#: try costs a lookup and a handshake; the cap is the lookup refresh interval, when the map would
#: show a new leader anyway.
RECONNECT = Backoff(initial=1.0, cap=30.0, jitter=0.5)
#: A failing nsqlookupd, skipped while another may be asked (``LookupClient``'s
#: ``max_backoff``): it is asked again at least once per refresh interval, the same cap.
LOOKUPD = Backoff(initial=0.5, cap=30.0, jitter=0.5)


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt, as the log line, ``on_retry`` and ``give_up`` see it."""

    #: what was tried, for the log (``"publish to 'orders'"``, ``"lookup of 'orders'"``)
    what: str
    #: the attempt that failed, 1 for the first
    attempt: int
    error: BaseException
    #: seconds before the next attempt (0.0 when the loop gives up)
    wait: float


def log_failure(
    logger: logging.Logger, what: str, attempt: int, reason: str, wait: float, until: str
) -> None:
    """One line for a failed attempt: a warning for the first in a row (``until`` says how long
    the retries go on), debug lines for the others, so that an outage logs one warning."""
    if attempt == 1:
        logger.warning(
            "%s failed on attempt 1 (%s); next try in %.2f s, retrying %s; further failures in "
            "a row are logged at debug level",
            what,
            reason,
            wait,
            until,
        )
    else:
        logger.debug(
            "%s failed on attempt %d (%s); next try in %.2f s", what, attempt, reason, wait
        )


def _text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def retry_after(
    first_error: BaseException,
    attempt: Callable[[int], Awaitable[T]],
    *,
    what: str,
    backoff: Backoff,
    should_retry: Callable[[BaseException], bool],
    attempts: int | None = None,
    deadline: float | None = None,
    started: float | None = None,
    on_retry: Callable[[Failure], None] | None = None,
    give_up: Callable[[Failure], BaseException] | None = None,
    describe: Callable[[BaseException], str] = _text,
    logger: logging.Logger = log,
) -> T:
    """``await attempt(n)`` for n = 2, 3, ... after the caller's attempt 1 failed with
    ``first_error``. ``started``: ``time.monotonic()`` when attempt 1 began (now by default),
    which ``deadline`` counts from. ``describe`` turns an error into the text logged (the caller
    redacts what may hold a secret).
    """
    first = time.monotonic() if started is None else started

    def failure(state: RetryCallState, wait: float) -> Failure:
        assert state.outcome is not None  # noqa: S101 - tenacity calls these after an attempt
        error = cast("BaseException", state.outcome.exception())
        return Failure(what, state.attempt_number, error, wait)

    def stop(state: RetryCallState) -> bool:
        if attempts is not None and state.attempt_number >= attempts:
            return True
        return deadline is not None and time.monotonic() - first >= deadline

    bounds = [f"{attempts} attempts"] if attempts is not None else []
    bounds += [f"{deadline:g} s"] if deadline is not None else []
    until = f"for up to {' or '.join(bounds)}" if bounds else "until it succeeds"

    def before_sleep(state: RetryCallState) -> None:
        failed = failure(state, state.upcoming_sleep)
        log_failure(logger, what, failed.attempt, describe(failed.error), failed.wait, until)
        if on_retry is not None:
            on_retry(failed)

    def exhausted(state: RetryCallState) -> NoReturn:
        failed = failure(state, 0.0)
        if give_up is None:
            raise failed.error
        raise give_up(failed) from failed.error

    number = 0

    async def next_attempt() -> T:
        nonlocal number
        number += 1
        if number == 1:  # tenacity's first attempt is the one already made
            raise first_error
        return await attempt(number)

    controller = AsyncRetrying(
        stop=stop,
        wait=backoff.wait(),
        retry=retry_if_exception(lambda exc: isinstance(exc, Exception) and should_retry(exc)),
        before_sleep=before_sleep,
        retry_error_callback=exhausted,
    )
    return cast("T", await controller(next_attempt))
