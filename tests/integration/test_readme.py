"""Every ```python example in README.md runs, as a script, against the embedded cluster.

The examples talk to ``http://127.0.0.1:4161`` (nsqlookupd's usual address); the test points
that at a fresh embedded cluster where ``orders`` (ordered, 4 partitions) and ``events`` (plain,
2 partitions) exist, as the examples assume. Each block runs in its own interpreter, like a user
pasting it into a file, and must exit 0 within its timeout and print what it says it prints.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nsq_ha.devcluster import DevClusterThread

README = Path(__file__).resolve().parents[2] / "README.md"
DEFAULT_LOOKUPD = "http://127.0.0.1:4161"


def python_blocks() -> list[tuple[str, str]]:
    """(id, code) of each ```python block, the id naming its section and position."""
    blocks: list[tuple[str, str]] = []
    section = "top"
    counts: dict[str, int] = {}
    lines = README.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = re.sub(r"[^a-z0-9]+", "_", line[3:].lower()).strip("_")
        if line.strip() == "```python":
            end = lines.index("```", i + 1)
            counts[section] = counts.get(section, 0) + 1
            blocks.append((f"{section}_{counts[section]}", "\n".join(lines[i + 1 : end])))
            i = end
        i += 1
    return blocks


BLOCKS = python_blocks()


def test_the_readme_has_the_examples_this_module_expects() -> None:
    """If extraction broke, the parametrized test below would silently run nothing."""
    assert [name for name, _ in BLOCKS] == [
        "publishing_1",
        "consuming_1",
        "blocking_code_1",
        "administration_1",
        "spark_1",
        "the_embedded_cluster_1",
    ]


@pytest.fixture(scope="module")
def lookupd() -> Iterator[str]:
    with DevClusterThread(nodes=3) as cluster:
        cluster.create_topic("orders", 4, 2, ordered=True)
        cluster.create_topic("events", 2, 1)
        yield cluster.lookupd_http


def _skip_before_replayable_stream() -> None:
    """The README's Spark example streams the fork's topic with the replayable source."""
    from nsq_ha.spark.compat import REPLAYABLE_STREAM_READ, pyspark_version, supports

    if not supports(REPLAYABLE_STREAM_READ):
        pytest.skip(
            f"PySpark {pyspark_version()}: the example's replayable streaming read needs 4.2+ "
            "(test_spark_versions.py checks the refusal)"
        )


@pytest.mark.parametrize(
    ("name", "code"),
    [
        pytest.param(name, code, marks=pytest.mark.spark if name.startswith("spark") else ())
        for name, code in BLOCKS
    ],
    ids=[name for name, _ in BLOCKS],
)
def test_readme_example_runs(lookupd: str, name: str, code: str) -> None:
    assert DEFAULT_LOOKUPD in code or "DevCluster(" in code, f"{name} talks to no cluster"
    if name.startswith("spark"):
        pytest.importorskip("pyspark", reason="pyspark is not installed: pip install -e '.[spark]'")
        _skip_before_replayable_stream()
    script = code.replace(DEFAULT_LOOKUPD, lookupd)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    if "print(" in code:
        assert proc.stdout.strip(), f"{name} printed nothing"
    assert "Traceback" not in proc.stderr, proc.stderr
