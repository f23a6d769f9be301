"""tools/build_compiled.py: without a C compiler it says so in one line (make demo's fallback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "build_compiled.py"


def probe(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--probe"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"CC": "/bin/false"}, "no working C compiler (/bin/false: exit status 1)"),
        ({"CC": "nsq-ha-no-such-cc"}, "no C compiler (nsq-ha-no-such-cc not found)"),
    ],
)
def test_without_a_c_compiler_the_probe_says_so_in_one_line(env: dict[str, str], said: str) -> None:
    result = probe(**env)
    assert result.returncode == 1
    assert result.stdout == f"nsq_ha: pure Python (the compiled build is optional: {said})\n"


def test_a_working_compiler_passes_the_probe_silently() -> None:
    cc = os.environ.get("CC", "cc")
    if subprocess.run(["sh", "-c", f"command -v {cc}"], capture_output=True).returncode != 0:
        pytest.skip(f"no {cc} on this machine")
    result = probe()
    assert (result.returncode, result.stdout) == (0, ""), result.stderr
