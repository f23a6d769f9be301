"""Topic and channel administration through nsqlookupd's and nsqd's HTTP admin APIs (the fork;
vanilla where it has one).

* :class:`LookupdAdmin` (:mod:`.lookupd`): create, list and delete topics, wait until a new
  topic is writable, add partitions to one (:mod:`.expansion`), move a partition's leader
  (``/topic/partition/move``), and create a channel on every partition's leader.
* :class:`NsqdAdmin` (:mod:`.nsqd`): nsqd's own calls on one node (``/channel/create``,
  ``/channel/setoffset``, ``/channel/pause``, ``/stats``, ...), written once: the consumer's
  :meth:`~nsq_ha.consumer.Consumer.seek`, the Spark source, the CLI and
  :meth:`LookupdAdmin.create_channel` all use it, and every refusal is an :class:`AdminError`
  (:class:`PartitionEmptyError`: a seek of a partition that never had a message, already at
  any position; :class:`TopicExistsError`: a topic created again with other parameters).
  :func:`seek_position` spells a setoffset position.
* :class:`TopicSpec` (:mod:`.spec`): what ``/topic/create`` is asked for.
* :func:`channel_lag` / :func:`entry_lag` (:mod:`.lag`): a channel's lag from a ``/stats``
  entry, as ``nsq-ha stats`` and :mod:`nsq_ha.otel` compute it.

Every public call of both clients has one overall deadline (the client's ``timeout``, or the
call's own ``timeout=`` where it waits on purpose) and fails past it with
:class:`~nsq_ha.errors.NsqTimeoutError`; every answer is read up to a cap and big JSON is parsed
in slices that leave the event loop free (:mod:`.answers`).
"""

from __future__ import annotations

from .exists import TopicExistsError
from .expansion import PartitionsNotReducibleError
from .lag import ChannelLag, channel_lag, entry_lag
from .lookupd import LookupdAdmin
from .nsqd import AdminError, NsqdAdmin, PartitionEmptyError, seek_position
from .spec import MAX_RETENTION_DAYS, MAX_SYNC_EVERY, TopicSpec

__all__ = [
    "MAX_RETENTION_DAYS",
    "MAX_SYNC_EVERY",
    "AdminError",
    "ChannelLag",
    "LookupdAdmin",
    "NsqdAdmin",
    "PartitionEmptyError",
    "PartitionsNotReducibleError",
    "TopicExistsError",
    "TopicSpec",
    "channel_lag",
    "entry_lag",
    "seek_position",
]
