"""The error tree, the code registry, the fatal / retry flags and how error frames read
(nsq_ha.protocol.error_frames)."""

from __future__ import annotations

import builtins
import inspect

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_ha import errors
from nsq_ha.errors import (
    BodyTooLargeError,
    BrokerError,
    ConfigError,
    ConnectError,
    FinFailedError,
    InvalidArgumentError,
    InvalidError,
    InvalidNameError,
    MpubFailedError,
    NotLeaderError,
    NotWritableError,
    NsqConnectionError,
    NsqError,
    NsqTimeoutError,
    ProtocolError,
    PubFailedError,
    PublishError,
    RemoteProtocolError,
    ReqFailedError,
    TooManyConnectionsError,
    TopicNotExistError,
    TouchFailedError,
)
from nsq_ha.protocol.error_frames import closes_connection, must_drop, parse_error_frame

#: every exception class the module defines (and the alias naming one of them)
_ERROR_NAMES = [
    name
    for name, value in vars(errors).items()
    if isinstance(value, type) and value.__module__ == errors.__name__
]

# §2.19 plus vanilla's codes: code -> (class, fatal with no context on the fork)
CODES = {
    "E_BAD_PROTOCOL": (errors.BadProtocolError, True),
    "E_INVALID": (errors.InvalidError, True),
    "E_BAD_BODY": (errors.BadBodyError, True),
    "E_BAD_MESSAGE": (errors.BadMessageError, True),
    "E_BAD_TOPIC": (errors.BadTopicError, True),
    "E_BAD_CHANNEL": (errors.BadChannelError, True),
    "E_BAD_PARTITION": (errors.BadPartitionError, True),
    "E_IDENTIFY_FAILED": (errors.IdentifyFailedError, True),
    "E_AUTH_DISABLED": (errors.AuthDisabledError, True),
    "E_AUTH_FAILED": (errors.AuthFailedError, True),
    "E_UNAUTHORIZED": (errors.UnauthorizedError, True),
    "E_AUTH_ERROR": (errors.AuthServerError, True),
    "E_AUTH_FIRST": (errors.AuthFirstError, True),
    "E_TOPIC_NOT_EXIST": (errors.TopicNotExistError, True),
    "E_SUB_ORDER_IS_MUST": (errors.SubOrderRequiredError, True),
    "E_SUB_EXTEND_NEED": (errors.ExtendSupportRequiredError, True),
    "E_SUB_EXTEND_FORBIDDON": (errors.ExtendSupportForbiddenError, True),
    "E_SUB_CHANNEL_NOT_REGISTERED": (errors.ChannelNotRegisteredError, True),
    "E_PUB_TOO_MUCH_WAITING": (errors.PubTooMuchWaitingError, True),
    "E_FAILED_ON_NOT_LEADER": (errors.NotLeaderError, True),
    "E_FAILED_ON_NOT_WRITABLE": (errors.NotWritableError, True),
    "E_PUB_FAILED": (errors.PubFailedError, False),
    "E_MPUB_FAILED": (errors.MpubFailedError, False),
    "E_DPUB_FAILED": (errors.DpubFailedError, True),
    "E_EXT_NOT_SUPPORT": (errors.ExtNotSupportedError, False),
    "E_INVALID_JSON_HEADER": (errors.InvalidJsonHeaderError, False),
    "INVALID_TRACE_ID": (errors.InvalidTraceIdError, False),
    "E_FIN_FAILED": (errors.FinFailedError, False),
    "E_REQ_FAILED": (errors.ReqFailedError, False),
    "E_TOUCH_FAILED": (errors.TouchFailedError, False),
}


@pytest.mark.parametrize(("code", "expected"), CODES.items())
def test_every_code_maps_to_its_class(code: str, expected: tuple[type[BrokerError], bool]) -> None:
    error_cls, fatal = expected
    error = parse_error_frame(f"{code} some description".encode())
    assert type(error) is error_cls
    assert error.code == code
    assert error.description == "some description"
    assert error.fatal is fatal
    assert str(error).startswith(f"{code} some description")  # a hint may follow
    assert BrokerError.class_for(code) is error_cls


def test_the_registry_holds_exactly_the_documented_codes() -> None:
    registered = {
        cls.wire_code
        for cls in vars(errors).values()
        if inspect.isclass(cls) and issubclass(cls, BrokerError) and cls.wire_code
    }
    # the connection-limit text has no code: the whole text stands for it
    assert registered == {*CODES, "too much client connections"}


def test_empty_description_keeps_the_code_and_no_trailing_space_in_str() -> None:
    error = parse_error_frame(b"E_TOPIC_NOT_EXIST ")
    assert isinstance(error, TopicNotExistError)
    assert (error.code, error.description, str(error)) == (
        "E_TOPIC_NOT_EXIST",
        "",
        "E_TOPIC_NOT_EXIST",
    )
    bare = parse_error_frame(b"E_BAD_PROTOCOL")
    assert (bare.code, bare.description) == ("E_BAD_PROTOCOL", "")


def test_codes_match_on_the_whole_token_not_a_prefix() -> None:
    assert type(parse_error_frame(b"E_INVALID_JSON_HEADER x")) is errors.InvalidJsonHeaderError
    assert type(parse_error_frame(b"E_INVALID x")) is InvalidError
    unknown = parse_error_frame(b"E_INVALIDATED something")
    assert type(unknown) is BrokerError
    assert unknown.code == "E_INVALIDATED"
    assert unknown.fatal is True


def test_unknown_code_is_a_generic_broker_error() -> None:
    error = parse_error_frame(b"E_SOMETHING_NEW with text")
    assert type(error) is BrokerError
    assert (error.code, error.description) == ("E_SOMETHING_NEW", "with text")
    assert not error.retriable


def test_non_utf8_text_does_not_raise() -> None:
    error = parse_error_frame(b"E_FIN_FAILED \xff\xfe")
    assert isinstance(error, FinFailedError)


def test_connection_limit_text_without_code() -> None:
    error = parse_error_frame(b"too much client connections")
    assert isinstance(error, TooManyConnectionsError)
    assert error.fatal is True
    assert error.retriable is True


@pytest.mark.parametrize("error_cls", [NotLeaderError, NotWritableError])
@pytest.mark.parametrize(
    ("after", "fatal"),
    [
        (b"PUB", False),
        (b"MPUB_TRACE", False),
        (b"PUB_EXT", False),
        (b"SUB", True),
        (b"FIN", True),
        (None, True),
    ],
)
def test_leader_errors_are_fatal_after_sub_and_fin_only(
    error_cls: type[BrokerError], after: bytes | None, fatal: bool
) -> None:
    assert closes_connection(error_cls, after) is fatal
    error = parse_error_frame(f"{error_cls.wire_code} ".encode())
    assert type(error) is error_cls
    assert must_drop(type(error), after) is fatal
    assert error.retriable
    assert error.refresh_lookup


def test_vanilla_closes_on_everything_but_fin_req_touch() -> None:
    for code, (error_cls, _) in CODES.items():
        expected = error_cls not in (FinFailedError, ReqFailedError, TouchFailedError)
        assert closes_connection(error_cls, b"PUB", fork=False) is expected, code
    assert closes_connection(PubFailedError, b"PUB") is False
    assert closes_connection(MpubFailedError, b"MPUB", fork=False) is True
    assert closes_connection(type(parse_error_frame(b"E_PUB_FAILED x")), None, fork=False)


def test_errors_after_mpub_ext_need_a_reconnect() -> None:
    ext_error = errors.ExtNotSupportedError
    assert closes_connection(ext_error, b"MPUB_EXT") is False
    assert must_drop(ext_error, b"MPUB_EXT") is True
    assert must_drop(ext_error, b"PUB_EXT") is False
    assert must_drop(ext_error, None) is False
    assert must_drop(InvalidError, b"RDY") is True


def test_retry_flags() -> None:
    assert TopicNotExistError.refresh_lookup
    assert TopicNotExistError.retriable
    assert errors.PubTooMuchWaitingError.retriable
    assert not errors.PubTooMuchWaitingError.refresh_lookup
    for never in (
        errors.BadBodyError,
        errors.BadMessageError,
        errors.BadTopicError,
        errors.ExtNotSupportedError,
        InvalidError,
        FinFailedError,
    ):
        assert not never.retriable, never
        assert not never.refresh_lookup, never
    assert NsqTimeoutError.retriable
    assert ConnectError.retriable
    assert not errors.HandshakeError.retriable
    assert errors.LookupdUnavailableError.retriable
    assert not errors.TopicNotFoundError.retriable
    assert errors.TopicNotWritableError.retriable
    assert errors.TopicNotWritableError.refresh_lookup


@pytest.mark.parametrize(
    ("data", "message_id"),
    [
        (
            b"E_FIN_FAILED FIN [0 0 0 0 0 0 3 231 0 0 0 0 0 0 0 0] failed ErrType:7 ErrCode:0 : "
            b"Message ID not in flight",
            bytes([0, 0, 0, 0, 0, 0, 3, 231]) + bytes(8),
        ),
        (
            b"E_REQ_FAILED REQ [0 0 0 0 0 0 3 231 0 0 0 0 0 0 0 7] failed Message ID not in flight",
            bytes([0, 0, 0, 0, 0, 0, 3, 231, 0, 0, 0, 0, 0, 0, 0, 7]),
        ),
        (b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight", b"0123456789abcdef"),
        (b"E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight", b"0123456789abcdef"),
        (b"E_FIN_FAILED FIN [0 0 0 0 0 0 3 999 0 0 0 0 0 0 0 0] failed x", None),
        (b"E_FIN_FAILED FIN [0 0 0] failed", None),
        (b"E_FIN_FAILED something else", None),
        (b"E_TOUCH_FAILED TOUCH \xc3\xa9123456789abcde failed x", None),
    ],
)
def test_fin_req_touch_failures_name_the_message(data: bytes, message_id: bytes | None) -> None:
    error = parse_error_frame(data)
    assert isinstance(error, errors.MessageCommandError)
    assert error.message_id == message_id


@given(st.binary(max_size=200))
def test_any_error_frame_parses_into_a_broker_error(data: bytes) -> None:
    error = parse_error_frame(data)
    assert isinstance(error, BrokerError)
    assert isinstance(must_drop(type(error), data[:10], fork=False), bool)
    text = data.decode("utf-8", errors="replace")
    if not isinstance(error, TooManyConnectionsError):
        assert error.code == text.partition(" ")[0]
    if isinstance(error, errors.MessageCommandError):
        assert error.message_id is None or len(error.message_id) == 16


def test_builtin_bases_and_no_shadowing() -> None:
    assert issubclass(ConfigError, ValueError)
    assert issubclass(InvalidNameError, ValueError)
    assert issubclass(InvalidNameError, NsqError)
    assert issubclass(NsqTimeoutError, TimeoutError)
    assert issubclass(RemoteProtocolError, ProtocolError)
    assert issubclass(ConnectError, NsqConnectionError)
    for name in _ERROR_NAMES:
        assert not hasattr(builtins, name), name
        assert issubclass(getattr(errors, name), NsqError), name


def test_every_documented_class_is_in_the_docstring_tree() -> None:
    doc = errors.__doc__ or ""
    for name in _ERROR_NAMES:
        assert name in doc, name


def test_body_too_large_names_size_and_limit() -> None:
    error = BodyTooLargeError("PUB body", 1048577, 1048576)
    assert (error.size, error.limit, error.what) == (1048577, 1048576, "PUB body")
    assert "1048577" in str(error)
    assert "1048576" in str(error)
    assert isinstance(error, InvalidArgumentError)


def test_publish_error_chains_the_last_error() -> None:
    last = NotLeaderError("E_FAILED_ON_NOT_LEADER")
    error = PublishError("gave up", attempts=3, last_error=last)
    assert error.attempts == 3
    assert error.__cause__ is last
    assert error.last_error is last
    assert PublishError("gave up", attempts=1).__cause__ is None


def test_explicit_fatal_overrides_the_class_default() -> None:
    assert InvalidError("E_INVALID", "x", fatal=False).fatal is False
    assert InvalidError("E_INVALID", "x").fatal is True


def test_sub_order_required_says_to_leave_ordered_unset() -> None:
    """nsqd's text alone names no fix: the error adds what to do (the wire fields stay)."""
    nsqd_text = "this topic is configured only allow ordered sub"
    error = parse_error_frame(b"E_SUB_ORDER_IS_MUST " + nsqd_text.encode())
    assert isinstance(error, errors.SubOrderRequiredError)
    assert (error.code, error.description) == ("E_SUB_ORDER_IS_MUST", nsqd_text)
    text = str(error)
    assert text.startswith(f"E_SUB_ORDER_IS_MUST {nsqd_text}")
    assert "ordered=None" in text
