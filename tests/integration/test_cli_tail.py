"""``nsq-ha tail`` at the edges of its output and input, run as a user runs it (a subprocess
each, a real pipe) on the embedded cluster and on the real fork: a reader that goes away
(``tail | head -1``) ends tail at once with status 0, the message it held given back and its
ephemeral channel gone; Ctrl-C ends it even while nobody reads its stdout; a bad ``--timeout``
is refused before any channel is made."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from typing import Any

import pytest

from nsq_ha.admin import NsqdAdmin, TopicSpec
from nsq_ha.producer import Producer

from .backend import Backend
from .cli_run import json_lines, nsq_ha, ok, one_line_error

T_HEAD = TopicSpec("nsqha_cli_tail_head", partitions=2)
T_DURABLE = TopicSpec("nsqha_cli_tail_durable", partitions=2)
T_IDLE = TopicSpec("nsqha_cli_tail_idle", partitions=1)
T_UNREAD = TopicSpec("nsqha_cli_tail_unread", partitions=2)
T_BAD = TopicSpec("nsqha_cli_tail_bad", partitions=1)

#: more than a pipe holds (64 KiB on Linux): tail cannot print them all before the reader goes
MANY = 2000
BODY = "x" * 100
#: how long tail may take to end once its reader left or Ctrl-C came (seconds)
PROMPT = 5.0


@pytest.fixture(scope="module")
def cluster(backend: Backend) -> Backend:
    backend.ensure_topics([T_HEAD, T_DURABLE, T_IDLE, T_UNREAD, T_BAD])
    return backend


async def _publish(lookupd: str, topic: str, count: int) -> None:
    async with Producer(lookupd=lookupd) as producer:
        await producer.publish_many(topic, [f"{i} {BODY}".encode() for i in range(count)])


def publish(cluster: Backend, topic: str, count: int) -> None:
    asyncio.run(_publish(cluster.lookupd_http, topic, count))


async def _channel_stats(cluster: Backend, topic: str) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for url in cluster.http_urls():
        async with NsqdAdmin(url) as nsqd:
            for entry in await nsqd.topic_stats(topic):
                for chan in entry.get("channels") or ():
                    found.setdefault(chan["channel_name"], []).append(chan)
    return found


def channel_stats(cluster: Backend, topic: str) -> dict[str, list[dict[str, Any]]]:
    """Each channel of ``topic`` on every nsqd (its /stats entries, one per partition)."""
    return asyncio.run(_channel_stats(cluster, topic))


def channels_left(cluster: Backend, topic: str, patience: float = 30.0) -> set[str]:
    """The topic's channels, once none is ephemeral or ``patience`` ran out (nsqd deletes an
    ephemeral channel in the background once its last client left)."""
    deadline = time.monotonic() + patience
    while True:
        names = set(channel_stats(cluster, topic))
        if not any(n.endswith("#ephemeral") for n in names) or time.monotonic() > deadline:
            return names
        time.sleep(0.2)


def tail_argv(cluster: Backend, topic: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "nsq_ha", "tail", "--lookupd", cluster.lookupd_http,
        "--topic", topic, "--timeout", "60", *extra,
    ]  # fmt: skip


@pytest.fixture
def reaper() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test started; any still running at its end are killed."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def tail_into_head(
    cluster: Backend, topic: str, reaper: list[subprocess.Popen[bytes]], *extra: str
) -> tuple[str, int, str, float]:
    """``nsq-ha tail ... | head -1``: head's line, tail's status and stderr, and how long tail
    ran on after head exited."""
    read_end, write_end = os.pipe()
    tail = subprocess.Popen(
        tail_argv(cluster, topic, *extra), stdout=write_end, stderr=subprocess.PIPE
    )
    reaper.append(tail)
    os.close(write_end)
    head = subprocess.Popen(["head", "-1"], stdin=read_end, stdout=subprocess.PIPE)
    reaper.append(head)
    os.close(read_end)
    line, _ = head.communicate(timeout=120)
    left = time.monotonic()
    try:
        _, err = tail.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        tail.kill()
        _, err = tail.communicate()
    return line.decode(), tail.returncode, err.decode(), time.monotonic() - left


def test_tail_into_head_ends_at_once_and_leaves_no_channel(
    cluster: Backend, reaper: list[subprocess.Popen[bytes]]
) -> None:
    """The reader goes while tail has much more to print: tail ends at once, status 0, no
    "Broken pipe", and its ephemeral channel is gone."""
    publish(cluster, T_HEAD.name, MANY)
    line, code, err, after = tail_into_head(cluster, T_HEAD.name, reaper, "--format", "{body}")
    assert line.endswith(f" {BODY}\n"), line
    assert (code, err) == (0, ""), err
    assert after < PROMPT
    assert channels_left(cluster, T_HEAD.name) == set()


def test_tail_into_head_gives_the_held_message_back(
    cluster: Backend, reaper: list[subprocess.Popen[bytes]]
) -> None:
    """On a durable channel: nothing is left in flight once tail ended (what it held is given
    back, not finished), and the next tail prints what the first did not finish, once."""
    topic = T_DURABLE.name
    publish(cluster, topic, MANY)
    line, code, err, after = tail_into_head(
        cluster, topic, reaper, "--channel", "kept", "--format", "{body}"
    )
    assert (code, err) == (0, ""), err
    assert after < PROMPT
    kept = channel_stats(cluster, topic)["kept"]
    assert sum(int(c["in_flight_count"]) for c in kept) == 0, kept
    assert sum(int(c["requeue_count"]) for c in kept) >= 1, kept
    left = sum(int(c["depth"]) for c in kept)
    assert 0 < left < MANY
    again = ["--lookupd", cluster.lookupd_http, "--topic", topic, "--channel", "kept"]
    rest = json_lines(ok(nsq_ha("tail", *again, "--exit-at-end", "--json", "--timeout", "60")))
    bodies = [str(m["body"]) for m in rest]
    assert len(bodies) == left == len(set(bodies))
    assert line.rstrip("\n") not in bodies
    assert any(int(str(m["attempts"])) >= 2 for m in rest)


def test_tail_ends_when_its_reader_leaves_while_nothing_arrives(
    cluster: Backend, reaper: list[subprocess.Popen[bytes]]
) -> None:
    """Everything fits in the pipe and no message comes after: tail still notices that head
    went away and ends at once (not at the next message or its --timeout)."""
    publish(cluster, T_IDLE.name, 3)
    line, code, err, after = tail_into_head(cluster, T_IDLE.name, reaper, "--format", "{body}")
    assert line.endswith(f" {BODY}\n"), line
    assert (code, err) == (0, ""), err
    assert after < PROMPT
    assert channels_left(cluster, T_IDLE.name) == set()


def test_ctrl_c_ends_tail_whose_stdout_nobody_reads(
    cluster: Backend, reaper: list[subprocess.Popen[bytes]]
) -> None:
    """stdout is a pipe nobody reads and tail's writes block: SIGINT still ends it within
    seconds (130, one line), and its ephemeral channel is gone."""
    publish(cluster, T_UNREAD.name, MANY)
    read_end, write_end = os.pipe()
    try:
        tail = subprocess.Popen(
            tail_argv(cluster, T_UNREAD.name), stdout=write_end, stderr=subprocess.PIPE
        )
        reaper.append(tail)
        os.close(write_end)
        capacity = fcntl.fcntl(read_end, fcntl.F_GETPIPE_SZ)
        deadline = time.monotonic() + 120
        while _pending(read_end) < capacity - 4096:  # a line does not fit: its write blocks
            assert tail.poll() is None, tail.communicate()
            assert time.monotonic() < deadline, f"the pipe holds only {_pending(read_end)}"
            time.sleep(0.05)
        tail.send_signal(signal.SIGINT)
        asked = time.monotonic()
        try:
            _, err = tail.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            tail.kill()
            _, err = tail.communicate()
        took = time.monotonic() - asked
    finally:
        os.close(read_end)
    proc = subprocess.CompletedProcess(tail.args, tail.returncode, "", err.decode())
    assert "interrupted" in one_line_error(proc, 130)
    assert took < PROMPT
    assert channels_left(cluster, T_UNREAD.name) == set()


def _pending(read_end: int) -> int:
    """Bytes written to the pipe and not read yet."""
    buffer = fcntl.ioctl(read_end, termios.FIONREAD, b"\0\0\0\0")
    return int.from_bytes(buffer, sys.byteorder)


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_a_bad_timeout_is_refused_before_any_channel_is_made(cluster: Backend, value: str) -> None:
    started = time.monotonic()
    proc = nsq_ha(
        "tail", "--lookupd", cluster.lookupd_http, "--topic", T_BAD.name,
        "--channel", "probe", "--timeout", value, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "--timeout" in proc.stderr.splitlines()[-1]
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - started < PROMPT
    assert channel_stats(cluster, T_BAD.name) == {}
