"""Sans-IO core of the NSQ TCP protocol (fork and vanilla): typed commands in, bytes out; bytes
in, events out. Nothing here opens sockets, awaits, reads clocks or logs. The server side
(:mod:`.command_decoder`, :mod:`.broker`) is imported from its modules: a client does not load it.
"""

from nsq_ha.protocol.commands import (
    MAGIC_V2,
    Auth,
    Cls,
    Fin,
    Identify,
    Nop,
    Rdy,
    Req,
    StartKind,
    StartPosition,
    Sub,
    SubAdvanced,
    SubOrdered,
    Touch,
)
from nsq_ha.protocol.frames import FrameType
from nsq_ha.protocol.message import DecodedMessage, MessageFormat, decode_message
from nsq_ha.protocol.names import (
    validate_channel,
    validate_message_id,
    validate_partition,
    validate_topic,
)
from nsq_ha.protocol.publish import Dpub, Publish, PublishMessage
from nsq_ha.protocol.session import FrameDecoder
from nsq_ha.protocol.trace import TracedResponse, parse_traced_response

__all__ = [
    "MAGIC_V2",
    "Auth",
    "Cls",
    "DecodedMessage",
    "Dpub",
    "Fin",
    "FrameDecoder",
    "FrameType",
    "Identify",
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
    "decode_message",
    "parse_traced_response",
    "validate_channel",
    "validate_message_id",
    "validate_partition",
    "validate_topic",
]
