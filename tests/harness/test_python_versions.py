"""`make test` on the extra interpreters: tools/find_python.sh and the Makefile's order.

The finder is run against fake interpreters (shell scripts answering as Python would) on a PATH
and under a PYENV_ROOT of the test's own, so every case is the same on any machine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FINDER = ROOT / "tools" / "find_python.sh"
MAKEFILE = ROOT / "Makefile"

#: a pyenv shim for a version that is not selected: on PATH, but it does not run Python
_SHIM = """#!/bin/sh
echo "pyenv: $(basename "$0"): command not found" >&2
exit 127
"""


def _fake_python(path: Path, version: str) -> Path:
    """An executable that answers the finder's question as Python ``version`` at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "{version} $0"\n', encoding="utf-8")
    path.chmod(0o755)
    return path


def _find(tmp_path: Path, version: str = "3.12") -> subprocess.CompletedProcess[str]:
    """Run the finder with only ``tmp_path/bin`` and the system's directories on PATH."""
    env = {
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "PYENV_ROOT": str(tmp_path / "pyenv"),
        "HOME": str(tmp_path),
    }
    return subprocess.run(
        ["bash", str(FINDER), version],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_a_working_interpreter_on_path_is_used(tmp_path: Path) -> None:
    python = _fake_python(tmp_path / "bin" / "python3.12", "3.12")
    _fake_python(tmp_path / "pyenv" / "versions" / "3.12.1" / "bin" / "python3.12", "3.12")
    found = _find(tmp_path)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(python)


def test_a_shim_that_does_not_run_falls_back_to_pyenvs_newest(tmp_path: Path) -> None:
    """A pyenv shim of an unselected version is on PATH but exits 127: pyenv's own is used."""
    shim = tmp_path / "bin" / "python3.12"
    shim.parent.mkdir(parents=True)
    shim.write_text(_SHIM, encoding="utf-8")
    shim.chmod(0o755)
    versions = tmp_path / "pyenv" / "versions"
    _fake_python(versions / "3.12.1" / "bin" / "python3.12", "3.12")
    newest = _fake_python(versions / "3.12.10" / "bin" / "python3.12", "3.12")
    _fake_python(versions / "3.13.0" / "bin" / "python3.13", "3.13")
    found = _find(tmp_path)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(newest)


def test_an_interpreter_of_another_version_is_not_taken(tmp_path: Path) -> None:
    _fake_python(tmp_path / "bin" / "python3.12", "3.11")
    pyenvs = _fake_python(tmp_path / "pyenv" / "versions" / "3.12.1" / "bin" / "python3.12", "3.12")
    found = _find(tmp_path)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(pyenvs)


def test_no_interpreter_fails_saying_what_was_tried_and_what_to_do(tmp_path: Path) -> None:
    shim = tmp_path / "bin" / "python3.13"
    shim.parent.mkdir(parents=True)
    shim.write_text(_SHIM, encoding="utf-8")
    shim.chmod(0o755)
    found = _find(tmp_path, "3.13")
    assert found.returncode == 1
    assert found.stdout == ""
    assert "no working Python 3.13" in found.stderr
    assert f"{shim} (pyenv: python3.13: command not found)" in found.stderr
    assert f"{tmp_path / 'pyenv'}/versions/3.13*/bin/python3.13 (none)" in found.stderr
    assert "pyenv install 3.13" in found.stderr


@pytest.mark.parametrize("version", ["", "3", "python3.12", "3.12.1"])
def test_a_version_that_is_not_x_y_is_a_usage_error(tmp_path: Path, version: str) -> None:
    found = _find(tmp_path, version)
    assert found.returncode == 2
    assert "usage" in found.stderr


def _make(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


@needs_make
def test_make_pythons_fails_at_once_for_a_missing_interpreter() -> None:
    done = _make("pythons", "PYTHON_VERSIONS=3.12 3.99")
    assert done.returncode != 0
    assert "Python 3.12: " in done.stdout
    assert "no working Python 3.99" in done.stderr


@needs_make
def test_make_test_checks_the_interpreters_first_and_runs_them_after_the_whole_suite() -> None:
    """The dry run's order: the finder, the 3.11 suite, then a run per extra interpreter."""
    plan = _make("-n", "test").stdout.splitlines()
    finder = next(i for i, line in enumerate(plan) if "tools/find_python.sh" in line)
    suite = next(i for i, line in enumerate(plan) if "-m pytest --durations" in line)
    extra = [
        (i, line) for i, line in enumerate(plan) if "pytest tests/unit tests/integration" in line
    ]
    assert finder < suite, plan
    assert [line.split("/bin/python")[0].split()[-1] for _, line in extra] == [
        ".venv-3.12",
        ".venv-3.13",
    ]
    assert all(i > suite for i, _ in extra), plan
    assert all("NSQ_HA_EMBEDDED_ONLY=1" in line for _, line in extra), extra


def test_the_classifiers_name_each_interpreter_make_test_runs() -> None:
    """3.11 (the whole suite) and every PYTHON_VERSIONS run, and no other minor version."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    prefix = "Programming Language :: Python :: 3."
    named = {
        "3." + c.removeprefix(prefix)
        for c in project["classifiers"]
        if c.startswith(prefix) and c.removeprefix(prefix).isdigit()
    }
    made = re.search(r"^PYTHON_VERSIONS\s*:=\s*(.*)$", MAKEFILE.read_text(), re.M)
    assert made, "the Makefile sets no PYTHON_VERSIONS"
    assert named == {"3.11", *made.group(1).split()}
    assert project["requires-python"] == ">=3.11"
