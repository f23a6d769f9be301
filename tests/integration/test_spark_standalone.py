"""The ``nsq`` source and sink on a real Spark standalone cluster, against the real fork.

A master and two workers are started once for the module from the installed PySpark
(``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``: separate JVMs,
one core each, on 127.0.0.1), and the driver (this process) connects through ``spark://``.
Each executor is a JVM the worker starts, with Python workers of its own, in the worker's work
directory and with the worker's environment: nothing of the driver's process, working
directory or environment reaches them except what Spark serializes (the reader, its
partitions, the writer).

* the executors are not the driver: another process, another working directory, another
  ``HOME``, and a variable set in the driver's environment is not in theirs;
* a stream read (``availableNow``) and a second run from its checkpoint read exactly the rows
  published before each run, once each;
* a keyed write of ``co_partition``-ed rows puts each key on its producer partition, in row
  order, exactly the rows written;
* no read channel is left on the topic afterwards.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

pyspark = pytest.importorskip(
    "pyspark", reason="pyspark is not installed: pip install -e '.[spark]' (make test does)"
)

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from nsq_ha.admin import NsqdAdmin  # noqa: E402
from nsq_ha.lookup import LookupClient  # noqa: E402
from nsq_ha.routing import partition_for_key  # noqa: E402
from nsq_ha.spark import co_partition  # noqa: E402
from nsq_ha.spark.compat import REPLAYABLE_STREAM_READ, pyspark_version, supports  # noqa: E402
from nsq_ha.spark.options import parse_read_options  # noqa: E402
from nsq_ha.spark.source.extents import fetch_extents  # noqa: E402
from nsq_ha.sync import Producer  # noqa: E402
from nsq_ha.testing.process import ManagedProcess, free_ports  # noqa: E402
from nsq_ha.testing.servers import ForkCluster  # noqa: E402

from .spark_session import local_spark  # noqa: E402

pytestmark = [
    pytest.mark.spark,
    pytest.mark.fork,
    pytest.mark.skipif(
        not supports(REPLAYABLE_STREAM_READ),
        reason=f"PySpark {pyspark_version()}: the replayable streaming source needs PySpark 4.2+",
    ),
]

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
WORKERS = 2
#: set in the driver's environment only: an executor that sees it shares the driver's
DRIVER_MARK = "NSQ_HA_DRIVER_ONLY"


@dataclass
class Standalone:
    url: str
    root: Path
    home: Path
    master: ManagedProcess
    ui_port: int


def _alive_workers(ui_port: int) -> int:
    """How many workers the master's JSON page lists alive (0 while it does not answer)."""
    try:
        answer = httpx.get(f"http://127.0.0.1:{ui_port}/json/", timeout=2.0)
        return int(answer.json().get("aliveworkers", 0))
    except (httpx.HTTPError, ValueError):
        return 0


def _logged(process: ManagedProcess, text: str) -> bool:
    try:
        return text in process.log_path.read_text(errors="replace")
    except OSError:
        return False


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    """A Spark standalone master and two 1-core workers on loopback, stopped and reaped at the
    end. The daemons (and so the executors) get their own ``HOME`` and no REST server. The
    workers are still starting when it yields (their JVMs boot while the driver's session
    does): :func:`spark` waits for them."""
    root = tmp_path_factory.mktemp("spark-standalone")
    home = root / "home"
    home.mkdir()
    rpc, ui = free_ports(2)
    url = f"spark://127.0.0.1:{rpc}"
    env = [
        "env",
        f"-u{DRIVER_MARK}",
        f"HOME={home}",
        "SPARK_LOCAL_IP=127.0.0.1",
        "SPARK_DAEMON_MEMORY=256m",
        "SPARK_MASTER_OPTS=-Dspark.master.rest.enabled=false",
        f"SPARK_LOG_DIR={root / 'logs'}",
        str(SPARK_CLASS),
    ]
    master_args = ["--host", "127.0.0.1", "--port", str(rpc), "--webui-port", str(ui)]
    master = ManagedProcess(
        "spark-master",
        [*env, "org.apache.spark.deploy.master.Master", *master_args],
        root / "master",
    )
    worker_args = ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0"]
    worker_args += ["--cores", "1", "--memory", "1g"]
    workers = [
        ManagedProcess(
            f"spark-worker-{i}",
            [
                *env,
                "org.apache.spark.deploy.worker.Worker",
                *worker_args,
                *("--work-dir", str(root / f"worker-{i}" / "work"), url),
            ],
            root / f"worker-{i}",
        )
        for i in range(WORKERS)
    ]
    try:
        master.start()
        master.wait_until(lambda: _logged(master, "New state: ALIVE"), "the master", timeout=60)
        for worker in workers:
            worker.start()
        yield Standalone(url, root, home, master, ui)
    finally:
        for process in (*workers, master):
            process.stop(timeout=20)


@pytest.fixture(scope="module")
def spark(standalone: Standalone) -> Iterator[SparkSession]:
    """The driver, through ``spark://``: one 1-core executor per worker, Python workers on this
    interpreter, the driver bound to loopback."""
    conf = {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.cores.max": str(WORKERS),
        "spark.pyspark.python": sys.executable,
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    }
    with local_spark("nsq_ha-standalone", standalone.url, conf) as session:
        standalone.master.wait_until(
            lambda: _alive_workers(standalone.ui_port) == WORKERS,
            f"{WORKERS} workers registered",
            timeout=90,
        )
        yield session


def test_executors_share_nothing_with_the_driver_but_what_spark_serializes(
    spark: SparkSession,
    standalone: Standalone,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(DRIVER_MARK, "driver")
    monkeypatch.chdir(tmp_path)
    mark = DRIVER_MARK

    def where_am_i(_: Iterable[int]) -> Iterator[tuple[int, str, str | None, str | None]]:
        # a closure, pickled by value: the executors cannot import this test module
        yield os.getpid(), os.getcwd(), os.environ.get("HOME"), os.environ.get(mark)

    seen = spark.sparkContext.parallelize(range(8), 8).mapPartitions(where_am_i).collect()
    for pid, cwd, home, theirs in seen:
        assert pid != os.getpid()
        # <worker's work dir>/<app id>/<executor id>
        assert Path(cwd).parent.parent.name == "work", cwd
        assert Path(cwd).is_relative_to(standalone.root), cwd
        assert home == str(standalone.home)
        assert theirs is None, "an executor sees the driver's environment"
    print(f"\nexecutors: {sorted({Path(cwd).name for _, cwd, _, _ in seen})}")


# -- a stream read, restarted from its checkpoint ---------------------------------------------


def _ends(lookupd: str, topic: str) -> dict[int, int]:
    endpoint = parse_read_options({"lookupd": lookupd, "topic": topic}).endpoint
    return {p: e.end for p, e in fetch_extents(endpoint).items()}


def _publish(lookupd: str, topic: str, bodies: list[bytes]) -> dict[tuple[int, int], bytes]:
    """Publish ``bodies`` keyed (40 keys): each one's (partition, offset) (traced: the fork
    answers a traced publish with its offset)."""
    with Producer(lookupd=lookupd, trace=True) as producer:
        futures = [
            producer.publish_async(topic, body, sharding_key=f"k{i % 40}")
            for i, body in enumerate(bodies)
        ]
        results = [f.result(60) for f in futures]
    published = {}
    for result, body in zip(results, bodies, strict=True):
        assert result.partition is not None, result
        assert result.offset is not None, result
        published[(result.partition, result.offset)] = body
    return published


def _available_now(
    spark: SparkSession, options: dict[str, str], checkpoint: Path, out: Path
) -> dict[tuple[int, int], bytes]:
    """One ``availableNow`` run of the stream from ``checkpoint``: the rows its batches had,
    by (partition, offset) (a row twice fails)."""
    out.mkdir()

    def collect(batch: DataFrame, batch_id: int) -> None:
        rows = [
            [r["partition"], r["offset"], bytes(r["body"]).hex()]
            for r in batch.select("partition", "offset", "body").collect()
        ]
        (out / f"{batch_id}.json").write_text(json.dumps(rows))

    reader = spark.readStream.format("nsq")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        stopped = query.awaitTermination(120)
    finally:
        query.stop()
    assert stopped, "the availableNow query did not stop by itself"
    assert query.exception() is None, query.exception()
    got: dict[tuple[int, int], bytes] = {}
    for path in sorted(out.glob("*.json")):
        for partition, offset, body in json.loads(path.read_text()):
            assert (partition, offset) not in got, f"{partition}/{offset} read twice"
            got[(partition, offset)] = bytes.fromhex(body)
    return got


async def _channels(lookupd: str, topic: str) -> set[tuple[str, str]]:
    """Every (partition, channel) of ``topic`` on every nsqd nsqlookupd lists for it."""
    found: set[tuple[str, str]] = set()
    async with LookupClient([lookupd]) as lookup:
        pmap = await lookup.lookup(topic, "r", force=True)
        nodes = {n.http_url for n in (*pmap.partitions.values(), *pmap.producers)}
    for url in sorted(nodes):
        async with NsqdAdmin(url) as nsqd:
            for entry in await nsqd.topic_stats(topic):
                partition = str(entry.get("topic_partition", ""))
                for channel in entry.get("channels") or ():
                    found.add((partition, str(channel.get("channel_name"))))
    return found


def test_stream_read_restarts_from_its_checkpoint_with_exactly_the_rows_published(
    spark: SparkSession, fork_cluster: ForkCluster, fork_topic4: str, tmp_path: Path
) -> None:
    lookupd, topic = fork_cluster.lookupd_http, fork_topic4
    channels = asyncio.run(_channels(lookupd, topic))
    tag = secrets.token_hex(3)
    options = {
        "lookupd": lookupd,
        "topic": topic,
        "startingOffsets": json.dumps({str(p): o for p, o in _ends(lookupd, topic).items()}),
    }
    checkpoint = tmp_path / "checkpoint"
    first = _publish(lookupd, topic, [f"{tag}-a{i:04d}".encode() for i in range(600)])
    assert _available_now(spark, options, checkpoint, tmp_path / "a") == first
    second = _publish(lookupd, topic, [f"{tag}-b{i:04d}".encode() for i in range(600)])
    assert _available_now(spark, options, checkpoint, tmp_path / "b") == second
    assert asyncio.run(_channels(lookupd, topic)) == channels, "a read channel was left"


# -- a keyed write -----------------------------------------------------------------------------


def test_keyed_write_puts_each_keys_rows_in_order_on_its_partition(
    spark: SparkSession, fork_cluster: ForkCluster, fork_topic4: str
) -> None:
    lookupd, topic = fork_cluster.lookupd_http, fork_topic4
    channels = asyncio.run(_channels(lookupd, topic))
    rows, keys, tag = 4000, 50, secrets.token_hex(3)
    before = _ends(lookupd, topic)
    frame = spark.range(rows, numPartitions=4).select(
        F.col("id").alias("seq"),
        F.concat(F.lit("u"), (F.col("id") % keys).cast("string")).alias("user"),
    )
    frame = frame.withColumn("payload", F.concat_ws(":", F.lit(tag), "user", "seq"))
    (
        co_partition(frame, "user", lookupd, topic, "seq")
        .write.format("nsq")
        .mode("append")
        .option("lookupd", lookupd)
        .option("topic", topic)
        .option("keyColumn", "user")
        .option("bodyColumn", "payload")
        .save()
    )
    stored = (
        spark.read.format("nsq")
        .option("lookupd", lookupd)
        .option("topic", topic)
        .option("startingOffsets", json.dumps({str(p): o for p, o in before.items()}))
        .load()
        .select("partition", "offset", "body")
        .collect()
    )
    mine = sorted(
        (r["partition"], r["offset"], bytes(r["body"]).decode())
        for r in stored
        if bytes(r["body"]).startswith(tag.encode())
    )
    assert len(mine) == rows, f"{len(mine)} rows stored, {rows} written"
    assert len({body for _, _, body in mine}) == rows, "a row stored twice"
    last: dict[str, int] = {}
    partitions: dict[str, set[int]] = defaultdict(set)
    for partition, _, body in mine:  # in offset order per partition
        _, user, seq = body.split(":")
        assert int(seq) > last.get(user, -1), f"{user}: {seq} after {last[user]}"
        last[user] = int(seq)
        partitions[user].add(partition)
    assert len(last) == keys
    for user, found in partitions.items():
        assert found == {partition_for_key(user, 4)}, f"{user} on {found}"
    assert asyncio.run(_channels(lookupd, topic)) == channels, "a read channel was left"
