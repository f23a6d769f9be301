"""The replayable Spark source's range read
(:func:`nsq_ha.spark.source.ranges.read_chunks`), without Spark, on the embedded broker and on
the real fork: a plain topic (``SUB_ADVANCED``, many messages in flight) and an ordered one
(``SUB_ORDERED``, which nsqd insists on) give back exactly the messages of the range, in offset
order, once each."""

from __future__ import annotations

import pytest

from nsq_ha.admin import TopicSpec
from nsq_ha.spark.options import parse_read_options
from nsq_ha.spark.source.extents import fetch_extents
from nsq_ha.spark.source.ranges import RangeTask, read_chunks, read_range
from nsq_ha.sync import Producer

from .backend import Backend

PLAIN = "sr_plain"  # 2 partitions
ORDERED = "sr_ordered"  # 2 partitions, ordered
TOPICS = [TopicSpec(PLAIN, partitions=2), TopicSpec(ORDERED, partitions=2, ordered=True)]
COUNT = 3000


@pytest.fixture(scope="module")
def cluster(backend: Backend) -> Backend:
    backend.ensure_topics(TOPICS)
    return backend


def _publish(lookupd: str, topic: str) -> dict[int, list[tuple[int, bytes]]]:
    """COUNT keyed messages; per partition, (offset, body) in offset order."""
    by_partition: dict[int, list[tuple[int, bytes]]] = {}
    with Producer(lookupd=lookupd, trace=True) as producer:
        futures = [
            (body, producer.publish_async(topic, body, sharding_key=f"k{i % 16}"))
            for i, body in enumerate(b"m%05d" % i for i in range(COUNT))
        ]
        for body, future in futures:
            result = future.result(60)
            assert result.partition is not None
            assert result.offset is not None
            by_partition.setdefault(result.partition, []).append((result.offset, body))
    return {p: sorted(rows) for p, rows in by_partition.items()}


@pytest.mark.parametrize("topic", [PLAIN, ORDERED])
def test_a_range_read_gives_exactly_the_ranges_messages_in_offset_order(
    cluster: Backend, topic: str
) -> None:
    lookupd = cluster.lookupd_http
    start = fetch_extents(parse_read_options({"lookupd": lookupd, "topic": topic}).endpoint)
    published = _publish(lookupd, topic)
    end = fetch_extents(parse_read_options({"lookupd": lookupd, "topic": topic}).endpoint)
    assert set(published) == {0, 1}
    for partition, rows in published.items():
        # everything published here, then a middle slice starting and ending on messages
        first, last = start[partition].end, end[partition].end
        lo, hi = rows[len(rows) // 4][0], rows[3 * len(rows) // 4][0]
        for begin, stop in ((first, last), (lo, hi)):
            task = RangeTask(
                (lookupd,), topic, "sr_check", partition, begin, stop, 30.0, fail_on_data_loss=True
            )
            chunks = list(read_chunks(task))
            got = [(message.offset, bytes(message.body)) for chunk in chunks for message in chunk]
            want = [(o, b) for o, b in rows if begin <= o < stop]
            assert got == want, f"{topic}/{partition} {begin}..{stop}: {len(got)} of {len(want)}"
            # a chunk becomes one Arrow batch in Spark: an ordered read (one message out at a
            # time) must still hand over many messages at once, not one batch per message
            assert len(chunks) <= len(want) // 5, f"{len(want)} messages in {len(chunks)} chunks"
        # the row form reads the same
        task = RangeTask(
            (lookupd,), topic, "sr_check", partition, lo, hi, 30.0, fail_on_data_loss=True
        )
        bodies = [row[10] for row in read_range(task)]
        assert bodies == [b for o, b in rows if lo <= o < hi]
