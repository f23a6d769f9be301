"""``nsq-ha tail`` and ``nsq-ha pub`` options, run as a user runs them (a subprocess each) against
the embedded cluster, the real fork cluster and real vanilla nsqd: the ephemeral channel tail
leaves nothing behind, ``--from``, ``--exit-at-end``, ``--format``, pub from files with a
delimiter or whole files, ``--partition``, ``--rate``, ``--defer``, the environment's defaults,
and the one-line refusals."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from nsq_ha.admin import LookupdAdmin, NsqdAdmin
from nsq_ha.devcluster import DevClusterThread
from nsq_ha.testing.servers import ForkCluster, VanillaCluster

from .auth_server import AuthServer, running_auth_server
from .cli_run import json_lines, nsq_ha, ok, one_line_error


def _name(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(3)}"


def summary_of(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    result: dict[str, object] = json.loads(ok(proc).splitlines()[-1])
    return result


@pytest.fixture(scope="module", params=["devcluster", "fork"])
def lookupd(request: pytest.FixtureRequest) -> Iterator[str]:
    """nsqlookupd's HTTP URL of the embedded cluster or of the real fork cluster."""
    if request.param == "devcluster":
        with DevClusterThread(nodes=3) as dev:
            yield dev.lookupd_http
    else:
        yield request.getfixturevalue("fork_cluster").lookupd_http


def create(lookupd: str, topic: str, *flags: str) -> None:
    ok(nsq_ha("topic", "create", "--lookupd", lookupd, "--topic", topic, *flags, "--json"))


def pub(lookupd: str, topic: str, lines: list[str], *flags: str) -> dict[str, object]:
    stdin = "".join(f"{line}\n" for line in lines).encode()
    return summary_of(nsq_ha("pub", "--lookupd", lookupd, "--topic", topic, *flags, stdin=stdin))


def tail(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return nsq_ha("tail", *argv, "--timeout", "60", env=env)


async def _channels(lookupd: str, topic: str) -> set[str]:
    names: set[str] = set()
    async with LookupdAdmin(lookupd) as admin:
        for node in await admin.nodes():
            async with NsqdAdmin(node.http_url) as nsqd:
                for entry in await nsqd.topic_stats(topic):
                    names |= {c["channel_name"] for c in entry.get("channels") or ()}
    return names


def channels_left(lookupd: str, topic: str, patience: float = 30.0) -> set[str]:
    """The topic's channels on every node of the cluster (nsqd /stats), once none of them is
    ephemeral or ``patience`` ran out (nsqd deletes an ephemeral channel in the background)."""
    deadline = time.monotonic() + patience
    while True:
        names = asyncio.run(_channels(lookupd, topic))
        if not any(n.endswith("#ephemeral") for n in names) or time.monotonic() > deadline:
            return names
        time.sleep(0.2)


# -- tail: the ephemeral channel, --exit-at-end, --format ---------------------------------------


def test_tail_uses_an_ephemeral_channel_and_leaves_nothing(lookupd: str) -> None:
    topic = _name("tl_eph")
    create(lookupd, topic, "--partitions", "2")
    assert pub(lookupd, topic, [f"m{i}" for i in range(6)])["published"] == 6
    messages = json_lines(ok(tail("--lookupd", lookupd, "--topic", topic, "-n", "6", "--json")))
    assert sorted(str(m["body"]) for m in messages) == [f"m{i}" for i in range(6)]
    assert channels_left(lookupd, topic) == set()
    # a named durable channel still works, and stays
    keep = ["--lookupd", lookupd, "--topic", topic, "--channel", "keep"]
    ok(tail(*keep, "-n", "6"))
    assert channels_left(lookupd, topic) == {"keep"}
    # it resumes where it is (nothing left) unless --from moves it
    assert ok(tail(*keep, "--exit-at-end")) == ""
    assert len(ok(tail(*keep, "--exit-at-end", "--from", "earliest")).splitlines()) == 6


def test_exit_at_end_prints_exactly_the_backlog_in_the_format(lookupd: str) -> None:
    topic = _name("tl_end")
    create(lookupd, topic, "--partitions", "2")
    bodies = [f"body-{i}" for i in range(9)]
    assert pub(lookupd, topic, bodies)["published"] == 9
    template = "{partition}@{offset} {body}"
    out = ok(tail("--lookupd", lookupd, "--topic", topic, "--exit-at-end", "--format", template))
    lines = out.splitlines()
    assert len(lines) == 9, out
    assert all(re.fullmatch(r"[01]@\d+ body-\d", line) for line in lines), out
    assert sorted(line.split(" ", 1)[1] for line in lines) == bodies
    # per partition, offsets grow
    for part in "01":
        offsets = [int(line.split("@")[1].split()[0]) for line in lines if line[0] == part]
        assert offsets == sorted(offsets)
    # latest: nothing after the end, and it still ends
    assert (
        ok(tail("--lookupd", lookupd, "--topic", topic, "--exit-at-end", "--from", "latest")) == ""
    )
    # the old names still work: start is earliest
    again = ok(tail("--lookupd", lookupd, "--topic", topic, "--exit-at-end", "--from", "start"))
    assert len(again.splitlines()) == 9
    assert channels_left(lookupd, topic) == set()


def test_from_offset_and_timestamp(lookupd: str) -> None:
    topic = _name("tl_pos")
    create(lookupd, topic, "--partitions", "1")
    first = json_lines(
        ok(
            nsq_ha(
                "pub",
                "--lookupd",
                lookupd,
                "--topic",
                topic,
                "--trace",
                "--json",
                stdin=b"a\nb\nc\n",
            )
        )
    )[:-1]
    offsets = [int(str(r["offset"])) for r in first]
    assert offsets == sorted(offsets)
    # every message of the second batch is written at or after `boundary` (whole seconds)
    boundary = int(time.time()) + 1
    time.sleep(max(0.0, boundary - time.time()) + 0.05)
    assert pub(lookupd, topic, ["d", "e"])["published"] == 2

    base = ["--lookupd", lookupd, "--topic", topic, "--exit-at-end", "--format", "{body}"]
    from_b = ok(tail(*base, "--from", f"offset={offsets[1]}"))
    assert from_b.split() == ["b", "c", "d", "e"]
    from_t = ok(tail(*base, "--from", f"timestamp={boundary}"))
    assert from_t.split() == ["d", "e"]
    assert ok(tail(*base, "--from", "earliest")).split() == ["a", "b", "c", "d", "e"]
    assert channels_left(lookupd, topic) == set()


def test_tag_and_ext_filter_reach_nsqd(lookupd: str) -> None:
    """``--tag`` (desired_tag): only that tag's messages; ``--ext-filter``: nsqd acknowledges
    the others without delivering them, so ``--exit-at-end`` still ends."""
    topic = _name("tl_ext")
    create(lookupd, topic, "--ext")
    for body, header in (
        ("a", {"##client_dispatch_tag": "t1", "k": "v"}),
        ("c", {"##client_dispatch_tag": "t1", "k": "w"}),
        ("b", {"##client_dispatch_tag": "t2", "k": "w"}),
    ):
        pub(lookupd, topic, [body], "--ext", json.dumps(header))
    base = ["--lookupd", lookupd, "--topic", topic]
    tagged = ok(tail(*base, "--channel", "tagged", "--tag", "t1", "-n", "2", "--format", "{body}"))
    assert tagged.split() == ["a", "c"]
    only_w = '{"type": 1, "filter_ext_key": "k", "filter_data": "w"}'
    out = ok(tail(*base, "--ext-filter", only_w, "--exit-at-end", "--format", "{body} {tag}"))
    assert out.splitlines() == ["c t1", "b t2"]
    bad = tail(*base, "--ext-filter", "[1]")
    assert "--ext-filter must be a JSON object" in one_line_error(bad, 2)


def test_pub_shows_progress_on_a_terminal(lookupd: str) -> None:
    """stderr a terminal (a pty here) and an input that takes more than a second: a progress
    line; stderr not a terminal: none (the other tests)."""
    topic = _name("pb_progress")
    create(lookupd, topic)
    rate = ["--rate", "10/s"]
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "nsq_ha", "pub", "--lookupd", lookupd, "--topic", topic, *rate],
            input=b"".join(b"p%d\n" % i for i in range(20)),
            stdout=subprocess.PIPE,
            stderr=terminal,
            timeout=120,
            check=False,
        )
        os.set_blocking(controller, False)
        shown = b""
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(controller, 65536):
                shown += chunk
    finally:
        os.close(terminal)
        os.close(controller)
    assert proc.returncode == 0, proc.stdout
    assert json.loads(proc.stdout.decode().splitlines()[-1])["published"] == 20
    assert re.search(rb"published \d+, failed 0 \(", shown), shown


def test_format_with_a_bad_field_is_refused_before_connecting() -> None:
    proc = nsq_ha(
        "tail", "--lookupd", "http://127.0.0.1:1", "--topic", "t", "--format", "{partition} {x}"
    )
    assert "--format: unknown field {x}" in one_line_error(proc, 2)
    proc = nsq_ha("tail", "--lookupd", "http://127.0.0.1:1", "--topic", "t", "--format", "{0}")
    assert "--format: name each field" in one_line_error(proc, 2)


# -- pub: files, delimiters, partitions, rate, defer -----------------------------------------------


def test_pub_from_files_with_a_delimiter_and_whole_files(lookupd: str, tmp_path: Path) -> None:
    topic = _name("pb_files")
    create(lookupd, topic, "--partitions", "2")
    records = tmp_path / "records.bin"
    records.write_bytes(b"r1\x1er2 with\nnewline\x1er3")
    whole = tmp_path / "whole.txt"
    whole.write_bytes(b"line one\nline two\n")
    summary = summary_of(
        nsq_ha(
            "pub", "--lookupd", lookupd, "--topic", topic, "-d", "\\x1e", str(records), "-",
            stdin=b"s1\x1es2",
        )
    )  # fmt: skip
    assert summary["published"] == 5
    summary = summary_of(
        nsq_ha("pub", "--lookupd", lookupd, "--topic", topic, "--whole-file", str(whole))
    )
    assert summary["published"] == 1
    got = json_lines(ok(tail("--lookupd", lookupd, "--topic", topic, "--exit-at-end", "--json")))
    assert sorted(str(m["body"]) for m in got) == sorted(
        ["r1", "r2 with\nnewline", "r3", "s1", "s2", "line one\nline two\n"]
    )
    missing = nsq_ha("pub", "--lookupd", lookupd, "--topic", topic, str(tmp_path / "nope"))
    assert "cannot read" in one_line_error(missing, 2)


def test_pub_partition_lands_on_that_partition(lookupd: str) -> None:
    topic = _name("pb_part")
    create(lookupd, topic, "--partitions", "3")
    summary = pub(lookupd, topic, [f"p{i}" for i in range(5)], "--partition", "2")
    assert summary["partitions"] == {"2": 5}
    got = json_lines(ok(tail("--lookupd", lookupd, "--topic", topic, "--exit-at-end", "--json")))
    assert [m["partition"] for m in got] == [2] * 5
    assert [m["body"] for m in got] == [f"p{i}" for i in range(5)]
    bad = nsq_ha("pub", "--lookupd", lookupd, "--topic", topic, "--partition", "3", stdin=b"x\n")
    assert "has 3 partitions" in one_line_error(bad, 2)


def test_pub_rate_spreads_the_publishes(lookupd: str) -> None:
    """Without --rate 30 lines go as one MPUB (the topic's count jumps 0 -> 30); with it nsqd
    sees them arrive a few at a time: intermediate counts are observed while pub runs."""
    topic = _name("pb_rate")
    create(lookupd, topic, "--partitions", "1")
    stdin = b"".join(b"r%d\n" % i for i in range(30))
    argv = ["pub", "--lookupd", lookupd, "--topic", topic, "--rate", "10/s"]
    seen: set[int] = set()
    with subprocess.Popen(
        [sys.executable, "-m", "nsq_ha", *argv],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdin is not None
        proc.stdin.write(stdin)
        proc.stdin.close()
        while proc.poll() is None:
            seen.add(asyncio.run(_message_count(lookupd, topic)))
            time.sleep(0.1)
        assert proc.stdout is not None
        assert proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()
    assert proc.returncode == 0, (out, err)
    assert json.loads(out.decode().splitlines()[-1])["published"] == 30
    intermediate = {n for n in seen if 0 < n < 30}
    assert len(intermediate) >= 3, sorted(seen)


async def _message_count(lookupd: str, topic: str) -> int:
    total = 0
    async with LookupdAdmin(lookupd) as admin:
        for node in await admin.nodes():
            async with NsqdAdmin(node.http_url) as nsqd:
                for entry in await nsqd.topic_stats(topic):
                    if entry.get("is_leader", True):
                        total += int(entry.get("message_count") or 0)
    return total


def test_defer_is_refused_on_the_fork(lookupd: str) -> None:
    topic = _name("pb_defer")
    create(lookupd, topic)
    proc = nsq_ha("pub", "--lookupd", lookupd, "--topic", topic, "--defer", "1", stdin=b"x\n")
    assert "the fork has no DPUB" in one_line_error(proc, 2)


# -- the environment's defaults ---------------------------------------------------------------


def test_environment_defaults_and_flags_win(lookupd: str) -> None:
    topic = _name("env")
    create(lookupd, topic)
    env = {"NSQ_HA_LOOKUPD": f"http://127.0.0.1:1,{lookupd}"}
    summary = summary_of(nsq_ha("pub", "--topic", topic, stdin=b"e1\ne2\n", env=env))
    assert summary["published"] == 2
    out = ok(tail("--topic", topic, "--exit-at-end", "--format", "{body}", env=env))
    assert out.split() == ["e1", "e2"]
    # a flag replaces the environment's addresses, both of them
    wrong = {"NSQ_HA_LOOKUPD": "http://127.0.0.1:1", "NSQ_HA_NSQD": "127.0.0.1:1"}
    argv = ["--lookupd", lookupd, "--topic", topic]
    assert summary_of(nsq_ha("pub", *argv, stdin=b"e3\n", env=wrong))["published"] == 1
    # both variables and no flag: which one is meant is not guessed
    proc = nsq_ha("pub", "--topic", topic, stdin=b"x\n", env=wrong)
    assert "NSQ_HA_LOOKUPD and $NSQ_HA_NSQD are both set" in one_line_error(proc, 2)


# -- vanilla -------------------------------------------------------------------------------------


async def _vanilla_channels(cluster: VanillaCluster, topic: str) -> set[str]:
    names: set[str] = set()
    for node in cluster.nodes:
        async with NsqdAdmin(node.http_url) as nsqd:
            for entry in await nsqd.topic_stats(topic):
                names |= {c["channel_name"] for c in entry.get("channels") or ()}
    return names


def vanilla_channels(cluster: VanillaCluster, topic: str, patience: float = 30.0) -> set[str]:
    deadline = time.monotonic() + patience
    while True:
        names = asyncio.run(_vanilla_channels(cluster, topic))
        if not any(n.endswith("#ephemeral") for n in names) or time.monotonic() > deadline:
            return names
        time.sleep(0.2)


@pytest.mark.vanilla
def test_vanilla_tail_pub_defer_and_refusals(vanilla_cluster: VanillaCluster) -> None:
    address = vanilla_cluster.nodes[0].tcp_address
    topic = _name("tl_vanilla")
    # DPUB: the deferred message comes after the one published after it
    ok(nsq_ha("pub", "--nsqd", address, "--topic", topic, "--defer", "2", stdin=b"late\n"))
    ok(nsq_ha("pub", "--nsqd", address, "--topic", topic, stdin=b"early\n"))
    out = ok(tail("--nsqd", address, "--topic", topic, "-n", "2", "--format", "{body}"))
    assert out.split() == ["early", "late"]
    assert vanilla_channels(vanilla_cluster, topic) == set()

    # a durable channel, then --exit-at-end through vanilla nsqlookupd
    lookupd = vanilla_cluster.lookupd_http
    ok(nsq_ha("pub", "--nsqd", address, "--topic", topic, stdin=b"v1\nv2\nv3\n"))
    durable = ["--lookupd", lookupd, "--topic", topic, "--channel", "kept"]
    # the topic's first channel: vanilla hands it what the topic holds
    assert ok(tail(*durable, "--exit-at-end", "--format", "{body}")).split() == ["v1", "v2", "v3"]
    ok(nsq_ha("pub", "--nsqd", address, "--topic", topic, stdin=b"v4\nv5\n"))
    assert ok(tail(*durable, "--exit-at-end", "--format", "{body}")).split() == ["v4", "v5"]
    assert vanilla_channels(vanilla_cluster, topic) == {"kept"}

    refusals = {
        ("--from", "offset=5"): "needs the fork",
        ("--from", "timestamp=5"): "needs the fork",
        ("--from", "earliest"): "only messages published after it exists",
        ("--partition", "1"): "need the fork",
    }
    for extra, message in refusals.items():
        proc = tail("--lookupd", lookupd, "--topic", topic, "-n", "1", *extra)
        assert message in one_line_error(proc, 2), extra
    proc = tail("--nsqd", address, "--topic", topic, "--exit-at-end")
    assert "give --lookupd" in one_line_error(proc, 2)


# -- TLS and AUTH ---------------------------------------------------------------------------------

SECRET = "let-me-in-cli"  # noqa: S105 - the test auth server's secret


@pytest.fixture(scope="module")
def auth_server() -> Iterator[AuthServer]:
    with running_auth_server(SECRET) as auth:
        yield auth


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, nsqd's certificate and key, the CA file clients get, and the secret's file."""
    ca = trustme.CA()
    directory: Path = tmp_path_factory.mktemp("cli_tls")
    cert = ca.issue_cert("127.0.0.1")
    files = {
        "cert": directory / "server.pem",
        "key": directory / "server.key",
        "ca": directory / "ca.pem",
        "secret": directory / "secret.txt",
        "wrong": directory / "wrong.txt",
    }
    cert.cert_chain_pems[0].write_to_path(str(files["cert"]))
    cert.private_key_pem.write_to_path(str(files["key"]))
    ca.cert_pem.write_to_path(str(files["ca"]))
    files["secret"].write_text(SECRET + "\n")
    files["wrong"].write_text("not-the-secret\n")
    return files


@pytest.fixture(scope="module", params=["vanilla", "fork"])
def secure_lookupd(
    request: pytest.FixtureRequest, tls_files: dict[str, Path], auth_server: AuthServer
) -> Iterator[tuple[str, str]]:
    """(nsqlookupd URL, a topic) of a one-node cluster whose nsqd wants TLS-capable AUTH."""
    flags = [
        f"--tls-cert={tls_files['cert']}",
        f"--tls-key={tls_files['key']}",
        f"--auth-http-address={auth_server.address}",
    ]
    topic = _name("secure")
    if request.param == "vanilla":
        binaries = request.getfixturevalue("vanilla_binaries")
        with VanillaCluster(binaries, nsqd_args=flags, node_count=1) as vanilla:
            vanilla.create_topic(topic)
            yield vanilla.lookupd_http, topic
    else:
        if shutil.which("etcd") is None:
            pytest.skip("etcd is not on PATH (the fork's cluster needs it)")
        binaries = request.getfixturevalue("fork_binaries")
        with ForkCluster(binaries, nsqd_args=flags, node_count=1) as fork:
            fork.create_topic(topic, partitions=1, replicas=1)
            yield fork.lookupd_http, topic


def test_pub_and_tail_over_tls_with_auth(
    secure_lookupd: tuple[str, str], tls_files: dict[str, Path], auth_server: AuthServer
) -> None:
    lookupd, topic = secure_lookupd
    secure = ["--tls-ca", str(tls_files["ca"]), "--auth-secret-file", str(tls_files["secret"])]
    argv = ["--lookupd", lookupd, "--topic", topic, *secure]
    asked = len(auth_server.queries)
    assert summary_of(nsq_ha("pub", *argv, stdin=b"s1\ns2\ns3\n"))["published"] == 3
    out = ok(tail(*argv, "--deflate", "--exit-at-end", "--format", "{body}"))
    assert out.split() == ["s1", "s2", "s3"]
    assert summary_of(nsq_ha("pub", *argv, "--snappy", stdin=b"s4\n"))["published"] == 1
    new = auth_server.queries[asked:]
    assert new
    assert all(q.get("tls") == "true" and q.get("secret") == SECRET for q in new)

    # a wrong secret: refused, in one line, and the secret is in no output, even with --debug
    wrong = ["--tls-ca", str(tls_files["ca"]), "--auth-secret-file", str(tls_files["wrong"])]
    proc = nsq_ha("--debug", "pub", "--lookupd", lookupd, "--topic", topic, *wrong, stdin=b"x\n")
    assert proc.returncode == 1
    assert "not-the-secret" not in proc.stdout + proc.stderr
    # AUTH is sent only over TLS: without --tls the secret is not sent at all
    plain = ["--auth-secret-file", str(tls_files["secret"])]
    proc = nsq_ha("--debug", "pub", "--lookupd", lookupd, "--topic", topic, *plain, stdin=b"x\n")
    assert proc.returncode == 1
    assert SECRET not in proc.stdout + proc.stderr


def test_an_unreadable_secret_file_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.txt"
    proc = nsq_ha(
        "tail", "--lookupd", "http://127.0.0.1:1", "--topic", "t", "--auth-secret-file",
        str(missing),
    )  # fmt: skip
    line = one_line_error(proc, 2)
    assert f"cannot read --auth-secret-file {str(missing)!r}" in line
    assert "No such file" in line
