"""The ``nsq`` sink's routing columns without Spark or a server: each row's topic (option or
column, looked up once per topic), partition and headers, the ext header's precedence, and the
split of a chunk into publish calls that keeps each (topic, key)'s rows in order."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_ha.errors import ConfigError
from nsq_ha.producer import PublishResult
from nsq_ha.spark.options import WriteOptions, parse_write_options
from nsq_ha.spark.sink.columns import TopicInfo, Topics, headers_of, partition_of, split
from nsq_ha.spark.sink.publish import BatchStamp, TaskOutcome, _Prepared, prepare_row

L = "http://127.0.0.1:4161"
EXT = TopicInfo(fork=True, ext=True, partitions=4)
PLAIN = TopicInfo(fork=True, ext=False, partitions=4)
VANILLA = TopicInfo(fork=False)
ALL = ["body", "user", "topic", "partition", "headers", "x"]


def _opts(columns: list[str] | None = ALL, **raw: str) -> WriteOptions:
    return parse_write_options({"lookupd": L, **raw}, columns)


class _Book:
    """A topic lookup that counts its calls."""

    def __init__(self, infos: dict[str, TopicInfo]) -> None:
        self.infos = infos
        self.calls: list[str] = []

    def __call__(self, topic: str) -> TopicInfo:
        self.calls.append(topic)
        return self.infos[topic]


# -- the topic column -------------------------------------------------------------------------


def test_each_row_names_its_topic_and_each_topic_is_looked_up_once() -> None:
    opts = _opts(keyColumn="user")
    assert (opts.topic, opts.topic_column) == (None, "topic")
    book = _Book({"a": EXT, "b": PLAIN})
    topics = Topics(opts, book)
    seen = [topics.of({"topic": t}, i)[0] for i, t in enumerate("abab")]
    assert seen == ["a", "b", "a", "b"]
    assert book.calls == ["a", "b"]
    assert topics.seen == {"a": EXT, "b": PLAIN}


def test_the_topic_option_wins_over_the_column_and_is_known_up_front() -> None:
    opts = _opts(topic="fixed")
    assert (opts.topic, opts.topic_column) == ("fixed", None)
    book = _Book({})
    topics = Topics(opts, book, {"fixed": EXT})
    assert topics.of({"topic": "other"}, 0) == ("fixed", EXT)
    assert book.calls == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, r"row 3: the topic column 'topic' is null"),
        ("", r"row 3: the topic column 'topic' is '' \(not a topic name\)"),
        (7, r"row 3: the topic column 'topic' is 7"),
        ("bad topic!", r"row 3: the topic column 'topic': .*"),
    ],
)
def test_a_null_or_invalid_topic_names_the_row(value: Any, message: str) -> None:
    topics = Topics(_opts(), _Book({}))
    with pytest.raises(ConfigError, match=message):
        topics.of({"topic": value}, 3)


# -- options ----------------------------------------------------------------------------------


def test_the_routing_columns_are_used_when_the_dataframe_has_them() -> None:
    opts = _opts(["body", "topic"])
    assert (opts.topic_column, opts.partition_column, opts.headers_column) == ("topic", None, None)
    opts = _opts(topic="t")
    assert (opts.topic_column, opts.partition_column, opts.headers_column) == (
        None,
        "partition",
        "headers",
    )
    renamed = _opts(
        ["body", "dest", "p", "h"], topicColumn="dest", partitionColumn="p", headersColumn="h"
    )
    assert (renamed.topic_column, renamed.partition_column, renamed.headers_column) == (
        "dest",
        "p",
        "h",
    )
    # without the schema (parsing alone), only the columns named explicitly are used
    bare = parse_write_options({"lookupd": L, "topic": "t"})
    assert (bare.partition_column, bare.headers_column) == (None, None)


@pytest.mark.parametrize("off", ["", "none", "NONE", " "])
def test_empty_or_none_ignores_a_column(off: str) -> None:
    opts = _opts(topic="t", partitionColumn=off, headersColumn=off)
    assert (opts.partition_column, opts.headers_column) == (None, None)


def test_a_default_name_taken_by_the_key_is_not_used_twice() -> None:
    opts = _opts(topic="t", keyColumn="partition")
    assert (opts.key_column, opts.partition_column) == ("partition", None)


@pytest.mark.parametrize(
    ("raw", "columns", "message"),
    [
        ({}, ["body"], r"option 'topic' is required, or a column .*'topicColumn'.*columns: body"),
        ({"topicColumn": "none"}, ["body", "topic"], "option 'topic' is required"),
        ({"topicColumn": "dest"}, ["body"], "option 'topicColumn': the DataFrame has no column"),
        ({"topic": "t", "partitionColumn": "p"}, ["body"], "'partitionColumn'.*no column 'p'"),
        ({"topic": "t", "keyColumn": "k", "partitionColumn": "k"}, ["body", "k"], "already the"),
        ({"partitionColumn": "topic"}, ["body", "topic"], "must differ"),
    ],
)
def test_bad_routing_column_options(raw: dict[str, str], columns: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _opts(columns, **raw)


# -- the partition and headers columns --------------------------------------------------------


def test_partition_values() -> None:
    opts = _opts(topic="t")
    assert partition_of({"partition": None}, 0, opts, "t", PLAIN) is None
    assert partition_of({"partition": 3}, 0, opts, "t", PLAIN) == 3
    unknown = TopicInfo(fork=True, partitions=0)  # the producer checks it later
    assert partition_of({"partition": 9}, 0, opts, "t", unknown) == 9
    for bad, message in [
        (-1, r"row 5: the partition column 'partition' must be null or an integer >= 0"),
        (True, "must be null or an integer"),
        ("1", "must be null or an integer"),
        (4, r"row 5: .* topic 't' has partitions 0\.\.3"),
    ]:
        with pytest.raises(ConfigError, match=message):
            partition_of({"partition": bad}, 5, opts, "t", PLAIN)
    with pytest.raises(ConfigError, match="vanilla nsqd, which has no partitions"):
        partition_of({"partition": 0}, 5, opts, "t", VANILLA)
    assert partition_of({"partition": None}, 5, opts, "t", VANILLA) is None


def test_headers_values() -> None:
    opts = _opts(topic="t")
    assert headers_of({"headers": None}, 0, opts, "t", PLAIN) is None
    assert headers_of({"headers": {}}, 0, opts, "t", PLAIN) is None
    assert headers_of({"headers": {"a": "1", "n": None}}, 0, opts, "t", EXT) == {"a": "1"}
    with pytest.raises(ConfigError, match=r"row 2: .* topic 't' is not an ext topic"):
        headers_of({"headers": {"a": "1"}}, 2, opts, "t", PLAIN)
    with pytest.raises(ConfigError, match="not vanilla nsqd"):
        headers_of({"headers": {"a": "1"}}, 2, opts, "t", VANILLA)
    with pytest.raises(ConfigError, match="must map strings to strings"):
        headers_of({"headers": {"a": 1}}, 2, opts, "t", EXT)
    with pytest.raises(ConfigError, match="must be a map<string,string>"):
        headers_of({"headers": "a=1"}, 2, opts, "t", EXT)


def test_the_ext_header_sink_fields_win_over_the_headers_map() -> None:
    opts = _opts(keyColumn="user", extColumns="x")
    topics = Topics(opts, _Book({"e": EXT, "p": PLAIN}))
    stamp = BatchStamp(query="q", batch=1, task=0)
    clash = {"x": "from-map", "nsq_key": "from-map", "nsq_spark_seq": "from-map", "mine": "m"}
    row = {"body": b"b", "user": b"u1", "topic": "e", "partition": None, "headers": clash, "x": 5}
    message = prepare_row(row, 7, opts, stamp, topics)
    assert (message.topic, message.partition, message.key) == ("e", None, b"u1")
    assert message.ext == {
        "x": "5",
        "nsq_key": "u1",
        "nsq_spark_seq": "7",
        "mine": "m",
        "nsq_spark_query": "q",
        "nsq_spark_batch": "1",
        "nsq_spark_task": "0",
    }
    # a topic without ext headers gets no key and no stamp from the sink (ext columns stay,
    # and the producer refuses them, as before)
    plain = prepare_row({**row, "topic": "p", "headers": None}, 8, opts, stamp, topics)
    assert plain.ext == {"x": "5"}


def test_a_row_with_a_partition_may_have_no_key() -> None:
    opts = _opts(keyColumn="user")
    topics = Topics(opts, _Book({"p": PLAIN}))
    row = {"body": b"b", "user": None, "topic": "p", "partition": 2, "headers": None, "x": 0}
    message = prepare_row(row, 0, opts, None, topics)
    assert (message.key, message.partition) == (None, 2)
    with pytest.raises(ConfigError, match="the key column 'user' is None"):
        prepare_row({**row, "partition": None}, 1, opts, None, topics)


# -- splitting a chunk --------------------------------------------------------------------------


def _m(topic: str, key: str | None, partition: int | None = None, n: int = 0) -> _Prepared:
    return _Prepared(f"{key}:{n}".encode(), key, None, None, topic, partition)


def test_without_partitions_a_chunk_is_one_call_per_topic_in_order() -> None:
    chunk = [_m("a", "k1"), _m("b", "k1"), _m("a", "k2"), _m("b", "k3")]
    batches = split(chunk, keyed=True)
    assert [(b.topic, b.partition, b.keyed, len(b.messages)) for b in batches] == [
        ("a", None, True, 2),
        ("b", None, True, 2),
    ]


def test_keyed_rows_and_rows_with_partitions_go_in_runs() -> None:
    chunk = [_m("a", "k", None), _m("a", "k", 1), _m("a", "j", 2), _m("a", "k", 1), _m("a", "k")]
    got = [(b.partition, [m.key for m in b.messages]) for b in split(chunk, keyed=True)]
    assert got == [(None, ["k"]), (1, ["k", "k"]), (2, ["j"]), (None, ["k"])]
    # unkeyed rows have no order to keep: one round-robin call, one per partition
    sizes = [(b.partition, len(b.messages)) for b in split(chunk, keyed=False)]
    assert sizes == [(None, 2), (1, 2), (2, 1)]


_rows = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.sampled_from(["k1", "k2", "k3"]),
        st.one_of(st.none(), st.integers(0, 3)),
    ),
    max_size=60,
)


@given(_rows)
def test_split_keeps_every_topic_and_key_in_row_order_on_every_partition(
    rows: list[tuple[str, str, int | None]],
) -> None:
    chunk = [_m(t, k, p, n) for n, (t, k, p) in enumerate(rows)]
    batches = split(chunk, keyed=True)
    assert sorted(id(m) for b in batches for m in b.messages) == sorted(id(m) for m in chunk)
    # what each (topic, partition) lane receives, in submission order
    lanes: dict[tuple[str, int], list[_Prepared]] = {}
    for batch in batches:
        assert all(m.topic == batch.topic for m in batch.messages)
        for m in batch.messages:
            assert m.partition == batch.partition
            part = batch.partition
            if part is None:
                assert m.key is not None
                part = zlib.crc32(str(m.key).encode()) % 4  # any fixed key -> partition map
            lanes.setdefault((batch.topic, part), []).append(m)
    for lane in lanes.values():
        for key in {m.key for m in lane}:
            seqs = [int(m.body.split(b":")[1]) for m in lane if m.key == key]
            assert seqs == sorted(seqs)


def test_the_outcome_counts_per_topic_and_partition() -> None:
    outcome = TaskOutcome()
    for topic, part, offset in [("a", 0, 10), ("a", 0, 20), ("b", 0, 5), ("b", None, None)]:
        outcome.add(PublishResult(topic, part, "h:1", 1, offset=offset))
    assert outcome.partitions == {0: 3, -1: 1}
    assert outcome.per_topic() == {"a": {0: 2}, "b": {-1: 1, 0: 1}}
    assert outcome.topic_offsets == {"a": {0: (10, 20)}, "b": {0: (5, 5)}}


# -- rows that are only a body and a key ------------------------------------------------------


def _chunked(opts: WriteOptions, info: TopicInfo, rows: list[dict[str, Any]]) -> list[_Prepared]:
    from nsq_ha.spark.sink.publish import _chunks

    topics = Topics(opts, _Book({"t": info}))
    return [m for chunk in _chunks(rows, opts, None, TaskOutcome(), topics) for m in chunk]


@pytest.mark.parametrize("info", [PLAIN, EXT, VANILLA], ids=["plain", "ext", "vanilla"])
def test_body_and_key_rows_are_prepared_as_prepare_row_does(info: TopicInfo) -> None:
    """After the first row, a write of nothing but a body and a key to a topic without ext
    headers reads just those two columns: the messages are the ones prepare_row makes."""
    opts = _opts(["body", "key"], topic="t", keyColumn="key")
    rows = [{"body": b"b%d" % i if i % 2 else f"s{i}", "key": f"k{i % 3}"} for i in range(6)]
    topics = Topics(opts, _Book({"t": info}))
    expected = [prepare_row(row, seq, opts, None, topics) for seq, row in enumerate(rows)]
    assert _chunked(opts, info, rows) == expected


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"body": None, "key": "k"}, "row 2: the body column 'body' is null"),
        ({"body": b"", "key": "k"}, "row 2: the body column 'body' is empty"),
        ({"body": b"x", "key": None}, "row 2: the key column 'key' is None"),
        ({"body": None, "key": None}, "row 2: the body column 'body' is null"),
    ],
)
def test_body_and_key_rows_are_checked_as_prepare_row_checks_them(
    bad: dict[str, Any], error: str
) -> None:
    opts = _opts(["body", "key"], topic="t", keyColumn="key")
    rows = [{"body": b"a", "key": "k"}, {"body": b"b", "key": "k"}, bad]
    with pytest.raises(ConfigError, match=error):
        _chunked(opts, PLAIN, rows)
