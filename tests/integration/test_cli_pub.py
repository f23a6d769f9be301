"""``nsq-ha pub`` run as a user runs it (a subprocess each): every record gets its own verdict
(a record refused by the client's checks or by nsqd does not stop the others, and none is
published twice), Ctrl-C with a stdin that stays open (``tail -f log | nsq-ha pub``) ends it
at once, after the summary of what it published, keyed records go where ``--strategy`` says,
and the summary is one line for a person on a terminal, JSON for a pipe or with ``--json``."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import secrets
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from nsq_ha.admin import LookupdAdmin, NsqdAdmin
from nsq_ha.cli.pub import INTERRUPT_GRACE
from nsq_ha.devcluster import DevClusterThread
from nsq_ha.routing import STRATEGIES, partition_for_key
from nsq_ha.testing.build import ServerBinaries
from nsq_ha.testing.servers import VanillaCluster

from .cli_run import json_lines, nsq_ha, ok
from .lying_nsqd import Peer, lying_nsqd

#: a line over the client's default message size limit (1 MiB, nsqd's default too)
BIG = b"x" * (2 * 1024 * 1024)
#: the message size limit of the servers started with a small one
SMALL_LIMIT = 1000


def _name(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(3)}"


@pytest.fixture(scope="module", params=["devcluster", pytest.param("fork", marks=pytest.mark.fork)])
def lookupd(request: pytest.FixtureRequest) -> Iterator[str]:
    """nsqlookupd's HTTP URL of the embedded cluster or of the real fork cluster."""
    if request.param == "devcluster":
        with DevClusterThread(nodes=3) as dev:
            yield dev.lookupd_http
    else:
        yield request.getfixturevalue("fork_cluster").lookupd_http


def create(lookupd: str, topic: str, *flags: str) -> None:
    ok(nsq_ha("topic", "create", "--lookupd", lookupd, "--topic", topic, *flags, "--json"))


def bodies_of(lookupd: str, topic: str) -> list[str]:
    """Every message of ``topic``, in order (a one-partition topic), read by ``nsq-ha tail``."""
    argv = ["--lookupd", lookupd, "--topic", topic, "--exit-at-end", "--json", "--timeout", "60"]
    return [str(m["body"]) for m in json_lines(ok(nsq_ha("tail", *argv)))]


async def _stored(http_urls: list[str], topic: str) -> int:
    total = 0
    for url in http_urls:
        async with NsqdAdmin(url) as nsqd:
            for entry in await nsqd.topic_stats(topic):
                if entry.get("is_leader", True):
                    total += int(entry.get("message_count") or 0)
    return total


async def _node_urls(lookupd: str) -> list[str]:
    async with LookupdAdmin(lookupd) as admin:
        return [node.http_url for node in await admin.nodes()]


def stored(lookupd: str, topic: str) -> int:
    """How many messages the cluster's nsqd hold for ``topic`` (their /stats)."""
    return asyncio.run(_stored(asyncio.run(_node_urls(lookupd)), topic))


def _run_pub(argv: list[str], stdin: bytes) -> tuple[int, list[dict[str, object]], str]:
    proc = nsq_ha("pub", *argv, "--json", stdin=stdin)
    return proc.returncode, json_lines(proc.stdout), proc.stderr


# -- a verdict per record -----------------------------------------------------------------------


def test_each_record_gets_its_own_verdict(lookupd: str) -> None:
    """A line over the message size limit and an empty line are refused by the client's own
    checks, each with its own error; the other lines of the same round are published, in order,
    once each; the exit status is 1 (some record failed)."""
    topic = _name("pb_verdict")
    create(lookupd, topic)
    stdin = b"one\ntwo\n" + BIG + b"\nfour\n\nsix\n"
    code, lines, err = _run_pub(["--lookupd", lookupd, "--topic", topic], stdin)
    *records, summary = lines
    assert code == 1, (lines[-1:], err)
    assert summary["published"] == 4
    assert summary["failed"] == 2
    assert [(r["line"], r["ok"]) for r in records] == [
        (1, True), (2, True), (3, False), (4, True), (5, False), (6, True)
    ]  # fmt: skip
    assert "2097152 bytes" in str(records[2]["error"])
    assert "empty" in str(records[4]["error"])
    assert all("error" not in r for r in records if r["ok"])
    assert bodies_of(lookupd, topic) == ["one", "two", "four", "six"]


def _refusing_vanilla(binaries: ServerBinaries) -> VanillaCluster:
    return VanillaCluster(binaries, nsqd_args=[f"--max-msg-size={SMALL_LIMIT}"], node_count=1)


@pytest.fixture(params=["devcluster", pytest.param("vanilla", marks=pytest.mark.vanilla)])
def small_limit_server(request: pytest.FixtureRequest) -> Iterator[tuple[list[str], list[str]]]:
    """(where options for ``nsq-ha pub``, nsqd HTTP URLs) of a server whose message size limit
    is ``SMALL_LIMIT`` bytes: the client (1 MiB) sends what the server then refuses."""
    if request.param == "devcluster":
        with DevClusterThread(nodes=1, max_msg_size=SMALL_LIMIT) as dev:
            yield ["--lookupd", dev.lookupd_http], asyncio.run(_node_urls(dev.lookupd_http))
    else:
        with _refusing_vanilla(request.getfixturevalue("vanilla_binaries")) as vanilla:
            node = vanilla.nodes[0]
            yield ["--nsqd", node.tcp_address], [node.http_url]


def test_a_round_the_server_refuses_is_published_record_by_record(
    small_limit_server: tuple[list[str], list[str]],
) -> None:
    """nsqd refuses the whole MPUB for one message over its limit (E_BAD_MESSAGE, nothing
    stored): the records of that round are sent again one at a time, so the good ones are
    published exactly once and the refused one gets nsqd's error."""
    where, http_urls = small_limit_server
    topic = _name("pb_refused")
    if where[0] == "--lookupd":
        create(where[1], topic)
    stdin = b"a\nb\n" + b"y" * (2 * SMALL_LIMIT) + b"\nd\n"
    code, lines, err = _run_pub([*where, "--topic", topic], stdin)
    *records, summary = lines
    assert code == 1, (lines[-1:], err)
    assert [(r["line"], r["ok"]) for r in records] == [(1, True), (2, True), (3, False), (4, True)]
    assert "E_BAD_MESSAGE" in str(records[2]["error"])
    assert (summary["published"], summary["failed"]) == (3, 1)
    assert asyncio.run(_stored(http_urls, topic)) == 3


# -- routing keys: --strategy ----------------------------------------------------------------


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_keyed_records_land_where_the_strategy_routes_them(lookupd: str, strategy: str) -> None:
    """With ``--strategy`` each keyed record is stored on the partition that strategy of
    :mod:`nsq_ha.routing` computes (``java``: the fork's Java SDK), read back by ``tail``; each
    other strategy puts some of the keys elsewhere, so a strategy not passed on would show."""
    partitions = 3  # the clusters have 3 nodes
    keys = [f"order-{i}" for i in range(50)]
    want = {k: partition_for_key(k, partitions, strategy) for k in keys}
    for other in STRATEGIES:
        if other != strategy:
            assert any(partition_for_key(k, partitions, other) != want[k] for k in keys), other
    topic = _name(f"pb_{strategy}")
    create(lookupd, topic, "--partitions", str(partitions))
    argv = ["--lookupd", lookupd, "--topic", topic, "--key-sep", "\\t", "--strategy", strategy]
    stdin = "".join(f"{k}\t{k}\n" for k in keys).encode()
    summary = json.loads(ok(nsq_ha("pub", *argv, stdin=stdin)).splitlines()[-1])
    assert (summary["published"], summary["failed"]) == (len(keys), 0), summary
    tail = ["--lookupd", lookupd, "--topic", topic, "--exit-at-end", "--json", "--timeout", "60"]
    got = json_lines(ok(nsq_ha("tail", *tail)))
    assert {str(m["body"]): m["partition"] for m in got} == want


# -- the summary: a line on a terminal, JSON for a pipe ----------------------------------------


def _on_a_terminal(argv: list[str], stdin: bytes) -> tuple[int, str, str]:
    """Run ``nsq-ha ARGV`` with its stdout a terminal (a pty) and stdin, stderr pipes: (exit
    status, what the terminal showed without carriage returns, stderr)."""
    controller, terminal = pty.openpty()
    shown = b""
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "nsq_ha", *argv],
            stdin=subprocess.PIPE,
            stdout=terminal,
            stderr=subprocess.PIPE,
            env={k: v for k, v in os.environ.items() if k not in ("NSQ_HA_LOOKUPD", "NSQ_HA_NSQD")},
        )
        os.close(terminal)
        terminal = -1
        try:
            assert proc.stdin is not None
            proc.stdin.write(stdin)
            proc.stdin.close()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # until the terminal's last writer is gone
                ready, _, _ = select.select([controller], [], [], 1.0)
                if not ready:
                    continue
                try:
                    chunk = os.read(controller, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                shown += chunk
            code = proc.wait(timeout=30)
            assert proc.stderr is not None
            err = proc.stderr.read().decode()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
    finally:
        if terminal != -1:
            os.close(terminal)
        os.close(controller)
    return code, shown.decode().replace("\r", ""), err


def test_on_a_terminal_the_summary_is_one_line_for_a_person(lookupd: str) -> None:
    """stdout a terminal, no --json: one line (published, of how many, to which topic, per
    partition, each distinct error with its count) and no JSON; exit 1 for the failed record."""
    topic = _name("pb_human")
    create(lookupd, topic)
    code, shown, err = _on_a_terminal(
        ["pub", "--lookupd", lookupd, "--topic", topic], b"one\ntwo\n\nfour\n"
    )
    assert code == 1, (shown, err)
    assert "{" not in shown, shown
    lines = shown.splitlines()
    assert len(lines) == 1, shown
    assert re.fullmatch(
        rf"published 3 of 4 to {re.escape(topic)} \(partitions 0:3\), 1 failed: .*empty.* \(x1\)",
        lines[0],
    ), lines[0]
    assert "Traceback" not in err


def test_with_json_on_a_terminal_and_on_a_pipe_the_summary_is_json(lookupd: str) -> None:
    """--json on a terminal: a JSON line per record, then the JSON summary; stdout a pipe
    (scripts parse it): the JSON summary alone, as before (a pipe with --json: the tests above)."""
    topic = _name("pb_json")
    create(lookupd, topic)
    argv = ["pub", "--lookupd", lookupd, "--topic", topic]
    code, shown, err = _on_a_terminal([*argv, "--json"], b"a\nb\n")
    assert code == 0, (shown, err)
    *records, summary = json_lines(shown)
    assert [(r["line"], r["ok"]) for r in records] == [(1, True), (2, True)]
    assert (summary["topic"], summary["published"], summary["partitions"]) == (topic, 2, {"0": 2})
    piped = ok(nsq_ha(*argv, stdin=b"c\n")).splitlines()
    assert len(piped) == 1, piped
    assert json.loads(piped[0])["published"] == 1


# -- Ctrl-C with a stdin that stays open ------------------------------------------------------


def _wait_stored(lookupd: str, topic: str, count: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while (now := stored(lookupd, topic)) < count:
        assert proc.poll() is None, "nsq-ha pub ended before Ctrl-C"
        assert time.monotonic() < deadline, f"nsqd holds {now} of {count} after 30 s"
        time.sleep(0.1)


@pytest.mark.parametrize(
    ("flags", "written", "published"),
    [([], 5, 5), (["--batch", "1"], 5, 5), (["--rate", "1/h"], 3, 1)],
    ids=["rounds", "one-per-round", "rate-waiting"],
)
def test_ctrl_c_with_an_open_stdin_prints_the_summary_and_exits_130(
    flags: list[str], written: int, published: int
) -> None:
    """Lines written to a pipe that stays open are published as they come; Ctrl-C (SIGINT)
    then ends pub within a few seconds, with exit 130 and a summary whose count is what nsqd
    stored (with --rate, the line waiting for its turn is not sent)."""
    with DevClusterThread(nodes=1) as dev:
        lookupd = dev.lookupd_http
        topic = _name("pb_sigint")
        create(lookupd, topic)
        argv = ["pub", "--lookupd", lookupd, "--topic", topic, *flags]
        env = {k: v for k, v in os.environ.items() if k not in ("NSQ_HA_LOOKUPD", "NSQ_HA_NSQD")}
        proc = subprocess.Popen(
            [sys.executable, "-m", "nsq_ha", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        try:
            proc.stdin.write(b"".join(b"line %d\n" % i for i in range(written)))
            proc.stdin.flush()
            _wait_stored(lookupd, topic, published, proc)
            proc.send_signal(signal.SIGINT)
            sent = time.monotonic()
            code = proc.wait(timeout=15)
            took = time.monotonic() - sent
            out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdin.close()
            proc.stdout.close()
            proc.stderr.close()
        assert code == 130, (out, err)
        assert took < 10, took
        summary = json.loads(out.splitlines()[-1])
        assert summary["interrupted"] is True
        assert summary["published"] == published == stored(lookupd, topic)
        assert "Traceback" not in err


async def test_ctrl_c_while_nsqd_has_not_acknowledged_reports_the_record_not_published() -> None:
    """An nsqd that takes the PUB and never answers: Ctrl-C gives the publish in flight
    INTERRUPT_GRACE seconds, then reports it as not published (nsqd did not acknowledge it),
    prints the summary and exits 130; the stdin pipe stays open throughout."""
    got_pub = asyncio.Event()

    async def silent(peer: Peer) -> None:
        await peer.handshake()
        await peer.expect(b"PUB")
        got_pub.set()
        await peer.until_client_closes()

    async with lying_nsqd(silent) as nsqd:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "nsq_ha", "pub", "--nsqd", nsqd.address, "--topic", "t",
            "--json",
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        try:
            proc.stdin.write(b"held\n")
            await proc.stdin.drain()
            async with asyncio.timeout(30):
                await got_pub.wait()
            proc.send_signal(signal.SIGINT)
            sent = time.monotonic()
            async with asyncio.timeout(INTERRUPT_GRACE + 10):
                out, err = await asyncio.gather(proc.stdout.read(), proc.stderr.read())
                code = await proc.wait()
            took = time.monotonic() - sent
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            proc.stdin.close()
    assert code == 130, (out, err)
    assert took < INTERRUPT_GRACE + 5, took
    *records, summary = json_lines(out.decode())
    assert [(r["line"], r["ok"]) for r in records] == [(1, False)]
    assert "acknowledged" in str(records[0]["error"])
    assert (summary["published"], summary["failed"], summary["interrupted"]) == (0, 1, True)
