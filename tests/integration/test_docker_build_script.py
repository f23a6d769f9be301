"""``docker/build-fork.sh`` (what the Docker image runs) builds the fork from the pinned source
archive, outside Docker, with the machine's Go: the same script, inputs and checks as the
image's build stage, minus the container (no Docker engine runs on the project's machines)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from nsq_ha.testing.build import FORK, BuildError, resolve_source
from nsq_ha.testing.plugin import unavailable

SCRIPT = Path(__file__).resolve().parents[2] / "docker" / "build-fork.sh"

pytestmark = pytest.mark.fork


def _archive() -> Path:
    """The fork's pinned source archive on this machine (or skip/fail as the plugin does)."""
    try:
        source = resolve_source(FORK)
    except BuildError as exc:
        unavailable("fork", str(exc))
    if source.kind not in ("pinned_archive", "archive") or shutil.which("go") is None:
        unavailable("fork", f"needs the fork's source archive and Go; have {source.describe()}")
    return Path(source.location)


def test_build_fork_sh_builds_both_servers_from_the_archive(tmp_path: Path) -> None:
    archive = _archive()
    assert FORK.archive is not None
    env = {
        **os.environ,
        "FORK_VERSION": FORK.version,
        "FORK_ARCHIVE": str(archive),
        "FORK_ARCHIVE_SHA256": FORK.archive.sha256,
        "FORK_EXPECTED_VERSION": FORK.expected_version,
        "EXTRA_REQUIRES": " ".join(f"{mod}@{ver}" for mod, ver in FORK.extra_requires),
    }
    proc = subprocess.run(
        ["/bin/sh", str(SCRIPT), "out"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"source: {archive} (sha256 {FORK.archive.sha256})" in proc.stderr
    for prog in ("nsqd", "nsqlookupd"):
        out = subprocess.run(
            [str(tmp_path / "out" / prog), "--version"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert FORK.expected_version in out.stdout + out.stderr
