"""One managed server process: start, wait for readiness, stop, and show its log when it fails.

Readiness is always a predicate polled until it holds (an HTTP ping, a cluster view), never a
fixed sleep; if the process exits first or the deadline passes, :class:`ServerStartError` carries
the tail of the process's log so a failed start explains itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

__all__ = ["ManagedProcess", "ServerStartError", "free_ports", "http_ok"]

log = logging.getLogger(__name__)

#: How many log lines a start failure shows.
LOG_TAIL_LINES = 40


class ServerStartError(RuntimeError):
    """A server process did not become ready (exited, or timed out); the message has its log."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback TCP ports that were free a moment ago."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def http_ok(url: str, *, expect: str | None = None, timeout: float = 1.0) -> bool:
    """True when ``GET url`` answers 200 (and, if given, a body containing ``expect``)."""
    try:
        resp = httpx.get(url, timeout=timeout)
    except httpx.HTTPError:
        return False
    return resp.status_code == 200 and (expect is None or expect in resp.text)


class ManagedProcess:
    """A child process with its output in ``<workdir>/<name>.log``.

    The process gets its own session (so a signal to it does not reach the test runner) and
    ``TMPDIR`` pointing into ``workdir`` (so nothing it writes outlives the cluster).
    """

    def __init__(self, name: str, argv: Sequence[str], workdir: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.workdir = workdir
        self.log_path = workdir / f"{name}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        if self._paused:
            state = "paused"
        pid = self._proc.pid if self._proc else None
        return f"<ManagedProcess {self.name} pid={pid} {state}>"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the process (appending to its log); a no-op if it is already running."""
        if self.running:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        tmp = self.workdir / "tmp"
        tmp.mkdir(exist_ok=True)
        env = dict(os.environ, TMPDIR=str(tmp))
        with self.log_path.open("ab") as logf:
            logf.write(f"\n=== start: {' '.join(self.argv)}\n".encode())
            logf.flush()
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
                start_new_session=True,
            )
        self._paused = False
        log.info("started %s (pid %d)", self.name, self._proc.pid)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the process's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def fail(self, what: str) -> ServerStartError:
        """An error about this process, with its log tail."""
        return ServerStartError(
            f"{self.name}: {what}\n--- last lines of {self.log_path} ---\n{self.log_tail()}"
        )

    def wait_until(
        self, ready: Callable[[], bool], what: str, timeout: float = 30.0, interval: float = 0.1
    ) -> None:
        """Poll ``ready()`` until true; raise with the log if the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                rc = self._proc.returncode if self._proc else None
                raise self.fail(f"exited (code {rc}) while waiting for {what}")
            if ready():
                return
            if time.monotonic() > deadline:
                raise self.fail(f"not ready after {timeout:.0f}s: {what}")
            time.sleep(interval)

    def pause(self) -> None:
        """SIGSTOP the process (fault injection)."""
        if self._proc is not None and self.running:
            os.kill(self._proc.pid, signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        """SIGCONT a paused process."""
        if self._proc is not None and self.running:
            os.kill(self._proc.pid, signal.SIGCONT)
        self._paused = False

    def stop(self, *, kill: bool = False, timeout: float = 15.0) -> None:
        """Stop gracefully (SIGTERM, then SIGKILL after ``timeout``) or at once with ``kill``."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self._paused:
                os.kill(proc.pid, signal.SIGCONT)
                self._paused = False
            proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.0fs; killing it", self.name, timeout)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=10)
        log.info("stopped %s (pid %d, code %s)", self.name, proc.pid, proc.returncode)
