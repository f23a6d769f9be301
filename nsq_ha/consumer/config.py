"""Every option of a :class:`~nsq_ha.consumer.Consumer`, checked once: :class:`ConsumerConfig`.

The async :class:`~nsq_ha.consumer.Consumer`, the blocking :class:`nsq_ha.sync.Consumer`, the
CLI and the Spark source all build one of these, so they accept the same options with the same
defaults and refuse the same bad values, with a :class:`~nsq_ha.errors.ConfigError` naming the
option, before any connection is made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nsq_ha.connection import ConnectionConfig
from nsq_ha.consumer.backoff import BackoffStrategy, Exponential
from nsq_ha.consumer.checks import (
    check_count,
    check_member,
    check_partitions,
    check_requeue_delay,
)
from nsq_ha.consumer.message import Message
from nsq_ha.consumer.positions import StartPosition, check_start
from nsq_ha.durations import seconds
from nsq_ha.errors import ConfigError
from nsq_ha.lookup import LookupClient
from nsq_ha.protocol.identify import ExtFilter
from nsq_ha.protocol.names import validate_channel, validate_topic
from nsq_ha.redact import redacted_repr

__all__ = ["OPTIONS", "ConsumerConfig", "GiveUp", "make_config"]

#: ``on_give_up``: called with a message delivered more than ``max_attempts`` times.
GiveUp = Callable[[Message], Awaitable[object] | object]

#: the durations that must be above 0 (the requeue delays may be 0)
_POSITIVE = (
    "lookup_interval",
    "drain_timeout",
    "rdy_redistribute_interval",
    "low_rdy_idle_timeout",
    "low_rdy_timeout",
    "reconnect_interval",
    "max_reconnect_interval",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ConsumerConfig:
    """What to consume and how (see :class:`~nsq_ha.consumer.Consumer` for each option).

    Give exactly one of ``lookupd``, ``lookup`` or ``nsqd``. ``connection`` is the base
    :class:`~nsq_ha.connection.ConnectionConfig` (the Consumer's ``config=`` keyword);
    ``msg_timeout``, ``sample_rate``, ``desired_tag`` and ``ext_filter`` override it when given
    (:meth:`connection_config`). Values are normalized: ``nsqd`` becomes a tuple of distinct
    addresses, ``lookupd`` a tuple, ``partitions`` a frozenset, ``member`` a pair of ints,
    ``start`` ``"earliest"``, ``"latest"``, float Unix seconds or a dict, and every duration a
    float.
    """

    topic: str
    channel: str
    lookupd: str | Sequence[str] | None = None
    lookup: LookupClient | None = None
    nsqd: str | Sequence[str] | None = None
    max_in_flight: int = 100
    ordered: bool | None = None
    with_offsets: bool = False
    partitions: Iterable[int] | None = None
    member: tuple[int, int] | None = None
    start: StartPosition | None = None
    desired_tag: str | None = None
    ext_filter: ExtFilter | None = None
    max_attempts: int = 15
    backoff: BackoffStrategy | None = field(default_factory=Exponential)
    requeue_delay: float = 1.0
    max_requeue_delay: float = 60.0
    msg_timeout: float | None = None
    sample_rate: int | None = None
    on_give_up: GiveUp | None = None
    connection: ConnectionConfig | None = None
    lookup_interval: float = 15.0
    drain_timeout: float = 30.0
    rdy_redistribute_interval: float = 5.0
    low_rdy_idle_timeout: float = 10.0
    low_rdy_timeout: float = 30.0
    reconnect_interval: float = 1.0
    max_reconnect_interval: float = 30.0

    def __post_init__(self) -> None:
        """Check and normalize every option (ConfigError, InvalidNameError)."""
        put = object.__setattr__
        validate_topic(self.topic)
        validate_channel(self.channel)
        given = [x is not None for x in (self.lookupd, self.lookup, self.nsqd)]
        if sum(given) != 1:
            raise ConfigError("give exactly one of lookupd=, lookup= or nsqd=")
        if self.ordered and self.sample_rate:
            raise ConfigError("ordered consumption needs sample_rate 0 (nsqd refuses otherwise)")
        if self.ordered is not None and not isinstance(self.ordered, bool):
            raise ConfigError(f"ordered must be None, True or False, got {self.ordered!r}")
        if not isinstance(self.with_offsets, bool):
            raise ConfigError(f"with_offsets must be True or False, got {self.with_offsets!r}")
        check_count(self.max_in_flight, "max_in_flight", 0)
        check_count(self.max_attempts, "max_attempts", 0)
        if self.backoff is not None and not isinstance(self.backoff, BackoffStrategy):
            raise ConfigError("backoff must have a delay(level) method, or be None")
        if self.on_give_up is not None and not callable(self.on_give_up):
            raise ConfigError(f"on_give_up must be callable, got {self.on_give_up!r}")
        for name in ("requeue_delay", "max_requeue_delay"):
            put(self, name, check_requeue_delay(getattr(self, name), name))
        for name in _POSITIVE:
            put(self, name, seconds(getattr(self, name), name))
        if self.msg_timeout is not None:
            put(self, "msg_timeout", seconds(self.msg_timeout, "msg_timeout"))
        if self.lookupd is not None:
            seeds = (self.lookupd,) if isinstance(self.lookupd, str) else tuple(self.lookupd)
            if not seeds:
                raise ConfigError("lookupd= needs at least one address")
            put(self, "lookupd", seeds)
        if self.lookup is not None and not isinstance(self.lookup, LookupClient):
            raise ConfigError(f"lookup must be a LookupClient, got {self.lookup!r}")
        if self.nsqd is not None:
            addresses = [self.nsqd] if isinstance(self.nsqd, str) else list(self.nsqd)
            if not addresses:
                raise ConfigError("nsqd= needs at least one address")
            put(self, "nsqd", tuple(dict.fromkeys(addresses)))
        put(self, "partitions", check_partitions(self.partitions))
        put(self, "member", check_member(self.member))
        if self.member is not None and self.nsqd is not None:
            raise ConfigError("member= needs the partition map: use lookupd= or lookup=")
        put(self, "start", check_start(self.start, partitions=self.partitions, member=self.member))
        if self.start is not None and self.nsqd is not None:
            raise ConfigError(
                "start= needs nsqlookupd (lookupd= or lookup=): it is applied on each "
                "partition's leader (fork), or decided from the topic's channels (vanilla)"
            )
        if self.connection is not None and not isinstance(self.connection, ConnectionConfig):
            raise ConfigError("config must be a ConnectionConfig")
        self.connection_config()  # the overrides must make a valid ConnectionConfig too

    def __repr__(self) -> str:
        """Every field, with a password in a ``lookupd`` URL shown as ``***``."""
        return redacted_repr(self)

    @property
    def addresses(self) -> tuple[str, ...]:
        """The ``nsqd=`` addresses (empty with lookupd= or lookup=)."""
        return tuple(self.nsqd or ())

    def wants(self, partition: int) -> bool:
        """True when ``partitions=`` and ``member=`` let this consumer read ``partition``."""
        if self.partitions is not None and partition not in self.partitions:
            return False
        return self.member is None or partition % self.member[1] == self.member[0]

    def connection_config(self, *, extend_support: bool | None = None) -> ConnectionConfig:
        """The ConnectionConfig of each subscription: ``connection`` with this config's
        IDENTIFY overrides (and ``extend_support`` when given)."""
        base = self.connection or ConnectionConfig()
        changes: dict[str, object] = {
            name: getattr(self, name)
            for name in ("msg_timeout", "sample_rate", "desired_tag", "ext_filter")
            if getattr(self, name) is not None
        }
        if extend_support is not None:
            changes["extend_support"] = extend_support
        return dataclasses.replace(base, **changes) if changes else base  # type: ignore[arg-type]


#: the Consumer keywords that are ConsumerConfig fields as they are (``config=`` is not: it is
#: the ``connection`` field, or a whole ConsumerConfig)
OPTIONS = frozenset(f.name for f in dataclasses.fields(ConsumerConfig)) - {
    "topic",
    "channel",
    "connection",
}


def _default(name: str) -> object:
    spec = ConsumerConfig.__dataclass_fields__[name]
    factory = spec.default_factory
    return factory() if callable(factory) else spec.default


def make_config(
    topic: str | None,
    channel: str | None,
    config: ConnectionConfig | ConsumerConfig | None,
    options: dict[str, Any],
) -> ConsumerConfig:
    """The ConsumerConfig of a Consumer's arguments (async or blocking, the same way).

    ``config`` may be a whole ConsumerConfig: then no option in ``options`` may differ from its
    default, and ``topic``/``channel``, if given, must match it. Otherwise ``options`` and
    ``config`` (the ConnectionConfig) make a new one."""
    if isinstance(config, ConsumerConfig):
        given = sorted(name for name, value in options.items() if value != _default(name))
        if given:
            raise ConfigError(
                f"config=ConsumerConfig(...) holds every option; do not also give {given}"
            )
        for name, value in (("topic", topic), ("channel", channel)):
            if value is not None and value != getattr(config, name):
                raise ConfigError(
                    f"{name}={value!r} differs from the ConsumerConfig's {getattr(config, name)!r}"
                )
        return config
    if topic is None or channel is None:
        raise ConfigError("a Consumer needs a topic and a channel (or config=ConsumerConfig(...))")
    if config is not None and not isinstance(config, ConnectionConfig):
        raise ConfigError("config must be a ConnectionConfig or a ConsumerConfig")
    return ConsumerConfig(topic=topic, channel=channel, connection=config, **options)
