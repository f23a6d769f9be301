"""nsq_ha: asyncio client for the partitioned, replicated, ordered NSQ fork (and vanilla NSQ)."""

from nsq_ha._version import __version__

__all__ = ["__version__"]
