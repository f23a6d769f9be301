"""Every option of a producer, once: :class:`ProducerConfig` holds their names, defaults and
checks, :class:`ProducerOptions` the types a caller may give as keywords (a unit test keeps the
two name lists equal), :class:`RetryPolicy` how a publish is retried. Every producer (asyncio,
blocking, the CLI's, the Spark sink's) takes them through :meth:`ProducerConfig.from_options`,
so a bad value is refused the same way everywhere."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

from nsq_ha.connection.config import ConnectionConfig, check_options
from nsq_ha.durations import seconds
from nsq_ha.errors import ConfigError, InvalidArgumentError
from nsq_ha.lookup import LookupClient, NodeInfo
from nsq_ha.redact import redacted_repr
from nsq_ha.retry import PUBLISH, Backoff
from nsq_ha.routing import DEFAULT_STRATEGY, ShardingStrategy, get_strategy


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """Retries of one publish (one batch) after a retriable error.

    ``attempts`` caps the tries (first one included); ``deadline`` caps the seconds from the first
    try until no new try starts (``None``: no deadline); the wait before try *n+1* is
    ``min(max_backoff, initial_backoff * 2**(n-1))`` plus up to ``jitter`` seconds at random.
    ``attempt_timeout`` bounds each try's wait for nsqd's answer.

    The defaults ride out a leader failover of the fork (a new leader is usually listed within
    a few seconds of a graceful stop, ~30 s after a crash), which the fork's own SDKs (3 tries
    within ~0.3 s) do not.
    """

    attempts: int = 60
    deadline: float | None = 60.0
    initial_backoff: float = PUBLISH.initial
    max_backoff: float = PUBLISH.cap
    jitter: float = PUBLISH.jitter
    attempt_timeout: float = 10.0

    def __post_init__(self) -> None:
        _count(self.attempts, "attempts")
        for name in ("initial_backoff", "max_backoff", "jitter"):
            seconds(getattr(self, name), name, zero=True)
        if self.deadline is not None:
            seconds(self.deadline, "deadline")
        seconds(self.attempt_timeout, "attempt_timeout")

    @property
    def waits(self) -> Backoff:
        """The waits as the project's retry loop takes them (:class:`nsq_ha.retry.Backoff`)."""
        return Backoff(initial=self.initial_backoff, cap=self.max_backoff, jitter=self.jitter)

    @classmethod
    def no_retry(cls) -> RetryPolicy:
        """One try only: every error reaches the caller (wrapped in PublishError if retriable)."""
        return cls(attempts=1, deadline=None)


class ProducerOptions(TypedDict, total=False):
    """The keywords of ``Producer(...)`` (asyncio and blocking): :class:`ProducerConfig`'s
    fields (and defaults), typed as a caller may give them (addresses as one string, a strategy
    by name)."""

    lookupd: str | Sequence[str] | None
    lookup: LookupClient | None
    nsqd: str | Sequence[str] | None
    strategy: str | ShardingStrategy
    connection: ConnectionConfig
    retry: RetryPolicy
    trace: bool
    unkeyed_window: int
    max_batch: int
    linger: float
    close_timeout: float
    topic_idle_timeout: float


def _addresses(value: object, name: str) -> tuple[str, ...] | None:
    """``None``, or one or more addresses as a tuple (duplicates dropped, order kept)."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if isinstance(items, bytes | bytearray) or not isinstance(items, Sequence):
        raise InvalidArgumentError(f"{name} must be an address or a sequence of addresses")
    addresses = tuple(dict.fromkeys(items))
    if not addresses:
        raise ConfigError(f"{name}= needs at least one address")
    for address in addresses:
        if not isinstance(address, str) or not address.strip():
            raise InvalidArgumentError(f"{name} addresses must be non-empty strings")
    return addresses


def static_node(address: str) -> NodeInfo:
    """An ``nsqd=`` address (``host:port``) as a node."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ConfigError(f"nsqd address {address!r} is not host:port")
    return NodeInfo(broadcast_address=host.strip("[]"), tcp_port=int(port), http_port=0)


def _count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
    return value


@dataclass(frozen=True, kw_only=True, slots=True)
class ProducerConfig:
    """How a producer finds nsqd, routes, batches, retries and closes: every option of a
    :class:`~nsq_ha.producer.Producer` (and of the blocking :class:`nsq_ha.sync.Producer`),
    its default and its check, here once. Give exactly one of ``lookupd``, ``lookup`` or
    ``nsqd``.

    Args:
        lookupd: nsqlookupd HTTP address(es) (``"http://127.0.0.1:4161"``), fork or vanilla.
        lookup: a shared :class:`~nsq_ha.lookup.LookupClient` (not closed with the producer).
        nsqd: nsqd TCP address(es) (``"127.0.0.1:4150"``): vanilla, or the fork without keys.
        strategy: how a sharding key picks a partition: ``"murmur3"`` (the fork's Go SDK),
            ``"java"`` (its Java SDK), ``"jump"`` or a
            :class:`~nsq_ha.routing.ShardingStrategy`; kept as the strategy object.
        connection: the connections' settings (a :class:`~nsq_ha.connection.ConnectionConfig`:
            size limits, TLS, AUTH, compression, timeouts).
        retry: the :class:`RetryPolicy` of every publish.
        trace: publish every message traced (trace id 0 unless given), so that every result
            carries its id and queue offset.
        unkeyed_window: unacknowledged unkeyed commands per partition.
        max_batch: most messages per ``MPUB``.
        linger: seconds a batch waits for more messages before it goes (0: it goes as soon as
            the previous batch of its partition is acknowledged).
        close_timeout: how long ``Producer.close`` waits for in-flight publishes, then fails them.
        topic_idle_timeout: seconds after a topic's last publish (once none of its messages is
            queued or in flight) when its routes, lanes and connections are freed and its lookup
            no longer refreshed; the next publish to it looks it up again.

    Durations are finite seconds (ConfigError for NaN, infinities, negatives and
    non-numbers); addresses become tuples of distinct addresses.
    """

    lookupd: tuple[str, ...] | None = None
    lookup: LookupClient | None = None
    nsqd: tuple[str, ...] | None = None
    strategy: ShardingStrategy = DEFAULT_STRATEGY
    connection: ConnectionConfig = field(default_factory=ConnectionConfig)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    trace: bool = False
    unkeyed_window: int = 1024
    max_batch: int = 1000
    linger: float = 0.0
    close_timeout: float = 10.0
    topic_idle_timeout: float = 300.0

    def __post_init__(self) -> None:
        lookupd = _addresses(self.lookupd, "lookupd")
        nsqd = _addresses(self.nsqd, "nsqd")
        if sum(x is not None for x in (lookupd, self.lookup, nsqd)) != 1:
            raise ConfigError("give exactly one of lookupd=, lookup= or nsqd=")
        if self.lookup is not None and not isinstance(cast(object, self.lookup), LookupClient):
            raise InvalidArgumentError(f"lookup must be a LookupClient, not {self.lookup!r}")
        for address in nsqd or ():
            static_node(address)  # host:port, or ConfigError
        strategy = cast("str | ShardingStrategy", self.strategy)
        if isinstance(strategy, str):
            strategy = get_strategy(strategy)
        if not isinstance(cast(object, self.connection), ConnectionConfig):
            raise InvalidArgumentError(
                f"connection must be a ConnectionConfig, not {type(self.connection).__name__}"
            )
        if not isinstance(cast(object, self.retry), RetryPolicy):
            raise ConfigError(f"retry must be a RetryPolicy, not {type(self.retry).__name__}")
        if not isinstance(cast(object, self.trace), bool):
            raise InvalidArgumentError(f"trace must be True or False, not {self.trace!r}")
        _count(self.unkeyed_window, "unkeyed_window")
        _count(self.max_batch, "max_batch")
        object.__setattr__(self, "lookupd", lookupd)
        object.__setattr__(self, "nsqd", nsqd)
        object.__setattr__(self, "strategy", strategy)
        object.__setattr__(self, "linger", seconds(self.linger, "linger", zero=True))
        object.__setattr__(self, "close_timeout", seconds(self.close_timeout, "close_timeout"))
        idle = seconds(self.topic_idle_timeout, "topic_idle_timeout")
        object.__setattr__(self, "topic_idle_timeout", idle)

    def __repr__(self) -> str:
        """Every field, with a password in a ``lookupd`` URL shown as ``***``."""
        return redacted_repr(self)

    @property
    def static_nodes(self) -> tuple[NodeInfo, ...]:
        """The ``nsqd=`` addresses as nodes (empty with lookupd= or lookup=)."""
        return tuple(static_node(a) for a in self.nsqd or ())

    @classmethod
    def from_options(
        cls, config: ProducerConfig | None, options: ProducerOptions
    ) -> ProducerConfig:
        """The config of a ``Producer(config=..., **options)`` call: the whole ``config``, or
        one made of the keyword ``options`` (ProducerConfig's defaults for the others); both at
        once are refused (ConfigError), before anything starts."""
        check_options("Producer", options, _OPTION_NAMES)
        if config is None:
            return cls(**cast("dict[str, Any]", options))
        if not isinstance(cast(object, config), ProducerConfig):
            raise InvalidArgumentError(
                f"config must be a ProducerConfig, not {type(config).__name__} "
                "(the connections' settings go in connection=ConnectionConfig(...))"
            )
        if options:
            raise ConfigError(
                "give the options in config=ProducerConfig(...) or as keywords, not both "
                f"({', '.join(sorted(options))} given as keywords)"
            )
        return config


#: the option names, in ProducerConfig's order (ProducerOptions names the same: a unit test)
_OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ProducerConfig))
