"""Process management against the real vanilla binaries: failed starts, clean teardown."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from nsq_ha.testing.build import ServerBinaries
from nsq_ha.testing.process import ManagedProcess, ServerStartError, free_ports
from nsq_ha.testing.servers import VanillaCluster


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_free_ports_are_distinct() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20
    assert all(1024 < p < 65536 for p in ports)


def test_a_failed_start_shows_the_server_log(
    vanilla_binaries: ServerBinaries, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [
            str(vanilla_binaries.nsqlookupd),
            f"--http-address=127.0.0.1:{port}",
            "--tcp-address=127.0.0.1:0",
        ]
        proc = ManagedProcess("lookupd-bad", argv, tmp_path)
        proc.start()
        with pytest.raises(ServerStartError) as exc:
            proc.wait_until(lambda: False, "never", timeout=10)
    text = str(exc.value)
    assert "lookupd-bad: exited (code 1) while waiting for never" in text
    assert f"127.0.0.1:{port}" in text
    assert "address already in use" in text


def test_readiness_timeout_shows_the_server_log(
    vanilla_binaries: ServerBinaries, tmp_path: Path
) -> None:
    (port,) = free_ports(1)
    argv = [
        str(vanilla_binaries.nsqlookupd),
        f"--http-address=127.0.0.1:{port}",
        "--tcp-address=127.0.0.1:0",
    ]
    proc = ManagedProcess("lookupd-slow", argv, tmp_path)
    proc.start()
    try:
        with pytest.raises(ServerStartError, match="not ready after 1s: a thing that never"):
            proc.wait_until(lambda: False, "a thing that never happens", timeout=1)
    finally:
        proc.stop()
    assert not proc.running


def test_cluster_teardown_leaves_no_process_or_directory(vanilla_binaries: ServerBinaries) -> None:
    with VanillaCluster(vanilla_binaries) as cluster:
        pids = [p.pid for p in cluster.processes]
        base = cluster.base_dir
        assert base.is_dir()
        assert all(pid is not None and _alive(pid) for pid in pids)
    assert not base.exists()
    assert not any(pid is not None and _alive(pid) for pid in pids)


def test_pause_and_resume_are_undone_by_stop(
    vanilla_binaries: ServerBinaries, tmp_path: Path
) -> None:
    proc = ManagedProcess(
        "nsqd-paused",
        [
            str(vanilla_binaries.nsqlookupd),
            "--http-address=127.0.0.1:0",
            "--tcp-address=127.0.0.1:0",
        ],
        tmp_path,
    )
    proc.start()
    proc.pause()
    assert "paused" in repr(proc)
    proc.stop(timeout=5)  # a paused process still stops (SIGCONT before SIGTERM)
    assert not proc.running
