"""The installed ``nsq-ha`` console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nsq_ha


def test_console_script_reports_its_version() -> None:
    exe = Path(sys.executable).with_name("nsq-ha")  # installed next to the venv's python
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"nsq-ha {nsq_ha.__version__}"


def test_without_a_command_it_shows_help_and_fails() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nsq_ha"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 2
    assert "servers" in out.stderr


def test_servers_rejects_unknown_recipes() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nsq_ha", "servers", "kafka"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2
    assert "unknown recipe(s) ['kafka']" in out.stderr
