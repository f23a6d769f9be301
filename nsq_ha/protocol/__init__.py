"""Sans-IO core of the NSQ TCP protocol (fork and vanilla): pure functions and data.

Nothing in this package opens sockets, awaits, reads clocks or logs. Connections feed it bytes
and write the bytes it returns.

* :mod:`.commands` / :mod:`.publish` - the typed client commands the session takes
  (:class:`Sub`, :class:`Rdy`, :class:`Fin`, :class:`Publish`, ...), and checked ``encode_*``
  functions (arguments -> bytes);
* :mod:`.frames` - server-to-client framing (types, limits, :func:`encode_frame`);
* :mod:`.message` - message frame payloads (:func:`decode_message`, :class:`MessageFormat`) and
  the RDY check on receipt (:class:`DeliveryLedger`);
* :mod:`.trace` - the 30-byte traced publish response;
* :mod:`.identify` - IDENTIFY/AUTH payloads and :class:`Negotiated`;
* :mod:`.names` - topic/channel/partition/message-id rules;
* :mod:`.command_decoder` - the server side: decoding what a client sends (loaded on first
  use of its names: a client does not need it);
* :mod:`.session` / :mod:`.events` - :class:`ClientSession`, the client side of a connection:
  typed commands in, bytes out; bytes in (its :class:`FrameDecoder`), events out
  (:mod:`.error_frames` reads error frames for it).
"""

from typing import TYPE_CHECKING, Any

from nsq_ha.protocol.commands import (
    MAGIC_V2,
    Auth,
    Cls,
    Command,
    Fin,
    Identify,
    InternalCreateTopic,
    Nop,
    Rdy,
    Req,
    StartKind,
    StartPosition,
    Sub,
    SubAdvanced,
    SubOrdered,
    Touch,
    encode_auth,
    encode_cls,
    encode_fin,
    encode_identify,
    encode_internal_create_topic,
    encode_nop,
    encode_rdy,
    encode_req,
    encode_sub,
    encode_sub_advanced,
    encode_sub_ordered,
    encode_touch,
    ms_to_seconds,
    seconds_to_ms,
)
from nsq_ha.protocol.error_frames import closes_connection, must_drop, parse_error_frame
from nsq_ha.protocol.events import (
    NEED_DATA,
    Answer,
    CloseWait,
    Delivered,
    Event,
    Failed,
    Heartbeat,
    Synced,
)
from nsq_ha.protocol.frames import (
    CLOSE_WAIT,
    DEFAULT_MAX_FRAME_SIZE,
    HEARTBEAT,
    OK,
    Frame,
    FrameType,
    encode_frame,
    max_frame_size_for,
)
from nsq_ha.protocol.identify import (
    AuthResponse,
    ExtFilter,
    ExtFilterTerm,
    IdentifyRequest,
    IdentifyResponse,
    Negotiated,
    build_identify,
    is_fork_version,
    parse_auth_response,
    parse_identify_response,
)
from nsq_ha.protocol.message import (
    EXT_VERSION_JSON,
    EXT_VERSION_NONE,
    EXT_VERSION_TAG,
    DecodedMessage,
    DeliveryLedger,
    MessageFormat,
    decode_message,
    encode_message,
    join_fork_id,
    split_fork_id,
)
from nsq_ha.protocol.names import (
    DEFAULT_PARTITION,
    MAX_NAME_LENGTH,
    MAX_PARTITION,
    is_valid_name,
    validate_channel,
    validate_message_id,
    validate_partition,
    validate_topic,
)
from nsq_ha.protocol.publish import (
    Dpub,
    ExtHeader,
    Publish,
    PublishMessage,
    encode_dpub,
    encode_ext_header,
    encode_mpub,
    encode_mpub_ext,
    encode_mpub_trace,
    encode_pub,
    encode_pub_ext,
    encode_pub_trace,
)
from nsq_ha.protocol.session import ClientSession, FrameDecoder
from nsq_ha.protocol.trace import (
    TracedResponse,
    encode_traced_response,
    is_traced_response,
    parse_traced_response,
)

__all__ = [
    "CLOSE_WAIT",
    "DEFAULT_MAX_FRAME_SIZE",
    "DEFAULT_PARTITION",
    "EXT_VERSION_JSON",
    "EXT_VERSION_NONE",
    "EXT_VERSION_TAG",
    "HEARTBEAT",
    "MAGIC_V2",
    "MAX_NAME_LENGTH",
    "MAX_PARTITION",
    "NEED_DATA",
    "OK",
    "Answer",
    "Auth",
    "AuthResponse",
    "ClientCommand",
    "ClientSession",
    "CloseWait",
    "Cls",
    "Command",
    "CommandDecoder",
    "DecodedMessage",
    "Delivered",
    "DeliveryLedger",
    "Dpub",
    "Event",
    "ExtFilter",
    "ExtFilterTerm",
    "ExtHeader",
    "Failed",
    "Fin",
    "Frame",
    "FrameDecoder",
    "FrameType",
    "Heartbeat",
    "Identify",
    "IdentifyRequest",
    "IdentifyResponse",
    "InternalCreateTopic",
    "Magic",
    "MessageFormat",
    "Negotiated",
    "Nop",
    "Publish",
    "PublishMessage",
    "Rdy",
    "Req",
    "StartKind",
    "StartPosition",
    "Sub",
    "SubAdvanced",
    "SubOrdered",
    "Synced",
    "Touch",
    "TracedResponse",
    "build_identify",
    "closes_connection",
    "decode_message",
    "encode_auth",
    "encode_cls",
    "encode_dpub",
    "encode_ext_header",
    "encode_fin",
    "encode_frame",
    "encode_identify",
    "encode_internal_create_topic",
    "encode_message",
    "encode_mpub",
    "encode_mpub_ext",
    "encode_mpub_trace",
    "encode_nop",
    "encode_pub",
    "encode_pub_ext",
    "encode_pub_trace",
    "encode_rdy",
    "encode_req",
    "encode_sub",
    "encode_sub_advanced",
    "encode_sub_ordered",
    "encode_touch",
    "encode_traced_response",
    "is_fork_version",
    "is_traced_response",
    "is_valid_name",
    "join_fork_id",
    "max_frame_size_for",
    "ms_to_seconds",
    "must_drop",
    "parse_auth_response",
    "parse_error_frame",
    "parse_identify_response",
    "parse_traced_response",
    "seconds_to_ms",
    "split_ext_message",
    "split_fork_id",
    "split_mpub_body",
    "split_trace_message",
    "validate_channel",
    "validate_message_id",
    "validate_partition",
    "validate_topic",
]

#: The server side's names, imported from :mod:`.command_decoder` when first asked for.
_SERVER_SIDE = frozenset(
    {
        "ClientCommand",
        "CommandDecoder",
        "Magic",
        "split_ext_message",
        "split_mpub_body",
        "split_trace_message",
    }
)

if TYPE_CHECKING:
    from nsq_ha.protocol.command_decoder import (
        ClientCommand,
        CommandDecoder,
        Magic,
        split_ext_message,
        split_mpub_body,
        split_trace_message,
    )


def __getattr__(name: str) -> Any:
    """The server side's names, loaded on first use."""
    if name in _SERVER_SIDE:
        from nsq_ha.protocol import command_decoder

        return getattr(command_decoder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
