"""The benchmark's Spark workloads: on the fork, each beside the client's own figure on the same
topic with as many rows, and the report's Spark table and targets (ratios, the fixed cost)."""

from __future__ import annotations

from nsq_ha.bench.report import Report
from nsq_ha.bench.runner import PROFILES, Bench, Cell, Sample
from nsq_ha.bench.workloads import FORK_TOPICS, SPARK_WORKLOADS, base_spec

#: (Spark's workload, the client's reference on the same cluster)
FORK_PAIRS = (
    ("spark-fork-read", "spark-fork-consume"),
    ("spark-fork-batch", "spark-fork-consume"),
    ("spark-fork-write", "spark-fork-pubmany"),
    ("spark-fork-read-ordered", "spark-fork-ordered"),
    ("spark-fork-floor", "spark-fork-consume"),
    ("spark-fork-floor-batch", "spark-fork-consume"),
)


def test_each_spark_workload_on_the_fork_runs_beside_the_client_on_the_same_topic() -> None:
    quick = PROFILES["quick"]
    workloads = {w.id: w for w in SPARK_WORKLOADS}
    assert FORK_TOPICS["o4"] == (4, 1, True, False)  # 4 ordered partitions, replica 1
    for spark, reference in FORK_PAIRS:
        mine, theirs = workloads[spark], workloads[reference]
        assert mine.server == theirs.server
        assert mine.server in FORK_TOPICS
        assert FORK_TOPICS[mine.server][0] == 4
        assert base_spec(quick, mine, "nsq_ha")["n"] == base_spec(quick, theirs, "nsq_ha")["n"]
    assert workloads["spark-fork-read-ordered"].server == "o4"
    modes = {w.id: base_spec(quick, w, "nsq_ha")["spark_mode"] for w in SPARK_WORKLOADS}
    assert modes["spark-fork-read"] == "stream"
    assert modes["spark-fork-batch"] == "batch"
    assert modes["spark-fork-fixed"] == "fixed"
    # Spark's floor reads as many rows as its read, from memory, in the same kind of read
    assert modes["spark-fork-floor"] == "floor"
    assert modes["spark-fork-floor-batch"] == "floor-batch"
    # the embedded cluster's one-partition ordered reference keeps its own size; the others
    # there read and write as many rows as Spark
    dev_ordered = base_spec(quick, workloads["spark-dev-ordered"], "nsq_ha")
    assert dev_ordered["n"] == quick.n_ordered * 5
    for embedded in ("spark-read", "spark-write", "spark-dev-consume", "spark-dev-write"):
        assert workloads[embedded].server == "dev"
        assert base_spec(quick, workloads[embedded], "nsq_ha")["n"] == quick.n_spark == 100_000
    assert base_spec(quick, workloads["spark-read-ordered"], "nsq_ha")["n"] == 50_000
    # a JVM per run: at most 2 rounds each; none in the smoke run
    assert {w.max_rounds for w in SPARK_WORKLOADS} == {2}
    smoke = Bench(PROFILES["smoke"], use_fork=False)
    assert smoke.unavailable["spark"] == "not in the smoke profile"
    assert not [w for w in smoke.workloads() if w.id.startswith("spark")]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 9)


def _bench(rates: dict[str, float]) -> Bench:
    bench = Bench(PROFILES["quick"], use_fork=False)
    bench.unavailable.pop("spark", None)
    bench.cells = {(w, "nsq_ha"): Cell([Sample(rate=r)]) for w, r in rates.items()}
    return bench


def test_the_report_compares_spark_with_the_client_and_shows_the_fixed_cost() -> None:
    bench = _bench(
        {
            "spark-fork-read": 40_000.0,
            "spark-fork-consume": 50_000.0,
            "spark-fork-batch": 45_000.0,
            "spark-fork-write": 30_000.0,
            "spark-fork-pubmany": 60_000.0,
            "spark-fork-read-ordered": 8_000.0,
            "spark-fork-ordered": 10_000.0,
            "spark-fork-fixed": 0.5,  # a query every 2 s
            "spark-fork-floor": 80_000.0,
            "spark-fork-floor-batch": 90_000.0,
            "spark-read": 20_000.0,
            "spark-dev-consume": 40_000.0,
            "spark-dev-ordered": 1_000.0,
            "spark-read-ordered": 3_000.0,
        }
    )
    report = Report(bench)
    targets = {t.name: t for t in report.targets()}
    read = targets["Spark stream read / async for"]
    assert (_rounded(read.value), read.goal, read.holds) == (0.8, 0.8, True)
    batch = targets["Spark bounded batch read / async for"]
    assert (_rounded(batch.value), batch.holds) == (0.9, True)
    write = targets["Spark keyed write / keyed publish_many"]
    assert (_rounded(write.value), write.holds) == (0.5, False)
    ordered = targets["Spark ordered stream read / 4 ordered consumers"]
    assert (_rounded(ordered.value), ordered.holds) == (0.8, True)
    # the embedded cluster's figures are measured, with no goal; its ordered reference is
    # one partition's consumer, times 4
    embedded = targets["Spark ordered stream read / ordered consume, embedded cluster"]
    assert (_rounded(embedded.value), embedded.goal) == (0.75, None)
    # 100k rows at 40k rows/s is 2.5 s, of which 2 s are the fixed cost: 200k rows/s net
    ratio, net = report._spark_ratio("spark-fork-read", "spark-fork-consume")
    assert (_rounded(ratio), _rounded(net)) == (0.8, 4.0)
    # the write has no query fixed cost measured: no net figure
    assert report._spark_ratio("spark-fork-write", "spark-fork-pubmany")[1] is None
    table = report.spark_markdown()
    # each read beside Spark's floor: the floor over the client, the read over the floor
    assert (
        "| fork | stream read | 40.0k | async for | 50.0k | 0.80x | 4.00x | 80.0k | 1.60x | 0.50x |"
        in table
    )
    assert "| fork | bounded batch read | 45.0k | async for | 50.0k | 0.90x |" in table
    assert "| 90.0k | 1.80x | 0.50x |" in table
    assert (
        "| fork | keyed write | 30.0k | keyed publish_many | 60.0k | 0.50x |  |  |  |  |" in table
    )
    # the floor has no target of its own
    assert not [t for t in targets if t.startswith("Spark") and "floor" in t]
    assert "ordered consume (one partition x 4) | 4.0k | 0.75x" in table
    assert "fixed cost of one stream query on the fork" in table
    assert "2.00 s" in table
    assert "Spark beside the client" in report.render()


def test_the_spark_table_leaves_out_what_was_not_run() -> None:
    bench = _bench({"spark-fork-read": 40_000.0})
    bench.only = ("spark-fork-read",)
    table = Report(bench).spark_markdown()
    assert "| fork | stream read | 40.0k | async for | - |  |  |  |  |  |" in table
    assert "bounded batch read" not in table
    assert "fixed cost of one stream query" not in table


def test_the_spark_table_shows_the_floor_alone_when_only_it_ran() -> None:
    bench = _bench({"spark-fork-floor": 80_000.0, "spark-fork-consume": 50_000.0})
    bench.only = ("spark-fork-floor", "spark-fork-consume")
    table = Report(bench).spark_markdown()
    assert "| fork | stream read | - | async for | 50.0k |  |  | 80.0k | 1.60x |  |" in table
    assert "keyed write" not in table
