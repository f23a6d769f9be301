"""The records ``nsq-ha pub`` reads: stdin or files split into lines, ``--delimiter``-separated
pieces or whole files, in bounded memory and linear time, by a reader Ctrl-C does not wait for.

:class:`RecordSplitter` is sans-IO: bytes in, records out. It keeps the position up to which
the buffer holds no delimiter, so a record that is long in coming is scanned once, not again
at every read; and it holds at most ``max_size`` bytes of one record: a longer record becomes an
:class:`Oversized` verdict and is skipped up to the next delimiter.

:class:`ChunkReader` reads in a daemon thread of its own (``os.read`` on the file descriptor),
never in the event loop's executor: a read blocked on a stdin that stays open
(``tail -f log | nsq-ha pub``) would hold the interpreter's exit until stdin closed. At most
:data:`DEPTH` chunks wait between the thread and the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import BinaryIO

__all__ = [
    "CHUNK",
    "DEPTH",
    "ChunkReader",
    "Oversized",
    "Piece",
    "RecordSplitter",
    "read_records",
]

#: bytes read at once
CHUNK = 64 * 1024
#: chunks read ahead of the records handed out
DEPTH = 4


@dataclass(frozen=True, slots=True)
class Oversized:
    """A record over the size limit: skipped, not held. ``size`` is its length in bytes."""

    size: int
    limit: int


Piece = bytes | Oversized


class RecordSplitter:
    """Split a byte stream into records: ``delimiter``-separated (with ``b"\\n"``, a line's
    ``\\r\\n`` counts as its end), or the whole stream as one record with ``None``. A last record
    without the delimiter still counts; a delimiter at the very end adds no empty record.

    Feeding N bytes costs O(N): each byte is searched for the delimiter once (plus
    ``len(delimiter) - 1`` bytes again per chunk, where a delimiter may straddle two chunks).
    :attr:`scanned` counts the bytes searched. At most ``max_size`` bytes of a record (and one
    chunk) are held: a longer record is dropped as it comes and reported as :class:`Oversized`.
    """

    def __init__(self, delimiter: bytes | None, max_size: int) -> None:
        if delimiter is not None and not delimiter:
            raise ValueError("the delimiter must not be empty")
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, got {max_size}")
        self._delimiter = delimiter
        self._lines = delimiter == b"\n"
        self._max = max_size
        #: the longest record held: a line may carry a ``\r`` beyond the limit
        self._hold = max_size + (1 if self._lines else 0)
        self._buffer = bytearray()
        #: ``self._buffer[:self._scan]`` holds no delimiter
        self._scan = 0
        #: bytes of an oversized record dropped so far (None: not skipping)
        self._skipped: int | None = None
        #: the last byte dropped of that record (a line's ``\r`` is not counted in its size)
        self._dropped_last = b""
        #: bytes searched for the delimiter so far
        self.scanned = 0

    @property
    def buffered(self) -> int:
        """Bytes held now (the start of the next record)."""
        return len(self._buffer)

    def feed(self, chunk: bytes) -> list[Piece]:
        """The records that ``chunk`` completes."""
        buffer = self._buffer
        buffer += chunk
        if self._delimiter is None:
            if self._skipped is not None or len(buffer) > self._max:
                self._skipped = (self._skipped or 0) + len(buffer)
                buffer.clear()
            return []
        pieces: list[Piece] = []
        delimiter, width = self._delimiter, len(self._delimiter)
        start, scan = 0, self._scan
        while (found := buffer.find(delimiter, scan)) >= 0:
            self.scanned += found + width - scan
            if self._skipped is not None:
                pieces.append(self._oversized(found - start, bytes(buffer[found - 1 : found])))
            else:
                pieces.append(self._record(bytes(buffer[start:found])))
            start = scan = found + width
        self.scanned += len(buffer) - scan
        # no delimiter starts before ``resume``: only a delimiter's head may end the buffer
        resume = max(start, len(buffer) - (width - 1))
        if self._skipped is None and resume - start > self._hold:
            self._skipped = 0
        if self._skipped is not None and resume > start:
            self._skipped += resume - start
            self._dropped_last = bytes(buffer[resume - 1 : resume])
            start = resume
        del buffer[:start]
        self._scan = resume - start
        return pieces

    def end(self) -> list[Piece]:
        """The last record, once the stream has ended (the splitter is then empty)."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        self._scan = 0
        if self._skipped is not None:
            return [self._oversized(len(rest), rest[-1:])]
        if self._delimiter is None:
            return [rest]
        return [self._record(rest)] if rest else []

    def _oversized(self, more: int, last: bytes) -> Oversized:
        """The verdict on the record being skipped, ending ``more`` bytes (the last one
        ``last``, unless ``more`` is 0) after what was dropped."""
        size = (self._skipped or 0) + more
        last = last if more else self._dropped_last
        self._skipped = None
        self._dropped_last = b""
        return Oversized(size - 1 if self._lines and last == b"\r" else size, self._max)

    def _record(self, record: bytes) -> Piece:
        if self._lines and record.endswith(b"\r"):
            record = record[:-1]
        return record if len(record) <= self._max else Oversized(len(record), self._max)


def _raw_reader(stream: BinaryIO) -> Callable[[int], bytes]:
    """``os.read`` on the stream's descriptor (no lock a blocked read would hold at exit), or
    the stream's own read for one without a descriptor (an in-memory stream)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        read: Callable[[int], bytes] = getattr(stream, "read1", stream.read)
        return read
    return lambda size: os.read(fd, size)


class ChunkReader:
    """Chunks of ``stream`` read by a daemon thread; ``b""`` at its end.

    The thread reads at most :data:`DEPTH` chunks ahead. A read that is still blocked when the
    command ends is abandoned (the thread is a daemon and holds no lock); with ``close``, the
    thread closes the stream once its last read returned.
    """

    def __init__(self, stream: BinaryIO, *, close: bool = False) -> None:
        self._stream = stream
        self._read = _raw_reader(stream)
        self._close = close
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
        self._room = threading.Semaphore(DEPTH)
        self._abandoned = False
        self._thread = threading.Thread(target=self._run, name="nsq-ha-reader", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<ChunkReader ready={self._queue.qsize()} abandoned={self._abandoned}>"

    def _run(self) -> None:
        try:
            while self._room.acquire() and not self._abandoned:
                try:
                    chunk = self._read(CHUNK)
                except BaseException as exc:  # handed to the reading task, raised there
                    self._hand(exc)
                    return
                if not self._hand(chunk) or not chunk:
                    return
        finally:
            if self._close:
                with contextlib.suppress(OSError, ValueError):
                    self._stream.close()

    def _hand(self, item: bytes | BaseException) -> bool:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody reads any more
            return False
        return True

    def ready(self) -> bool:
        """A chunk (or the end) is waiting: :meth:`next` returns without waiting."""
        return not self._queue.empty()

    async def next(self, stop: asyncio.Event | None = None) -> bytes | None:
        """The next chunk (``b""``: the end), or ``None`` once ``stop`` is set."""
        if stop is not None and stop.is_set():
            return None
        if self._queue.empty() and stop is not None:
            getter = asyncio.ensure_future(self._queue.get())
            stopper = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if getter not in done:
                getter.cancel()
                return None
            item = getter.result()
        else:
            item = await self._queue.get()
        self._room.release()
        if isinstance(item, BaseException):
            raise item
        return item

    def abandon(self) -> None:
        """Read no further: the thread ends after the read it is in (if any)."""
        self._abandoned = True
        self._room.release()


async def read_records(
    stream: BinaryIO,
    delimiter: bytes | None,
    *,
    max_size: int,
    stop: asyncio.Event | None = None,
    on_idle: Callable[[], Awaitable[None]] | None = None,
    close: bool = False,
) -> AsyncGenerator[Piece, None]:
    """The records of ``stream`` (see :class:`RecordSplitter`), each ``bytes`` or
    :class:`Oversized`. Nothing more once ``stop`` is set, even while a read waits for input.
    ``on_idle`` is awaited whenever the next record has to wait for input (``nsq-ha pub``
    publishes what it holds then). With ``close``, the stream is closed after its last read."""
    splitter = RecordSplitter(delimiter, max_size)
    reader = ChunkReader(stream, close=close)
    try:
        while True:
            if on_idle is not None and not reader.ready():
                await on_idle()
            chunk = await reader.next(stop)
            if chunk is None:
                return
            for piece in splitter.feed(chunk) if chunk else splitter.end():
                if stop is not None and stop.is_set():
                    return
                yield piece
            if not chunk:
                return
    finally:
        reader.abandon()
