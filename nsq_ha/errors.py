"""Every exception nsq_ha raises, in one hierarchy.

::

    NsqError
    ├── ConfigError (also ValueError)             bad configuration or argument values
    │   ├── InvalidArgumentError                   an encoder refused an argument
    │   │   ├── InvalidNameError                   topic/channel name breaks the name rule
    │   │   └── BodyTooLargeError                  body over the negotiated size limit
    │   └── UnsupportedByServerError               server kind lacks it (UnsupportedByServer)
    ├── NsqTimeoutError (also TimeoutError)
    ├── NsqConnectionError
    │   ├── ConnectError                           could not open the TCP connection
    │   ├── ConnectionClosedError                  the peer closed (or the socket broke)
    │   └── HandshakeError                         magic / IDENTIFY / AUTH / TLS / compression
    ├── ProtocolError
    │   ├── LocalProtocolError                     we tried to do something the protocol forbids
    │   └── RemoteProtocolError                    the peer sent bytes we cannot understand
    ├── DiscoveryError
    │   ├── LookupdUnavailableError                no nsqlookupd answered
    │   │   └── LookupdNeverAnsweredError          none ever has: a wrong address (not retried)
    │   ├── TopicNotFoundError                     lookup does not know the topic
    │   │   └── TopicNotWritableError              known, but no partition is writable now
    │   └── PartitionNotAvailableError             the partition has no writable leader now
    ├── BrokerError                                an nsqd error frame (``.code``, ``.description``)
    │   ├── InvalidError               E_INVALID
    │   ├── BadProtocolError           E_BAD_PROTOCOL
    │   ├── BadBodyError               E_BAD_BODY
    │   ├── BadMessageError            E_BAD_MESSAGE
    │   ├── BadTopicError              E_BAD_TOPIC
    │   ├── BadChannelError            E_BAD_CHANNEL
    │   ├── BadPartitionError          E_BAD_PARTITION
    │   ├── IdentifyFailedError        E_IDENTIFY_FAILED
    │   ├── AuthError                  (base of the auth codes)
    │   │   ├── AuthDisabledError      E_AUTH_DISABLED
    │   │   ├── AuthFailedError        E_AUTH_FAILED
    │   │   ├── UnauthorizedError      E_UNAUTHORIZED
    │   │   ├── AuthServerError        E_AUTH_ERROR
    │   │   └── AuthFirstError         E_AUTH_FIRST
    │   ├── TopicNotExistError         E_TOPIC_NOT_EXIST
    │   ├── SubOrderRequiredError      E_SUB_ORDER_IS_MUST
    │   ├── ExtendSupportRequiredError E_SUB_EXTEND_NEED
    │   ├── ExtendSupportForbiddenError E_SUB_EXTEND_FORBIDDON (sic)
    │   ├── ChannelNotRegisteredError  E_SUB_CHANNEL_NOT_REGISTERED
    │   ├── PubTooMuchWaitingError     E_PUB_TOO_MUCH_WAITING
    │   ├── NotLeaderError             E_FAILED_ON_NOT_LEADER
    │   ├── NotWritableError           E_FAILED_ON_NOT_WRITABLE
    │   ├── PubFailedError             E_PUB_FAILED
    │   ├── MpubFailedError            E_MPUB_FAILED
    │   ├── DpubFailedError            E_DPUB_FAILED (vanilla)
    │   ├── ExtNotSupportedError       E_EXT_NOT_SUPPORT
    │   ├── InvalidJsonHeaderError     E_INVALID_JSON_HEADER
    │   ├── InvalidTraceIdError        INVALID_TRACE_ID
    │   ├── MessageCommandError        (base: carries ``.message_id``)
    │   │   ├── FinFailedError         E_FIN_FAILED
    │   │   ├── ReqFailedError         E_REQ_FAILED
    │   │   └── TouchFailedError       E_TOUCH_FAILED
    │   └── TooManyConnectionsError    "too much client connections" (no code)
    ├── PublishError                               retries exhausted (``.attempts``)
    ├── ProducerClosedError                        publishing on a closed producer
    ├── ConsumerClosedError                        starting a closed consumer
    └── MessageResponseError                       a message cannot be answered
        ├── MessageAlreadyRespondedError           already finished / requeued / timed out
        └── MessageConnectionGoneError             its connection is gone (also NsqConnectionError)

Classes and flags only: ``retriable``/``refresh_lookup`` are read by :mod:`nsq_ha.retry`;
``fatal``/``nonfatal_after``/``vanilla_fatal`` by :mod:`nsq_ha.protocol.error_frames`.
"""

from __future__ import annotations

from typing import ClassVar

#: Commands after which the fork keeps the connection open on a leadership error (§2.19).
_PUBLISH = frozenset(b"PUB PUB_TRACE PUB_EXT MPUB MPUB_TRACE MPUB_EXT DPUB".split())


class NsqError(Exception):
    """Root of every nsq_ha exception; a subclass sets its flags as class keywords."""

    #: Trying the same operation again may succeed.
    retriable: ClassVar[bool] = False
    #: The cached partition map is stale: look the topic up again before retrying.
    refresh_lookup: ClassVar[bool] = False

    def __init_subclass__(
        cls, *, retriable: bool | None = None, refresh_lookup: bool | None = None, **kwargs: object
    ) -> None:
        super().__init_subclass__(**kwargs)
        if retriable is not None:
            cls.retriable = retriable
        if refresh_lookup is not None:
            cls.refresh_lookup = refresh_lookup


class ConfigError(NsqError, ValueError):
    """A configuration value or a function argument is not acceptable."""


class InvalidArgumentError(ConfigError):
    """A protocol encoder refused an argument (bad partition, id, count, empty body, ...)."""


class InvalidNameError(InvalidArgumentError):
    """A topic or channel name breaks the rule ``^[.a-zA-Z0-9_-]+(#ephemeral)?$``, 1..64 bytes."""


class BodyTooLargeError(InvalidArgumentError):
    """A body is larger than the limit nsqd enforces (``max_msg_size`` / ``max_body_size``)."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"{what} is {size} bytes, over the limit of {limit} bytes")
        self.what, self.size, self.limit = what, size, limit


class UnsupportedByServerError(ConfigError):
    """The request needs a feature this server kind lacks (DPUB on the fork; partitions, traces
    or ext headers on vanilla nsqd); raised before anything is sent."""


#: The name the issue tracker and the docs use.
UnsupportedByServer = UnsupportedByServerError


class NsqTimeoutError(NsqError, TimeoutError, retriable=True):
    """An operation did not finish in time."""


class NsqConnectionError(NsqError, retriable=True):
    """The TCP connection could not be used."""


class ConnectError(NsqConnectionError):
    """Opening the TCP connection failed."""


class ConnectionClosedError(NsqConnectionError):
    """The connection was closed, by the peer or after a fatal error."""


class HandshakeError(NsqConnectionError, retriable=False):
    """The magic, IDENTIFY, AUTH, TLS or compression negotiation failed."""


class ProtocolError(NsqError):
    """The byte stream broke the NSQ protocol."""


class LocalProtocolError(ProtocolError):
    """We were about to do something the protocol forbids (a bug on our side)."""


class RemoteProtocolError(ProtocolError, retriable=True):
    """The peer sent something we cannot decode; the connection must be dropped."""


class DiscoveryError(NsqError):
    """Looking up where a topic lives failed."""


class LookupdUnavailableError(DiscoveryError, retriable=True):
    """No nsqlookupd answered (retried: one that answered before may be restarting)."""


class LookupdNeverAnsweredError(LookupdUnavailableError, retriable=False):
    """No nsqlookupd given has answered since the client started (refused, unknown host, or an
    answer that is not HTTP): a wrong address, not an outage, so it is not retried."""


class TopicNotFoundError(DiscoveryError):
    """nsqlookupd does not know the topic; not retriable (``nsq-ha topic create`` makes it on the
    fork, a publish to an nsqd on vanilla). A consumer started on it keeps watching lookup."""


class TopicNotWritableError(TopicNotFoundError, retriable=True, refresh_lookup=True):
    """The topic exists but no partition is writable now (new topic, channel missing, failover);
    retriable with a fresh lookup: a new fork topic is writable within seconds, a failover ends."""


class PartitionNotAvailableError(DiscoveryError, retriable=True, refresh_lookup=True):
    """The partition a message must go to has no writable leader in the current lookup; keyed
    messages are never sent elsewhere, so this is retried (with a lookup refresh)."""


_REGISTRY: dict[str, type[BrokerError]] = {}


class BrokerError(NsqError):
    """An error frame sent by nsqd: ``<CODE> <description>``; a subclass names its code as a
    class keyword (``code="E_FAILED_ON_NOT_LEADER"``) and is found by :meth:`class_for`."""

    #: The code token this class stands for (empty on the generic class).
    wire_code: ClassVar[str] = ""
    #: nsqd closes the connection after this error (the usual case; see ``nonfatal_after``).
    fatal: bool = True
    #: Commands after which the fork keeps the connection open although ``fatal`` says otherwise.
    nonfatal_after: ClassVar[frozenset[bytes]] = frozenset()
    #: Vanilla nsqd closes the connection after this error.
    vanilla_fatal: ClassVar[bool] = True

    def __init__(self, code: str, description: str = "", *, fatal: bool | None = None) -> None:
        super().__init__(f"{code} {description}".rstrip() if description else code)
        self.code, self.description = code, description
        if fatal is not None:
            self.fatal = fatal

    def __init_subclass__(cls, *, code: str = "", fatal: bool | None = None, **flags: bool) -> None:
        super().__init_subclass__(**flags)
        if code:
            cls.wire_code = code
            _REGISTRY[code] = cls
        if fatal is not None:
            cls.fatal = fatal

    @classmethod
    def class_for(cls, code: str) -> type[BrokerError]:
        """Return the class registered for ``code`` (``BrokerError`` for an unknown code)."""
        return _REGISTRY.get(code, BrokerError)


class InvalidError(BrokerError, code="E_INVALID"):
    """E_INVALID: wrong state, bad parameters, unknown command, bad RDY or message id."""


class BadProtocolError(BrokerError, code="E_BAD_PROTOCOL"):
    """E_BAD_PROTOCOL: the magic was not ``  V2``."""


class BadBodyError(BrokerError, code="E_BAD_BODY"):
    """E_BAD_BODY: a body size or format problem."""


class BadMessageError(BrokerError, code="E_BAD_MESSAGE"):
    """E_BAD_MESSAGE: a message is too big or truncated."""


class BadTopicError(BrokerError, code="E_BAD_TOPIC"):
    """E_BAD_TOPIC: invalid topic name."""


class BadChannelError(BrokerError, code="E_BAD_CHANNEL"):
    """E_BAD_CHANNEL: invalid channel name."""


class BadPartitionError(BrokerError, code="E_BAD_PARTITION"):
    """E_BAD_PARTITION: the partition token is not an integer, or an ordered topic needs one."""


class IdentifyFailedError(BrokerError, code="E_IDENTIFY_FAILED"):
    """E_IDENTIFY_FAILED: IDENTIFY or the TLS/compression upgrade failed."""


class AuthError(BrokerError):
    """Base of the authorization error codes."""


class AuthDisabledError(AuthError, code="E_AUTH_DISABLED"):
    """E_AUTH_DISABLED: AUTH sent to an nsqd without an auth server."""


class AuthFailedError(AuthError, code="E_AUTH_FAILED"):
    """E_AUTH_FAILED: the auth server could not be asked or said no."""


class UnauthorizedError(AuthError, code="E_UNAUTHORIZED"):
    """E_UNAUTHORIZED: the identity lacks the permission."""


class AuthServerError(AuthError, code="E_AUTH_ERROR"):
    """E_AUTH_ERROR: the auth server answered with an error."""


class AuthFirstError(AuthError, code="E_AUTH_FIRST"):
    """E_AUTH_FIRST: the command needs a successful AUTH first."""


class TopicNotExistError(
    BrokerError, code="E_TOPIC_NOT_EXIST", retriable=True, refresh_lookup=True
):
    """E_TOPIC_NOT_EXIST: the topic/partition is not on this nsqd (never auto-created)."""


class SubOrderRequiredError(BrokerError, code="E_SUB_ORDER_IS_MUST"):
    """E_SUB_ORDER_IS_MUST: an ordered topic accepts only SUB_ORDERED."""

    def __str__(self) -> str:
        return (
            f"{super().__str__()}: the topic is ordered; leave the consumer's ordered=None (it "
            "then subscribes with SUB_ORDERED) or set ordered=True, not ordered=False"
        )


class ExtendSupportRequiredError(BrokerError, code="E_SUB_EXTEND_NEED"):
    """E_SUB_EXTEND_NEED: an ext topic needs IDENTIFY ``extend_support: true``."""


class ExtendSupportForbiddenError(BrokerError, code="E_SUB_EXTEND_FORBIDDON"):
    """E_SUB_EXTEND_FORBIDDON (spelled so by nsqd): a non-ext topic with ``extend_support``."""


class ChannelNotRegisteredError(BrokerError, code="E_SUB_CHANNEL_NOT_REGISTERED"):
    """E_SUB_CHANNEL_NOT_REGISTERED: the topic does not auto-create channels."""


class PubTooMuchWaitingError(BrokerError, code="E_PUB_TOO_MUCH_WAITING", retriable=True):
    """E_PUB_TOO_MUCH_WAITING: back-pressure, too many bytes queued on the partition."""


class NotLeaderError(BrokerError, code="E_FAILED_ON_NOT_LEADER"):
    """E_FAILED_ON_NOT_LEADER: not the partition's leader now (non-fatal after a publish: §2.19)."""

    retriable = True
    refresh_lookup = True
    nonfatal_after = _PUBLISH


class NotWritableError(BrokerError, code="E_FAILED_ON_NOT_WRITABLE"):
    """E_FAILED_ON_NOT_WRITABLE: replication trouble or consuming disabled (as NotLeaderError)."""

    retriable = True
    refresh_lookup = True
    nonfatal_after = _PUBLISH


class PubFailedError(BrokerError, code="E_PUB_FAILED", retriable=True, fatal=False):
    """E_PUB_FAILED: the write failed (non-fatal on the fork, fatal on vanilla)."""


class MpubFailedError(BrokerError, code="E_MPUB_FAILED", retriable=True, fatal=False):
    """E_MPUB_FAILED: the batch write failed (non-fatal on the fork, fatal on vanilla)."""


class DpubFailedError(BrokerError, code="E_DPUB_FAILED", retriable=True):
    """E_DPUB_FAILED: vanilla's deferred publish failed."""


class ExtNotSupportedError(BrokerError, code="E_EXT_NOT_SUPPORT", fatal=False):
    """E_EXT_NOT_SUPPORT: JSON headers sent to a non-ext topic."""


class InvalidJsonHeaderError(BrokerError, code="E_INVALID_JSON_HEADER", fatal=False):
    """E_INVALID_JSON_HEADER: the ext header is not valid JSON."""


class InvalidTraceIdError(BrokerError, code="INVALID_TRACE_ID", fatal=False):
    """INVALID_TRACE_ID: ``##trace_id`` is not a string holding a decimal u64."""


class MessageCommandError(BrokerError, fatal=False):
    """Base of the non-fatal FIN/REQ/TOUCH failures; ``message_id`` says which message (the
    16-byte id the description names, set by the error frame reader; ``None``: none named)."""

    vanilla_fatal = False
    message_id: bytes | None = None


class FinFailedError(MessageCommandError, code="E_FIN_FAILED"):
    """E_FIN_FAILED: the message is not in flight (timed out, or owned by another client)."""


class ReqFailedError(MessageCommandError, code="E_REQ_FAILED"):
    """E_REQ_FAILED: the message is not in flight or was requeued too often."""


class TouchFailedError(MessageCommandError, code="E_TOUCH_FAILED"):
    """E_TOUCH_FAILED: the message is not in flight."""


class TooManyConnectionsError(BrokerError, code="too much client connections", retriable=True):
    """``too much client connections``: nsqd's connection limit (no code: the whole text)."""


class PublishError(NsqError):
    """A publish failed after every attempt; ``__cause__`` is the last error."""

    def __init__(
        self, message: str, *, attempts: int, last_error: BaseException | None = None
    ) -> None:
        super().__init__(message)
        self.attempts, self.last_error = attempts, last_error
        #: publish_many: per message, its PublishResult or the exception that stopped it
        self.results: list[object] | None = None
        if last_error is not None:
            self.__cause__ = last_error


class ProducerClosedError(NsqError):
    """The producer is closed (or closing): the publish was not sent."""


class ConsumerClosedError(NsqError):
    """The consumer is closed (or closing): it cannot be started again."""


class MessageResponseError(NsqError):
    """A message cannot be finished, requeued or touched (see the subclasses)."""


class MessageAlreadyRespondedError(MessageResponseError):
    """The message was already finished or requeued (by the handler, a give-up, or a drain)."""


class MessageConnectionGoneError(MessageResponseError, NsqConnectionError, retriable=False):
    """The connection that delivered the message (FIN/REQ/TOUCH must go there) is gone, so it is
    not retriable: nsqd redelivers it after ``msg_timeout`` (at once after a leader move)."""
