"""The one retry decider: every error class against its decision (retry, refresh lookup,
reconnect), and the broker errors whose decision depends on the command that failed."""

from __future__ import annotations

import asyncio

import pytest

import nsq_ha.errors as errors
from nsq_ha.errors import BrokerError, NsqError
from nsq_ha.protocol.error_frames import must_drop, parse_error_frame
from nsq_ha.retry import GIVE_UP, Decision, decide

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
    "BadExtError": (False, True, True),
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
    "CreateTopicFailedError": (False, False, False),
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
    found = {getattr(errors, name) for name in errors.__all__}
    return sorted((c for c in found if isinstance(c, type)), key=lambda c: c.__name__)


def test_the_table_covers_every_error_class() -> None:
    assert {c.__name__ for c in _classes()} == set(TABLE)


@pytest.mark.parametrize("cls", _classes(), ids=lambda c: c.__name__)
def test_each_error_class_decides_as_the_table_says(cls: type[NsqError]) -> None:
    retry, refresh, reconnect = TABLE[cls.__name__]
    decision = decide(_build(cls))
    assert decision == Decision(retry=retry, refresh_lookup=refresh, reconnect=reconnect)
    assert decision.give_up is (not retry)
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
        (b"E_PUB_FAILED x", b"PUB t 0\n", True, (True, False, False)),
        # vanilla closes it: a new connection, and a fresh look at where the topic lives
        (b"E_PUB_FAILED x", b"PUB t\n", False, (True, True, True)),
        # not the leader any more: nsqd keeps the connection after PUB, but it leads nothing
        (b"E_FAILED_ON_NOT_LEADER x", b"PUB t 0\n", True, (True, True, True)),
        (b"E_FAILED_ON_NOT_LEADER x", b"SUB t c 0\n", True, (True, True, True)),
        # a header error after MPUB_EXT leaves the stream out of step (§2.15): reconnect
        (b"E_EXT_NOT_SUPPORT x", b"MPUB_EXT t 0\n", True, (False, True, True)),
        (b"E_EXT_NOT_SUPPORT x", b"PUB_EXT t 0\n", True, (False, False, False)),
        # the topic is not on this nsqd (moved, or not created yet): fatal, look again
        (b"E_TOPIC_NOT_EXIST ", b"PUB t 0\n", True, (True, True, True)),
        (b"E_BAD_TOPIC x", b"SUB t c\n", True, (False, True, True)),
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
