"""The benchmark harness's pure parts: Go output parsing, medians, ratios, targets."""

from __future__ import annotations

import pytest

from nsq_ha.bench.gotools import go_duration, parse_go
from nsq_ha.bench.measure import latency_summary, percentile
from nsq_ha.bench.report import Report, Target
from nsq_ha.bench.runner import PROFILES, Bench, BenchError, Cell, Sample
from nsq_ha.bench.workloads import FORK_WORKLOADS, VANILLA_WORKLOADS, base_spec


def test_go_tool_output_is_read_as_count_and_seconds() -> None:
    line = (
        "[bench_writer] 2026/11/21 20:49:33 duration: 1.000252977s - 33.437mb/s - "
        "350611.303ops/s - 2.852us/op"
    )
    parsed = parse_go(line)
    assert parsed["seconds"] == pytest.approx(1.000252977)
    assert parsed["count"] / parsed["seconds"] == pytest.approx(350611.303, rel=1e-5)
    assert go_duration("1m2.5s") == pytest.approx(62.5)
    assert go_duration("750ms") == pytest.approx(0.75)
    with pytest.raises(BenchError, match="no figures"):
        parse_go("panic: dial tcp: connection refused")


def test_percentiles_and_the_warm_up_cut() -> None:
    assert percentile([], 0.5) == 0.0
    assert percentile([float(v) for v in range(1, 101)], 0.99) == 99.0
    samples = [100_000_000] * 10 + [1_000_000] * 90  # a slow start, then 1 ms
    summary = latency_summary(samples)
    assert summary["p99_ms"] == pytest.approx(1.0)
    assert summary["max_ms"] == pytest.approx(1.0)


def test_medians_ratios_and_targets_come_from_the_same_run() -> None:
    bench = Bench(PROFILES["smoke"], use_fork=False)
    bench.cells = {
        ("pub1", "nsq_ha"): Cell([Sample(rate=90.0), Sample(rate=100.0), Sample(rate=300.0)]),
        ("pub1", "pynsq"): Cell([Sample(rate=10.0)]),
        ("pub1", "ansq"): Cell([Sample(rate=40.0), Sample(error="boom")]),
        ("hold", "nsq_ha"): Cell([Sample(rss_mb=70.0)]),
        ("consume", "nsq_ha"): Cell([Sample(rate=100.0)]),
        ("consume", "nsq_ha-sync"): Cell([Sample(rate=85.0)]),
    }
    bench.unavailable["fork"] = "not built"
    report = Report(bench)
    assert report.value("pub1", "nsq_ha") == 100.0  # the median, not the mean
    targets = {t.name: t for t in report.targets()}
    publish = targets["publish, one per call / best peer"]
    assert publish.value == pytest.approx(2.5)  # 100 / ansq's 40, the best peer
    assert publish.holds is False  # the goal is 3x
    blocking = targets["consume, blocking iterator / async for"]
    assert (blocking.value, blocking.holds) == (pytest.approx(0.85), True)
    assert targets["consumer RSS, 10k in flight"].holds is False  # 70 MiB > 40
    assert targets["ordered consume / one-round-trip bound"].holds is None
    table = report.render()
    assert "(1 failed)" in table
    assert "no fork: not built" in table


def test_a_target_reads_lower_is_better_the_right_way() -> None:
    assert Target("p99", 1.5, 2.0, False, " ms").holds is True
    assert Target("p99", 2.5, 2.0, False, " ms").holds is False
    assert "MISSED" in Target("x", 0.5, 0.9, True, "x").row()


def test_a_measurement_without_a_goal_is_reported_not_judged() -> None:
    durable = Target("durable / default", 0.41, None, True, "x")
    assert durable.holds is None
    assert durable.row() == "| durable / default | (measured) | 0.41x | - |"
    missing = Target("durable / default", None, None, True, "x", "no fork: not built")
    assert missing.row() == "| durable / default | (measured) | not measured | no fork: not built |"


def test_a_run_spec_sizes_follow_the_workload() -> None:
    quick = PROFILES["quick"]
    by_id = {w.id: w for w in VANILLA_WORKLOADS + FORK_WORKLOADS}
    assert base_spec(quick, by_id["pub1"], "pynsq")["n"] == quick.n
    assert base_spec(quick, by_id["fork-pub1-r3"], "nsq_ha")["n"] == quick.n_slow
    assert base_spec(quick, by_id["fork-ordered"], "raw")["n"] == quick.n_ordered
    hold = base_spec(quick, by_id["hold"], "nsq_ha")
    assert (hold["n"], hold["rdy"]) == (quick.hold, 10000)
    direct = base_spec(quick, by_id["fork-pub1-r1"], "nsq_ha-direct")
    assert direct["client"] == "nsq_ha"  # the same driver, placed without lookupd
    assert base_spec(quick, by_id["latency"], "gnsq")["unbuffered"] is True
    assert base_spec(quick, by_id["consume"], "gnsq")["unbuffered"] is False


def test_a_result_line_becomes_the_workloads_figures() -> None:
    result = {"count": 1000, "seconds": 0.5, "cpu": 0.25, "rss_mb": 42.0}
    assert Sample.from_result(result, "pub1") == Sample(rate=2000.0, cpu_per_100k=25.0)
    assert Sample.from_result(result, "hold") == Sample(rss_mb=42.0)
    slow = Sample.from_result(
        {"count": 500, "seconds": 1.0, "p50_ms": 1.0, "p99_ms": 3.0}, "latency"
    )
    assert (slow.p50_ms, slow.p99_ms) == (1.0, 3.0)
    assert slow.note == "kept only 0.5k of 10k msgs/s"
    assert slow.describe() == "500 msgs/s p50 1.00 ms p99 3.00 ms (kept only 0.5k of 10k msgs/s)"
    assert Sample(error="boom").describe() == "ERROR boom"


def test_a_workload_with_max_rounds_runs_only_that_many() -> None:
    from nsq_ha.bench.workloads import SPARK_WORKLOADS

    bench = Bench(PROFILES["quick"], use_fork=False)  # 3 rounds
    read = next(w for w in SPARK_WORKLOADS if w.id == "spark-read")
    pub1 = next(w for w in VANILLA_WORKLOADS if w.id == "pub1")
    bench.workloads = lambda: [pub1, read]  # type: ignore[method-assign]
    bench.clients = lambda workload: ["nsq_ha"]  # type: ignore[method-assign]
    bench.run_one = lambda workload, client: Sample(rate=1.0)  # type: ignore[method-assign]
    bench.progress = lambda line: None  # type: ignore[method-assign]
    bench.run_rounds()
    assert len(bench.cells[("pub1", "nsq_ha")].samples) == 3
    assert len(bench.cells[("spark-read", "nsq_ha")].samples) == 2


def test_the_cpu_mode_reads_callgrinds_total_and_divides_the_differences() -> None:
    from nsq_ha.bench.cpu import CpuCell, read_ir

    out = "events: Ir\nfn=(1) main\n5 100\nsummary: 1705000000\ntotals: 1705000000\n"
    assert read_ir(out) == 1_705_000_000
    assert read_ir("events: Ir\ntotals: 42\n") == 42
    with pytest.raises(BenchError, match="summary:/totals:"):
        read_ir("events: Ir\n")
    # start-up cancels: 10k messages 1.705e9, 40k messages 3.764e9 -> 68.6k per message
    cell = CpuCell((10_000, 40_000), [1_705_000_000, 3_764_000_000])
    assert cell.per_message == pytest.approx(68_633.3, rel=1e-4)
    assert CpuCell((10_000, 40_000), [1_705_000_000], error="boom").per_message is None
    assert CpuCell((10_000, 40_000), [1_705_000_000]).per_message is None


def test_the_cpu_mode_covers_every_client_of_the_client_bound_workloads() -> None:
    from nsq_ha.bench.cpu import CPU_WORKLOADS
    from nsq_ha.bench.drivers import _ASYNC, _BLOCKING
    from nsq_ha.bench.workloads import PEERS

    by_id = {w.id: w for w in CPU_WORKLOADS}
    fork_pub = {
        f"fork-{kind}-{tasks}"
        for kind in ("keyed-cold", "keyed", "unkeyed")
        for tasks in (1, 100, 2000)
    }
    assert set(by_id) == {"consume", "pub1", "pubmany", "fork-ordered", *fork_pub}
    assert set(by_id["consume"].clients) == {
        "nsq_ha",
        "nsq_ha-uvloop",
        "nsq_ha-batch",
        "nsq_ha-sync",
        "pynsq",
        "gnsq",
        "ansq",
    }
    for wid in ("pub1", "pubmany"):
        assert {"nsq_ha", "nsq_ha-uvloop", "pynsq", "gnsq", "ansq"} <= set(by_id[wid].clients)
    assert {"floor", "raw"} <= set(by_id["fork-ordered"].clients)
    for w in CPU_WORKLOADS:
        assert w.counts[0] < w.counts[1]
        for client in w.clients:  # the wall-clock mode's drivers, on its workloads
            spec = base_spec(PROFILES["quick"], w.workload, client)
            key = (spec["client"], spec["workload"])
            assert client in PEERS or key in _ASYNC or key in _BLOCKING, (w.id, client)
    # cold: both counts from a fresh producer (their difference keeps what the cold start
    # leaves behind); warm: after one publish; unkeyed: the same topic without keys
    for tasks in (1, 100, 2000):
        cold, warm = by_id[f"fork-keyed-cold-{tasks}"], by_id[f"fork-keyed-{tasks}"]
        unkeyed = by_id[f"fork-unkeyed-{tasks}"]
        assert (cold.workload.kind, cold.workload.concurrency, cold.workload.keyed) == (
            "pub1-cold",
            tasks,
            True,
        )
        assert (warm.workload.kind, warm.workload.concurrency, warm.workload.keyed) == (
            "pub1",
            tasks,
            True,
        )
        assert (unkeyed.workload.kind, unkeyed.workload.keyed) == ("pub1", False)
        assert cold.counts == warm.counts == unkeyed.counts
        assert all(n % tasks == 0 for n in cold.counts)
    assert by_id["fork-ordered"].counts[1] < by_id["consume"].counts[1]
    # the smoke run: a tenth, whole calls of every task
    assert by_id["consume"].scaled(10) == (200, 600)
    assert by_id["pubmany"].scaled(10) == (800, 4800)
    assert by_id["fork-keyed-cold-100"].scaled(10) == (200, 600)


def test_the_keyed_cold_start_is_a_wall_clock_workload_at_three_concurrencies() -> None:
    quick = PROFILES["quick"]
    cold = {w.id: w for w in FORK_WORKLOADS if w.kind == "pub1-cold"}
    assert sorted(w.concurrency for w in cold.values()) == [1, 100, 2000]
    for workload in cold.values():
        spec = base_spec(quick, workload, "nsq_ha")
        assert (spec["workload"], spec["keyed"], spec["concurrency"]) == (
            "pub1-cold",
            True,
            workload.concurrency,
        )
    assert base_spec(quick, cold["fork-keyed-cold-1"], "nsq_ha")["n"] == quick.n_slow


def test_the_cpu_table_is_workload_by_client_in_thousands() -> None:
    from nsq_ha.bench.cpu import CpuBench, CpuCell

    bench = Bench(PROFILES["quick"], use_fork=False)
    cpu = CpuBench(bench)
    cpu.cells = {
        ("consume", "nsq_ha"): CpuCell((2000, 6000), [1_000_000_000, 1_274_400_000]),
        ("consume", "pynsq"): CpuCell((2000, 6000), [900_000_000], error="exit 1"),
    }
    table = cpu.markdown()
    assert "| consume, FIN each (RDY 2500) | 2,000, 6,000 | 68.6 | failed |" in table
    assert "| nsq_ha | pynsq |" in table
    assert "`consume` pynsq failed: exit 1" in cpu.render()
    record = cpu.as_json()["results"]["consume/nsq_ha"]
    assert record["instructions_per_message"] == pytest.approx(68_600.0)
    assert record["ir"] == [1_000_000_000, 1_274_400_000]


def test_nsq_ha_bench_takes_the_cpu_flag() -> None:
    from nsq_ha.cli import build_parser

    assert build_parser().parse_args(["bench", "--cpu", "--no-peers"]).cpu is True
    assert build_parser().parse_args(["bench"]).cpu is False
