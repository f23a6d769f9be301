"""The ``nsq`` data source's option parsing and the pure parts of its sink and source (no
Spark needed): typed values, one clear error per bad value, the per-trigger byte limit, the
data-loss policy, row preparation and the ext stamp."""

from __future__ import annotations

from typing import Any

import pytest

from nsq_ha.connection.security import Security
from nsq_ha.errors import ConfigError
from nsq_ha.spark.options import (
    OptionError,
    ReadOptions,
    WriteOptions,
    check_read_options,
    parse_read_options,
    parse_write_options,
)
from nsq_ha.spark.sink.publish import STAMP_KEYS, BatchStamp, prepare
from nsq_ha.spark.source.extents import DataLossError, Extent, apply_byte_limit, check_retained

L = "http://127.0.0.1:4161"


def test_write_options_defaults_and_case_insensitive_keys() -> None:
    opts = parse_write_options({"LOOKUPD": f"{L}, http://h2:4161", "topic": "orders"})
    assert opts.endpoint.lookupd == (L, "http://h2:4161")
    assert opts.endpoint.topic == "orders"
    assert (opts.body_column, opts.key_column, opts.strategy) == ("body", None, "murmur3")
    assert (opts.max_batch, opts.max_pending, opts.publish_timeout) == (500, 10_000, 60.0)
    opts = parse_write_options(
        {
            "lookupd": L,
            "topic": "t",
            "keycolumn": "user",
            "bodyColumn": "payload",
            "extColumns": "a, b",
            "strategy": "java",
            "maxBatch": "10",
            "trace": "TRUE",
            "checkpointLocation": "/tmp/x",  # Spark's own options are let through
        }
    )
    assert opts.key_column == "user"
    assert opts.body_column == "payload"
    assert opts.ext_columns == ("a", "b")
    assert opts.strategy == "java"
    assert opts.trace


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lookupd": L}, "option 'topic' is required"),
        ({"topic": "t"}, "exactly one of the options 'lookupd'"),
        ({"topic": "t", "lookupd": L, "nsqd": "h:4150"}, "exactly one of the options"),
        ({"topic": "bad topic!", "lookupd": L}, "option 'topic'"),
        ({"topic": "t", "nsqd": "nohost"}, "is not host:port"),
        ({"topic": "t", "nsqd": "h:99999"}, "is not host:port"),
        ({"topic": "t", "lookupd": L, "maxBatch": "ten"}, "'maxBatch' must be an integer >= 1"),
        ({"topic": "t", "lookupd": L, "maxPending": "0"}, "'maxPending' must be an integer"),
        ({"topic": "t", "lookupd": L, "publishTimeout": "-1"}, "seconds > 0, got '-1'"),
        ({"topic": "t", "lookupd": L, "publishTimeout": "nan"}, "seconds > 0"),
        ({"topic": "t", "lookupd": L, "trace": "maybe"}, "must be true or false"),
        ({"topic": "t", "lookupd": L, "strategy": "md5"}, "option 'strategy'"),
        ({"topic": "t", "lookupd": L, "keyColumn": "body"}, "must differ"),
        ({"topic": "t", "lookupd": L, "extColumns": "body"}, "already the body"),
        ({"topic": "t", "nsqd": "h:4150", "traceColumn": "x"}, "exist only on the fork"),
        ({"topic": "t", "lookupd": L, "bodyColum": "x"}, "unknown option 'bodyColum'"),
        ({"topic": "t", "lookupd": L, "partitionColumn": "body"}, "already the body/key/trace"),
        ({"lookupd": L, "topicColumn": "none"}, "option 'topic' is required, or a column"),
        ({"lookupd": L, "topicColumn": "t", "headersColumn": "t"}, "must differ"),
        ({"nsqd": "nohost", "topicColumn": "t"}, "is not host:port"),
    ],
)
def test_bad_write_options_are_refused_with_what_is_wrong(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(OptionError, match=message) as caught:
        parse_write_options(options)
    assert isinstance(caught.value, ConfigError)
    assert isinstance(caught.value, ValueError)


def test_unknown_option_lists_the_known_ones() -> None:
    with pytest.raises(OptionError, match=r"known options: .*bodyColumn.*keyColumn"):
        parse_write_options({"topic": "t", "lookupd": L, "key": "user"})


def test_read_options() -> None:
    opts = parse_read_options({"lookupd": L, "topic": "t"})
    assert (opts.mode, opts.starting, opts.fail_on_data_loss) == ("auto", "latest", True)
    opts = parse_read_options(
        {
            "lookupd": L,
            "topic": "t",
            "startingOffsets": '{"0": 10, "1": -2, "3": -1}',
            "maxBytesPerTrigger": "4096",
            "failOnDataLoss": "false",
            "mode": "REPLAYABLE",
            "channel": "spark_q1",
        }
    )
    assert opts.starting == {0: 10, 1: -2, 3: -1}
    assert opts.max_bytes_per_trigger == 4096
    assert not opts.fail_on_data_loss
    assert opts.mode == "replayable"
    assert opts.channel == "spark_q1"
    opts = parse_read_options(
        {"nsqd": "h:4150", "topic": "t", "startingTimestamp": "1700000000123"}
    )
    assert opts.starting_timestamp_ms == 1700000000123


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"startingOffsets": "first"}, "must be latest, earliest or a JSON object"),
        ({"startingOffsets": "[1, 2]"}, "JSON object"),
        ({"startingOffsets": '{"a": 1}'}, "is not partition"),
        ({"startingOffsets": '{"0": -5}'}, "-2 for earliest, -1 for latest"),
        ({"startingOffsets": '{"0": true}'}, "is not partition"),
        ({"startingOffsets": "earliest", "startingTimestamp": "1"}, "not both"),
        ({"mode": "fast"}, "must be auto, replayable or driver"),
        ({"channel": "no spaces"}, "option 'channel'"),
        ({"maxBytesPerTrigger": "0"}, "'maxBytesPerTrigger' must be an integer >= 1"),
        ({"readTimeout": "soon"}, "'readTimeout' must be a number of seconds"),
    ],
)
def test_bad_read_options(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_read_options({"lookupd": L, "topic": "t", **options})


def test_replayable_mode_needs_lookupd() -> None:
    with pytest.raises(OptionError, match="needs the fork in cluster mode"):
        parse_read_options({"nsqd": "h:4150", "topic": "t", "mode": "replayable"})


# -- the byte limit per trigger ---------------------------------------------------------------


def test_without_a_limit_the_batch_ends_at_the_write_ends() -> None:
    assert apply_byte_limit({0: 5, 1: 0}, {0: 100, 1: 50}, None) == {0: 100, 1: 50}
    assert apply_byte_limit({0: 5, 1: 0}, {0: 100, 1: 50}, 10_000) == {0: 100, 1: 50}


def test_a_limit_is_shared_fairly_and_a_small_partition_leaves_its_share() -> None:
    # partition 1 has only 10 bytes: the other two share the rest
    ends = apply_byte_limit({0: 0, 1: 0, 2: 0}, {0: 1000, 1: 10, 2: 1000}, 310)
    assert ends[1] == 10
    assert ends[0] + ends[2] == 300
    assert abs(ends[0] - ends[2]) <= 1
    # the total never exceeds the limit, and nothing moves backwards
    ends = apply_byte_limit({0: 900, 1: 0}, {0: 1000, 1: 1000}, 7)
    assert sum(ends[p] - s for p, s in {0: 900, 1: 0}.items()) == 7


def test_a_partition_with_nothing_new_stays_where_it_is() -> None:
    assert apply_byte_limit({0: 100, 1: 0}, {0: 100, 1: 500}, 50) == {0: 100, 1: 50}


def test_data_loss_fails_or_skips_to_the_first_retained_offset() -> None:
    extents = {0: Extent(0, 100), 1: Extent(400, 900)}
    assert check_retained({0: 10, 1: 400}, extents, fail=True, topic="t") == {0: 10, 1: 400}
    with pytest.raises(DataLossError, match=r"t/1: offsets 100\.\.400 .* failOnDataLoss=false"):
        check_retained({0: 10, 1: 100}, extents, fail=True, topic="t")
    assert check_retained({0: 10, 1: 100}, extents, fail=False, topic="t") == {0: 10, 1: 400}


# -- rows in, messages out; messages in, rows out ---------------------------------------------


def test_prepare_converts_a_row_and_stamps_it() -> None:
    opts = parse_write_options(
        {"lookupd": L, "topic": "t", "keyColumn": "k", "traceColumn": "tr", "extColumns": "x"}
    )
    stamp = BatchStamp(query="q", batch=3, task=1)
    row: dict[str, Any] = {"body": "héllo", "k": 42, "tr": 7, "x": 1.5}
    message = prepare(row, 9, opts, stamp)
    assert message.body == "héllo".encode()
    assert (message.key, message.trace_id) == (42, 7)
    assert message.ext == {
        "x": "1.5",
        "nsq_spark_query": "q",
        "nsq_spark_batch": "3",
        "nsq_spark_task": "1",
        "nsq_spark_seq": "9",
    }
    assert tuple(k for k in message.ext if k.startswith("nsq_spark")) == STAMP_KEYS  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"body": None, "k": "a"}, "row 4: the body column 'body' is null"),
        ({"body": b"", "k": "a"}, "is empty"),
        ({"body": 12, "k": "a"}, "must be binary or string, got int"),
        ({"body": b"x", "k": None}, "the key column 'k' is None"),
        ({"body": b"x", "k": 1.5}, "must be string, binary or integer, got float"),
    ],
)
def test_prepare_names_the_row_and_column_of_a_bad_value(row: dict[str, Any], message: str) -> None:
    opts = parse_write_options({"lookupd": L, "topic": "t", "keyColumn": "k"})
    with pytest.raises(ConfigError, match=message):
        prepare(row, 4, opts, None)


def test_bad_trace_values_are_refused() -> None:
    opts = parse_write_options({"lookupd": L, "topic": "t", "traceColumn": "tr"})
    for value in (-1, 2**64, "7", True):
        with pytest.raises(ConfigError, match="must be a u64"):
            prepare({"body": b"x", "tr": value}, 0, opts, None)


def test_batch_read_options_start_at_earliest_and_may_end() -> None:
    base = {"lookupd": L, "topic": "t"}
    batch = parse_read_options(base, batch=True)
    assert (batch.starting, batch.ending) == ("earliest", "latest")
    assert parse_read_options(base).starting == "latest"  # a stream starts at the end
    ranged = parse_read_options(
        {**base, "startingOffsets": '{"0": 10}', "endingOffsets": '{"0": 99, "1": -1}'},
        batch=True,
    )
    assert (ranged.starting, ranged.ending) == ({0: 10}, {0: 99, 1: -1})
    assert (
        parse_read_options({**base, "endingTimestamp": "1700"}, batch=True).ending_timestamp_ms
        == 1700
    )
    with pytest.raises(OptionError, match="for batch reads"):
        parse_read_options({**base, "endingOffsets": "latest"})
    with pytest.raises(OptionError, match="cannot be earliest"):
        parse_read_options({**base, "endingOffsets": "earliest"}, batch=True)
    with pytest.raises(OptionError, match="not both"):
        parse_read_options({**base, "endingOffsets": "latest", "endingTimestamp": "1"}, batch=True)
    with pytest.raises(OptionError, match="batch read needs offsets"):
        parse_read_options({**base, "mode": "driver", "channel": "c"}, batch=True)


# Spark hands a data source its option keys lower-cased, so the tests below spell them so.
@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"topc": "t"},
            "unknown option 'topc' for spark.readStream.format('nsq'): did you mean 'topic'?",
        ),
        ({"topic": "t", "startingoffset": "earliest"}, "did you mean 'startingOffsets'?"),
        ({"topic": "t", "maxbytespertriger": "1"}, "did you mean 'maxBytesPerTrigger'?"),
        ({"topic": "t", "failondatalos": "false"}, "did you mean 'failOnDataLoss'?"),
        ({"topic": "t", "keycolumn": "k"}, "option 'keyColumn' is for writing"),
    ],
)
def test_a_mistyped_read_option_gets_a_did_you_mean(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError) as caught:
        parse_read_options({"lookupd": L, **options})
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "t", "bodycolum": "b"}, "did you mean 'bodyColumn'?"),
        ({"topic": "t", "maxbatchsize": "10"}, "did you mean 'maxBatch'?"),
        ({"topic": "t", "startingoffsets": "earliest"}, "option 'startingOffsets' is for reading"),
    ],
)
def test_a_mistyped_write_option_gets_a_did_you_mean(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError) as caught:
        parse_write_options({"lookupd": L, **options})
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("subscribe", "'subscribe' is Kafka's option: use 'topics' (comma separated) or 'topic'"),
        ("subscribepattern", "'subscribePattern' is Kafka's option: use 'topicPattern'"),
        ("maxoffsetspertrigger", "use 'maxBytesPerTrigger', which counts bytes"),
        ("kafka.bootstrap.servers", "'kafka.bootstrap.servers' is Kafka's option: use 'lookupd'"),
        ("groupidprefix", "'groupIdPrefix' is Kafka's option: use 'channel'"),
        ("kafka.group.id", "'kafka.group.id' is Kafka's option: use 'channel'"),
        ("startingoffsetsbytimestamp", "use 'startingTimestamp'"),
        ("kafkaconsumer.polltimeoutms", "use 'readTimeout'"),
        ("minpartitions", "'minPartitions' is Kafka's option"),
        ("kafka.max.poll.records", "nsq has no Kafka consumer settings; see the option list"),
        ("kafka.batch.size", "'kafka.batch.size' is an option of Kafka's sink, not for"),
    ],
)
def test_a_kafka_read_option_points_at_ours(key: str, message: str) -> None:
    with pytest.raises(OptionError) as caught:
        parse_read_options({"lookupd": L, "topic": "t", key: "x"})
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("kafka.bootstrap.servers", "'kafka.bootstrap.servers' is Kafka's option: use 'lookupd'"),
        ("kafka.batch.size", "use 'maxBatch'"),
        ("kafka.delivery.timeout.ms", "use 'publishTimeout'"),
        ("kafka.compression.type", "use 'compression'"),
        ("kafka.linger.ms", "nsq has no Kafka producer settings; see the option list"),
        ("subscribe", "'subscribe' is an option of Kafka's source, not for df.write"),
    ],
)
def test_a_kafka_write_option_points_at_ours(key: str, message: str) -> None:
    with pytest.raises(OptionError) as caught:
        parse_write_options({"lookupd": L, "topic": "t", key: "x"})
    assert message in str(caught.value)


def test_a_value_error_names_the_documented_spelling_of_a_lower_cased_key() -> None:
    with pytest.raises(OptionError, match="option 'startingOffsets' must be latest, earliest"):
        parse_read_options({"lookupd": L, "topic": "t", "startingoffsets": "bogus"})


def test_read_checks_before_the_kind_of_read_is_known() -> None:
    """``load()`` does not say whether a batch or a stream reads: what both refuse is refused,
    what only one of them refuses is left for later."""
    check_read_options({"lookupd": L, "topic": "t", "endingoffsets": "latest"})
    check_read_options({"lookupd": L, "topic": "t", "mode": "driver", "channel": "c"})
    with pytest.raises(OptionError, match="option 'startingOffsets' must be"):
        check_read_options({"lookupd": L, "topic": "t", "startingoffsets": "bogus"})
    with pytest.raises(OptionError, match="did you mean 'topic'"):
        check_read_options({"lookupd": L, "topc": "t"})


def test_an_option_not_given_takes_its_dataclass_default() -> None:
    """The dataclasses hold the defaults; the parsers add none of their own (a batch read's
    start, ``earliest``, is the one documented exception)."""
    read = parse_read_options({"lookupd": L, "topic": "t"})
    assert read == ReadOptions(endpoint=read.endpoint, topic_set=read.topic_set)
    batch = parse_read_options({"lookupd": L, "topic": "t"}, batch=True)
    assert batch == ReadOptions(
        endpoint=batch.endpoint, topic_set=batch.topic_set, starting="earliest"
    )
    write = parse_write_options({"lookupd": L, "topic": "t"})
    assert write == WriteOptions(endpoint=write.endpoint)
    assert write.endpoint.security == Security()
    tls = parse_read_options({"lookupd": L, "topic": "t", "tlsCaFile": __file__})
    assert tls.endpoint.security.tls  # a tls* file turns TLS on unless tls=false
    with pytest.raises(OptionError, match="need tls=true"):
        parse_read_options({"lookupd": L, "topic": "t", "tlsCaFile": __file__, "tls": "false"})
    with pytest.raises(OptionError, match="needs compression=deflate"):
        parse_read_options({"lookupd": L, "topic": "t", "deflateLevel": "3"})


def test_the_default_strategy_is_the_routing_modules() -> None:
    import inspect

    from nsq_ha import spark
    from nsq_ha.routing import DEFAULT_STRATEGY

    write = parse_write_options({"lookupd": L, "topic": "t"})
    assert write.strategy == DEFAULT_STRATEGY.name
    for function in (spark.with_nsq_partition, spark.co_partition):
        assert inspect.signature(function).parameters["strategy"].default == DEFAULT_STRATEGY.name
