"""Running ``nsq-ha`` in the command-line tests as a user does: a subprocess each, text output,
and the checks every such test makes (exit 0, or one line on stderr with a given code)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def nsq_ha(
    *argv: str, stdin: bytes = b"", timeout: float = 180, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``nsq-ha ARGV`` the way a shell does, without this process's ``NSQ_HA_LOOKUPD`` /
    ``NSQ_HA_NSQD`` (``env`` is added to the rest of its environment)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("NSQ_HA_LOOKUPD", "NSQ_HA_NSQD")}
    environ.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "nsq_ha", *argv],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        check=False,
        env=environ,
    )
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode()
    )


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    """Its stdout, once it exited 0 (else the failure shows both outputs)."""
    assert proc.returncode == 0, (
        f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    return proc.stdout


def one_line_error(proc: subprocess.CompletedProcess[str], code: int) -> str:
    """The one ``nsq-ha ...`` line on stderr of a run that exited ``code``, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("nsq-ha ")
    return lines[0]


def json_lines(text: str) -> list[dict[str, object]]:
    """Each non-empty line of ``text`` as JSON."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]
