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
