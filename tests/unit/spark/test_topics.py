"""The ``nsq`` source's topic options (``topic``, ``topics``, ``topicPattern``, ``assign``),
Kafka's per-topic ``startingOffsets`` / ``endingOffsets``, and the stream's per-topic offset
JSON (with the single-topic form older checkpoints hold). Pure: no server, no Spark."""

from __future__ import annotations

import inspect
import json
import pickle

import pytest

from nsq_ha.lookup.http import ADMIN_TIMEOUT
from nsq_ha.spark.options import OptionError, parse_read_options
from nsq_ha.spark.source.extents import apply_byte_limit
from nsq_ha.spark.source.topics import (
    decode_offset,
    encode_offset,
    flatten,
    list_topics,
    nest,
)
from nsq_ha.spark.topic_set import TopicOffsets, TopicSet, wanted_offsets

L = "http://127.0.0.1:4161"


def test_topic_and_a_one_element_topics_list_mean_the_same() -> None:
    one = parse_read_options({"lookupd": L, "topic": "a"})
    listed = parse_read_options({"lookupd": L, "topics": "a"})
    assert one.topic_set == listed.topic_set == TopicSet(names=("a",))
    assert one.endpoint == listed.endpoint
    assert one.endpoint.topic == "a"


def test_topics_pattern_and_assign_are_parsed() -> None:
    opts = parse_read_options({"lookupd": L, "Topics": " a, b ,a,, c"})
    assert opts.topic_set.names == ("a", "b", "c")
    assert opts.endpoint.topic == "a"  # the first one (the sink's field, kept working)
    opts = parse_read_options({"lookupd": L, "topicPattern": r"orders\..*"})
    assert opts.topic_set.pattern == r"orders\..*"
    assert opts.endpoint.topic == ""
    assert opts.topic_set.matches("orders.eu")
    assert not opts.topic_set.matches("old.orders.eu")  # fullmatch, not search
    assert not opts.topic_set.fixed
    opts = parse_read_options({"lookupd": L, "assign": '{"b": [2, 0, 2], "a": [1]}'}, batch=True)
    assert opts.topic_set.names == ("b", "a")
    assert opts.topic_set.partitions("b") == (0, 2)
    assert opts.topic_set.partitions("c") == ()
    assert parse_read_options({"lookupd": L, "topics": "a"}).topic_set.partitions("a") is None
    # what reaches the executors pickles
    assert pickle.loads(pickle.dumps(opts)) == opts  # noqa: S301 - our own bytes


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, r"exactly one of the options 'topic', 'topics', 'topicPattern' or 'assign'"),
        ({"topic": "a", "topics": "b"}, r"\(given: 'topic', 'topics'\)"),
        ({"topics": "a", "topicPattern": "a.*"}, "exactly one of"),
        ({"topics": " , "}, "option 'topics' lists no topic"),
        ({"topics": "a,bad topic"}, "option 'topics'"),
        ({"topicPattern": "a("}, "option 'topicPattern' is not a Python regular expression"),
        ({"assign": "[0]"}, "option 'assign' must be a JSON object"),
        ({"assign": '{"a": []}'}, "non-empty list of partition numbers"),
        ({"assign": '{"a": [-1]}'}, "option 'assign'"),
        ({"assign": '{"a": [true]}'}, "option 'assign'"),
        ({"assign": '{"bad topic": [0]}'}, "option 'assign'"),
        ({"assign": '{"a": [0]}', "mode": "driver", "channel": "c"}, "vanilla nsqd has no"),
        ({"topics": "a,b", "startingOffsets": '{"0": 5}'}, "with several topics"),
        ({"topicPattern": "a.*", "startingOffsets": '{"0": 5}'}, "with several topics"),
        ({"topics": "a", "startingOffsets": '{"b": {"0": 5}}'}, "topic 'b' is not read"),
        ({"assign": '{"a": [0]}', "startingOffsets": '{"a": {"1": 5}}'}, r"\[1\] of 'a' are not"),
        ({"topics": "a", "startingOffsets": '{"a": {"0": 5}, "1": 3}'}, "not both"),
        ({"topics": "a", "startingOffsets": '{"a": {"x": 5}}'}, "is not partition"),
        ({"topics": "a", "startingOffsets": '{"a": {"0": -3}}'}, "-2 for earliest"),
    ],
)
def test_bad_topic_options_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        parse_read_options({"lookupd": L, **options})


def test_pattern_and_assign_need_lookupd() -> None:
    with pytest.raises(OptionError, match="'topicPattern' matches the topics nsqlookupd lists"):
        parse_read_options({"nsqd": "h:4150", "topicPattern": "a.*"})
    with pytest.raises(OptionError, match="option 'assign'"):
        parse_read_options({"nsqd": "h:4150", "assign": '{"a": [0]}'})
    # several topics on vanilla nsqd: fine (the driver source reads each)
    assert parse_read_options({"nsqd": "h:4150", "topics": "a,b"}).topic_set.names == ("a", "b")


def test_kafka_per_topic_offsets_and_the_single_topic_form() -> None:
    opts = parse_read_options(
        {
            "lookupd": L,
            "topics": "a,b",
            "startingOffsets": '{"a": {"0": 12, "1": -2}, "b": {"0": -1}}',
            "endingOffsets": '{"a": {"0": 99}}',
        },
        batch=True,
    )
    assert opts.starting == TopicOffsets({"a": {0: 12, 1: -2}, "b": {0: -1}})
    assert wanted_offsets(opts.starting, "a") == {0: 12, 1: -2}
    assert wanted_offsets(opts.ending, "b") == {}  # left out: every partition takes the default
    # today's single-topic form stays as it was
    single = parse_read_options({"lookupd": L, "topic": "a", "startingOffsets": '{"0": 7}'})
    assert single.starting == {0: 7}
    assert wanted_offsets(single.starting, "a") == {0: 7}
    assert wanted_offsets("earliest", "a") == "earliest"
    # the per-topic form is fine with a pattern (topics it names may come later)
    opts = parse_read_options(
        {"lookupd": L, "topicPattern": "a.*", "startingOffsets": '{"a1": {"0": 5}}'}
    )
    assert wanted_offsets(opts.starting, "a1") == {0: 5}


def test_offset_json_is_per_topic_and_sorted() -> None:
    offset = encode_offset("spark_q", {("b", 1): 30, ("a", 0): 10, ("b", 0): 20})
    assert offset == {"channel": "spark_q", "topics": {"a": {"0": 10}, "b": {"0": 20, "1": 30}}}
    assert list(json.loads(json.dumps(offset))["topics"]) == ["a", "b"]
    channel, positions = decode_offset(json.loads(json.dumps(offset)))
    assert channel == "spark_q"
    assert positions == {("a", 0): 10, ("b", 0): 20, ("b", 1): 30}
    assert encode_offset("c", {}) == {"channel": "c", "topics": {}}
    assert decode_offset({"channel": "c", "topics": {}}) == ("c", {})


def test_an_old_single_topic_checkpoint_offset_is_read_as_the_same_positions() -> None:
    old = {"topic": "orders", "channel": "spark_abc", "partitions": {"0": 123, "1": 0}}
    assert decode_offset(old) == ("spark_abc", {("orders", 0): 123, ("orders", 1): 0})
    # written again, it is the per-topic form
    assert encode_offset(*decode_offset(old)) == {
        "channel": "spark_abc",
        "topics": {"orders": {"0": 123, "1": 0}},
    }


def test_nest_and_flatten_are_inverse() -> None:
    flat = {("a", 0): 1, ("a", 3): 2, ("b", 0): 3}
    assert nest(flat) == {"a": {0: 1, 3: 2}, "b": {0: 3}}
    assert flatten(nest(flat)) == flat


def test_the_byte_limit_is_shared_across_every_partition_of_every_topic() -> None:
    start = {("a", 0): 0, ("a", 1): 0, ("b", 0): 0}
    ends = {("a", 0): 1000, ("a", 1): 10, ("b", 0): 1000}
    limited = apply_byte_limit(start, ends, 310)
    assert limited[("a", 1)] == 10  # the small one takes what it has, the others share
    assert abs(limited[("a", 0)] - limited[("b", 0)]) <= 1
    assert sum(limited[tp] - start[tp] for tp in start) == 310
    assert apply_byte_limit(start, ends, None) == ends


def test_listing_topics_waits_as_long_as_every_admin_call() -> None:
    timeout = inspect.signature(list_topics).parameters["timeout"].default
    assert timeout == ADMIN_TIMEOUT
