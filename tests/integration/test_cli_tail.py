"""``nsq-ha tail`` at the edges of its output and input, run as a user runs it (a subprocess
each, a real pipe) on the embedded cluster and on the real fork: a reader that goes away
(``tail | head -1``) ends tail at once with status 0, the message it held given back and its
ephemeral channel gone; Ctrl-C ends it even while nobody reads its stdout; a bad ``--timeout``
is refused before any channel is made; every line on a plain fork topic carries its message's
partition and queue offset (``--format``, ``--json`` and the default line), and on vanilla nsqd,
which has neither, the fields print ``-`` (``null`` in ``--json``)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
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
from nsq_ha.testing.servers import VanillaCluster

from .backend import Backend
from .cli_run import json_lines, nsq_ha, ok, one_line_error

T_HEAD = TopicSpec("nsqha_cli_tail_head", partitions=2)
T_DURABLE = TopicSpec("nsqha_cli_tail_durable", partitions=2)
T_IDLE = TopicSpec("nsqha_cli_tail_idle", partitions=1)
T_UNREAD = TopicSpec("nsqha_cli_tail_unread", partitions=2)
T_BAD = TopicSpec("nsqha_cli_tail_bad", partitions=1)
T_OFFSETS = TopicSpec("nsqha_cli_tail_offsets", partitions=2)

#: more than a pipe holds (64 KiB on Linux): tail cannot print them all before the reader goes
MANY = 2000
BODY = "x" * 100
#: how long tail may take to end once its reader left or Ctrl-C came (seconds)
PROMPT = 5.0


@pytest.fixture(scope="module")
def cluster(backend: Backend) -> Backend:
    backend.ensure_topics([T_HEAD, T_DURABLE, T_IDLE, T_UNREAD, T_BAD, T_OFFSETS])
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


# -- partition and offset on every line -----------------------------------------------------------

#: (partition, offset, body) of a printed line, per output shape
Where = tuple[int | None, int | None, str]
#: the argv and the parser of each output shape: the template of the README, JSON, the default
SHAPES = {
    "format": ("--format", "{partition}@{offset} {body}"),
    "json": ("--json",),
    "default": (),
}


def _number(text: str) -> int | None:
    return None if text == "-" else int(text)


def _json_int(value: object) -> int | None:
    assert value is None or type(value) is int, value
    return value


def parse_lines(shape: str, out: str) -> list[Where]:
    """Each printed line as (partition, offset, body); a line of another shape fails."""
    if shape == "json":
        return [
            (_json_int(m["partition"]), _json_int(m["offset"]), str(m["body"]))
            for m in json_lines(out)
        ]
    pattern = r"(-|\d+)@(-|\d+) (.*)" if shape == "format" else r"\[(-|\d+)(?:@(\d+))?\] (.*)"
    found: list[Where] = []
    for line in out.splitlines():
        match = re.fullmatch(pattern, line)
        assert match is not None, f"{line!r} is not {shape!r}'s line"
        found.append((_number(match[1]), _number(match[2] or "-"), match[3]))
    return found


async def _publish_traced(lookupd: str, topic: str, count: int) -> set[Where]:
    """Publish ``count`` messages with PUB_TRACE (whose answer carries the offset nsqd stored
    each at), alternating partitions 0 and 1."""
    where: set[Where] = set()
    async with Producer(lookupd=lookupd) as producer:
        for i in range(count):
            body = f"offset-{i}"
            result = await producer.publish(
                topic, body.encode(), partition=i % 2, trace_id=7000 + i
            )
            assert result.offset is not None, result
            where.add((result.partition, result.offset, body))
    return where


@pytest.fixture(scope="module")
def traced(cluster: Backend) -> set[Where]:
    """What was published to ``T_OFFSETS``: (partition, offset, body) as nsqd answered."""
    return asyncio.run(_publish_traced(cluster.lookupd_http, T_OFFSETS.name, 8))


@pytest.mark.parametrize("shape", SHAPES)
def test_every_line_carries_its_partition_and_offset_on_a_plain_fork_topic(
    cluster: Backend, traced: set[Where], shape: str
) -> None:
    """A plain (unordered) 2-partition topic: each line shows the partition and the queue
    offset nsqd stored the message at (the offset PUB_TRACE answered), whichever the output."""
    argv = ["--lookupd", cluster.lookupd_http, "--topic", T_OFFSETS.name, "--exit-at-end"]
    out = ok(nsq_ha("tail", *argv, *SHAPES[shape], "--timeout", "60"))
    printed = parse_lines(shape, out)
    assert sorted(printed, key=str) == sorted(traced, key=str), out
    assert channels_left(cluster, T_OFFSETS.name) == set()


@pytest.mark.vanilla
@pytest.mark.parametrize("shape", SHAPES)
def test_vanilla_lines_show_a_dash_for_partition_and_offset(
    vanilla_cluster: VanillaCluster, shape: str
) -> None:
    """Vanilla nsqd has no partitions and no offsets: ``{partition}`` and ``{offset}`` print
    ``-`` (``null`` in ``--json``, the default line is ``[-] body``), and tail still
    subscribes with a plain SUB, which vanilla accepts."""
    topic = f"nsqha_cli_tail_vanilla_{shape}"
    vanilla_cluster.create_topic(topic)
    asyncio.run(_publish_plain(vanilla_cluster.lookupd_http, topic, ["v0", "v1", "v2"]))
    argv = ["--lookupd", vanilla_cluster.lookupd_http, "--topic", topic, "--exit-at-end"]
    out = ok(nsq_ha("tail", *argv, *SHAPES[shape], "--timeout", "60"))
    assert sorted(parse_lines(shape, out), key=str) == [(None, None, f"v{i}") for i in range(3)]


async def _publish_plain(lookupd: str, topic: str, bodies: list[str]) -> None:
    async with Producer(lookupd=lookupd) as producer:
        await producer.publish_many(topic, [body.encode() for body in bodies])
