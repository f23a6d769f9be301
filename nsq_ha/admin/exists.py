""":class:`TopicExistsError`: the fork's nsqlookupd refuses to create a topic that exists with
other parameters, answering only ``already exist``; this error says what exists (from the
topic's lookup), what was asked for, and what to do."""

from __future__ import annotations

from nsq_ha.lookup.wire import TopicMeta

from .nsqd import AdminError
from .spec import TopicSpec

__all__ = ["ALREADY_EXISTS", "TopicExistsError"]

#: nsqlookupd's answer to ``/topic/create`` of a topic that exists with other parameters
ALREADY_EXISTS = "already exist"


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _flags(*pairs: tuple[str, bool]) -> str:
    names = [name for name, on in pairs if on]
    return f" ({', '.join(names)})" if names else ""


class TopicExistsError(AdminError):
    """``create_topic`` of a topic that exists with other parameters: ``partitions``,
    ``replicas``, ``ordered``, ``ext``, ``multi_part`` and ``channel_auto_create`` are the
    existing topic's (what its lookup shows; ``sync_every`` and ``retention_days`` are not
    shown by nsqlookupd)."""

    def __init__(self, spec: TopicSpec, meta: TopicMeta) -> None:
        self.topic = spec.name
        self.partitions = meta.partition_num
        self.replicas = meta.replica
        self.ordered = meta.ordered
        self.ext = meta.extend_support
        self.multi_part = meta.multi_part
        self.channel_auto_create = not meta.disable_channel_auto_create
        exists = _count(self.partitions, "partition") + " and " + _count(self.replicas, "replica")
        exists += _flags(
            ("ordered", self.ordered),
            ("ext", self.ext),
            ("multi-part", self.multi_part),
            ("channels not auto-created", not self.channel_auto_create),
        )
        asked = _count(spec.partitions, "partition") + " and " + _count(spec.replicas, "replica")
        asked += _flags(
            ("ordered", spec.ordered),
            ("ext", spec.ext),
            ("multi-part", spec.multi_part),
            ("channels not auto-created", not spec.channel_auto_create),
        )
        #: the lookup shows nothing that differs from what was asked for
        self.same_as_shown = asked == exists
        if self.same_as_shown:
            differs = (
                f"as asked, but with another sync_every or retention_days than the "
                f"{spec.sync_every or 'default'} and {spec.retention_days or 'default'} asked for "
                "(lookups do not show them)"
            )
        else:
            differs = f"not the {asked} asked for"
        super().__init__(
            f"topic {spec.name!r} already exists with {exists}, {differs}: use it as it is "
            f"(nsq-ha lookup --topic {spec.name} shows it), or delete it first, with its "
            f"messages (nsq-ha topic delete --topic {spec.name}), and create it again"
        )
