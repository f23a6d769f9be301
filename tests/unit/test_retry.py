"""The one retry decider: every error class against its decision (retry, refresh lookup,
reconnect), and the broker errors whose decision depends on the command that failed; the one
retry loop (tenacity): its waits, its bounds, its log, its last error and cancellation."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

import nsq_ha.errors as errors
from nsq_ha.errors import BrokerError, NsqError
from nsq_ha.protocol.error_frames import must_drop, parse_error_frame
from nsq_ha.retry import (
    GIVE_UP,
    LOOKUPD,
    PUBLISH,
    RECONNECT,
    Backoff,
    Decision,
    Failure,
    decide,
    retry_after,
)

#: class name -> (retry, refresh lookup, reconnect) for an error built without command context
#: (broker errors then carry their class's ``fatal``).
TABLE: dict[str, tuple[bool, bool, bool]] = {
    "AuthDisabledError": (False, True, True),
    "AuthError": (False, True, True),
    "AuthFailedError": (False, True, True),
    "AuthFirstError": (False, True, True),
    "AuthServerError": (False, True, True),
    "BadBodyError": (False, True, True),
    "BadChannelError": (False, True, True),
    "BadMessageError": (False, True, True),
    "BadPartitionError": (False, True, True),
    "BadProtocolError": (False, True, True),
    "BadTopicError": (False, True, True),
    "BodyTooLargeError": (False, False, False),
    "BrokerError": (False, True, True),
    "ChannelNotRegisteredError": (False, True, True),
    "ConfigError": (False, False, False),
    "ConnectError": (True, True, True),
    "ConnectionClosedError": (True, True, True),
    "ConsumerClosedError": (False, False, False),
    "DiscoveryError": (False, False, False),
    "DpubFailedError": (True, True, True),
    "ExtNotSupportedError": (False, False, False),
    "ExtendSupportForbiddenError": (False, True, True),
    "ExtendSupportRequiredError": (False, True, True),
    "FinFailedError": (False, False, False),
    "HandshakeError": (False, True, True),
    "IdentifyFailedError": (False, True, True),
    "InvalidArgumentError": (False, False, False),
    "InvalidError": (False, True, True),
    "InvalidJsonHeaderError": (False, False, False),
    "InvalidNameError": (False, False, False),
    "InvalidTraceIdError": (False, False, False),
    "LocalProtocolError": (False, False, False),
    "LookupdNeverAnsweredError": (False, False, False),
    "LookupdUnavailableError": (True, False, False),
    "MessageAlreadyRespondedError": (False, False, False),
    "MessageCommandError": (False, False, False),
    "MessageConnectionGoneError": (False, True, True),
    "MessageResponseError": (False, False, False),
    "MpubFailedError": (True, False, False),
    "NotLeaderError": (True, True, True),
    "NotWritableError": (True, True, True),
    "NsqConnectionError": (True, True, True),
    "NsqError": (False, False, False),
    "NsqTimeoutError": (True, True, True),
    "PartitionNotAvailableError": (True, True, False),
    "ProducerClosedError": (False, False, False),
    "ProtocolError": (False, False, False),
    "PubFailedError": (True, False, False),
    "PubTooMuchWaitingError": (True, True, True),
    "PublishError": (False, False, False),
    "RemoteProtocolError": (True, True, True),
    "ReqFailedError": (False, False, False),
    "SubOrderRequiredError": (False, True, True),
    "TooManyConnectionsError": (True, True, True),
    "TopicNotExistError": (True, True, True),
    "TopicNotFoundError": (False, False, False),
    "TopicNotWritableError": (True, True, False),
    "TouchFailedError": (False, False, False),
    "UnauthorizedError": (False, True, True),
    "UnsupportedByServerError": (False, False, False),
}


def _build(cls: type[NsqError]) -> NsqError:
    if issubclass(cls, BrokerError):
        return cls(cls.wire_code or "E_SOMETHING", "detail")
    if cls is errors.BodyTooLargeError:
        return errors.BodyTooLargeError("body", 2, 1)
    if cls is errors.PublishError:
        return errors.PublishError("gave up", attempts=3)
    return cls("detail")


def _classes() -> list[type[NsqError]]:
    found = {c for c in vars(errors).values() if isinstance(c, type)}
    return sorted((c for c in found if c.__module__ == errors.__name__), key=lambda c: c.__name__)


def test_the_table_covers_every_error_class() -> None:
    assert {c.__name__ for c in _classes()} == set(TABLE)


@pytest.mark.parametrize("cls", _classes(), ids=lambda c: c.__name__)
def test_each_error_class_decides_as_the_table_says(cls: type[NsqError]) -> None:
    retry, refresh, reconnect = TABLE[cls.__name__]
    decision = decide(_build(cls))
    assert decision == Decision(retry=retry, refresh_lookup=refresh, reconnect=reconnect)
    # the decision never contradicts the flags the class documents
    assert decision.retry is cls.retriable
    if cls.refresh_lookup:
        assert decision.refresh_lookup


@pytest.mark.parametrize(
    "exc", [ValueError("x"), asyncio.CancelledError(), OSError("x"), TimeoutError()]
)
def test_anything_but_an_nsq_error_gives_up(exc: BaseException) -> None:
    assert decide(exc) == GIVE_UP


@pytest.mark.parametrize(
    ("frame", "after", "fork", "expected"),
    [
        # the fork keeps the connection after a failed write: retry on it, lookup unchanged
        (b"E_PUB_FAILED x", b"PUB", True, (True, False, False)),
        # vanilla closes it: a new connection, and a fresh look at where the topic lives
        (b"E_PUB_FAILED x", b"PUB", False, (True, True, True)),
        # not the leader any more: nsqd keeps the connection after PUB, but it leads nothing
        (b"E_FAILED_ON_NOT_LEADER x", b"PUB", True, (True, True, True)),
        (b"E_FAILED_ON_NOT_LEADER x", b"SUB", True, (True, True, True)),
        # a header error after MPUB_EXT leaves the stream out of step (§2.15): reconnect
        (b"E_EXT_NOT_SUPPORT x", b"MPUB_EXT", True, (False, True, True)),
        (b"E_EXT_NOT_SUPPORT x", b"PUB_EXT", True, (False, False, False)),
        # the topic is not on this nsqd (moved, or not created yet): fatal, look again
        (b"E_TOPIC_NOT_EXIST ", b"PUB", True, (True, True, True)),
        (b"E_BAD_TOPIC x", b"SUB", True, (False, True, True)),
    ],
)
def test_broker_errors_decide_from_the_command_that_failed(
    frame: bytes, after: bytes, fork: bool, expected: tuple[bool, bool, bool]
) -> None:
    # as ClientSession does: the typed error, then whether the connection must go
    error = parse_error_frame(frame)
    error.fatal = must_drop(type(error), after, fork=fork)
    retry, refresh, reconnect = expected
    assert decide(error) == Decision(retry=retry, refresh_lookup=refresh, reconnect=reconnect)


# -- the retry loop (tenacity, built in one place) ---------------------------------------------

FAST = Backoff(initial=0.001, cap=0.002)


def worth_retrying(exc: BaseException) -> bool:
    """What the clients pass as should_retry (with their own state): the decision's retry."""
    return decide(exc).retry


class Script:
    """An operation whose attempts (2, 3, ...) raise the scripted errors, then return "done"."""

    def __init__(self, *errors_: BaseException) -> None:
        self.errors = list(errors_)
        self.calls: list[int] = []

    async def __call__(self, number: int) -> str:
        self.calls.append(number)
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def test_the_waits_double_from_initial_up_to_the_cap() -> None:
    backoff = Backoff(initial=0.05, cap=1.0)
    waits = [backoff.delay(n) for n in range(1, 9)]
    assert waits == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
    assert backoff.delay(10_000) == pytest.approx(1.0)  # no overflow however long the streak


def test_the_jitter_is_added_after_the_cap_so_capped_waits_still_spread() -> None:
    backoff = Backoff(initial=1.0, cap=1.0, jitter=0.5)
    waits = {backoff.delay(5) for _ in range(200)}
    assert all(1.0 <= w <= 1.5 for w in waits)
    assert len(waits) > 100  # spread, not one wait for every client at the cap


def test_the_three_loops_waits_are_one_family() -> None:
    for backoff in (PUBLISH, RECONNECT, LOOKUPD):
        assert backoff.delay(1) >= backoff.initial
        assert backoff.delay(100) <= backoff.cap + backoff.jitter
    assert PUBLISH.cap <= RECONNECT.cap == LOOKUPD.cap
    assert Backoff(initial=2.0, cap=1.0).delay(1) == 1.0  # a cap below the first wait rules


async def test_attempts_after_the_first_run_until_one_succeeds() -> None:
    heard: list[Failure] = []
    op = Script(errors.ConnectError("refused again"))
    result = await retry_after(
        errors.ConnectError("refused"),
        op,
        what="publish to 'orders'",
        backoff=FAST,
        attempts=5,
        on_retry=heard.append,
        should_retry=worth_retrying,
    )
    assert result == "done"
    assert op.calls == [2, 3]  # attempt 1 was the caller's
    assert [(f.attempt, str(f.error)) for f in heard] == [(1, "refused"), (2, "refused again")]
    assert all(0.001 <= f.wait <= 0.002 for f in heard)


async def test_giving_up_raises_the_typed_error_with_the_last_error_as_its_cause() -> None:
    last = errors.ConnectError("refused 3")
    op = Script(errors.ConnectError("refused 2"), last)

    def give_up(failed: Failure) -> BaseException:
        return errors.PublishError(f"{failed.what} failed {failed.attempt} times", attempts=3)

    with pytest.raises(errors.PublishError, match="publish failed 3 times") as caught:
        await retry_after(
            errors.ConnectError("refused 1"),
            op,
            what="publish",
            backoff=FAST,
            attempts=3,
            give_up=give_up,
            should_retry=worth_retrying,
        )
    assert caught.value.__cause__ is last
    assert op.calls == [2, 3]


async def test_giving_up_without_a_typed_error_raises_the_last_error_itself() -> None:
    last = errors.ConnectError("refused 2")
    with pytest.raises(errors.ConnectError) as caught:
        await retry_after(
            errors.ConnectError("refused 1"),
            Script(last),
            what="x",
            backoff=FAST,
            attempts=2,
            should_retry=worth_retrying,
        )
    assert caught.value is last
    assert caught.value.__cause__ is None


async def test_the_deadline_counts_from_the_first_attempt() -> None:
    op = Script()
    with pytest.raises(errors.LookupdUnavailableError, match="gave up") as caught:
        await retry_after(
            errors.ConnectError("refused"),
            op,
            what="x",
            backoff=FAST,
            deadline=5.0,
            started=time.monotonic() - 6.0,
            give_up=lambda f: errors.LookupdUnavailableError(f"gave up after {f.attempt}"),
            should_retry=worth_retrying,
        )
    assert op.calls == []  # the first attempt took the whole deadline: no second one
    assert isinstance(caught.value.__cause__, errors.ConnectError)


async def test_an_error_not_worth_another_try_is_raised_as_it_is() -> None:
    refused = errors.ConfigError("bad topic")
    op = Script(refused)
    with pytest.raises(errors.ConfigError) as caught:
        await retry_after(
            errors.ConnectError("x"),
            op,
            what="x",
            backoff=FAST,
            attempts=9,
            should_retry=worth_retrying,
        )
    assert caught.value is refused
    assert op.calls == [2]
    first = errors.ConfigError("at once")
    with pytest.raises(errors.ConfigError) as caught:
        await retry_after(
            first, op, what="x", backoff=FAST, attempts=9, should_retry=worth_retrying
        )
    assert caught.value is first
    assert op.calls == [2]


async def test_cancellation_is_never_retried_nor_wrapped() -> None:
    op = Script(asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await retry_after(
            errors.ConnectError("x"),
            op,
            what="x",
            backoff=FAST,
            attempts=9,
            should_retry=lambda exc: True,
        )
    assert op.calls == [2]


async def test_cancelling_the_wait_ends_the_loop_at_once() -> None:
    waiting = asyncio.Event()
    op = Script()
    task = asyncio.ensure_future(
        retry_after(
            errors.ConnectError("x"),
            op,
            what="x",
            backoff=Backoff(initial=60.0, cap=60.0),
            on_retry=lambda _: waiting.set(),
            should_retry=worth_retrying,
        )
    )
    async with asyncio.timeout(5):
        await waiting.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert op.calls == []


async def test_each_failure_logs_what_failed_the_attempt_and_the_next_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="nsq_ha.retry")
    op = Script(errors.ConnectError("refused 2"))
    await retry_after(
        errors.ConnectError("refused 1"),
        op,
        what="lookup of 'orders'",
        backoff=Backoff(initial=0.001, cap=0.001),
        attempts=5,
        deadline=60.0,
        should_retry=worth_retrying,
    )
    records = [r for r in caplog.records if r.name == "nsq_ha.retry"]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (
            logging.WARNING,
            "lookup of 'orders' failed on attempt 1 (refused 1); next try in 0.00 s, retrying "
            "for up to 5 attempts or 60 s; further failures in a row are logged at debug level",
        ),
        (logging.DEBUG, "lookup of 'orders' failed on attempt 2 (refused 2); next try in 0.00 s"),
    ]


async def test_the_logged_error_text_is_the_callers_description(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="nsq_ha.retry")
    await retry_after(
        errors.ConnectError("http://u:secret@h:4161 refused"),
        Script(),
        what="x",
        backoff=FAST,
        describe=lambda exc: "redacted",
        should_retry=worth_retrying,
    )
    assert "secret" not in caplog.text
    assert "(redacted)" in caplog.text
