"""The ``nsq`` sink's routing columns, read row by row (no pyspark import: tested on its own).

As in Kafka's sink, a row may say where it goes:

* its topic, in the topic column (option ``topicColumn``, ``topic`` by default), used only
  without the option ``topic`` (which wins). A null or invalid name fails the task, naming the
  row. What the sink needs of each topic (:class:`TopicInfo`: fork or vanilla, partition
  count, ext headers) is known up front for the option's topic (looked up on the driver) and
  looked up in the task for the column's topics, once per distinct topic (:class:`Topics`);
* its partition, in the partition column (``partition``): a non-null value overrides the key's
  partition; null falls back to the key (or round-robin). A partition the topic does not have,
  or any partition on vanilla nsqd (it has none), fails the task, naming the row;
* headers, in the headers column (``headers``, a ``map<string,string>``, as the source's rows
  carry it): on an ext topic of the fork they go into the message's ext header, below the
  sink's own fields (``extColumns``, the key ``nsq_key`` and a stream's stamp win on a clash);
  on any other topic a non-empty map fails the task (such topics carry no headers).

:func:`split` cuts a chunk of prepared rows into publish calls: one per topic, and, where rows
name partitions, runs that keep every (topic, key)'s rows in row order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from ...errors import ConfigError
from ...lookup import LookupClient
from ...protocol import validate_topic
from ...routing import ShardingKey
from ..options import Endpoint, WriteOptions

__all__ = ["Batch", "TopicInfo", "Topics", "headers_of", "partition_of", "split", "topic_info"]


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """What the sink needs to know of a topic."""

    #: a topic of the fork (it has partitions); False: vanilla nsqd
    fork: bool
    #: the fork's ext topic: messages carry a JSON ext header
    ext: bool = False
    #: the fork's partition count (0: unknown, or vanilla)
    partitions: int = 0


#: every topic of vanilla nsqd given as ``nsqd`` addresses (no lookup to ask)
VANILLA = TopicInfo(fork=False)


async def topic_info(endpoint: Endpoint, topic: str) -> TopicInfo:
    """Ask nsqlookupd about ``topic`` (``VANILLA`` without lookupd)."""
    if not endpoint.lookupd:
        return VANILLA
    async with LookupClient(list(endpoint.lookupd)) as lookup:
        pmap = await lookup.lookup(topic, "w", force=True)
    if not pmap.fork:
        return VANILLA
    return TopicInfo(fork=True, ext=pmap.extend_support, partitions=pmap.partition_num)


class _RowLike(Protocol):
    def __getitem__(self, key: str) -> Any: ...


class Topics:
    """Each row's topic and its :class:`TopicInfo`: the option ``topic``, or the row's topic
    column, checked and looked up (``look_up``) once per distinct topic, then cached."""

    __slots__ = ("_column", "_fixed", "_infos", "_look_up")

    def __init__(
        self,
        opts: WriteOptions,
        look_up: Callable[[str], TopicInfo],
        known: Mapping[str, TopicInfo] | None = None,
    ) -> None:
        self._fixed = opts.topic
        self._column = opts.topic_column
        self._look_up = look_up
        self._infos: dict[str, TopicInfo] = dict(known or {})

    @property
    def seen(self) -> dict[str, TopicInfo]:
        """The topics met so far (and those known up front)."""
        return dict(self._infos)

    def of(self, row: _RowLike, seq: int) -> tuple[str, TopicInfo]:
        """The row's topic and what is known of it (raises ConfigError naming the row)."""
        if self._fixed is not None:
            topic = self._fixed
        else:
            column = self._column
            if column is None:  # parse_write_options refuses this: no topic at all
                raise ConfigError("no option 'topic' and no topic column")
            value = row[column]
            if not isinstance(value, str) or not value:
                what = "null" if value is None else f"{value!r} (not a topic name)"
                raise ConfigError(
                    f"row {seq}: the topic column {column!r} is {what}; every row needs its "
                    "topic (or give the option 'topic')"
                )
            topic = value
        info = self._infos.get(topic)
        if info is None:
            if self._fixed is None:
                try:
                    validate_topic(topic)
                except ConfigError as exc:
                    raise ConfigError(
                        f"row {seq}: the topic column {self._column!r}: {exc}"
                    ) from None
            info = self._infos[topic] = self._look_up(topic)
        return topic, info


def partition_of(
    row: _RowLike, seq: int, opts: WriteOptions, topic: str, info: TopicInfo
) -> int | None:
    """The row's partition from the partition column (``None``: null, or no such column)."""
    column = opts.partition_column
    if column is None:
        return None
    value = row[column]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"row {seq}: the partition column {column!r} must be null or an integer >= 0, "
            f"got {value!r}"
        )
    if not info.fork:
        raise ConfigError(
            f"row {seq}: the partition column {column!r} is {value}, but topic {topic!r} is on "
            "vanilla nsqd, which has no partitions: leave it null, or set partitionColumn to none"
        )
    if info.partitions > 0 and value >= info.partitions:
        raise ConfigError(
            f"row {seq}: the partition column {column!r} is {value}, but topic {topic!r} has "
            f"partitions 0..{info.partitions - 1}"
        )
    return value


def headers_of(
    row: _RowLike, seq: int, opts: WriteOptions, topic: str, info: TopicInfo
) -> dict[str, str] | None:
    """The row's headers map (``None``: null, empty, or no such column); a non-empty map for a
    topic without ext headers raises ConfigError."""
    column = opts.headers_column
    if column is None:
        return None
    value = row[column]
    if not value:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"row {seq}: the headers column {column!r} must be a map<string,string>, "
            f"got {type(value).__name__}"
        )
    headers: dict[str, str] = {}
    for name, text in value.items():
        if not isinstance(name, str) or not (text is None or isinstance(text, str)):
            raise ConfigError(
                f"row {seq}: the headers column {column!r} must map strings to strings, "
                f"got {name!r}: {text!r}"
            )
        if text is not None:
            headers[name] = text
    if headers and not info.ext:
        why = "the fork's ext topics" if info.fork else "the fork's ext topics, not vanilla nsqd"
        raise ConfigError(
            f"row {seq}: the headers column {column!r} has {len(headers)} header(s), but topic "
            f"{topic!r} is not an ext topic: only {why} carry headers (leave the map null or "
            "empty, or set headersColumn to none)"
        )
    return headers or None


class _Routed(Protocol):
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int | None: ...
    @property
    def key(self) -> ShardingKey | None: ...


_M = TypeVar("_M", bound=_Routed)


@dataclass(frozen=True, slots=True)
class Batch(Generic[_M]):
    """One publish call: ``messages`` to ``topic``, all to ``partition`` when it is set, else
    by their keys (``keyed``) or round-robin."""

    topic: str
    partition: int | None
    keyed: bool
    messages: list[_M]


def split(chunk: Sequence[_M], keyed: bool) -> list[Batch[_M]]:
    """``chunk`` as publish calls, submitted in the order returned.

    One call per topic (in order of first appearance) when no row names a partition. Rows that
    name one go in one call per partition; in a keyed write they are cut into runs (keyed rows,
    then rows with partitions, then keyed rows, ...) so that a key's rows never overtake each
    other within a topic. Unkeyed rows have no order to keep: those without a partition go in
    one round-robin call."""
    by_topic: dict[str, list[_M]] = {}
    for message in chunk:
        by_topic.setdefault(message.topic, []).append(message)
    batches: list[Batch[_M]] = []
    for topic, messages in by_topic.items():
        if all(m.partition is None for m in messages):
            batches.append(Batch(topic, None, keyed, messages))
        else:
            batches.extend(_runs(topic, messages, keyed))
    return batches


def _runs(topic: str, messages: list[_M], keyed: bool) -> list[Batch[_M]]:
    """One topic's rows, some with partitions, as calls (see :func:`split`)."""
    batches: list[Batch[_M]] = []
    free: list[_M] = []
    fixed: dict[int, list[_M]] = {}
    for message in messages:
        cut = keyed and (free if message.partition is not None else fixed)
        if cut:  # a keyed write changes between keyed rows and rows with partitions
            _flush(batches, topic, keyed, free, fixed)
            free, fixed = [], {}
        if message.partition is None:
            free.append(message)
        else:
            fixed.setdefault(message.partition, []).append(message)
    _flush(batches, topic, keyed, free, fixed)
    return batches


def _flush(
    batches: list[Batch[_M]], topic: str, keyed: bool, free: list[_M], fixed: dict[int, list[_M]]
) -> None:
    if free:
        batches.append(Batch(topic, None, keyed, free))
    batches.extend(Batch(topic, p, keyed, ms) for p, ms in fixed.items())
