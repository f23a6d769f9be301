"""One asyncio connection to one nsqd: :class:`NsqdConnection`, its :class:`ConnectionConfig`
and :class:`Security` (TLS, AUTH and compression by file paths and names; loaded when first
asked for: the clients do not need it)."""

from typing import TYPE_CHECKING, Any

from nsq_ha.connection.config import ConnectionConfig
from nsq_ha.connection.core import NsqdConnection

if TYPE_CHECKING:
    from nsq_ha.connection.security import Compression, Security

__all__ = ["Compression", "ConnectionConfig", "NsqdConnection", "Security"]


def __getattr__(name: str) -> Any:
    """:class:`Security` and :class:`Compression`, loaded on first use."""
    if name in ("Security", "Compression"):
        from nsq_ha.connection import security

        return getattr(security, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
