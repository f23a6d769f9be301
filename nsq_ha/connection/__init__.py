"""One asyncio connection to one nsqd: :class:`NsqdConnection` and its :class:`ConnectionConfig`."""

from nsq_ha.connection.config import DEFAULT_MAX_BODY_SIZE, DEFAULT_MAX_MSG_SIZE, ConnectionConfig
from nsq_ha.connection.core import ErrorHandler, MessageHandler, NsqdConnection

__all__ = [
    "DEFAULT_MAX_BODY_SIZE",
    "DEFAULT_MAX_MSG_SIZE",
    "ConnectionConfig",
    "ErrorHandler",
    "MessageHandler",
    "NsqdConnection",
]
