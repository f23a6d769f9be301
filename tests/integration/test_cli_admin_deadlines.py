"""The admin commands against lookupds that trickle their answers or record what they get, run
as a user runs them (a subprocess each): ``--timeout`` (or the default) bounds the whole command,
which ends with one line saying what timed out and what to do; a bad duration is refused (exit 2)
before anything is sent."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest

from .cli_run import nsq_ha as run_cli
from .cli_run import one_line_error
from .lying_admin import routes
from .lying_http import LyingHttpServer, answer, trickler

#: seconds past the deadline a command may take: interpreter start and imports (~1 s) included
SLACK = 3.0


async def _timed(*argv: str, limit: float) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``nsq-ha ARGV`` off the loop (the lying server runs on it); a run still going
    15 s past ``limit`` fails the test (subprocess.TimeoutExpired)."""
    start = time.monotonic()
    proc = await asyncio.to_thread(run_cli, *argv, timeout=limit + 15)
    return proc, time.monotonic() - start


@pytest.mark.parametrize(
    ("argv", "limit"),
    [
        (["topic", "create", "--topic", "t", "--timeout", "3"], 3.0),
        (["topic", "list", "--timeout", "3"], 3.0),
        (["stats", "--topic", "t", "--timeout", "3"], 3.0),
        (["leader", "move", "--topic", "t", "--partition", "0", "--timeout", "3"], 3.0),
        (["channel", "pause", "--topic", "t", "--channel", "c", "--timeout", "3"], 3.0),
        (["topic", "delete", "--topic", "t", "--timeout", "3"], 3.0),
        (["lookup", "--topic", "t", "--timeout", "3"], 3.0),
        (["topic", "expand", "--topic", "t", "--partitions", "3", "--timeout", "3"], 3.0),
    ],
    ids=[
        "topic-create",
        "topic-list",
        "stats",
        "leader-move",
        "channel-pause",
        "topic-delete",
        "lookup",
        "topic-expand",
    ],
)
async def test_an_admin_command_ends_by_its_timeout_against_a_trickling_lookupd(
    argv: list[str], limit: float
) -> None:
    async with LyingHttpServer(trickler(interval=0.5)) as slow:
        proc, elapsed = await _timed(*argv, "--lookupd", slow.url, limit=limit)
    line = one_line_error(proc, 1)
    assert elapsed < limit + SLACK, f"took {elapsed:.1f} s"
    assert f"within {limit:g} s" in line
    assert "--timeout" in line
    assert "check" in line
    assert slow.url.removeprefix("http://") in line or "--lookupd" in line


@pytest.mark.parametrize(
    "argv",
    [
        ["topic", "create", "--topic", "t", "--timeout", "nan"],
        ["topic", "create", "--topic", "t", "--timeout", "inf"],
        ["topic", "create", "--topic", "t", "--timeout", "0"],
        ["leader", "move", "--topic", "t", "--partition", "0", "--timeout", "-1"],
        ["topic", "list", "--timeout", "nan"],
        ["topic", "delete", "--topic", "t", "--timeout", "-1"],
        ["channel", "pause", "--topic", "t", "--channel", "c", "--timeout", "inf"],
        ["stats", "--timeout", "nan"],
        ["stats", "--watch", "nan"],
        ["stats", "--watch", "inf"],
        ["lookup", "--topic", "t", "--timeout", "-1"],
        ["topic", "expand", "--topic", "t", "--partitions", "3", "--timeout", "nan"],
    ],
    ids=lambda argv: " ".join(a for a in argv if a not in ("--topic", "t", "--channel", "c")),
)
async def test_a_bad_duration_exits_2_before_anything_is_sent(argv: list[str]) -> None:
    """A lookupd that would accept everything records no request at all."""
    handler = routes(
        {"/listlookup": answer(None), "/cluster/stats": answer({"stable": True})},
        other=answer({}),
    )
    async with LyingHttpServer(handler) as liar:
        proc, elapsed = await _timed(*argv, "--lookupd", liar.url, limit=5)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert "finite number of seconds" in proc.stderr or "0.05..86400" in proc.stderr
    assert liar.requests == []
    assert elapsed < 5


async def test_a_bad_timeout_is_one_error_line_naming_the_option() -> None:
    proc = await asyncio.to_thread(
        run_cli, "topic", "create", "--topic", "t", "--timeout", "nan", "--lookupd", "127.0.0.1:9"
    )
    assert proc.returncode == 2
    (error,) = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert "argument --timeout" in error
    assert "nan" in error
