"""Turn a benchmark run into the README's Markdown tables and a JSON record."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from nsq_ha.bench.runner import Bench
from nsq_ha.bench.spark_drivers import PARTITIONS
from nsq_ha.bench.workloads import PEERS, Workload, base_spec

_LABELS = {
    "nsq_ha": "nsq_ha",
    "nsq_ha-direct": "nsq_ha, nsqd= (no lookup)",
    "nsq_ha-batch": "nsq_ha, batch handler",
    "nsq_ha-sync": "nsq_ha, sync iterator",
    "nsq_ha-uvloop": "nsq_ha on uvloop",
    "raw": "raw socket",
    "floor": "asyncio floor (a task woken per message)",
    "floor-uvloop": "uvloop floor (a task woken per message)",
}
_METRIC = {"latency": "p99_ms", "hold": "rss_mb"}
#: (what, Spark's workload, the client's reference, its workload, cluster): the Spark table
_SPARK_PAIRS = (
    ("stream read", "spark-fork-read", "async for", "spark-fork-consume", "fork"),
    ("bounded batch read", "spark-fork-batch", "async for", "spark-fork-consume", "fork"),
    ("keyed write", "spark-fork-write", "keyed publish_many", "spark-fork-pubmany", "fork"),
    ("ordered stream read", "spark-fork-read-ordered", "4 ordered consumers",
     "spark-fork-ordered", "fork"),
    ("stream read", "spark-read", "async for", "spark-dev-consume", "embedded"),
    ("keyed write", "spark-write", "keyed publish_many", "spark-dev-write", "embedded"),
    ("ordered stream read", "spark-read-ordered", "ordered consume", "spark-dev-ordered",
     "embedded"),
)  # fmt: skip
#: Spark's floor of a read on the fork: the same rows from memory, no NSQ (same kind of read)
_SPARK_FLOORS = {
    "spark-fork-read": "spark-fork-floor",
    "spark-fork-batch": "spark-fork-floor-batch",
}
_UNIT = {"rate": "msgs/s", "p99_ms": "p99 ms", "rss_mb": "RSS MiB"}


def _metric(workload: Workload) -> str:
    return _METRIC.get(workload.kind, "rate")


def _fmt(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    if metric == "rate":
        return f"{value / 1000:,.1f}k" if value < 1e6 else f"{value / 1e6:,.2f}M"
    return f"{value:.2f}" if metric == "p99_ms" else f"{value:.1f}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _times(a: float | None, factor: float) -> float | None:
    return None if a is None else a * factor


@dataclass
class Target:
    """A target of the issue and how this run measured it."""

    name: str
    value: float | None
    #: None: a measurement reported beside the targets, with no goal
    goal: float | None
    higher_is_better: bool
    unit: str
    why_missing: str = ""

    @property
    def holds(self) -> bool | None:
        if self.value is None or self.goal is None:
            return None
        return self.value >= self.goal if self.higher_is_better else self.value <= self.goal

    def row(self) -> str:
        sign = ">=" if self.higher_is_better else "<="
        goal = "(measured)" if self.goal is None else f"{sign} {self.goal:g}{self.unit}"
        if self.value is None:
            got, verdict = "not measured", self.why_missing or "-"
        else:
            got = f"{self.value:.2f}{self.unit}"
            verdict = "-" if self.goal is None else "holds" if self.holds else "MISSED"
        return f"| {self.name} | {goal} | {got} | {verdict} |"


class Report:
    """Medians, ratios and targets of one :class:`~nsq_ha.bench.runner.Bench`."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench

    def value(self, workload_id: str, client: str, metric: str = "rate") -> float | None:
        cell = self.bench.cells.get((workload_id, client))
        return cell.median(metric) if cell is not None else None

    def best_peer(self, workload: Workload) -> tuple[str, float] | None:
        metric = _metric(workload)
        figures = [
            (p, v)
            for p in PEERS
            if p in workload.clients and (v := self.value(workload.id, p, metric)) is not None
        ]
        if not figures:
            return None
        pick: Callable[..., tuple[str, float]] = max if metric == "rate" else min
        return pick(figures, key=lambda pv: pv[1])

    # -- tables -----------------------------------------------------------------------------

    def markdown(self) -> str:
        bench = self.bench
        peers = list(PEERS)
        lines = [
            "| workload | nsq_ha variant | nsq_ha | "
            + " | ".join(peers)
            + " | Go / bound | ÷ best peer | ÷ Go / bound |",
            "|---|---|---:|" + "---:|" * len(peers) + "---:|---:|---:|",
        ]
        for workload in bench.workloads():
            metric = _metric(workload)
            ours = [c for c in workload.clients if c not in PEERS and c != "raw"]
            reference = "go" if workload.go else ("raw" if "raw" in workload.clients else None)
            ref_value = self.value(workload.id, reference, metric) if reference else None
            best = self.best_peer(workload)
            for i, client in enumerate(ours):
                mine = self.value(workload.id, client, metric)
                title = f"{workload.title} [{_UNIT[metric]}]" if i == 0 else "″"
                peer_cells = [
                    (self._cell(workload, p, metric) if i == 0 else "″")
                    if p in workload.clients
                    else ""
                    for p in peers
                ]
                ref_cell = ""
                if reference:
                    ref_cell = self._cell(workload, reference, metric) if i == 0 else "″"
                vs_peer = _ratio(mine, best[1]) if best else None
                vs_ref = _ratio(mine, ref_value)
                lines.append(
                    f"| {title} | {_LABELS.get(client, client)} | "
                    f"{self._cell(workload, client, metric)} | "
                    + " | ".join(peer_cells)
                    + f" | {ref_cell} | {_x(vs_peer)} | {_x(vs_ref)} |"
                )
        return "\n".join(lines)

    def _cell(self, workload: Workload, client: str, metric: str) -> str:
        cell = self.bench.cells.get((workload.id, client))
        if cell is None:
            why = self.bench.unavailable.get(client, "")
            return "n/a" if why else ""
        text = _fmt(cell.median(metric), metric)
        if cell.errors:
            text += f" ({len(cell.errors)} failed)"
        if cell.notes:
            text += "*"
        return text

    def cpu_markdown(self) -> str:
        """CPU seconds per 100k messages, per client, on the throughput workloads."""
        clients = ["nsq_ha", "nsq_ha-batch", "nsq_ha-sync", *PEERS, "go"]
        lines = [
            "| workload | " + " | ".join(_LABELS.get(c, c) for c in clients) + " |",
            "|---|" + "---:|" * len(clients),
        ]
        for workload in self.bench.workloads():
            if workload.kind not in ("pub1", "pubmany", "consume") or workload.server != "vanilla":
                continue
            cells = []
            for client in clients:
                value = self.value(workload.id, client, "cpu_per_100k")
                cells.append(f"{value:.2f}" if value is not None else "")
            lines.append(f"| {workload.title} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    # -- targets ----------------------------------------------------------------------------

    def targets(self) -> list[Target]:
        v = self.value
        fork_missing = self.bench.unavailable.get("fork", "")

        def peer(workload_id: str) -> float | None:
            workload = next((w for w in self.bench.workloads() if w.id == workload_id), None)
            best = self.best_peer(workload) if workload else None
            return best[1] if best else None

        fork_why = f"no fork: {fork_missing}" if fork_missing else ""
        spark_missing = self.bench.unavailable.get("spark", "")
        spark_why = f"no spark: {spark_missing}" if spark_missing else ""

        def thousands(value: float | None) -> float | None:
            return None if value is None else value / 1000

        x, up, down = "x", True, False
        cpu = "cpu_per_100k"
        # issue 22's table, row by row, with its goals; then what must keep holding
        return [
            Target("consume, blocking iterator / async for",
                   _ratio(v("consume", "nsq_ha-sync"), v("consume", "nsq_ha")), 0.8, up, x),
            Target("ordered consume / one-round-trip bound",
                   _ratio(v("fork-ordered", "nsq_ha"), v("fork-ordered", "raw")),
                   0.9, up, x, fork_why),
            Target("ordered consume, CPU / raw socket's CPU",
                   _ratio(v("fork-ordered", "nsq_ha", cpu), v("fork-ordered", "raw", cpu)),
                   2.0, down, x, fork_why),
            Target("ordered consume on uvloop / one-round-trip bound",
                   _ratio(v("fork-ordered", "nsq_ha-uvloop"), v("fork-ordered", "raw")),
                   None, up, x, fork_why),
            Target("ordered: asyncio floor / one-round-trip bound",
                   _ratio(v("fork-ordered", "floor"), v("fork-ordered", "raw")),
                   None, up, x, fork_why),
            Target("ordered: uvloop floor / one-round-trip bound",
                   _ratio(v("fork-ordered", "floor-uvloop"), v("fork-ordered", "raw")),
                   None, up, x, fork_why),
            Target("ordered consume / asyncio floor",
                   _ratio(v("fork-ordered", "nsq_ha"), v("fork-ordered", "floor")),
                   None, up, x, fork_why),
            Target("ordered consume on uvloop / uvloop floor",
                   _ratio(v("fork-ordered", "nsq_ha-uvloop"), v("fork-ordered", "floor-uvloop")),
                   None, up, x, fork_why),
            Target("consume, async for on uvloop / on asyncio",
                   _ratio(v("consume", "nsq_ha-uvloop"), v("consume", "nsq_ha")), None, up, x),
            Target("publish_many, vanilla / best peer",
                   _ratio(v("pubmany", "nsq_ha"), peer("pubmany")), 1.1, up, x),
            Target("publish_many, fork replica 1 / best peer",
                   _ratio(v("fork-pubmany-r1", "nsq_ha"), peer("fork-pubmany-r1")),
                   1.1, up, x, fork_why),
            Target("publish_many, fork replica 1 / Go bench_writer",
                   _ratio(v("fork-pubmany-r1", "nsq_ha"), v("fork-pubmany-r1", "go")),
                   0.9, up, x, fork_why),
            Target("publish_many, fork replica 3 / best peer",
                   _ratio(v("fork-pubmany-r3", "nsq_ha"), peer("fork-pubmany-r3")),
                   1.1, up, x, fork_why),
            Target("consume, batch handler / Go bench_reader",
                   _ratio(v("consume", "nsq_ha-batch"), v("consume", "go")), 0.9, up, x),
            Target("consume, async for / best peer",
                   _ratio(v("consume", "nsq_ha"), peer("consume")), 3.0, up, x),
            Target("publish, one per call / best peer",
                   _ratio(v("pub1", "nsq_ha"), peer("pub1")), 3.0, up, x),
            Target("fork, through lookupd / nsqd= (one per call)",
                   _ratio(v("fork-pub1-r1", "nsq_ha"), v("fork-pub1-r1", "nsq_ha-direct")),
                   0.95, up, x, fork_why),
            Target("fork, through lookupd / nsqd= (publish_many)",
                   _ratio(v("fork-pubmany-r1", "nsq_ha"), v("fork-pubmany-r1", "nsq_ha-direct")),
                   0.95, up, x, fork_why),
            Target("p99 publish->deliver at 10k msgs/s",
                   v("latency", "nsq_ha", "p99_ms"), 1.0, down, " ms"),
            Target("consumer RSS, 10k in flight",
                   v("hold", "nsq_ha", "rss_mb"), 40.0, down, " MiB"),
            Target("fork replica 3, one per call / pynsq",
                   _ratio(v("fork-pub1-r3", "nsq_ha"), v("fork-pub1-r3", "pynsq")),
                   10.0, up, x, fork_why),
            Target("fork replica 3, durable / default topic (one per call)",
                   _ratio(v("fork-pub1-r3d", "nsq_ha"), v("fork-pub1-r3", "nsq_ha")),
                   None, up, x, fork_why),
            Target("fork replica 3, durable / default topic (publish_many)",
                   _ratio(v("fork-pubmany-r3d", "nsq_ha"), v("fork-pubmany-r3", "nsq_ha")),
                   None, up, x, fork_why),
            # Spark local[2] against the client's own figure on the same fork topic, same run
            *(Target(f"Spark {name} / {reference}", self._spark_ratio(spark, client)[0],
                     0.8, up, x, spark_why)
              for name, spark, reference, client, cluster in _SPARK_PAIRS if cluster == "fork"),
            # the same on the embedded cluster (Python, sharing the 2 cores), measured only
            *(Target(f"Spark {name} / {reference}, embedded cluster",
                     self._spark_ratio(spark, client)[0], None, up, x, spark_why)
              for name, spark, reference, client, cluster in _SPARK_PAIRS if cluster != "fork"),
        ]  # fmt: skip

    def targets_markdown(self) -> str:
        lines = ["| target | goal | this run | |", "|---|---:|---:|---|"]
        lines += [t.row() for t in self.targets()]
        return "\n".join(lines)

    # -- Spark ------------------------------------------------------------------------------

    def _spark_ratio(self, spark: str, client: str) -> tuple[float | None, float | None]:
        """Spark's rate over the client's (times 4 for the embedded one-partition ordered
        reference), and the same with Spark's fixed cost per query taken out of its time
        (reads on the fork only: None otherwise)."""
        v = self.value
        mine, theirs = v(spark, "nsq_ha"), v(client, "nsq_ha")
        if client == "spark-dev-ordered":
            theirs = _times(theirs, PARTITIONS)
        net = None
        fixed_rate = v("spark-fork-fixed", "nsq_ha")
        workload = self._workload(spark)
        if mine and fixed_rate and workload is not None and "read" in spark:
            rows = base_spec(self.bench.profile, workload, "nsq_ha")["n"]
            left = rows / mine - 1 / fixed_rate
            net = _ratio(rows / left, theirs) if left > 0 else None
        return _ratio(mine, theirs), net

    def _workload(self, workload_id: str) -> Workload | None:
        return next((w for w in self.bench.workloads() if w.id == workload_id), None)

    def spark_markdown(self) -> str:
        """Each Spark workload beside the client's own on the same cluster in the same run
        (medians, rows/s), a read beside Spark's floor (the same rows from memory, no NSQ),
        and PySpark's fixed cost per query."""
        lines = [
            "| cluster | Spark local[2] | rows/s | the client itself | msgs/s | ratio | "
            "ratio, fixed cost out | Spark's floor (no NSQ) | floor / client | Spark / floor |",
            "|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, spark, reference, client, cluster in _SPARK_PAIRS:
            workload = self._workload(spark)
            floor_id = _SPARK_FLOORS.get(spark, "")
            floor_workload = self._workload(floor_id)
            if workload is None and floor_workload is None:
                continue
            theirs = self.value(client, "nsq_ha")
            if client == "spark-dev-ordered":
                reference += f" (one partition x {PARTITIONS})"
                theirs = _times(theirs, PARTITIONS)
            ratio, net = self._spark_ratio(spark, client)
            mine = self._cell(workload, "nsq_ha", "rate") if workload else "-"
            floor_cells = "  |  |  |"
            if floor_workload is not None:
                floor = self.value(floor_id, "nsq_ha")
                over = _ratio(self.value(spark, "nsq_ha"), floor)
                floor_cells = (
                    f" {self._cell(floor_workload, 'nsq_ha', 'rate')} "
                    f"| {_x(_ratio(floor, theirs))} | {_x(over)} |"
                )
            lines.append(
                f"| {cluster} | {name} | {mine} | {reference} "
                f"| {_fmt(theirs, 'rate')} | {_x(ratio)} | {_x(net)} |{floor_cells}"
            )
        fixed = self.value("spark-fork-fixed", "nsq_ha")
        if fixed:
            lines += [
                "",
                "PySpark's fixed cost of one stream query on the fork (4 rows, availableNow, "
                f"after a warm-up one; median of the runs): {1 / fixed:.2f} s. The "
                "column 'ratio, fixed cost out' takes it out of the Spark read's time.",
            ]
        return "\n".join(lines)

    # -- whole report -----------------------------------------------------------------------

    def header(self) -> str:
        m = self.bench.machine
        versions = ", ".join(f"{k} {v}" for k, v in sorted(self.bench.versions.items()))
        missing = "; ".join(f"{k}: {v}" for k, v in sorted(self.bench.unavailable.items()))
        text = (
            f"Measured {m['date']} with `nsq-ha bench --{self.bench.profile.name}` "
            f"({self.bench.profile.rounds} interleaved rounds, medians; 100-byte messages) on "
            f"{m['cpus']} CPUs ({m['cpu'] or 'unknown CPU'}), Python {m['python']}, "
            f"{m['os']}; {versions}."
        )
        if missing:
            text += f" Not measured: {missing}."
        return text

    def render(self) -> str:
        notes = []
        for (wid, client), cell in sorted(self.bench.cells.items()):
            for note in cell.notes:
                notes.append(f"- `{wid}` {client}: {note}")
            for error in sorted(set(cell.errors)):
                notes.append(f"- `{wid}` {client} failed: {error}")
        parts = [
            self.header(),
            "",
            self.markdown(),
            "",
            "CPU seconds per 100k messages (the client process; Go: the tool's process):",
            "",
            self.cpu_markdown(),
            "",
            self.targets_markdown(),
        ]
        if any(w.id.startswith("spark-") for w in self.bench.workloads()):
            parts += ["", "Spark beside the client (same cluster, same run):", "",
                      self.spark_markdown()]  # fmt: skip
        if notes:
            parts += ["", "Notes (* in the table):", "", *notes]
        return "\n".join(parts) + "\n"

    def as_json(self) -> dict[str, Any]:
        return {
            "machine": self.bench.machine,
            "profile": asdict(self.bench.profile),
            "versions": self.bench.versions,
            "unavailable": self.bench.unavailable,
            "results": {
                f"{wid}/{client}": {
                    "median_rate": cell.median("rate"),
                    "median_cpu_per_100k": cell.median("cpu_per_100k"),
                    "median_rss_mb": cell.median("rss_mb"),
                    "median_p50_ms": cell.median("p50_ms"),
                    "median_p99_ms": cell.median("p99_ms"),
                    "samples": [asdict(s) for s in cell.samples],
                }
                for (wid, client), cell in sorted(self.bench.cells.items())
            },
            "targets": [{**asdict(t), "holds": t.holds} for t in self.targets()],
        }


def _x(ratio: float | None) -> str:
    return f"{ratio:.2f}x" if ratio is not None else ""


__all__ = ["Report", "Target"]
