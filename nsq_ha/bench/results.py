"""What runs yield: one :class:`Sample` per run, a :class:`Cell` of samples per (workload,
client), :class:`BenchError` for a run that could not be set up or measured, and the
:func:`machine` the figures were taken on.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nsq_ha._version import __version__
from nsq_ha.bench.workloads import LATENCY_RATE

__all__ = ["BenchError", "Cell", "Sample", "machine"]


class BenchError(RuntimeError):
    """A run that could not be set up or measured."""


@dataclass
class Sample:
    """One client's run of one workload in one round."""

    rate: float | None = None  # messages per second
    cpu_per_100k: float | None = None
    rss_mb: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    error: str | None = None
    note: str | None = None

    @classmethod
    def from_result(cls, result: dict[str, Any], kind: str) -> Sample:
        """The figures of a driver's (or a Go tool's) result line for a ``kind`` workload."""
        count, seconds = result.get("count", 0), result.get("seconds", 0.0)
        sample = cls()
        if count and seconds > 0 and kind != "hold":
            sample.rate = count / seconds
        if count and "cpu" in result and kind not in ("hold", "latency"):
            sample.cpu_per_100k = result["cpu"] / count * 100_000
        if kind == "hold":
            sample.rss_mb = result.get("rss_mb")
        if kind == "latency":
            sample.p50_ms, sample.p99_ms = result.get("p50_ms"), result.get("p99_ms")
            notes = []
            if result.get("errors"):
                notes.append(f"{result['errors']} publish errors")
            if sample.rate is not None and sample.rate < 0.8 * LATENCY_RATE:
                # a client that cannot keep the pace is measured at a lighter load: say so
                notes.append(
                    f"kept only {sample.rate / 1000:.1f}k of {LATENCY_RATE // 1000}k msgs/s"
                )
            sample.note = "; ".join(notes) or None
        return sample

    def describe(self) -> str:
        """One line for the progress log."""
        if self.error:
            return f"ERROR {self.error}"
        parts = []
        if self.rate is not None:
            parts.append(f"{self.rate:,.0f} msgs/s")
        if self.p99_ms is not None:
            parts.append(f"p50 {self.p50_ms:.2f} ms p99 {self.p99_ms:.2f} ms")
        if self.rss_mb is not None:
            parts.append(f"RSS {self.rss_mb:.1f} MiB")
        if self.note:
            parts.append(f"({self.note})")
        return " ".join(parts)


@dataclass
class Cell:
    """Everything one (workload, client) pair measured, over the rounds."""

    samples: list[Sample] = field(default_factory=list)

    def median(self, name: str) -> float | None:
        values = [getattr(s, name) for s in self.samples if getattr(s, name) is not None]
        return statistics.median(values) if values else None

    @property
    def errors(self) -> list[str]:
        return [s.error for s in self.samples if s.error]

    @property
    def notes(self) -> list[str]:
        return sorted({s.note for s in self.samples if s.note})


def machine() -> dict[str, str]:
    """What the figures were measured on."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "date": dt.date.today().isoformat(),
        "cpus": str(os.cpu_count()),
        "cpu": model,
        "python": platform.python_version(),
        "os": platform.platform(terse=True),
        "nsq_ha": __version__,
    }
