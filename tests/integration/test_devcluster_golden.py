"""The embedded broker replays the real fork's recorded TCP exchanges byte for byte.

``tests/golden/`` holds exchanges captured from nsqd 0.3.7-HA.1.13.0 (see its README).  Each
recording is replayed against a fresh :class:`DevCluster` whose topics are placed as the
recording's topology says: every client byte is sent as recorded and every server frame must
come back identical (timestamps masked, as the recordings mark them), with the same
connection outcome (closed / still open / nothing sent within the recorded time).

This runs everywhere (no Go, no etcd), so CI checks the emulator against the real server's
bytes on every run; ``tests/conformance`` adds the live comparison when a fork is available.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nsq_ha.devcluster import DevCluster, EventKind

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
#: recorded ports -> node index: 14150 = node 0, 24150 = node 1, 34150 = node 2
PORT_NODE = {14150: 0, 24150: 1, 34150: 2}
#: how long "still open" / "no frame" observations wait here (the recordings waited longer)
QUIET = 0.3
#: cases whose error text ends in the fork's JSON parser's message: only this prefix is ours
PREFIX_ONLY = {"PUB_EXT invalid JSON header": b"E_INVALID_JSON_HEADER fail to parse json header:"}


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GOLDEN / name).read_text())
    return data


def masked(data: bytes, vary: list[dict[str, int]] | None) -> bytes:
    out = bytearray(data)
    for span in vary or []:
        out[span["from"] : span["to"]] = b"\0" * (span["to"] - span["from"])
    return bytes(out)


class Replayer:
    """Plays one recording's steps against a running DevCluster."""

    def __init__(self, cluster: DevCluster, ports: dict[str, int]) -> None:
        self.cluster = cluster
        self.ports = ports  # connection name -> recorded port
        self.conns: dict[str, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}

    async def conn(self, name: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if name not in self.conns:
            node = self.cluster.nodes[PORT_NODE[self.ports[name]]]
            self.conns[name] = await asyncio.open_connection(node.host, node.tcp_port)
        return self.conns[name]

    async def close(self) -> None:
        for _, writer in self.conns.values():
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def expect_nothing(self, name: str, seconds: float) -> None:
        reader, _ = await self.conn(name)
        try:
            data = await asyncio.wait_for(reader.read(1), seconds)
        except TimeoutError:
            return
        raise AssertionError(f"{name}: expected silence, got {data!r} (EOF if empty)")

    async def play(self, steps: list[dict[str, Any]], label: str) -> None:
        for index, step in enumerate(steps):
            where = f"{label} step {index} ({step.get('note', '')})"
            kind = step["dir"]
            if kind == "c2s":
                _, writer = await self.conn(step["conn"])
                writer.write(bytes.fromhex(step["hex"]))
                await writer.drain()
            elif kind == "s2c":
                reader, _ = await self.conn(step["conn"])
                want = bytes.fromhex(step["hex"])
                if label in PREFIX_ONLY:
                    # the rest of the error text is the Go JSON parser's own wording
                    size, frame_type = struct.unpack(">iI", await reader.readexactly(8))
                    data = await reader.readexactly(size - 4)
                    assert frame_type == 1, f"{where}: frame type {frame_type}"
                    assert data.startswith(PREFIX_ONLY[label]), f"{where}: got {data!r}"
                    continue
                got = await asyncio.wait_for(reader.readexactly(len(want)), 10)
                vary = step.get("vary")
                assert masked(got, vary) == masked(want, vary), (
                    f"{where}:\n got {got.hex()}\nwant {want.hex()}"
                )
            else:
                await self.event(step, where)

    async def event(self, step: dict[str, Any], where: str) -> None:
        event: str = step["event"]
        name = step["conn"]
        names = list(self.conns) if name == "both" else [name]
        if event == "server_closed":
            reader, _ = await self.conn(name)
            rest = await asyncio.wait_for(reader.read(), 3)
            assert rest == b"", f"{where}: expected EOF, got {rest!r}"
        elif event == "still_open":
            await self.expect_nothing(name, QUIET)
        elif match := re.fullmatch(r"no_frame_within_([\d.]+)s", event):
            wait = min(float(match.group(1)), 1.0)
            await asyncio.gather(*(self.expect_nothing(n, wait) for n in names))
        elif event.startswith("data:"):
            pass  # the next s2c step checks the same bytes
        else:
            raise AssertionError(f"{where}: unknown event {event!r}")


async def _errors_cluster(cluster: DevCluster) -> None:
    cluster.create_topic("cf_err", 2, 1, placement=[[1], [2]])
    cluster.create_topic("cf_ordered", 2, 1, ordered=True, placement=[[2], [0]])
    cluster.create_topic("cf_ext", 2, 1, ext=True, placement=[[1], [2]])
    cluster.create_topic("cf_rep3", 1, 3, placement=[[0, 1, 2]])


async def _req_ordered_history(cluster: DevCluster) -> None:
    """Case "REQ with delay on an ordered channel" found id 5 at offset 105: three earlier
    5-byte messages, then its channel, then the message."""
    part = cluster.partition("cf_ordered", 0)
    for _ in range(3):
        cluster.append(part, [(b"x" * 5, 0, None)])
    cluster.create_channel("cf_ordered", "ch_req", 0)
    cluster.append(part, [(b"req-me", 0, None)])


ERROR_CASES = load("fork_errors.json")["cases"]
SETUP: dict[str, Callable[[DevCluster], Any]] = {
    "REQ with delay on an ordered channel": _req_ordered_history,
}


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c["label"] for c in ERROR_CASES])
async def test_fork_error_case(case: dict[str, Any]) -> None:
    """Each recorded error exchange (PROTOCOL.md §2, §11): same bytes, same close behaviour."""
    async with DevCluster(nodes=3) as cluster:
        await _errors_cluster(cluster)
        setup = SETUP.get(case["label"])
        if setup is not None:
            await setup(cluster)
        replay = Replayer(cluster, {"c": case["connection"]["port"]})
        try:
            await replay.play(case["steps"], case["label"])
        finally:
            await replay.close()


IDENTIFY_CASES = [c for c in load("identify.json")["cases"] if c["label"].startswith("fork:")]


@pytest.mark.parametrize("case", IDENTIFY_CASES, ids=[c["label"] for c in IDENTIFY_CASES])
async def test_fork_identify_case(case: dict[str, Any]) -> None:
    """IDENTIFY answers and validation errors (§3.3) byte for byte."""
    async with DevCluster(nodes=1) as cluster:
        replay = Replayer(cluster, {"c": 14150})
        try:
            await replay.play(case["steps"], case["label"])
        finally:
            await replay.close()


async def test_fork_heartbeats_and_read_deadline() -> None:
    """Heartbeats every interval to a producer connection, then a close 3 intervals after
    the last command, with no error frame (§1.4)."""
    flows = load("identify.json")["heartbeat"]
    flow = next(f for f in flows if f["server_kind"] == "fork" and not f["subscribed"])
    async with DevCluster(nodes=1) as cluster:
        replay = Replayer(cluster, {"c": 14150})
        try:
            await replay.play(flow["steps"][:-1], "heartbeat")
            # EOF with no 4th silent heartbeat before it: the close came within one interval
            # of the 3rd, and it was the read deadline that closed the connection
            await replay.event(flow["steps"][-1], "heartbeat close")
            await cluster.wait_for(EventKind.CLIENT_TIMED_OUT, timeout=1)
            assert not cluster.events_of(EventKind.CONNECTION_DROPPED)
        finally:
            await replay.close()


FLOWS = {
    "fork_pub_sub.json": lambda c: c.create_topic(
        "cf_pubsub", 4, 1, placement=[[0], [1], [2], [0]]
    ),
    "fork_ordered.json": lambda c: c.create_topic(
        "cf_ordered2", 4, 1, ordered=True, placement=[[0], [1], [2], [0]]
    ),
    "fork_ext_trace.json": lambda c: (
        c.create_topic("cf_trace", 2, 1, placement=[[2], [0]]),
        c.create_topic("cf_ext", 2, 1, ext=True, placement=[[1], [2]]),
    ),
}


@pytest.mark.parametrize("name", list(FLOWS))
async def test_fork_flow(name: str) -> None:
    """Whole publish/consume flows on fresh partitions: ids from 2, offsets from 0, traced
    answers, the ext and detail parts, ordered delivery (§2.10-§2.16, §4)."""
    recording = load(name)
    steps = recording["steps"]
    if name == "fork_ordered.json":
        # phase B: which of two consumers gets each message is up to the server
        steps = steps[: next(i for i, s in enumerate(steps) if "phase B" in s.get("note", ""))]
    async with DevCluster(nodes=3) as cluster:
        FLOWS[name](cluster)
        ports = {n: c["port"] for n, c in recording["connections"].items()}
        replay = Replayer(cluster, ports)
        try:
            await replay.play(steps, name)
        finally:
            await replay.close()
