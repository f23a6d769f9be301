"""What every benchmark driver measures, with the standard library only.

The peer drivers (:mod:`nsq_ha.bench.peers`) run in the peers' own virtualenv, where nsq_ha is
not installed; they load this file as a top-level module, so it must not import nsq_ha.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from typing import Any

#: the first bytes of a latency probe's body: ``perf_counter_ns()`` at publish, zero-padded
STAMP_DIGITS = 20


def cpu_seconds() -> float:
    """User + system CPU of this process (every thread) so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_mb() -> float:
    """Resident set size now, in MiB (``VmRSS``; 0.0 where /proc is missing)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def body(size: int) -> bytes:
    """A benchmark body of ``size`` bytes."""
    return b"x" * size


def stamped_body(size: int) -> bytes:
    """A body that starts with the publish time (``perf_counter_ns``), padded to ``size``."""
    return f"{time.perf_counter_ns():0{STAMP_DIGITS}d}".encode().ljust(size, b"x")


def latency_ns(data: bytes) -> int:
    """How long ago the stamped body ``data`` was published (same host, monotonic clock)."""
    return time.perf_counter_ns() - int(data[:STAMP_DIGITS])


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))
    return ordered[rank]


class Span:
    """Wall clock and CPU between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self.wall0 = 0.0
        self.cpu0 = 0.0

    def start(self) -> None:
        self.wall0 = time.perf_counter()
        self.cpu0 = cpu_seconds()

    def stop(self, count: int, **extra: Any) -> dict[str, Any]:
        seconds = time.perf_counter() - self.wall0
        return {
            "count": count,
            "seconds": seconds,
            "cpu": cpu_seconds() - self.cpu0,
            "rss_mb": rss_mb(),
            **extra,
        }


def latency_summary(samples_ns: list[int], warmup: float = 0.1) -> dict[str, float]:
    """p50/p99/max in ms of ``samples_ns``, leaving out the first ``warmup`` fraction."""
    kept = [s / 1e6 for s in samples_ns[int(len(samples_ns) * warmup) :]]
    return {
        "p50_ms": percentile(kept, 0.50),
        "p99_ms": percentile(kept, 0.99),
        "max_ms": max(kept, default=0.0),
    }


def read_spec() -> dict[str, Any]:
    """The workload spec: the JSON object in ``argv[1]``."""
    spec: dict[str, Any] = json.loads(sys.argv[1])
    return spec


def emit(result: dict[str, Any]) -> None:
    """Hand the result to the runner: one JSON line on stdout, tagged so logs cannot mix in."""
    sys.stdout.write("NSQ_HA_BENCH_RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()
