"""A missing extra is named: the embedded broker without ``h11`` (the ``devcluster`` extra).

``h11`` is made unimportable in a fresh interpreter (``sys.modules['h11'] = None``, which is what
Python does for a module it must not import), as in an install of the client alone.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WITHOUT_H11 = "import sys; sys.modules['h11'] = None\n"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_H11 + code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_importing_the_embedded_broker_without_its_extra_names_the_extra() -> None:
    out = _run(
        "try:\n"
        "    import nsq_ha.devcluster\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc.name, exc, sep='|')\n"
    )
    assert out.returncode == 0, out.stderr
    name, message = out.stdout.strip().split("|")
    assert name == "h11"
    assert "pip install 'nsq-ha[devcluster]'" in message


def test_the_client_and_its_pytest_plugin_work_without_the_extra() -> None:
    out = _run(
        "import nsq_ha, nsq_ha.producer, nsq_ha.consumer, nsq_ha.sync, nsq_ha.testing.plugin\n"
        "print(nsq_ha.Producer.__name__)\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Producer"


@pytest.mark.parametrize("command", ["devcluster", "demo"])
def test_a_command_that_needs_the_extra_says_which_in_one_line(command: str) -> None:
    out = _run(f"from nsq_ha.cli import main\nsys.exit(main([{command!r}]))\n")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"nsq-ha {command}: ")
    assert "pip install 'nsq-ha[devcluster]'" in lines[0]
    assert "internal error" not in lines[0]
