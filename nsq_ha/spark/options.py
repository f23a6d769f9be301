"""The ``nsq`` data source's options: strings in, typed values out, clear errors for bad ones.

Spark hands a data source its options as a case-insensitive mapping of strings. This module
turns them into :class:`WriteOptions` and :class:`ReadOptions` in one place, so that every
value is checked before a task starts, and every mistake reads like ``option 'maxBatch' must
be an integer >= 1, got 'ten'``; a name that is no option gets the closest one, or ours for
a Kafka option (:mod:`.option_names`). It imports nothing from pyspark, so it is tested on
its own.

Common options
    ``lookupd``  nsqlookupd HTTP address(es), comma separated (the fork, or vanilla with lookupd)
    ``nsqd``     nsqd TCP address(es) ``host:port``, comma separated (vanilla, no lookupd)
    ``topic``    the topic (required)
    ``strategy`` sharding strategy for keys: ``murmur3`` (Go SDK, default), ``java``, ``jump``

Security and compression (source and sink; see :class:`nsq_ha.connection.Security`)
    ``tls`` (``true`` when a ``tls*`` file is given), ``tlsCaFile``, ``tlsCertFile`` and
    ``tlsKeyFile`` (paths that must exist where the connection is made: every executor),
    ``tlsServerHostname``; ``authSecret`` or ``authSecretFile`` (its first line; Spark redacts
    options named like ``secret`` in its UI and logs); ``allowPlaintextAuth`` (``false``: the
    secret goes over TLS only); ``compression`` ``none`` | ``snappy`` | ``deflate``;
    ``deflateLevel`` (1-9, 6)

Write options
    ``bodyColumn`` (``body``), ``keyColumn``, ``traceColumn``, ``extColumns`` (comma list),
    ``trace`` (``false``: publish traced so each result has its offset), ``maxBatch`` (500),
    ``maxPending`` (10000 rows in flight per task), ``publishTimeout`` (60 s),
    ``stampBatch`` (``true``: streaming writes to ext topics stamp query, batch, task and row);
    ``topicColumn`` (``topic``: each row's topic when the option ``topic`` is not given),
    ``partitionColumn`` (``partition``: a non-null value is the row's partition),
    ``headersColumn`` (``headers``: a ``map<string,string>`` merged into the ext header); these
    three are used when the DataFrame has the column; ``''`` or ``none`` ignores such a column
    (see :func:`parse_write_options`)

Read options
    exactly one of ``topic``, ``topics`` (comma separated), ``topicPattern`` (a regular expression)
    or ``assign`` (JSON ``{"a": [0, 1]}``), see :mod:`nsq_ha.spark.topic_set`; ``mode`` ``auto`` |
    ``replayable`` | ``driver``; ``channel``; ``startingOffsets`` (``latest`` | ``earliest`` | JSON
    ``{"0": 123, "1": 0}`` for one topic, or per topic as in Kafka
    ``{"a": {"0": 123}, "b": {"0": -2}}``); ``startingTimestamp`` (milliseconds since the epoch,
    like Kafka's); batch reads (``spark.read``) also take ``endingOffsets`` (``latest``, the
    default, or JSON) or
    ``endingTimestamp`` (ms: the range ends before the first message at or after it), and start at
    ``earliest`` by default; a partition a JSON object leaves out takes the default;
    ``maxBytesPerTrigger``; ``maxMessagesPerTrigger`` (driver mode); ``failOnDataLoss`` (``true``:
    an offset nsqd does not hold, before the first retained one or past a partition's end as after
    the topic was deleted and re-created, in a checkpoint or given in ``startingOffsets`` /
    ``endingOffsets``, fails with :class:`~nsq_ha.spark.source.extents.DataLossError` naming the
    topic, partition and offsets; ``false``: logged, and read from the first retained offset, or up
    to the end); ``readTimeout`` (60 s); ``walPath`` (driver mode: where batches are kept until
    Spark commits them, a local path or a ``pyarrow.fs`` URI such as ``hdfs://`` or ``s3://``, see
    :mod:`nsq_ha.spark.source.wal`); ``msgTimeout`` (driver mode, s); ``pollTimeout`` (driver mode,
    s to wait for a first message); ``staleChannelTimeout`` (600 s: the driver deletes a range
    read's channel older than this that no consumer holds, left by a killed task; see
    :mod:`nsq_ha.spark.source.channels`); ``keyHeader`` (``nsq_key``: the ext header field a row's
    ``key`` is read from); ``keyBodyField`` (a field of a JSON object body to take the ``key`` from
    when the ext header has none, e.g. on a topic without ext headers; not set: no body is parsed)
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from ..connection.security import Security
from ..errors import ConfigError
from ..lookup.http import normalize_lookupd
from ..protocol import validate_channel, validate_topic
from ..redact import redact_url, redacted_repr
from ..routing import DEFAULT_STRATEGY, get_strategy
from .locations import redact_location
from .option_names import OptionKind, spell, unknown_option
from .routing_columns import routing_columns
from .rows import RowFormat
from .topic_set import TOPIC_OPTIONS, TopicOffsets, TopicSet, parse_json_offsets, parse_topic_set

__all__ = [
    "OptionError",
    "ReadOptions",
    "WriteOptions",
    "check_read_options",
    "parse_read_options",
    "parse_write_options",
]

ReadMode = Literal["auto", "replayable", "driver"]
_T = TypeVar("_T")


class OptionError(ConfigError):
    """An option of the ``nsq`` data source is missing, unknown or has a bad value."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the topic is: lookupd URLs (fork or vanilla) or nsqd TCP addresses (vanilla), and
    how nsqd's connections are secured."""

    topic: str
    lookupd: tuple[str, ...] = ()
    nsqd: tuple[str, ...] = ()
    #: TLS, AUTH and compression of the nsqd connections
    security: Security = field(default_factory=Security)

    def __repr__(self) -> str:
        """Every field, with a password in a ``lookupd`` URL shown as ``***`` (the AUTH
        secret is hidden by :class:`~nsq_ha.connection.Security`'s own repr)."""
        return redacted_repr(self)


@dataclass(frozen=True, slots=True)
class WriteOptions:
    """Typed options of ``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``.

    ``endpoint.topic`` is the option ``topic``, or ``""`` when each row names its topic in
    ``topic_column``. ``topic_column``, ``partition_column`` and ``headers_column`` are the
    columns in use (``None``: not used), as :func:`parse_write_options` resolved them."""

    endpoint: Endpoint
    strategy: str = DEFAULT_STRATEGY.name
    body_column: str = "body"
    key_column: str | None = None
    trace_column: str | None = None
    ext_columns: tuple[str, ...] = ()
    trace: bool = False
    max_batch: int = 500
    max_pending: int = 10_000
    publish_timeout: float = 60.0
    stamp_batch: bool = True
    #: each row's topic (only without the option ``topic``, which wins, as in Kafka's sink)
    topic_column: str | None = None
    #: a row's partition when not null (overrides its key's, as in Kafka's sink)
    partition_column: str | None = None
    #: a ``map<string,string>`` merged into the ext header (ext topics only)
    headers_column: str | None = None

    @property
    def topic(self) -> str | None:
        """The option ``topic``; ``None`` when the topic comes from ``topic_column``."""
        return self.endpoint.topic or None


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """Typed options of ``spark.readStream.format("nsq")``."""

    endpoint: Endpoint
    mode: ReadMode = "auto"
    channel: str | None = None
    starting: str | dict[int, int] | TopicOffsets = "latest"
    starting_timestamp_ms: int | None = None
    ending: str | dict[int, int] | TopicOffsets = "latest"
    ending_timestamp_ms: int | None = None
    max_bytes_per_trigger: int | None = None
    max_messages_per_trigger: int = 10_000
    fail_on_data_loss: bool = True
    read_timeout: float = 60.0
    wal_path: str | None = None
    msg_timeout: float = 60.0
    poll_timeout: float = 1.0
    stale_channel_timeout: float = 600.0
    #: where a row's ``key`` comes from
    row_format: RowFormat = field(default_factory=RowFormat)
    #: the topics read (``topic``, ``topics``, ``topicPattern`` or ``assign``; see
    #: :mod:`.topic_set`); empty: ``endpoint.topic``, which is the first named topic ("" for a
    #: pattern)
    topic_set: TopicSet = field(default_factory=TopicSet)

    def __repr__(self) -> str:
        """Every field; the endpoint hides the passwords of its URLs, and the credentials
        of a ``walPath`` URI are shown as ``***`` too."""
        return redacted_repr(self, ("wal_path",), redact_location)


class _Options:
    """Case-insensitive view of the raw options that remembers how the user spelled them."""

    def __init__(self, raw: Mapping[str, Any], kind: OptionKind, what: str) -> None:
        self.values: dict[str, str] = {}
        self.spelled: dict[str, str] = {}
        for key, value in raw.items():
            problem = unknown_option(key, kind, what)
            if problem is not None:
                raise OptionError(problem)
            if value is None:
                continue
            low = key.lower()
            self.values[low] = str(value)
            # Spark lower-cases every key: then the documented spelling reads better
            self.spelled[low] = key if key != low else spell(low)

    def name(self, low: str) -> str:
        return self.spelled.get(low, spell(low))

    def text(self, low: str) -> str | None:
        value = self.values.get(low)
        if value is None:
            return None
        value = value.strip()
        return value or None

    def integer(self, low: str, minimum: int) -> int | None:
        raw = self.text(low)
        if raw is None:
            return None
        try:
            value = int(raw)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise OptionError(
                f"option {self.name(low)!r} must be an integer >= {minimum}, got {raw!r}"
            )
        return value

    def seconds(self, low: str) -> float | None:
        raw = self.text(low)
        if raw is None:
            return None
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not math.isfinite(value) or value <= 0:
            raise OptionError(
                f"option {self.name(low)!r} must be a number of seconds > 0, got {raw!r}"
            )
        return value

    def boolean(self, low: str) -> bool | None:
        raw = self.text(low)
        if raw is None:
            return None
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise OptionError(f"option {self.name(low)!r} must be true or false, got {raw!r}")

    def column(self, low: str, default: str | None = None) -> str | None:
        return self.text(low) or default

    def endpoint(self) -> Endpoint:
        topic = self.text("topic")
        if topic is None:
            raise OptionError("option 'topic' is required")
        try:
            validate_topic(topic)
        except ConfigError as exc:
            raise OptionError(f"option 'topic': {exc}") from None
        lookupd = _split(self.text("lookupd"))
        nsqd = _split(self.text("nsqd"))
        if bool(lookupd) == bool(nsqd):
            raise OptionError(
                "give exactly one of the options 'lookupd' (nsqlookupd HTTP addresses, comma "
                "separated) or 'nsqd' (nsqd TCP host:port addresses, comma separated)"
            )
        for address in nsqd:
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise OptionError(f"option 'nsqd': {address!r} is not host:port")
        for url in lookupd:
            if "://" not in url and ":" not in url:
                raise OptionError(
                    f"option 'lookupd': {redact_url(url)!r} is not an address such as "
                    "http://host:4161"
                )
            try:
                normalize_lookupd(url)  # its error shows the address redacted
            except ConfigError as exc:
                raise OptionError(f"option 'lookupd': {exc}") from None
        return Endpoint(topic=topic, lookupd=lookupd, nsqd=nsqd, security=self.security())

    def security(self) -> Security:
        """TLS, AUTH and compression (see :class:`~nsq_ha.connection.Security`)."""
        compression = self.text("compression")
        if compression is not None:
            compression = compression.lower()
        if compression not in (None, "none", "snappy", "deflate"):
            raise OptionError(
                f"option {self.name('compression')!r} must be none, snappy or deflate, "
                f"got {compression!r}"
            )
        level = self.integer("deflatelevel", 1)
        if level is not None and level > 9:
            raise OptionError(
                f"option {self.name('deflatelevel')!r} must be from 1 to 9, got {level}"
            )
        if level is not None and compression != "deflate":
            raise OptionError("option 'deflateLevel' needs compression=deflate")
        files = ("tlscafile", "tlscertfile", "tlskeyfile", "tlsserverhostname")
        given = [self.name(k) for k in files if self.text(k) is not None]
        tls = self.boolean("tls")
        if given and tls is False:
            raise OptionError(f"option(s) {', '.join(given)} need tls=true")
        try:
            return _given(
                Security,
                tls=tls or bool(given) or None,
                tls_ca_file=self.text("tlscafile"),
                tls_cert_file=self.text("tlscertfile"),
                tls_key_file=self.text("tlskeyfile"),
                tls_server_hostname=self.text("tlsserverhostname"),
                auth_secret=self.values.get("authsecret") or None,
                auth_secret_file=self.text("authsecretfile"),
                allow_plaintext_auth=self.boolean("allowplaintextauth"),
                compression=compression,  # checked above
                deflate_level=level,
            )
        except ConfigError as exc:  # the pairs: certificate and key, secret or its file
            raise OptionError(
                f"{exc} (options tlsCertFile/tlsKeyFile, authSecret/authSecretFile)"
            ) from None


def _given(cls: Callable[..., _T], **values: Any) -> _T:
    """``cls(**values)`` without the options not given (``None``), which take the dataclass
    field's default: each option's default is written once, on its dataclass."""
    return cls(**{name: value for name, value in values.items() if value is not None})


def _default(cls: type[Any], name: str) -> Any:
    """The default of the dataclass field ``name``, for a check that needs the value."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def _split(value: str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return tuple(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))


def parse_write_options(
    raw: Mapping[str, Any], columns: Collection[str] | None = None
) -> WriteOptions:
    """Check and convert the options of an ``nsq`` sink; raises :class:`OptionError`.

    ``columns``: the DataFrame's column names. The topic, partition and headers columns
    (options ``topicColumn``, ``partitionColumn``, ``headersColumn``; defaults ``topic``,
    ``partition``, ``headers``) are used when the DataFrame has them; a name given explicitly
    must exist; ``''`` or ``none`` ignores such a column. A default name that is already the
    body, key or trace column is not used for the second role (an explicit one is refused).
    Without ``columns``, only explicitly named columns are used. The option ``topic`` wins over
    the topic column (as in Kafka's sink); without either the write is refused."""
    what = "df.write.format('nsq')"
    opts = _Options(raw, "write", what)
    if opts.text("topic") is not None:
        endpoint = opts.endpoint()
    else:  # each row names its topic: the endpoint's other checks still apply
        others = {k: v for k, v in raw.items() if k.lower() != "topic"}
        found = _Options({**others, "topic": "_"}, "write", what).endpoint()
        endpoint = Endpoint(
            topic="", lookupd=found.lookupd, nsqd=found.nsqd, security=found.security
        )
    strategy = opts.text("strategy")
    if strategy is not None:
        try:
            get_strategy(strategy)
        except ConfigError as exc:
            raise OptionError(f"option 'strategy': {exc}") from None
    ext_columns = _split(opts.text("extcolumns"))
    body = opts.column("bodycolumn", _default(WriteOptions, "body_column"))
    key = opts.column("keycolumn")
    trace_col = opts.column("tracecolumn")
    named = [c for c in (body, key, trace_col) if c is not None]
    for column in ext_columns:
        if column in named:
            raise OptionError(f"option 'extColumns': {column!r} is already the body/key/trace")
    if len(set(named)) != len(named):
        raise OptionError("options 'bodyColumn', 'keyColumn' and 'traceColumn' must differ")
    trace = opts.boolean("trace")
    if endpoint.nsqd and (trace_col or ext_columns or trace):
        raise OptionError(
            "trace ids and ext headers exist only on the fork: use 'lookupd', not 'nsqd'"
        )
    try:
        routing = routing_columns(
            opts.values, opts.name, columns, taken=named, topic_given=bool(endpoint.topic)
        )
    except ConfigError as exc:
        raise OptionError(str(exc)) from None
    return _given(
        WriteOptions,
        topic_column=routing["topiccolumn"],
        partition_column=routing["partitioncolumn"],
        headers_column=routing["headerscolumn"],
        endpoint=endpoint,
        strategy=strategy,
        body_column=body,
        key_column=key,
        trace_column=trace_col,
        ext_columns=ext_columns,
        trace=trace,
        max_batch=opts.integer("maxbatch", 1),
        max_pending=opts.integer("maxpending", 1),
        publish_timeout=opts.seconds("publishtimeout"),
        stamp_batch=opts.boolean("stampbatch"),
    )


def check_read_options(raw: Mapping[str, Any]) -> None:
    """Refuse what every read of an ``nsq`` source refuses, batch or stream; raises
    :class:`OptionError`. For ``load()``, which does not tell which read it is: what only one
    of them refuses (``endingOffsets`` on a stream, ``mode=driver`` on a batch read) is
    refused when Spark makes that reader."""
    _parse_read(raw, batch=None)


def parse_read_options(raw: Mapping[str, Any], *, batch: bool = False) -> ReadOptions:
    """Check and convert the options of an ``nsq`` source (``batch``: of ``spark.read``, which
    starts at ``earliest`` by default and may end); raises :class:`OptionError`."""
    return _parse_read(raw, batch=batch)


_READ_WHAT = {
    True: "spark.read.format('nsq')",
    False: "spark.readStream.format('nsq')",
    None: "spark.read/readStream.format('nsq')",
}


def _parse_read(raw: Mapping[str, Any], *, batch: bool | None) -> ReadOptions:
    """:func:`parse_read_options`; ``batch=None``: either kind of read."""
    opts = _Options(raw, "read", _READ_WHAT[batch])
    given = {k: v for k in TOPIC_OPTIONS if (v := opts.text(k)) is not None}
    # the endpoint's checks want a topic; the topic options are checked below
    endpoint = (opts if "topic" in given else _with_topic(opts, "_")).endpoint()
    mode = (opts.text("mode") or _default(ReadOptions, "mode")).lower()
    if mode not in ("auto", "replayable", "driver"):
        raise OptionError(f"option 'mode' must be auto, replayable or driver, got {mode!r}")
    try:
        topic_set = parse_topic_set(given, lookupd=bool(endpoint.lookupd), driver=mode == "driver")
    except ConfigError as exc:
        raise OptionError(str(exc)) from None
    endpoint = dataclasses.replace(endpoint, topic=next(iter(topic_set.names), ""))
    if mode == "replayable" and endpoint.nsqd:
        raise OptionError(
            "mode 'replayable' needs the fork in cluster mode, found through 'lookupd'"
        )
    channel = opts.text("channel")
    if channel is not None:
        try:
            validate_channel(channel)
        except ConfigError as exc:
            raise OptionError(f"option 'channel': {exc}") from None
    # a batch read starts at the earliest offset unless told (Kafka's default too); a stream
    # at the dataclass's
    starting = _offsets(opts, "startingoffsets", "earliest" if batch else None)
    timestamp_ms = _timestamp(opts, "startingtimestamp", "startingoffsets")
    ending = _offsets(opts, "endingoffsets")
    ending_ms = _timestamp(opts, "endingtimestamp", "endingoffsets")
    _check_topic_offsets(opts, "startingoffsets", starting, topic_set)
    _check_topic_offsets(opts, "endingoffsets", ending, topic_set)
    if batch is False:
        for key in ("endingoffsets", "endingtimestamp"):
            if opts.text(key) is not None:
                raise OptionError(
                    f"option {opts.name(key)!r} is for batch reads (spark.read); a stream has "
                    "no end"
                )
    if batch and mode == "driver":
        raise OptionError("a batch read needs offsets: mode must be auto or replayable")
    return _given(
        ReadOptions,
        endpoint=endpoint,
        mode=mode,  # checked above
        channel=channel,
        starting=starting,
        starting_timestamp_ms=timestamp_ms,
        ending=ending,
        ending_timestamp_ms=ending_ms,
        max_bytes_per_trigger=opts.integer("maxbytespertrigger", 1),
        max_messages_per_trigger=opts.integer("maxmessagespertrigger", 1),
        fail_on_data_loss=opts.boolean("failondataloss"),
        read_timeout=opts.seconds("readtimeout"),
        wal_path=opts.text("walpath"),
        msg_timeout=opts.seconds("msgtimeout"),
        poll_timeout=opts.seconds("polltimeout"),
        stale_channel_timeout=opts.seconds("stalechanneltimeout"),
        row_format=_given(
            RowFormat, key_header=opts.text("keyheader"), key_body_field=opts.text("keybodyfield")
        ),
        topic_set=topic_set,
    )


def _with_topic(opts: _Options, topic: str) -> _Options:
    view = copy.copy(opts)
    view.values = {**opts.values, "topic": topic}
    return view


def _check_topic_offsets(
    opts: _Options, key: str, spec: str | dict[int, int] | TopicOffsets | None, topics: TopicSet
) -> None:
    """The partition form of an offsets option is for one named topic; the per-topic form
    names only topics (and assigned partitions) that are read."""
    if isinstance(spec, dict) and (not topics.fixed or len(topics.names) > 1):
        raise OptionError(
            f"option {opts.name(key)!r}: with several topics, give each topic its partitions "
            'as in Kafka: {"topicA": {"0": 12}, "topicB": {"0": -2}}'
        )
    if not isinstance(spec, TopicOffsets) or not topics.fixed:
        return
    for topic, offsets in spec.by_topic.items():
        if topic not in topics.names:
            raise OptionError(f"option {opts.name(key)!r}: topic {topic!r} is not read")
        assigned = topics.partitions(topic)
        stray = sorted(set(offsets) - set(assigned)) if assigned is not None else []
        if stray:
            raise OptionError(
                f"option {opts.name(key)!r}: partitions {stray} of {topic!r} are not assigned"
            )


def _timestamp(opts: _Options, key: str, offsets_key: str) -> int | None:
    """A timestamp option in ms (``None`` when absent), refused beside its offsets option."""
    if opts.text(key) is None:
        return None
    if opts.text(offsets_key) is not None:
        raise OptionError(f"give {opts.name(offsets_key)!r} or {opts.name(key)!r}, not both")
    return opts.integer(key, 0)


def _offsets(
    opts: _Options, key: str, default: str | None = None
) -> str | dict[int, int] | TopicOffsets | None:
    raw = opts.text(key)
    if raw is None:
        return default
    if raw.lower() in ("latest", "earliest"):
        if key == "endingoffsets" and raw.lower() == "earliest":
            raise OptionError(f"option {opts.name(key)!r} cannot be earliest (nothing to read)")
        return raw.lower()
    name = opts.name(key)
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not data:
        raise OptionError(
            f"option {name!r} must be latest, earliest or a JSON object of partition to byte "
            f'offset such as {{"0": 0, "1": 2048}} (or, per topic, {{"a": {{"0": 0}}}}), got '
            f"{raw!r}"
        )
    try:
        return parse_json_offsets(name, data)
    except ConfigError as exc:
        raise OptionError(str(exc)) from None
