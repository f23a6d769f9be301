"""Every option of a :class:`~nsq_ha.consumer.Consumer`, checked once: :class:`ConsumerConfig`.

Both Consumers (through :func:`consumer_config`), the CLI and the Spark source build one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from nsq_ha.connection.config import ConnectionConfig, check_options
from nsq_ha.consumer.backoff import BackoffStrategy, Exponential
from nsq_ha.consumer.checks import check_count, check_requeue_delay
from nsq_ha.consumer.message import Message
from nsq_ha.consumer.positions import StartPosition, check_start
from nsq_ha.durations import optional_seconds, seconds
from nsq_ha.errors import ConfigError
from nsq_ha.lookup import LookupClient
from nsq_ha.protocol.identify import ExtFilter
from nsq_ha.protocol.names import validate_channel, validate_topic
from nsq_ha.redact import redacted_repr
from nsq_ha.retry import RECONNECT

__all__ = ["ConsumerConfig", "ConsumerOptions", "GiveUp", "consumer_config"]

#: ``on_give_up``: called with a message delivered more than ``max_attempts`` times.
GiveUp = Callable[[Message], Awaitable[object] | object]


@dataclass(frozen=True, kw_only=True, slots=True)
class ConsumerConfig:
    """What to consume and how: every option of a :class:`~nsq_ha.consumer.Consumer` (and of
    the blocking :class:`nsq_ha.sync.Consumer`), its type, its default and its check, here once.

    Give exactly one of ``lookupd``, ``lookup`` or ``nsqd``.

    Args:
        topic: the topic.
        channel: the channel.
        lookupd: nsqlookupd HTTP address(es).
        lookup: a shared :class:`~nsq_ha.lookup.LookupClient`.
        nsqd: nsqd TCP address(es).
        max_in_flight: messages out to this consumer at once, across all connections.
        ordered: ``None`` follows the topic (lookup ``meta.ordered`` / nsqd's answer), ``True``
            forces ``SUB_ORDERED`` (fork only; it marks the channel ordered on nsqd), ``False``
            never subscribes ordered (an ordered topic then refuses the subscription).
        with_offsets: on plain topics of the fork, subscribe with ``SUB_ADVANCED``: every
            message carries its queue ``offset`` and ``raw_size`` while delivery stays
            unordered, at full ``max_in_flight`` (vanilla nsqd refuses it).
        partitions: consume only these.
        member: ``(i, n)``: only partitions ``p % n == i``.
        start: where a **new** channel starts: ``"earliest"`` (the first retained message),
            ``"latest"`` (the end: what the fork does anyway), a time (Unix seconds, or an
            aware :class:`~datetime.datetime`; to the second, rounded down) or
            ``{partition: offset}`` (queue offsets, e.g. a message's ``offset``; partitions not
            named start at the end). Applied before the partition's first SUB when its leader
            does not have the channel yet; an existing channel keeps its position (a restarted
            consumer does not rewind its group; two consumers creating the channel at the same
            moment may both move it). Needs ``lookupd=`` or ``lookup=``. Vanilla nsqd has no
            start position: ``"earliest"`` holds on a topic's first channel, ``"latest"`` on a
            later one, and ``Consumer.start`` raises
            :class:`~nsq_ha.errors.UnsupportedByServerError` for anything else before
            subscribing. A partition that never had a message is at any position already.
        desired_tag: sent in IDENTIFY; overrides ``connection``'s (:meth:`connection_config`).
        ext_filter: sent in IDENTIFY; overrides ``connection``'s.
        max_attempts: (0 = unlimited) a message delivered more often goes to ``on_give_up``
            instead of the handler, then is finished (a failing ``on_give_up`` requeues it).
            On ordered channels, where skipping breaks order, it keeps going to the handler
            (logged as an error) unless ``on_give_up`` is given.
        backoff: a :class:`~nsq_ha.consumer.backoff.BackoffStrategy` (default exponential
            1 s .. 120 s), or ``None`` to never pause on failures.
        requeue_delay: the delay of a requeue without one, per attempt (``attempts x
            requeue_delay``, at most ``max_requeue_delay``); ignored on ordered channels (0).
        max_requeue_delay: the longest such delay.
        msg_timeout: (s) sent in IDENTIFY; overrides ``connection``'s.
        sample_rate: sent in IDENTIFY; overrides ``connection``'s.
        on_give_up: gets a message delivered more than ``max_attempts`` times; the default
            logs and finishes.
        connection: the :class:`~nsq_ha.connection.ConnectionConfig` of every connection.
        lookup_interval: how often the partition map is looked up again.
        drain_timeout: how long ``Consumer.close`` lets handlers finish what they hold.
        rdy_redistribute_interval: with more connections than ``max_in_flight``: how often RDY
            moves,
        low_rdy_idle_timeout: after how long idle a connection gives its RDY up,
        low_rdy_timeout: and after how long holding it.
        reconnect_interval: the first wait before re-making a lost connection, doubled after
            each failure of the same (node, partition) (plus the jitter of
            :data:`nsq_ha.retry.RECONNECT`, whose bounds are the defaults).
        max_reconnect_interval: the longest such wait.

    Every duration is float seconds, finite and not negative (most above 0); anything else
    raises :class:`~nsq_ha.errors.ConfigError` naming the option. Values are normalized:
    ``nsqd`` and ``lookupd`` become tuples of distinct addresses, ``partitions`` a frozenset,
    ``member`` a pair of ints, ``start`` ``"earliest"``, ``"latest"``, float Unix seconds or a
    dict, and every duration a float.
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
    reconnect_interval: float = RECONNECT.initial
    max_reconnect_interval: float = RECONNECT.cap

    def __post_init__(self) -> None:
        """Check and normalize every option (ConfigError, InvalidNameError)."""
        put = object.__setattr__
        validate_topic(self.topic)
        validate_channel(self.channel)
        if sum(x is not None for x in (self.lookupd, self.lookup, self.nsqd)) != 1:
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
        for option in dataclasses.fields(self):  # every float: seconds > 0, requeue delays >= 0
            if option.type == "float":
                check = check_requeue_delay if "requeue_delay" in option.name else seconds
                put(self, option.name, check(getattr(self, option.name), option.name))
        if self.max_reconnect_interval < self.reconnect_interval:
            raise ConfigError(
                f"max_reconnect_interval ({self.max_reconnect_interval:g} s) is below "
                f"reconnect_interval ({self.reconnect_interval:g} s)"
            )
        put(self, "msg_timeout", optional_seconds(self.msg_timeout, "msg_timeout", zero=False))
        if self.lookup is not None and not isinstance(self.lookup, LookupClient):
            raise ConfigError(f"lookup must be a LookupClient, got {self.lookup!r}")
        for name in ("lookupd", "nsqd"):
            value = getattr(self, name)
            if value is not None:
                addresses = (value,) if isinstance(value, str) else tuple(value)
                if not addresses:
                    raise ConfigError(f"{name}= needs at least one address")
                put(self, name, tuple(dict.fromkeys(addresses)))
        if (chosen := self.partitions) is not None:
            if isinstance(chosen, str | bytes) or not isinstance(chosen, Iterable):
                raise ConfigError(f"partitions must be a collection of ints, got {chosen!r}")
            chosen = list(chosen)
            if any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in chosen):
                raise ConfigError(f"partitions must be ints >= 0, got {chosen!r}")
            put(self, "partitions", frozenset(chosen))
        if (member := self.member) is not None:  # (i, n): the partitions p % n == i
            try:
                index, count = member
            except (TypeError, ValueError):
                raise ConfigError(f"member must be (index, count), got {member!r}") from None
            if any(isinstance(x, bool) or not isinstance(x, int) for x in (index, count)):
                raise ConfigError(f"member must be two ints, got {member!r}")
            if count < 1 or not 0 <= index < count:
                raise ConfigError(f"member=(i, n) needs n >= 1 and 0 <= i < n, got {member!r}")
            if self.nsqd is not None:
                raise ConfigError("member= needs the partition map: use lookupd= or lookup=")
            put(self, "member", (index, count))
        put(self, "start", start := check_start(self.start))
        others = sorted(p for p in start if not self.wants(p)) if isinstance(start, dict) else []
        if others:
            raise ConfigError(
                f"start names partitions {others}, which this consumer does not read "
                "(partitions=/member=): leave them out"
            )
        if self.start is not None and self.nsqd is not None:
            raise ConfigError(
                "start= needs nsqlookupd (lookupd= or lookup=): it is applied on each "
                "partition's leader (fork), or decided from the topic's channels (vanilla)"
            )
        if self.connection is not None and not isinstance(self.connection, ConnectionConfig):
            raise ConfigError("connection must be a ConnectionConfig")
        self.connection_config()  # the overrides must make a valid ConnectionConfig too

    def __repr__(self) -> str:
        """Every field, with a password in a ``lookupd`` URL shown as ``***``."""
        return redacted_repr(self)

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


class ConsumerOptions(TypedDict, total=False):
    """The keywords a Consumer (async or blocking) takes besides ``topic``, ``channel`` and
    ``config``: :class:`ConsumerConfig`'s fields, with the same types (a unit test checks)."""

    lookupd: str | Sequence[str] | None
    lookup: LookupClient | None
    nsqd: str | Sequence[str] | None
    max_in_flight: int
    ordered: bool | None
    with_offsets: bool
    partitions: Iterable[int] | None
    member: tuple[int, int] | None
    start: StartPosition | None
    desired_tag: str | None
    ext_filter: ExtFilter | None
    max_attempts: int
    backoff: BackoffStrategy | None
    requeue_delay: float
    max_requeue_delay: float
    msg_timeout: float | None
    sample_rate: int | None
    on_give_up: GiveUp | None
    connection: ConnectionConfig | None
    lookup_interval: float
    drain_timeout: float
    rdy_redistribute_interval: float
    low_rdy_idle_timeout: float
    low_rdy_timeout: float
    reconnect_interval: float
    max_reconnect_interval: float


_OPTIONS = tuple(ConsumerOptions.__annotations__)  # ConsumerConfig's fields (a unit test checks)


def consumer_config(
    topic: str | None, channel: str | None, config: object, options: ConsumerOptions
) -> ConsumerConfig:
    """The ConsumerConfig of a Consumer's arguments (async or blocking): the options made into
    one, or ``config`` whole (then no option, and only its own ``topic``/``channel``)."""
    check_options("Consumer", options, _OPTIONS)
    if config is None:
        if topic is None or channel is None:
            raise ConfigError(
                "a Consumer needs a topic and a channel (or config=ConsumerConfig(...))"
            )
        return ConsumerConfig(topic=topic, channel=channel, **options)
    if not isinstance(config, ConsumerConfig):
        raise ConfigError(
            f"config must be a ConsumerConfig, got a {type(config).__name__} (the "
            "connections' settings go in connection=ConnectionConfig(...))"
        )
    if options:
        raise ConfigError(
            f"config=ConsumerConfig(...) holds every option; do not also give {sorted(options)} "
            "(dataclasses.replace(config, ...) makes one with other values)"
        )
    for name, value in (("topic", topic), ("channel", channel)):
        if value is not None and value != getattr(config, name):
            raise ConfigError(
                f"{name}={value!r} differs from the ConsumerConfig's {getattr(config, name)!r}"
            )
    return config
