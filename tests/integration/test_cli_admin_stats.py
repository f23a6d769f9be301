"""``nsq-ha stats --watch`` as a user sees it, on the embedded cluster and the real fork (the
``backend`` fixture): on a terminal (a pty) one table redrawn in place, rich's or plain text's;
through a pipe one table (or ``--json`` object) per refresh, without escape sequences. Each
partition's msgs/s is its ``message_count`` growth over the time between two refreshes (blank in
the first table), seen here after messages were published between refreshes."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pty
import re
import secrets
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable

import pytest

from nsq_ha import Producer
from nsq_ha.admin import TopicSpec

from .backend import Backend
from .cli_run import nsq_ha, ok

T_RATE = TopicSpec(f"clistats_rate_{secrets.token_hex(3)}", partitions=2)
#: any escape sequence (CSI), as a terminal receives it
_CSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def cluster(backend: Backend) -> Backend:
    backend.ensure_topics([T_RATE])
    return backend


def _publish(lookupd: str, count: int) -> None:
    async def send() -> None:
        async with Producer(lookupd=lookupd) as producer:
            await producer.publish_many(
                T_RATE.name, [b"r%d" % i for i in range(count)], partition=0
            )

    asyncio.run(send())


def _on_a_terminal(argv: list[str], after_first: Callable[[], None], timeout: float = 90) -> bytes:
    """Run ``nsq-ha ARGV`` with stdout on a pty (250 x 60) until it exits; ``after_first`` is
    called once the first table holds the topic's rows. Returns what the terminal received."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 250, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("NSQ_HA_LOOKUPD", "NSQ_HA_NSQD")}
    env.update(TERM="xterm-256color", COLUMNS="250", LINES="60")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "nsq_ha", *argv],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(slave)
    received = b""
    called = False
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the process closed the terminal
                break
            if not chunk:
                break
            received += chunk
            if not called and received.count(T_RATE.name.encode()) >= 2:
                called = True
                after_first()
        assert proc.wait(timeout=max(1.0, deadline - time.monotonic())) == 0, proc.stderr
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()
    assert called, received[-2000:]
    return received


def _rates(screen: bytes) -> list[float]:
    """The msgs/s of partition 0 in every table drawn (none where the cell is blank)."""
    text = _CSI.sub(b"", screen).decode("utf-8", "replace")
    found = []
    for line in text.splitlines():
        cells = [c for c in re.split(r"\s*[│┃]\s*|\s{2,}", line.strip()) if c]
        if len(cells) > 3 and cells[0] == T_RATE.name and cells[1] == "0":
            with contextlib.suppress(ValueError):
                found.append(float(cells[3]))
    return found


@pytest.mark.parametrize("look", ["plain", "rich"])
def test_watch_on_a_terminal_redraws_one_table_with_msgs_per_second(
    cluster: Backend, look: str
) -> None:
    argv = ["stats", "--lookupd", cluster.lookupd_http, T_RATE.name, "--watch", "0.5"]
    argv += ["--count", "6", *(["--plain"] if look == "plain" else [])]
    screen = _on_a_terminal(argv, lambda: _publish(cluster.lookupd_http, 50))
    assert re.search(rb"\x1b\[\d*A", screen), "no cursor-up: tables were not redrawn in place"
    assert re.search(rb"\x1b\[(2K|0?J)", screen), "no erase: the old table was not cleared"
    rates = _rates(screen)
    assert rates, _CSI.sub(b"", screen).decode()[-3000:]
    assert max(rates) > 0, rates


def test_watch_through_a_pipe_prints_one_plain_table_per_refresh(cluster: Backend) -> None:
    argv = ["stats", "--lookupd", cluster.lookupd_http, "--topic", T_RATE.name]
    out = ok(nsq_ha(*argv, "--watch", "0.2", "--count", "3"))
    assert "\x1b" not in out
    assert out.count("nsq-ha stats ") == 3
    headers = [line for line in out.splitlines() if "topic" in line and "partition" in line]
    assert len(headers) == 3
    assert all("msgs/s" in h for h in headers)


def test_watch_json_gives_msgs_per_second_after_the_first_refresh(cluster: Backend) -> None:
    argv = [sys.executable, "-m", "nsq_ha", "stats", "--lookupd", cluster.lookupd_http]
    argv += [T_RATE.name, "--json", "--watch", "0.5", "--count", "5"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        _publish(cluster.lookupd_http, 40)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert [r["msgs_per_s"] for r in first["rows"]] == [None, None]
    later = [json.loads(line) for line in out.splitlines()]
    assert len(later) == 4
    p0 = [r["msgs_per_s"] for s in later for r in s["rows"] if r["partition"] == 0]
    assert all(isinstance(rate, float) for rate in p0), p0
    assert max(p0) > 0, p0
