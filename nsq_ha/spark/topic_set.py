"""Which topics a read of the ``nsq`` source names, and the offsets it asks for: option values.

The options (exactly one of them, as Kafka's ``subscribe`` / ``subscribePattern`` / ``assign``):

* ``topic``: one topic; ``topics``: a comma-separated list (``topic=a`` is ``topics=a``);
* ``topicPattern``: a Python regular expression, matched with :func:`re.fullmatch` against the
  names nsqlookupd lists (``GET /topics``). A stream lists them again at each micro-batch, so a
  topic created later is read from its start (as Kafka reads a new partition); a batch read
  lists them once when Spark plans it; the driver source lists them once when it starts;
* ``assign``: JSON ``{"a": [0, 1], "b": [2]}``, only those partitions of those topics (the
  fork's partitions; not in driver mode).

:class:`TopicSet` holds the choice and :func:`parse_topic_set` checks the option values;
:class:`TopicOffsets` is Kafka's per-topic ``startingOffsets`` / ``endingOffsets``, read by
:func:`parse_json_offsets`, and :func:`wanted_offsets` says what they ask of one topic. The
source lists the topics and keeps its offsets in :mod:`.source.topics`. Nothing here does I/O
or imports pyspark or the rest of :mod:`nsq_ha.spark`, so :mod:`.options` parses with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..protocol import validate_topic

__all__ = [
    "TOPIC_OPTIONS",
    "TopicOffsets",
    "TopicSet",
    "parse_json_offsets",
    "parse_topic_set",
    "wanted_offsets",
]

#: the options that choose the topics, exactly one of which is given (lower case)
TOPIC_OPTIONS = ("topic", "topics", "topicpattern", "assign")
#: the spelling shown in messages
_SHOWN = "'topic', 'topics', 'topicPattern' or 'assign'"


@dataclass(frozen=True, slots=True)
class TopicSet:
    """The topics a source reads: ``names`` (``topic``, ``topics``, or the topics of
    ``assign``), or ``pattern`` (``topicPattern``); with ``assign``, only those partitions."""

    names: tuple[str, ...] = ()
    pattern: str | None = None
    #: topic -> the partitions to read (option ``assign``); ``None``: every partition
    assign: Mapping[str, tuple[int, ...]] | None = None

    def or_topic(self, topic: str) -> TopicSet:
        """This set, or ``topic`` alone if it is empty (options made without a topic set)."""
        return self if self.names or self.pattern is not None else TopicSet(names=(topic,))

    @property
    def fixed(self) -> bool:
        """Whether the topics are named (not found by a pattern)."""
        return self.pattern is None

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:  # compiled once: re caches it
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.names

    def partitions(self, topic: str) -> tuple[int, ...] | None:
        """The partitions of ``topic`` to read (``None``: all of them)."""
        return None if self.assign is None else self.assign.get(topic, ())

    def describe(self) -> str:
        if self.pattern is not None:
            return f"topics matching {self.pattern!r}"
        if self.assign is not None:
            return "assign " + json.dumps({t: list(p) for t, p in self.assign.items()})
        return ", ".join(repr(n) for n in self.names)


def _topic_name(option: str, name: object) -> str:
    if not isinstance(name, str):
        raise ConfigError(f"option {option!r}: {name!r} is not a topic name")
    try:
        validate_topic(name)
    except ConfigError as exc:
        raise ConfigError(f"option {option!r}: {exc}") from None
    return name


def parse_topic_set(given: Mapping[str, str], *, lookupd: bool, driver: bool) -> TopicSet:
    """The :class:`TopicSet` of the options in ``given`` (lower-case key -> stripped value of
    those of :data:`TOPIC_OPTIONS` the user gave); ``lookupd``: the source finds nsqd through
    nsqlookupd; ``driver``: ``mode=driver``. Raises :class:`ConfigError` naming the option."""
    if len(given) != 1:
        named = ", ".join(repr(_spelled(k)) for k in given) or "none"
        raise ConfigError(f"give exactly one of the options {_SHOWN} (given: {named})")
    ((key, value),) = given.items()
    if key == "topic":
        return TopicSet(names=(_topic_name("topic", value),))
    if key == "topics":
        names = tuple(dict.fromkeys(p.strip() for p in value.split(",") if p.strip()))
        if not names:
            raise ConfigError("option 'topics' lists no topic (comma-separated names)")
        return TopicSet(names=tuple(_topic_name("topics", n) for n in names))
    if key == "topicpattern":
        if not lookupd:
            raise ConfigError(
                "option 'topicPattern' matches the topics nsqlookupd lists: give 'lookupd', "
                "not 'nsqd'"
            )
        try:
            re.compile(value)
        except re.error as exc:
            raise ConfigError(
                f"option 'topicPattern' is not a Python regular expression: {exc}"
            ) from None
        return TopicSet(pattern=value)
    return _parse_assign(value, lookupd=lookupd, driver=driver)


def _parse_assign(value: str, *, lookupd: bool, driver: bool) -> TopicSet:
    if driver or not lookupd:
        raise ConfigError(
            "option 'assign' names partitions of the fork's topics: it needs the replayable "
            "source (through 'lookupd', mode auto or replayable); vanilla nsqd has no "
            "partitions (use 'topics')"
        )
    try:
        data = json.loads(value)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not data:
        raise ConfigError(
            f'option \'assign\' must be a JSON object such as {{"a": [0, 1], "b": [2]}}, '
            f"got {value!r}"
        )
    assign: dict[str, tuple[int, ...]] = {}
    for topic, parts in data.items():
        name = _topic_name("assign", topic)
        if (
            not isinstance(parts, list)
            or not parts
            or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts)
        ):
            raise ConfigError(
                f"option 'assign': {topic!r} must map to a non-empty list of partition numbers "
                f"(integers >= 0), got {parts!r}"
            )
        assign[name] = tuple(sorted(set(parts)))
    return TopicSet(names=tuple(assign), assign=assign)


def _spelled(key: str) -> str:
    return "topicPattern" if key == "topicpattern" else key


# -- offsets ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopicOffsets:
    """Kafka's per-topic form of ``startingOffsets`` / ``endingOffsets``:
    ``{"a": {"0": 12}, "b": {"0": -2}}`` (-2 earliest, -1 latest); a topic or partition it
    leaves out takes the option's default."""

    by_topic: Mapping[str, Mapping[int, int]]


def parse_json_offsets(name: str, data: Mapping[str, Any]) -> dict[int, int] | TopicOffsets:
    """A JSON object of ``startingOffsets`` / ``endingOffsets`` (option ``name``): partition
    to offset, or topic to such an object. Raises :class:`ConfigError`."""
    nested = [isinstance(v, dict) for v in data.values()]
    if any(nested):
        if not all(nested):
            raise ConfigError(
                f"option {name!r}: give either partition to offset, or topic to (partition to "
                'offset) as in Kafka ({"a": {"0": 12}}), not both'
            )
        by_topic = {_topic_name(name, t): _partition_offsets(name, v) for t, v in data.items()}
        return TopicOffsets(by_topic)
    return _partition_offsets(name, data)


def _partition_offsets(name: str, data: Mapping[str, Any]) -> dict[int, int]:
    result: dict[int, int] = {}
    for key, value in data.items():
        if not str(key).isdigit() or isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(
                f"option {name!r}: {key!r}: {value!r} is not partition (digits): offset (int)"
            )
        if value < 0 and value not in (-1, -2):
            raise ConfigError(
                f"option {name!r}: partition {key} offset {value} must be >= 0, or -2 for "
                "earliest, -1 for latest (as in Kafka)"
            )
        result[int(key)] = value
    return result


def wanted_offsets(spec: str | dict[int, int] | TopicOffsets, topic: str) -> str | dict[int, int]:
    """What ``startingOffsets`` / ``endingOffsets`` asks of ``topic``: ``earliest``,
    ``latest``, or partition to offset (a partition left out takes the option's default)."""
    if isinstance(spec, TopicOffsets):
        return dict(spec.by_topic.get(topic, {}))
    return spec
