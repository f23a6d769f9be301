"""``docker/build-fork.sh`` (what the Docker image runs) builds the fork from the pinned source
archive, outside Docker, with the machine's Go: the same script, inputs and checks as the
image's build stage, minus the container (no Docker engine runs on the project's machines).

The image also builds nsqadmin (``FORK_OPTIONAL_PROGRAMS``) when the source has it. The pinned
archive has only what nsqd and nsqlookupd need, so with it the script must skip nsqadmin, say
why, and still build both servers. ``NSQ_HA_FORK_FULL_ARCHIVE`` names a ``.tar.gz`` of the whole
tree at the pinned commit (e.g. ``git archive`` of a clone), from which nsqadmin must build."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
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


def _build(tmp_path: Path, archive: Path, sha256: str) -> subprocess.CompletedProcess[str]:
    """build-fork.sh with the image's settings (its optional nsqadmin included) into tmp/out."""
    env = {
        **os.environ,
        "FORK_VERSION": FORK.version,
        "FORK_ARCHIVE": str(archive),
        "FORK_ARCHIVE_SHA256": sha256,
        "FORK_EXPECTED_VERSION": FORK.expected_version,
        "EXTRA_REQUIRES": " ".join(f"{mod}@{ver}" for mod, ver in FORK.extra_requires),
        "FORK_OPTIONAL_PROGRAMS": "apps/nsqadmin",
    }
    return subprocess.run(
        ["/bin/sh", str(SCRIPT), "out"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _version(binary: Path) -> str:
    out = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    return out.stdout + out.stderr


def _has_nsqadmin_package(archive: Path) -> bool:
    with tarfile.open(archive) as tar:
        return any(name.split("/")[1:2] == ["nsqadmin"] for name in tar.getnames())


def test_build_fork_sh_builds_both_servers_from_the_archive(tmp_path: Path) -> None:
    archive = _archive()
    assert FORK.archive is not None
    proc = _build(tmp_path, archive, FORK.archive.sha256)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"source: {archive} (sha256 {FORK.archive.sha256})" in proc.stderr
    for prog in ("nsqd", "nsqlookupd"):
        assert FORK.expected_version in _version(tmp_path / "out" / prog)
    if _has_nsqadmin_package(archive):
        assert FORK.expected_version in _version(tmp_path / "out" / "nsqadmin")
    else:  # the pinned, trimmed archive
        assert "skipping optional apps/nsqadmin: the source lacks what it imports" in proc.stderr
        assert not (tmp_path / "out" / "nsqadmin").exists()


def test_build_fork_sh_builds_nsqadmin_from_the_full_tree(tmp_path: Path) -> None:
    full = os.environ.get("NSQ_HA_FORK_FULL_ARCHIVE")
    if not full:
        pytest.skip(
            "NSQ_HA_FORK_FULL_ARCHIVE is not set (a .tar.gz of github.com/youzan/nsq's whole tree "
            f"at {FORK.archive.commit if FORK.archive else 'the pinned commit'})"
        )
    if shutil.which("go") is None:
        pytest.skip("needs Go")
    archive = Path(full)
    sha256 = hashlib.sha256(archive.read_bytes()).hexdigest()
    proc = _build(tmp_path, archive, sha256)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for prog in ("nsqd", "nsqlookupd", "nsqadmin"):
        assert FORK.expected_version in _version(tmp_path / "out" / prog), prog
