"""Every block of README.md and of the docs' pages runs as written, in order, as a new user would.

The order is the README's, then each page of the docs' guide in the order of its table of
contents (``docs/index.md``'s toctrees; a page that only includes a file from elsewhere, such as
``docs/ARCHITECTURE.md``, has no blocks of its own).

The Quickstart's first block runs in a copy of this checkout's tracked files: it makes a fresh
``.venv`` there (``pip install -e '.[cli]'``), activates it and starts ``nsq-ha devcluster`` in
the foreground, the "first terminal". It stays up for the whole module and gets Ctrl-C (SIGINT)
at the end, when it must say ``stopped`` and exit 0. Every later block is the "second terminal":

* a shell block runs in ``bash -e -o pipefail`` in that copy, with the copy's ``.venv/bin`` first
  on ``PATH`` (what ``. .venv/bin/activate`` did in the Quickstart);
* a Python block runs as a script with this interpreter (the suite's environment, which has the
  ``spark`` and ``otel`` extras the Spark example needs), each in its own process, like a user
  saving it to a file; it must exit 0 and print what it says it prints;
* a block that runs until Ctrl-C (its last line ends in ``# until Ctrl-C``) is started, must
  print its ready line, and must exit 0 on SIGINT.

The examples talk to ``http://127.0.0.1:4161``, where ``nsq-ha devcluster`` listens by default.
If another program holds 4161 on this machine, the cluster takes a free port and prints its own
``export`` line (as the Quickstart tells the user); the blocks then get that address instead.

Blocks that are not run say why in :data:`NOT_RUN`; a block with neither a rule nor a reason
fails :func:`test_every_block_is_run_or_says_why_not`, so a new block cannot be skipped silently.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DEFAULT_LOOKUPD = "http://127.0.0.1:4161"
UNTIL_CTRL_C = "# until Ctrl-C"

#: blocks the test does not run, and why
NOT_RUN = {
    "two_commands_sh1": "make test is the suite this test belongs to; make demo installs what the "
    "Quickstart's first block installs and runs `nsq-ha demo`, which the command line's block "
    "runs as written",
    "run_the_tests_sh1": "make test is the suite this test belongs to",
    "operating_against_a_real_cluster_sh1": "needs a Docker engine, which this project's machines "
    "do not have (the page says so); tests/unit/test_docker_files.py checks the compose files",
    "development_run_the_tests_sh1": "make test is the suite this test belongs to",
    "development_the_compiled_build_sh1": "builds the compiled modules into the test's own "
    "virtualenv (minutes, a C compiler) under the pure run's NSQ_HA_PURE=1; make test's 3.12 run "
    "builds them and tests them live (tests/unit/test_compiled.py), and "
    "tests/harness/test_compiled_build.py checks the message without a C compiler",
    "spark_on_a_spark_cluster_sh1": "needs a Spark standalone cluster at spark-master:7077 and "
    "an install from PyPI; tests/integration/test_spark_standalone.py runs a stream read and a "
    "keyed write through spark:// on a master and two workers it starts",
}


@dataclass(frozen=True)
class Block:
    name: str  # page, section, kind and position: quickstart_sh1, producing_top_py1
    kind: str  # "sh" or "py"
    code: str

    @property
    def until_ctrl_c(self) -> bool:
        return self.kind == "sh" and self.code.rstrip().endswith(UNTIL_CTRL_C)


def doc_pages() -> list[Path]:
    """The guide's Markdown pages, in the order of docs/index.md's tables of contents."""
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    pages = []
    for toctree in re.findall(r"(?ms)^```\{toctree\}\n(.*?)^```", index):
        for entry in toctree.splitlines():
            page = DOCS / f"{entry.strip()}.md"
            if (
                entry.strip()
                and not entry.startswith(":")
                and page.is_file()
                and not page.read_text(encoding="utf-8").startswith("```{include}")
            ):
                pages.append(page)
    return pages


def markdown_blocks(path: Path, prefix: str = "") -> list[Block]:
    """Every ```sh and ```python block of a Markdown file, in order (``` {directive} aside)."""
    blocks: list[Block] = []
    section = "top"
    counts: dict[str, int] = {}
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = re.sub(r"[^a-z0-9]+", "_", line[3:].lower()).strip("_")
        fence = line.strip()
        if fence.startswith("```") and fence != "```":
            end = lines.index("```", i + 1)
            if not fence.startswith("```{"):  # a MyST directive (include, toctree, argparse)
                kind = {"```sh": "sh", "```python": "py"}.get(fence)
                assert kind is not None, f"{path.name} line {i + 1}: a {fence} block not run"
                key = f"{prefix}{section}_{kind}"
                counts[key] = counts.get(key, 0) + 1
                blocks.append(Block(f"{key}{counts[key]}", kind, "\n".join(lines[i + 1 : end])))
            i = end
        i += 1
    return blocks


def all_blocks() -> list[Block]:
    """The README's blocks, then each page's, named ``<page>_<section>_<kind><n>``."""
    blocks = markdown_blocks(README)
    for page in doc_pages():
        blocks += markdown_blocks(page, prefix=f"{page.stem}_")
    return blocks


BLOCKS = all_blocks()
QUICKSTART, *REST = [block for block in BLOCKS if block.name not in NOT_RUN]


def test_every_guide_page_is_read() -> None:
    """A new page of the guide is read by this module as soon as docs/index.md lists it."""
    pages = {page.name for page in doc_pages()}
    written = {
        page.name
        for page in DOCS.glob("*.md")
        if page.name != "index.md"
        and not page.read_text(encoding="utf-8").startswith("```{include}")
    }
    assert pages == written, f"pages not in docs/index.md's toctrees: {written - pages}"


def test_every_block_is_run_or_says_why_not() -> None:
    """The blocks as this module expects them: extraction cannot silently drop one."""
    names = [block.name for block in BLOCKS]
    assert QUICKSTART.name == "quickstart_sh1"
    assert QUICKSTART.until_ctrl_c
    assert set(NOT_RUN) <= set(names), set(NOT_RUN) - set(names)
    assert names == [
        "two_commands_sh1",
        "quickstart_sh1",
        "quickstart_sh2",
        "in_python_py1",
        "run_the_tests_sh1",
        "producing_top_py1",
        "producing_ext_headers_py1",
        "consuming_top_py1",
        "consuming_blocking_code_py1",
        "cli_top_sh1",
        "spark_top_py1",
        "spark_on_a_spark_cluster_sh1",
        "opentelemetry_an_example_py1",
        "testing_the_embedded_cluster_sh1",
        "testing_the_embedded_cluster_py1",
        "operating_administration_py1",
        "operating_adding_partitions_sh1",
        "operating_against_a_real_cluster_sh1",
        "development_run_the_tests_sh1",
        "development_the_compiled_build_sh1",
    ]


@dataclass
class Terminal:
    """The Quickstart's state: the copy of the checkout, its venv and the cluster's address."""

    copy: Path
    lookupd: str
    env: dict[str, str]

    def as_written(self, code: str) -> str:
        """The block, with the cluster's address if 4161 was taken (see the module docstring)."""
        return (
            code if self.lookupd == DEFAULT_LOOKUPD else code.replace(DEFAULT_LOOKUPD, self.lookupd)
        )


def _copy_of_the_checkout(dest: Path) -> Path:
    """The tracked files as they are in the work tree (a fresh clone of this state)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout, so no fresh copy can be made: {listed.stderr!r}")
    for name in listed.stdout.decode().split("\0"):
        source = ROOT / name
        if name and source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


def _start_until_ready(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> tuple[subprocess.Popen[str], list[str]]:
    """Start a long-running block; its stdout up to the ``ready in`` line."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # Ctrl-C goes to its process group, as a terminal sends it
    )
    assert proc.stdout is not None
    lines: list[str] = []
    killer = _Deadline(proc, timeout)
    try:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("ready in"):
                return proc, lines
    finally:
        killer.cancel()
    _out, err = proc.communicate(timeout=10)
    raise AssertionError(f"{argv!r} ended before it was ready:\n" + "\n".join(lines) + err)


class _Deadline:
    """Kill a process group that has not become ready in time (a read of its stdout blocks)."""

    def __init__(self, proc: subprocess.Popen[str], timeout: float) -> None:
        import threading

        self._timer = threading.Timer(timeout, self._kill, args=(proc,))
        self._timer.daemon = True
        self._timer.start()

    @staticmethod
    def _kill(proc: subprocess.Popen[str]) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)

    def cancel(self) -> None:
        self._timer.cancel()


def _ctrl_c(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    """Send SIGINT to the block's process group; its exit status and output."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def terminal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Terminal]:
    """The Quickstart's first block, run as written in a fresh copy; Ctrl-C at the end."""
    copy = _copy_of_the_checkout(tmp_path_factory.mktemp("fresh-clone"))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "NSQ_HA_LOOKUPD")}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if Path(p) != Path(sys.executable).parent
    )
    proc, lines = _start_until_ready(
        ["bash", "-e", "-o", "pipefail", "-c", QUICKSTART.code], copy, env, timeout=600
    )
    try:
        exports = [
            line.split("=", 1)[1] for line in lines if line.startswith("export NSQ_HA_LOOKUPD=")
        ]
        assert exports, f"the cluster printed no export line:\n{lines}"
        venv_bin = copy / ".venv" / "bin"
        assert (venv_bin / "nsq-ha").exists(), "the Quickstart's install made no nsq-ha"
        env = {
            **env,
            "PATH": f"{venv_bin}{os.pathsep}{env['PATH']}",
            "VIRTUAL_ENV": str(copy / ".venv"),
        }
        yield Terminal(copy, exports[0], env)
    finally:
        status, out, err = _ctrl_c(proc)
    assert status == 0, f"the Quickstart's cluster did not end cleanly on Ctrl-C:\n{out}\n{err}"
    assert out.rstrip().endswith("stopped"), out


def _skip_before_replayable_stream() -> None:
    """The README's Spark example streams the fork's topic with the replayable source."""
    from nsq_ha.spark.compat import REPLAYABLE_STREAM_READ, pyspark_version, supports

    if not supports(REPLAYABLE_STREAM_READ):
        pytest.skip(
            f"PySpark {pyspark_version()}: the example's replayable streaming read needs 4.2+ "
            "(test_spark_versions.py checks the refusal)"
        )


@pytest.mark.parametrize(
    "block",
    [
        pytest.param(block, marks=pytest.mark.spark if block.name.startswith("spark") else ())
        for block in REST
    ],
    ids=[block.name for block in REST],
)
def test_readme_block_runs_as_written(terminal: Terminal, block: Block) -> None:
    code = terminal.as_written(block.code)
    if block.kind == "py":
        assert DEFAULT_LOOKUPD in block.code or "DevCluster(" in code, f"{block.name}: no cluster"
        if block.name.startswith("spark"):
            pytest.importorskip(
                "pyspark", reason="pyspark is not installed: pip install -e '.[spark]'"
            )
            _skip_before_replayable_stream()
        if block.name.startswith("opentelemetry"):
            pytest.importorskip(
                "opentelemetry.sdk", reason="the SDK is not installed: pip install -e '.[otel]'"
            )
        argv = [sys.executable, "-c", code]
        env = {k: v for k, v in os.environ.items() if k != "NSQ_HA_LOOKUPD"}
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", code]
        env = terminal.env
    if block.until_ctrl_c:
        proc, lines = _start_until_ready(argv, terminal.copy, env, timeout=60)
        status, out, err = _ctrl_c(proc)
        assert status == 0, f"{block.name} did not end cleanly on Ctrl-C:\n{lines}\n{out}\n{err}"
        assert out.rstrip().endswith("stopped"), out
        return
    proc = subprocess.run(
        argv, cwd=terminal.copy, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, f"{block.name} failed:\n{proc.stdout}\n{proc.stderr}"
    if block.kind == "sh" or "print(" in code:
        assert proc.stdout.strip(), f"{block.name} printed nothing"
    assert "Traceback" not in proc.stderr, proc.stderr
