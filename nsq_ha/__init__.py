"""nsq_ha: asyncio client for the partitioned, replicated, ordered NSQ fork (and vanilla NSQ).

``Producer`` publishes (asyncio); ``nsq_ha.sync.Producer`` is its blocking twin;
``LookupClient`` finds partitions; ``NsqdConnection`` is one connection to one nsqd.
"""

from nsq_ha._version import __version__
from nsq_ha.connection import ConnectionConfig, NsqdConnection
from nsq_ha.lookup import LookupClient
from nsq_ha.producer import Producer, PublishResult, RetryPolicy

__all__ = [
    "ConnectionConfig",
    "LookupClient",
    "NsqdConnection",
    "Producer",
    "PublishResult",
    "RetryPolicy",
    "__version__",
]
