"""One asyncio connection to one nsqd: :class:`NsqdConnection`, its :class:`ConnectionConfig`
and :class:`Security` (TLS, AUTH and compression by file paths and names)."""

from nsq_ha.connection.config import DEFAULT_MAX_BODY_SIZE, DEFAULT_MAX_MSG_SIZE, ConnectionConfig
from nsq_ha.connection.core import ErrorHandler, MessageHandler, NsqdConnection
from nsq_ha.connection.security import Compression, Security

__all__ = [
    "DEFAULT_MAX_BODY_SIZE",
    "DEFAULT_MAX_MSG_SIZE",
    "Compression",
    "ConnectionConfig",
    "ErrorHandler",
    "MessageHandler",
    "NsqdConnection",
    "Security",
]
