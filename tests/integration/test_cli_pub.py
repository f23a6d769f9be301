"""``nsq-ha pub`` run as a user runs it (a subprocess each): every record gets its own verdict
(a record refused by the client's checks or by nsqd does not stop the others, and none is
published twice), and Ctrl-C with a stdin that stays open (``tail -f log | nsq-ha pub``) ends it
at once, after the summary of what it published."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from nsq_ha.admin import LookupdAdmin, NsqdAdmin
from nsq_ha.cli.pub import INTERRUPT_GRACE
from nsq_ha.devcluster import DevClusterThread
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
