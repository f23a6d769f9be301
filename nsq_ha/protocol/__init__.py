"""Sans-IO core of the NSQ TCP protocol (fork and vanilla): typed commands in, bytes out; bytes
in, events out. Nothing here opens sockets, awaits, reads clocks or logs.

The server side (:mod:`.command_decoder`, decoding what a client sends, and :mod:`.broker`,
encoding what nsqd writes) loads on first use of its names: a client does not need it.
"""

import importlib
from typing import TYPE_CHECKING, Any

from nsq_ha.protocol.commands import (
    MAGIC_V2,
    Auth,
    Cls,
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
    ms_to_seconds,
    seconds_to_ms,
)
from nsq_ha.protocol.frames import (
    Frame,
    FrameType,
    encode_frame,
)
from nsq_ha.protocol.identify import (
    build_identify,
    parse_identify_response,
)
from nsq_ha.protocol.message import (
    DecodedMessage,
    MessageFormat,
    decode_message,
)
from nsq_ha.protocol.names import (
    is_valid_name,
    validate_channel,
    validate_message_id,
    validate_partition,
    validate_topic,
)
from nsq_ha.protocol.publish import Dpub, Publish, PublishMessage, encode_ext_header
from nsq_ha.protocol.session import FrameDecoder
from nsq_ha.protocol.trace import (
    TracedResponse,
    is_traced_response,
    parse_traced_response,
)

__all__ = [
    "MAGIC_V2",
    "Auth",
    "ClientCommand",
    "Cls",
    "CommandDecoder",
    "DecodedMessage",
    "Dpub",
    "Fin",
    "Frame",
    "FrameDecoder",
    "FrameType",
    "Identify",
    "InternalCreateTopic",
    "Magic",
    "MessageFormat",
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
    "Touch",
    "TracedResponse",
    "build_identify",
    "decode_message",
    "encode_ext_header",
    "encode_frame",
    "encode_message",
    "encode_traced_response",
    "is_traced_response",
    "is_valid_name",
    "join_fork_id",
    "ms_to_seconds",
    "parse_identify_response",
    "parse_traced_response",
    "seconds_to_ms",
    "split_ext_message",
    "split_mpub_body",
    "split_trace_message",
    "validate_channel",
    "validate_message_id",
    "validate_partition",
    "validate_topic",
]

#: The server side's names, imported from their module when first asked for.
_SERVER_SIDE = {
    "ClientCommand": "command_decoder",
    "CommandDecoder": "command_decoder",
    "Magic": "command_decoder",
    "split_ext_message": "command_decoder",
    "split_mpub_body": "command_decoder",
    "split_trace_message": "command_decoder",
    "encode_message": "broker",
    "encode_traced_response": "broker",
    "join_fork_id": "broker",
}

if TYPE_CHECKING:
    from nsq_ha.protocol.broker import encode_message, encode_traced_response, join_fork_id
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
        module = importlib.import_module(f"nsq_ha.protocol.{_SERVER_SIDE[name]}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
