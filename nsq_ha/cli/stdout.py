"""Printing to stdout without ever blocking the event loop: :class:`Stdout`.

A write to a pipe nobody reads blocks until someone does. Made on the event loop, such a write
stops everything, the loop's Ctrl-C handler included. So :class:`Stdout` hands each line to a
daemon thread of its own and the loop awaits the write like any other I/O: Ctrl-C still ends
the command, and a write that never completes is left to its thread (a daemon thread does not
hold the process at exit). What cannot block is written on the loop at once (a thread's round
trip costs ~70 µs a line, ten times the write): a line to a regular file, and a line of at most
``PIPE_BUF`` bytes to a pipe that has room for it.

A reader that goes away (``cmd | head -1``) is noticed on the next write (``EPIPE``), or at once
by a second thread that waits for the pipe's error condition (``poll``: ``POLLERR`` once the
read end is closed), so a command with nothing to print also learns of it. Then
:attr:`Stdout.gone` is set, nothing more is written, and file descriptor 1 points at
``/dev/null``: the interpreter's own flush of ``sys.stdout`` at exit finds no broken pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import select
import stat
import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Literal, Self, TextIO

__all__ = ["Stdout"]

_Job = tuple[bytes, "asyncio.Future[None]"]


class Stdout:
    """Lines to ``stream`` (default: ``sys.stdout``) from a thread; see the module docstring.

    ``async with Stdout() as out: if not await out.write("line\\n"): ...`` (False: the reader
    is gone). A stream without a file descriptor (a test's ``StringIO``) is written directly.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = sys.stdout if stream is None else stream
        self._fd = _fd_of(self._stream)
        self._encoding = getattr(self._stream, "encoding", None) or "utf-8"
        self._errors = getattr(self._stream, "errors", None) or "strict"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._wake: int | None = None  # the write end of the watcher's wake-up pipe
        self._queued = 0  # writes handed to the thread and not done yet
        self._closed = False
        #: where a write may be made on the loop: True (a regular file), a poll object (a
        #: pipe: room for one more line?), None (anything else: always the thread)
        self._room: select.poll | Literal[True] | None = None
        #: set once the reader went away; nothing is written after it
        self.gone = asyncio.Event()

    def __repr__(self) -> str:
        state = "gone" if self.gone.is_set() else "open" if self._loop else "new"
        return f"<Stdout fd={self._fd} {state}>"

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def start(self) -> None:
        """Start the writer thread (and the watcher, for a pipe or a socket)."""
        self._loop = asyncio.get_running_loop()
        if self._fd is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()  # what was printed before comes first
        fd = self._fd
        self._room = _room_of(fd)
        threading.Thread(
            target=self._write_jobs, args=(fd,), name="nsq_ha-stdout", daemon=True
        ).start()
        if _watchable(fd):
            wake_read, self._wake = os.pipe()
            threading.Thread(
                target=self._watch, args=(fd, wake_read), name="nsq_ha-stdout-watch", daemon=True
            ).start()

    def close(self) -> None:
        """Let the threads end (a write blocked on a reader that never reads stays blocked)."""
        self._closed = True  # the descriptor is the owner's again: no dup2 onto it any more
        self._jobs.put(None)
        if self._wake is not None:
            with contextlib.suppress(OSError):
                os.write(self._wake, b"x")
            os.close(self._wake)
            self._wake = None

    async def write(self, text: str) -> bool:
        """Write ``text`` whole; False once the reader is gone (``text`` may be cut short).

        Other write errors (a full disk) raise ``OSError``. Cancelled, the write goes on in its
        thread."""
        if self.gone.is_set():
            return False
        if self._fd is None or self._loop is None:
            try:
                self._stream.write(text)
                self._stream.flush()
            except BrokenPipeError:
                self._reader_left()
                return False
            return True
        data = text.encode(self._encoding, self._errors)
        try:
            data = self._write_now(self._fd, data)
        except BrokenPipeError:
            self._reader_left()
            return False
        if not data:
            return True
        done: asyncio.Future[None] = self._loop.create_future()
        self._queued += 1
        self._jobs.put((data, done))
        try:
            await done
        except BrokenPipeError:
            self._reader_left()
            return False
        return not self.gone.is_set()  # the watcher saw the reader go: it may have hit /dev/null

    def _write_now(self, fd: int, data: bytes) -> bytes:
        """Write what cannot block here, on the loop (a thread's round trip costs ~70 µs a
        line): to a regular file, or a line up to ``PIPE_BUF`` to a pipe with room for it
        (``POLLOUT``: a write that small is atomic, so it does not block); what is left."""
        room = self._room
        if self._queued or room is None:
            return data  # the thread writes what came before, or this is no pipe nor file
        if not isinstance(room, bool):  # a pipe
            if len(data) > select.PIPE_BUF:
                return data
            events = room.poll(0)
            if not events or events[0][1] != select.POLLOUT:
                return data
        try:
            return data[os.write(fd, data) :]
        except BlockingIOError:  # someone made the descriptor non-blocking
            return data

    # -- the threads --------------------------------------------------------------------------

    def _write_jobs(self, fd: int) -> None:
        while (job := self._jobs.get()) is not None:
            data, done = job
            error: OSError | None = None
            try:
                _write_all(fd, data)
            except OSError as exc:
                error = exc
            self._tell(self._settle, done, error)
            if isinstance(error, BrokenPipeError):
                return

    def _watch(self, fd: int, wake: int) -> None:
        try:
            poller = select.poll()
            poller.register(fd, 0)  # 0: only POLLERR, POLLHUP and POLLNVAL are reported
            poller.register(wake, select.POLLIN)
            events = dict(poller.poll())
        finally:
            os.close(wake)
        if wake not in events and events.get(fd, 0) & (select.POLLERR | select.POLLHUP):
            self._tell(self._reader_left)

    def _tell(self, callback: Callable[..., object], *args: object) -> None:
        """Run ``callback(*args)`` on the loop (unless the loop is gone: the command ended)."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(callback, *args)

    def _settle(self, done: asyncio.Future[None], error: OSError | None) -> None:
        self._queued -= 1
        if done.done():  # cancelled: nobody waits any more
            return
        if error is None:
            done.set_result(None)
        else:
            done.set_exception(error)

    def _reader_left(self) -> None:
        if self.gone.is_set():
            return
        self.gone.set()
        if self._fd is not None and not self._closed:
            with contextlib.suppress(OSError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self._fd)
                os.close(devnull)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:  # someone made the descriptor non-blocking: wait until writable
            select.select([], [fd], [])


def _fd_of(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return None


def _room_of(fd: int) -> select.poll | Literal[True] | None:
    """See :attr:`Stdout._room`."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return True
    if stat.S_ISFIFO(mode) and hasattr(select, "poll"):
        room = select.poll()
        room.register(fd, select.POLLOUT)
        return room
    return None


def _watchable(fd: int) -> bool:
    """A pipe or a socket (their error condition means the reader left) where ``poll`` is."""
    if not hasattr(select, "poll"):
        return False
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)
