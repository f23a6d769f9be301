"""The Go reference tools of nsqio/nsq v1.3.0, ``bench_writer`` and ``bench_reader``, as one
more client of a workload (the ``go`` column), against the vanilla nsqd.

:func:`parse_go` reads their one result line; :class:`GoTools` runs them for a workload.
"""

from __future__ import annotations

import re
import resource
import subprocess
from typing import Any

from nsq_ha.bench.results import BenchError
from nsq_ha.bench.stage import Stage
from nsq_ha.bench.workloads import Workload

__all__ = ["GoTools", "go_duration", "parse_go"]


def go_duration(text: str) -> float:
    """Seconds of a Go ``time.Duration`` string (``1m2.5s``, ``750ms``)."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9}
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)(h|ms|m|s|µs|us|ns)", text):
        total += float(number) * units[unit]
    return total


def parse_go(output: str) -> dict[str, Any]:
    """``{"count", "seconds"}`` from a Go tool's output, or :class:`BenchError`."""
    match = re.search(r"duration: (\S+) - \S+mb/s - ([\d.]+)ops/s", output)
    if match is None:
        raise BenchError(f"no figures in the Go tool's output: {output.strip()[-300:]}")
    rate = float(match.group(2))
    seconds = go_duration(match.group(1))
    return {"count": round(rate * seconds), "seconds": seconds}


class GoTools:
    """Runs the Go tools built with vanilla nsqd, each for ``seconds`` (``--runfor``)."""

    def __init__(self, stage: Stage, seconds: float) -> None:
        self.stage = stage
        self.seconds = seconds

    def __repr__(self) -> str:
        return f"<GoTools {self.stage.vanilla_bin.bin_dir} runfor={self.seconds}s>"

    def run(self, workload: Workload, spec: dict[str, Any]) -> dict[str, Any]:
        """The result of ``workload.go`` (``writer:<batch>`` or ``reader``) on the spec's topic."""
        kind, _, batch = (workload.go or "").partition(":")
        runfor = f"{self.seconds}s"
        common = [f"--nsqd-tcp-address={spec['nsqd']}", f"--topic={spec['topic']}", "--size=100"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        if kind == "writer":
            out = self._go("bench_writer", [*common, f"--batch-size={batch}", f"--runfor={runfor}"])
            result = parse_go(out)
        else:
            # fill for twice the read time at the writer's speed, read, check it did not run dry
            filled = self._go(
                "bench_writer", [*common, "--batch-size=200", f"--runfor={2 * self.seconds}s"]
            )
            self.stage.post(
                f"{self.stage.vanilla_http}/channel/create",
                {"topic": spec["topic"], "channel": "ch"},
            )
            out = self._go(
                "bench_reader", [*common, "--channel=ch", "--rdy=2500", f"--runfor={runfor}"]
            )
            result = parse_go(out)
            if self.stage.vanilla_depth(spec["topic"], "ch") == 0:
                result["note"] = "ran dry (a lower bound)"
            result["filled"] = parse_go(filled)["count"]
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if kind == "writer":
            result["cpu"] = cpu
        return result

    def _go(self, program: str, args: list[str]) -> str:
        argv = [str(self.stage.vanilla_bin.path(program)), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            raise BenchError(f"{program} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        return proc.stderr + proc.stdout
