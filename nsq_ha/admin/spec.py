"""What ``/topic/create`` is asked for (:class:`TopicSpec`) and the fork's bounds for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nsq_ha.errors import ConfigError
from nsq_ha.protocol.names import validate_topic

__all__ = ["MAX_RETENTION_DAYS", "MAX_SYNC_EVERY", "TopicSpec"]

#: the fork's upper bound for ``syncdisk`` (larger values are clamped by nsqlookupd)
MAX_SYNC_EVERY = 4000
#: the fork's upper bound for a topic's ``retention`` (days)
MAX_RETENTION_DAYS = 60


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """What ``/topic/create`` is asked for.

    ``sync_every`` is the fork's ``syncdisk``: nsqd fsyncs the partition's log after that many
    messages (and flushes its write buffer then).  ``1`` (``durable``) means every write is on
    disk before nsqd acknowledges it, so a leader crash (``kill -9``) loses no acknowledged
    write; ``None`` leaves nsqd's ``--sync-every`` default (2500), with which a crash can lose
    the writes acknowledged since the last sync, on every replica (see the README's
    "Durability on the fork").  ``retention_days`` (1..60) overrides nsqd's retention of
    consumed data; ``channel_auto_create=False`` makes SUB to an unknown channel fail until
    ``/channel/create`` made it.
    """

    name: str
    partitions: int = 1
    replicas: int = 1
    ordered: bool = False
    ext: bool = False
    #: several partitions of a plain topic may share a node (ordered topics always may)
    multi_part: bool = False
    sync_every: int | None = None
    retention_days: int | None = None
    channel_auto_create: bool = True

    def __post_init__(self) -> None:
        validate_topic(self.name)
        for what in ("partitions", "replicas", "sync_every", "retention_days"):
            value = getattr(self, what)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"{what} must be an int, got {value!r}")
        if not 1 <= self.partitions <= 254:
            raise ConfigError(f"partitions must be 1..254, got {self.partitions}")
        if not 1 <= self.replicas <= 5:
            raise ConfigError(f"replicas must be 1..5, got {self.replicas}")
        if self.sync_every is not None and not 1 <= self.sync_every <= MAX_SYNC_EVERY:
            raise ConfigError(
                f"sync_every must be 1..{MAX_SYNC_EVERY} (1 = fsync every write), "
                f"got {self.sync_every}"
            )
        if self.retention_days is not None and not 1 <= self.retention_days <= MAX_RETENTION_DAYS:
            raise ConfigError(
                f"retention_days must be 1..{MAX_RETENTION_DAYS}, got {self.retention_days}"
            )

    @property
    def durable(self) -> bool:
        """Every acknowledged write is fsynced first (``sync_every == 1``)."""
        return self.sync_every == 1

    @classmethod
    def with_durability(
        cls,
        name: str,
        partitions: int | None = None,
        replicas: int | None = None,
        ordered: bool | None = None,
        ext: bool | None = None,
        multi_part: bool | None = None,
        *,
        durable: bool = False,
        sync_every: int | None = None,
        retention_days: int | None = None,
        channel_auto_create: bool | None = None,
    ) -> TopicSpec:
        """The spec, where ``durable=True`` means ``sync_every=1`` (any other ``sync_every``
        with it is a :class:`ConfigError`); an option left at ``None`` takes the field's
        default."""
        if durable:
            if sync_every not in (None, 1):
                raise ConfigError(f"durable means sync_every=1; got sync_every={sync_every}")
            sync_every = 1
        given: dict[str, Any] = {
            "partitions": partitions,
            "replicas": replicas,
            "ordered": ordered,
            "ext": ext,
            "multi_part": multi_part,
            "channel_auto_create": channel_auto_create,
        }
        return cls(
            name,
            sync_every=sync_every,
            retention_days=retention_days,
            **{option: value for option, value in given.items() if value is not None},
        )

    def query(self) -> dict[str, str]:
        """The query string of the fork's ``/topic/create``."""
        params = {
            "topic": self.name,
            "partition_num": str(self.partitions),
            "replicator": str(self.replicas),
        }
        if self.ordered:
            params["orderedmulti"] = "true"
        if self.ext:
            params["extend"] = "true"
        if self.multi_part:
            params["multipart"] = "true"
        if self.sync_every is not None:
            params["syncdisk"] = str(self.sync_every)
        if self.retention_days is not None:
            params["retention"] = str(self.retention_days)
        if not self.channel_auto_create:
            params["disable_channel_auto_create"] = "true"
        return params
