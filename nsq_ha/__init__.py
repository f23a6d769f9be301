"""nsq_ha: asyncio client for the partitioned, replicated, ordered NSQ fork (and vanilla NSQ).

``Producer`` publishes and ``Consumer`` consumes (asyncio); ``nsq_ha.sync`` has their blocking
twins. The names are imported on first use, so that importing ``nsq_ha`` (as the pytest plugin
does when pytest starts) loads no client code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from nsq_ha._version import __version__

if TYPE_CHECKING:
    from nsq_ha.connection import ConnectionConfig, NsqdConnection
    from nsq_ha.consumer import Consumer, ConsumerConfig, Message
    from nsq_ha.lookup import LookupClient
    from nsq_ha.producer import Producer, ProducerConfig, PublishResult, RetryPolicy

_EXPORTS = {
    **dict.fromkeys(["ConnectionConfig", "NsqdConnection"], "nsq_ha.connection"),
    **dict.fromkeys(["Consumer", "ConsumerConfig", "Message"], "nsq_ha.consumer"),
    "LookupClient": "nsq_ha.lookup",
    **dict.fromkeys(
        ["Producer", "ProducerConfig", "PublishResult", "RetryPolicy"], "nsq_ha.producer"
    ),
}

__all__ = [
    "ConnectionConfig",
    "Consumer",
    "ConsumerConfig",
    "LookupClient",
    "Message",
    "NsqdConnection",
    "Producer",
    "ProducerConfig",
    "PublishResult",
    "RetryPolicy",
    "__version__",
]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nsq_ha' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
