"""Discovery through nsqlookupd: wire parsing (:mod:`.wire`) and :class:`LookupClient`."""

from nsq_ha.lookup.client import LookupClient
from nsq_ha.lookup.http import normalize_lookupd
from nsq_ha.lookup.wire import (
    Access,
    LookupdError,
    NodeInfo,
    PartitionMap,
    Route,
    TopicMeta,
    merge_maps,
    parse_listlookup,
    parse_lookup,
    unwrap,
)

__all__ = [
    "Access",
    "LookupClient",
    "LookupdError",
    "NodeInfo",
    "PartitionMap",
    "Route",
    "TopicMeta",
    "merge_maps",
    "normalize_lookupd",
    "parse_listlookup",
    "parse_lookup",
    "unwrap",
]
