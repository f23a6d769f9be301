"""The ``nsq`` Spark data source on Spark ``local[2]``: against the embedded cluster and the real
fork cluster (same test, both backends), and the driver source against real vanilla nsqd.

* a batch write of 100k rows with 500 keys to a 4-partition ordered topic keeps each key on one
  partition, in row order (after ``co_partition``), nothing missing;
* a streaming read stopped mid-way and restarted from its checkpoint (its last batch forced to
  run again) sees every message; on the replayable source each batch holds exactly the offset
  range its checkpoint names, and the replayed batch is identical;
* a streaming write with a task that fails once publishes duplicates but loses nothing, and the
  ``nsq_spark_*`` ext stamps remove the duplicates exactly.

Marked ``spark``: ``pytest -m spark`` runs only these. Spark comes from the ``spark`` extra.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pyspark = pytest.importorskip(
    "pyspark", reason="pyspark is not installed: pip install -e '.[spark]' (make test does)"
)

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from nsq_ha.admin import LookupdAdmin  # noqa: E402
from nsq_ha.devcluster import DevClusterThread  # noqa: E402
from nsq_ha.routing import partition_for_key  # noqa: E402
from nsq_ha.spark import STAMP_KEYS, co_partition  # noqa: E402
from nsq_ha.spark.compat import REPLAYABLE_STREAM_READ, pyspark_version, supports  # noqa: E402
from nsq_ha.spark.options import parse_read_options  # noqa: E402
from nsq_ha.spark.source.extents import fetch_extents  # noqa: E402
from nsq_ha.sync import Producer  # noqa: E402

from .spark_session import consume_stored, local_spark, run_until  # noqa: E402

pytestmark = pytest.mark.spark
#: the replayable streaming source needs PySpark 4.2+ (test_spark_versions.py checks the refusal)
needs_replayable_stream = pytest.mark.skipif(
    not supports(REPLAYABLE_STREAM_READ),
    reason=f"PySpark {pyspark_version()}: the replayable streaming source needs PySpark 4.2+",
)

ROWS = 100_000
KEYS = 500


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    """One local Spark for the module: 2 cores, up to 4 attempts per task (local mode would
    otherwise never retry a failed task)."""
    conf = {
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    }
    with local_spark("nsq_ha-tests", "local[2,4]", conf) as session:
        yield session


@dataclass
class Backend:
    name: str
    lookupd: str


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def _name(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(3)}"


async def _create(lookupd: str, topics: list[tuple[str, dict[str, Any]]], channel: str) -> None:
    """Create the topics (all at once: a new fork topic takes seconds to become writable) and,
    on each partition, ``channel`` at the partition's start (so it sees every message)."""
    async with LookupdAdmin(lookupd) as admin:
        await asyncio.gather(*(admin.create_topic(name, **spec) for name, spec in topics))
        for name, _ in topics:
            await admin.create_channel(name, channel, rewind=True)


TOPICS = {
    "ordered": {"partitions": 4, "replicas": 2, "ordered": True},
    "events": {"partitions": 4, "replicas": 2, "multi_part": True},
    "ext": {"partitions": 4, "replicas": 2, "ext": True, "multi_part": True},
}
CHECK = "check"


@pytest.fixture(scope="module", params=["devcluster", "fork"])
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[Backend, dict[str, str]]]:
    """The embedded cluster or the real fork cluster, with this module's topics created."""
    names = {kind: _name(f"sp_{kind}") for kind in TOPICS}
    if request.param == "devcluster":
        with DevClusterThread(nodes=3) as dev:
            spec = [(names[k], TOPICS[k]) for k in TOPICS]
            _run(_create(dev.lookupd_http, spec, CHECK))
            yield Backend("devcluster", dev.lookupd_http), names
    else:
        fork = request.getfixturevalue("fork_cluster")
        spec = [(names[k], TOPICS[k]) for k in TOPICS]
        _run(_create(fork.lookupd_http, spec, CHECK))
        yield Backend("fork", fork.lookupd_http), names


# -- 1. batch write, key order ----------------------------------------------------------------


def test_batch_write_keeps_each_keys_rows_on_one_partition_in_row_order(
    spark: SparkSession, backend: tuple[Backend, dict[str, str]]
) -> None:
    where, names = backend
    topic = names["ordered"]
    df = spark.range(ROWS).select(
        F.col("id").alias("seq"),
        F.concat(F.lit("k"), (F.col("id") % KEYS).cast("string")).alias("user"),
    )
    df = df.withColumn("payload", F.concat_ws(":", "user", F.col("seq").cast("string")))
    placed = co_partition(df, "user", where.lookupd, topic, "seq")
    started = time.monotonic()
    (
        placed.write.format("nsq")
        .mode("append")
        .option("lookupd", where.lookupd)
        .option("topic", topic)
        .option("keyColumn", "user")
        .option("bodyColumn", "payload")
        .save()
    )
    wrote = time.monotonic() - started
    messages = _run(consume_stored(topic, CHECK, ROWS, limit=600, lookupd=where.lookupd))
    bodies = [m.body.decode() for m in messages]
    assert len(bodies) == ROWS, f"{len(bodies)} consumed, {ROWS} written"
    assert len(set(bodies)) == ROWS, "duplicates without a task retry"
    last: dict[str, int] = {}
    partitions: dict[str, set[int]] = defaultdict(set)
    per_partition: Counter[int] = Counter()
    for message, body in zip(messages, bodies, strict=True):
        user, seq = body.split(":")
        assert int(seq) > last.get(user, -1), f"{user}: {seq} after {last[user]}"
        last[user] = int(seq)
        partitions[user].add(message.partition)
        per_partition[message.partition] += 1
    assert len(last) == KEYS
    for user, parts in partitions.items():
        assert parts == {partition_for_key(user, 4)}, f"{user} on {parts}"
    print(
        f"\n{where.name}: wrote {ROWS} rows ({KEYS} keys) in {wrote:.1f} s; consumed "
        f"{len(bodies)}, per partition {dict(sorted(per_partition.items()))}, 0 order "
        "violations, every key on its producer partition"
    )


# -- 2. streaming read, stop, restart from the checkpoint -------------------------------------


def _collect_to(out: Path, run: str) -> Callable[[DataFrame, int], None]:
    def sink(batch: DataFrame, batch_id: int) -> None:
        rows = batch.select("partition", "offset", "raw_size", "id", "body").collect()
        path = out / f"batch-{batch_id:05d}-{run}.json"
        records = [
            {
                "partition": r["partition"],
                "offset": r["offset"],
                "raw_size": r["raw_size"],
                "id": r["id"],
                "body": bytes(r["body"]).decode(),
            }
            for r in rows
        ]
        partial = path.with_suffix(".part")  # the test polls the directory: no half-files
        partial.write_text(json.dumps(records))
        partial.replace(path)

    return sink


def _batches(out: Path) -> dict[tuple[int, str], list[dict[str, Any]]]:
    result = {}
    for path in sorted(out.glob("batch-*.json")):
        _, batch, run = path.stem.split("-")
        result[(int(batch), run)] = json.loads(path.read_text())
    return result


def _forget_last_commit(checkpoint: Path) -> int:
    """Make the restarted query run its last committed batch N again, as after a crash between
    processing and committing it: delete ``commits/N`` and any later, uncommitted ``offsets/``
    (Spark re-runs only the newest batch of its offset log)."""

    def numbered(folder: str) -> list[int]:
        return sorted(int(p.name) for p in (checkpoint / folder).iterdir() if p.name.isdigit())

    last = numbered("commits")[-1]
    for folder, batches in (
        ("offsets", [b for b in numbered("offsets") if b > last]),
        ("commits", [last]),
    ):
        for batch in batches:
            (checkpoint / folder / str(batch)).unlink()
            (checkpoint / folder / f".{batch}.crc").unlink(missing_ok=True)
    return last


def _offsets_file(checkpoint: Path, batch: int) -> dict[str, Any]:
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    return json.loads(lines[-1])


def _stream(
    spark: SparkSession, options: dict[str, str], out: Path, checkpoint: Path, run: str
) -> Any:
    reader = spark.readStream.format("nsq")
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load()
        .writeStream.foreachBatch(_collect_to(out, run))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0 seconds")
        .start()
    )


@needs_replayable_stream
def test_replayable_read_restarts_from_its_checkpoint_and_rereads_exact_ranges(
    spark: SparkSession, backend: tuple[Backend, dict[str, str]], tmp_path: Path
) -> None:
    where, names = backend
    topic = names["events"]
    total = 2000
    with Producer(lookupd=where.lookupd, trace=True) as producer:
        results = [
            producer.publish_async(topic, f"e{i:05d}".encode(), sharding_key=f"k{i % 40}")
            for i in range(total)
        ]
        published = {
            (r.partition, r.offset): f"e{i:05d}"
            for i, r in enumerate(f.result(60) for f in results)
        }
    assert len(published) == total
    size = sum(r.result().raw_size or 0 for r in results)
    options = {
        "lookupd": where.lookupd,
        "topic": topic,
        "startingOffsets": "earliest",
        "maxBytesPerTrigger": str(size // 6),
    }
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    out.mkdir()

    def seen() -> set[tuple[int, int]]:
        return {(r["partition"], r["offset"]) for rows in _batches(out).values() for r in rows}

    first = _stream(spark, options, out, checkpoint, "a")
    run_until(first, lambda: len(_batches(out)) >= 2, timeout=300)
    assert len(seen()) < total, "the first run was meant to stop mid-way"
    replayed = _forget_last_commit(checkpoint)
    second = _stream(spark, options, out, checkpoint, "b")
    run_until(second, lambda: len(seen()) >= total, timeout=300)

    batches = _batches(out)
    assert seen() == set(published), "a published message is missing (or a stranger came)"
    # the replayed batch read exactly what it read the first time
    again = {run: rows for (b, run), rows in batches.items() if b == replayed}
    assert set(again) == {"a", "b"}, f"batch {replayed} was not run again: {sorted(batches)}"
    assert again["a"] == again["b"]
    # every batch holds exactly the messages in its checkpointed offset range, once
    counts: Counter[tuple[int, int]] = Counter()
    for (batch, run), rows in sorted(batches.items()):
        if (batch == replayed and run == "b") or (batch > replayed and run == "a"):
            # the replay (compared above), and what the first run wrote for batches whose
            # offsets were dropped to force the replay: they were planned again in run b
            continue
        end = _offsets_file(checkpoint, batch)["topics"][topic]
        # batch 0 starts at the earliest offsets: 0 on a new topic
        start = _offsets_file(checkpoint, batch - 1)["topics"][topic] if batch > 0 else {}
        want = {(p, o) for (p, o) in published if int(start.get(str(p), 0)) <= o < int(end[str(p)])}
        got = {(r["partition"], r["offset"]) for r in rows}
        assert got == want, f"batch {batch}: {len(got)} rows, its range holds {len(want)}"
        counts.update(got)
        for r in rows:
            assert published[(r["partition"], r["offset"])] == r["body"]
    assert set(counts) == set(published)
    assert max(counts.values()) == 1
    print(
        f"\n{where.name}: {total} published; {len(batches)} batch outputs over 2 runs; batch "
        f"{replayed} re-read after the restart with the same {len(again['a'])} rows; every "
        "offset in exactly one checkpointed range"
    )


def test_batch_read_gives_the_offset_range_asked_for_and_the_same_rows_again(
    spark: SparkSession, backend: tuple[Backend, dict[str, str]]
) -> None:
    """``spark.read.format("nsq")``: from recorded positions to ``latest``, then a JSON range
    of each partition's middle, read twice: exactly the published messages of each range, the
    same rows both times."""
    where, names = backend
    topic = names["events"]
    endpoint = parse_read_options({"lookupd": where.lookupd, "topic": topic}).endpoint
    before = {p: e.end for p, e in fetch_extents(endpoint).items()}
    with Producer(lookupd=where.lookupd, trace=True) as producer:
        futures = [
            producer.publish_async(topic, f"b{i:04d}".encode(), sharding_key=f"k{i % 12}")
            for i in range(800)
        ]
        published = {(r.partition, r.offset): r for r in (f.result(60) for f in futures)}
    bodies = {(p, o): f"b{i:04d}" for i, (p, o) in enumerate(published)}

    def read(**options: str) -> list[tuple[int, int, str]]:
        reader = spark.read.format("nsq").option("lookupd", where.lookupd).option("topic", topic)
        for key, value in options.items():
            reader = reader.option(key, value)
        return sorted(
            (r["partition"], r["offset"], bytes(r["body"]).decode())
            for r in reader.load().select("partition", "offset", "body").collect()
        )

    assert read(startingOffsets="latest") == []  # an empty range: Spark plans one empty task
    everything = read(startingOffsets=json.dumps({str(p): o for p, o in before.items()}))
    assert everything == sorted((p, o, b) for (p, o), b in bodies.items())
    middle: dict[str, tuple[int, int]] = {}
    for p in sorted(before):
        offsets = sorted(o for (q, o) in published if q == p)
        middle[str(p)] = (offsets[len(offsets) // 4], offsets[3 * len(offsets) // 4])
    ranged = {
        "startingOffsets": json.dumps({p: lo for p, (lo, _) in middle.items()}),
        "endingOffsets": json.dumps({p: hi for p, (_, hi) in middle.items()}),
    }
    first, second = read(**ranged), read(**ranged)
    want = sorted(
        (p, o, b) for (p, o), b in bodies.items() if middle[str(p)][0] <= o < middle[str(p)][1]
    )
    assert first == want
    assert second == first
    print(f"\n{where.name}: batch read {len(everything)} rows, then {len(first)} twice")


@needs_replayable_stream
def test_query_progress_shows_the_latest_offsets_beside_the_batch_end(
    spark: SparkSession, backend: tuple[Backend, dict[str, str]], tmp_path: Path
) -> None:
    """``reportLatestOffset``: each micro-batch's progress carries the partitions' write ends,
    so a query held back by ``maxBytesPerTrigger`` shows how far behind it is."""
    where, names = backend
    topic = names["events"]
    with Producer(lookupd=where.lookupd) as producer:
        producer.publish_many(topic, [b"p%04d" % i for i in range(400)])
    endpoint = parse_read_options({"lookupd": where.lookupd, "topic": topic}).endpoint
    before = {str(p): e.end for p, e in fetch_extents(endpoint).items()}
    (tmp_path / "out").mkdir()
    query = _stream(
        spark,
        {
            "lookupd": where.lookupd,
            "topic": topic,
            "startingOffsets": "earliest",
            "maxBytesPerTrigger": "2048",
        },
        tmp_path / "out",
        tmp_path / "checkpoint",
        "a",
    )
    run_until(query, lambda: len(query.recentProgress) >= 1, timeout=300)
    after = {str(p): e.end for p, e in fetch_extents(endpoint).items()}
    source = query.recentProgress[0]["sources"][0]
    latest = json.loads(source["latestOffset"])["topics"][topic]
    end = json.loads(source["endOffset"])["topics"][topic]
    # the write ends when the batch was planned (the fork's /stats may trail a little)
    assert set(latest) == set(before)
    assert all(before[p] <= latest[p] <= after[p] for p in latest)
    assert sum(end.values()) < sum(latest.values())  # 2 KiB read of far more
    print(f"\n{where.name}: batch 0 ended at {end}, the partitions at {latest}")


def test_driver_source_on_vanilla_is_at_least_once_across_a_restart(
    spark: SparkSession, vanilla_cluster: Any, tmp_path: Path
) -> None:
    """Vanilla nsqd: the driver source; a restart replays its last batch from the WAL."""
    topic = _name("sp_vanilla")
    nsqd = vanilla_cluster.nodes[0].tcp_address
    total = 1500
    with Producer(nsqd=nsqd) as producer:
        producer.publish(topic, b"warmup")
        # the channel exists before the messages: it gets them all
        consumer = _run(consume_stored(topic, "spark", 1, limit=30, nsqd=nsqd))
        assert [m.body for m in consumer] == [b"warmup"]
        producer.publish_many(topic, [f"v{i:05d}".encode() for i in range(total)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    out.mkdir()
    options = {
        "nsqd": nsqd,
        "topic": topic,
        "channel": "spark",
        "walPath": str(checkpoint / "nsq-wal"),
        "maxMessagesPerTrigger": "200",
        "msgTimeout": "30",
    }

    def bodies() -> Counter[str]:
        return Counter(r["body"] for rows in _batches(out).values() for r in rows)

    first = _stream(spark, options, out, checkpoint, "a")
    run_until(first, lambda: len(_batches(out)) >= 3, timeout=300)
    assert len(bodies()) < total
    replayed = _forget_last_commit(checkpoint)
    second = _stream(spark, options, out, checkpoint, "b")
    run_until(second, lambda: len(bodies()) >= total, timeout=300)
    batches = _batches(out)
    again = {run: rows for (b, run), rows in batches.items() if b == replayed}
    assert set(again) == {"a", "b"}, f"batch {replayed} was not replayed: {sorted(batches)}"
    assert again["a"] == again["b"], "the replayed batch differs from the WAL's"
    counts = bodies()
    assert set(counts) == {f"v{i:05d}" for i in range(total)}
    duplicates = sum(c - 1 for c in counts.values())
    print(
        f"\nvanilla: {total} published, {len(counts)} distinct seen, {duplicates} duplicates "
        f"(the replayed batch {replayed} and redeliveries of unfinished messages)"
    )


# -- 3. streaming write with a failing task ---------------------------------------------------


def test_streaming_write_with_a_failed_task_duplicates_but_loses_nothing(
    spark: SparkSession, backend: tuple[Backend, dict[str, str]], tmp_path: Path
) -> None:
    where, names = backend
    topic = names["ext"]
    source = tmp_path / "in"
    source.mkdir()
    files, per_file = 3, 1000
    for f in range(files):
        rows = [
            json.dumps({"seq": f * per_file + i, "user": f"u{(f * per_file + i) % 50}"})
            for i in range(per_file)
        ]
        (source / f"part-{f}.json").write_text("\n".join(rows) + "\n")
    total = files * per_file
    fail_at = per_file + 700  # in the second file (batch 1), once

    from pyspark import TaskContext
    from pyspark.sql.types import StringType

    def body(seq: int, user: str) -> str | None:
        context = TaskContext.get()
        if seq == fail_at and context is not None and context.attemptNumber() == 0:
            return None  # the sink refuses a null body: the task fails, Spark retries it
        return f"{user}:{seq}"

    body_udf = F.udf(body, StringType(), useArrow=False)
    stream = (
        spark.readStream.schema("seq long, user string")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .repartition(2)  # before the UDF, so that it runs in the writing task (and its retry)
        .withColumn("body", body_udf("seq", "user"))
    )
    query = (
        stream.writeStream.format("nsq")
        .option("lookupd", where.lookupd)
        .option("topic", topic)
        .option("keyColumn", "user")
        .option("maxBatch", "50")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    assert query.exception() is None, query.exception()
    messages = _run(consume_stored(topic, CHECK, total, limit=300, lookupd=where.lookupd))
    bodies = Counter(m.body.decode() for m in messages)
    assert set(bodies) == {f"u{s % 50}:{s}" for s in range(total)}, "a row was lost"
    duplicates = sum(c - 1 for c in bodies.values())
    assert duplicates > 0, "the failed attempt published nothing, so nothing was shown"
    stamps: dict[tuple[str, ...], str] = {}
    for message in messages:
        ext = message.ext
        stamp = tuple(str(ext[k]) for k in STAMP_KEYS)
        assert ext["nsq_key"] == message.body.decode().split(":")[0]
        previous = stamps.setdefault(stamp, message.body.decode())
        assert previous == message.body.decode(), f"{stamp} on two different rows"
    assert len(stamps) == total, f"{len(stamps)} distinct stamps for {total} rows"
    batches = Counter(int(s[1]) for s in stamps)
    print(
        f"\n{where.name}: {total} rows streamed in {len(batches)} batches; {len(messages)} "
        f"messages consumed, {duplicates} duplicates from the retried task, 0 lost; "
        f"deduplicated on the nsq_spark_* stamp: {len(stamps)}"
    )
    shutil.rmtree(tmp_path / "checkpoint", ignore_errors=True)
