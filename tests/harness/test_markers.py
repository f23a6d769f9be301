"""The ``fork`` and ``vanilla`` markers: ``-m "not fork and not vanilla"`` runs no real server.

``make test`` runs the suite on the extra interpreters (3.12, 3.13) with that expression, so a
test that starts or uses a real server through a fixture must carry that server's marker even
when its author did not write one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: a plugin for the child pytest: after deselection, every test still selected that uses a
#: real server's fixture (directly or through other fixtures)
_REPORTER = textwrap.dedent(
    """
    REAL = {"fork_binaries", "vanilla_binaries"}

    def pytest_collection_finish(session):
        for item in session.items:
            used = sorted(REAL & set(getattr(item, "fixturenames", ())))
            if used:
                print("USES-REAL-SERVER", item.nodeid, used)
        print("SELECTED", len(session.items))
    """
)


def test_embedded_only_selection_uses_no_real_server_fixture(tmp_path: Path) -> None:
    """Under ``-m "not fork and not vanilla"`` no selected test needs a real server's fixture."""
    (tmp_path / "real_server_reporter.py").write_text(_REPORTER, encoding="utf-8")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "real_server_reporter",
            "-m",
            "not fork and not vanilla",
            "tests",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    leaks = [line for line in proc.stdout.splitlines() if line.startswith("USES-REAL-SERVER")]
    assert leaks == [], "\n".join(leaks)
    selected = [line for line in proc.stdout.splitlines() if line.startswith("SELECTED")]
    assert selected, proc.stdout[-3000:]
    assert int(selected[0].split()[1]) > 0, selected
    # the devcluster half of a backend-parametrized test stays selected
    assert "[devcluster" in proc.stdout


#: tests that reach the real fork only through a parameter resolved at run time
_DYNAMIC = textwrap.dedent(
    """
    import pytest

    @pytest.fixture(params=["fork"])
    def server(request):
        return request.getfixturevalue("fork_binaries")

    def test_uses_the_fork(server):
        assert server

    def test_uses_the_fork_again(server):
        assert server
    """
)


def test_embedded_only_run_skips_a_real_server_the_markers_could_not_see(tmp_path: Path) -> None:
    """With ``NSQ_HA_EMBEDDED_ONLY=1`` a real server requested at run time skips, saying why.

    Twice: the second test gets the session fixture's cached skip.
    """
    # laid out as here: the rootdir above tests/ (a session fixture's hooks are the rootdir's)
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    (tmp_path / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "test_dynamic.py").write_text(_DYNAMIC, encoding="utf-8")
    env = {**os.environ, "NSQ_HA_EMBEDDED_ONLY": "1", "NSQ_HA_REQUIRE_SERVERS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "-q", "tests"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 skipped" in proc.stdout, proc.stdout[-3000:]
    assert "NSQ_HA_EMBEDDED_ONLY" in proc.stdout, proc.stdout[-3000:]
    assert "pytest.mark.fork" in proc.stdout, proc.stdout[-3000:]
