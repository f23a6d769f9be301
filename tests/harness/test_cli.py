"""The installed ``nsq-ha`` console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nsq_ha


def test_console_script_reports_its_version() -> None:
    exe = Path(sys.executable).with_name("nsq-ha")  # installed next to the venv's python
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"nsq-ha {nsq_ha.__version__}"


def test_without_a_command_it_shows_help_and_fails() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nsq_ha"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 2
    assert "servers" in out.stderr


def test_servers_rejects_unknown_recipes() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nsq_ha", "servers", "kafka"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2
    assert "unknown recipe(s) ['kafka']" in out.stderr


def test_devcluster_serves_until_interrupted() -> None:
    import signal

    import httpx

    argv = ["devcluster", "--nodes", "2", "--topic", "orders:4:2:ordered"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "nsq_ha", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith("ready in"):
                break
        lookupd = lines[0].split()[1]
        assert lines[0].startswith("lookupd http://127.0.0.1:")
        assert [line.split()[0] for line in lines[1:3]] == ["nsqd0", "nsqd1"]
        assert lines[3].startswith("topic orders partitions 4 leaders ")
        answer = httpx.get(
            f"{lookupd}/lookup",
            params={"topic": "orders", "access": "w", "metainfo": "true"},
            headers={"Accept": "application/vnd.nsq; version=1.0"},
        ).json()
        assert answer["meta"]["ordered"] is True
        assert sorted(answer["partitions"]) == ["0", "1", "2", "3"]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0, err
        assert out.strip().endswith("stopped")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_devcluster_rejects_a_bad_topic_spec() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nsq_ha", "devcluster", "--topic", "orders:4:2:sorted"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2
    assert "bad --topic 'orders:4:2:sorted'" in out.stderr


def _start_devcluster(*argv: str) -> tuple[subprocess.Popen[str], list[str]]:
    """Start ``nsq-ha devcluster`` and read its stdout up to the ready line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "nsq_ha", "devcluster", "--nodes", "1", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith("ready in") or len(lines) > 50:
            break
    return proc, lines


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    import signal

    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _port_is_free(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_devcluster_binds_the_usual_lookupd_port_and_prints_the_export_line() -> None:
    import pytest

    if not _port_is_free(4161):
        pytest.skip("127.0.0.1:4161 is taken by another program on this machine")
    proc, lines = _start_devcluster()
    try:
        assert lines[0] == "lookupd http://127.0.0.1:4161", lines
        assert "export NSQ_HA_LOOKUPD=http://127.0.0.1:4161" in lines, lines
    finally:
        _stop(proc)


def test_devcluster_takes_a_free_port_with_a_note_when_4161_is_taken() -> None:
    import socket

    holder = socket.socket()
    try:
        try:  # hold 4161; if another program already holds it, it is taken all the same
            holder.bind(("127.0.0.1", 4161))
            holder.listen()
        except OSError:
            pass
        proc, lines = _start_devcluster()
        try:
            assert lines[0].startswith("lookupd http://127.0.0.1:"), lines
            url = lines[0].split()[1]
            assert not url.endswith(":4161")
            assert f"export NSQ_HA_LOOKUPD={url}" in lines, lines
        finally:
            _out, err = _stop(proc)
        assert "4161 is taken" in err, err
    finally:
        holder.close()


def test_devcluster_fails_when_the_port_it_was_given_is_taken() -> None:
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "nsq_ha", "devcluster", "--lookupd-port", str(port)],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert out.returncode == 1
    assert f"port {port}" in out.stderr, out.stderr
    assert "--lookupd-port" in out.stderr, out.stderr
