"""A raw-socket NSQ V2 speaker for the conformance cases.

It writes exactly the bytes a case asks for and reads frames back by hand (PROTOCOL.md §1),
so the cases judge the *servers*, never nsq_ha's own client code.  Reads are bounded by a
timeout; a server close is reported as such (:meth:`Wire.expect_closed`), and so is silence
(:meth:`Wire.expect_silence`).
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

MAGIC_V2 = b"  V2"
FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE = 0, 1, 2
HEARTBEAT = b"_heartbeat_"
OK = b"OK"
CLOSE_WAIT = b"CLOSE_WAIT"

#: the default wait for an expected frame (the fork flushes after at most 50 ms)
READ_TIMEOUT = 5.0


class ServerClosed(ConnectionError):
    """The server closed the connection while a frame was expected."""


class NoFrame(TimeoutError):
    """No (non-heartbeat) frame arrived within the timeout."""


@dataclass(frozen=True)
class Frame:
    """One server-to-client frame."""

    type: int
    data: bytes

    @property
    def raw(self) -> bytes:
        """The frame exactly as on the wire: ``[u32 size][i32 type][data]``."""
        return frame_bytes(self.type, self.data)

    def __repr__(self) -> str:
        kind = {0: "response", 1: "error", 2: "message"}.get(self.type, str(self.type))
        return f"Frame({kind}, {self.data!r})"


def frame_bytes(ftype: int, data: bytes) -> bytes:
    """``[u32 4+len][i32 type][data]`` (PROTOCOL.md §1.3)."""
    return struct.pack(">Ii", 4 + len(data), ftype) + data


def error_frame(text: str | bytes) -> bytes:
    """The exact bytes of an error frame."""
    return frame_bytes(FRAME_ERROR, text.encode() if isinstance(text, str) else text)


def response_frame(data: bytes) -> bytes:
    """The exact bytes of a response frame."""
    return frame_bytes(FRAME_RESPONSE, data)


def go_bytes(data: bytes) -> str:
    """``data`` printed as a Go byte slice: ``[0 0 3 231]``."""
    return "[" + " ".join(str(b) for b in data) + "]"


def fork_id(internal_id: int, trace_id: int = 0) -> bytes:
    """The fork's 16-byte message id: u64 internal id + u64 trace id (PROTOCOL.md §4.1)."""
    return struct.pack(">QQ", internal_id, trace_id)


def traced_answer(internal_id: int, trace_id: int, offset: int, raw_size: int) -> bytes:
    """The 30-byte traced publish answer (PROTOCOL.md §2.16)."""
    return OK + struct.pack(">QQQI", internal_id, trace_id, offset, raw_size)


@dataclass(frozen=True)
class Traced:
    """A decoded traced publish answer."""

    internal_id: int
    trace_id: int
    offset: int
    raw_size: int

    @classmethod
    def parse(cls, data: bytes) -> Traced:
        assert len(data) == 30, f"not a traced answer: {data!r}"
        assert data[:2] == OK, f"not a traced answer: {data!r}"
        return cls(*struct.unpack(">QQQI", data[2:]))

    @property
    def id(self) -> bytes:
        return fork_id(self.internal_id, self.trace_id)


@dataclass(frozen=True)
class Message:
    """A decoded message frame (PROTOCOL.md §4.2)."""

    data: bytes
    timestamp: int
    attempts: int
    id: bytes
    internal_id: int
    trace_id: int
    ext_version: int | None
    ext: bytes
    offset: int | None
    raw_size: int | None
    body: bytes

    @classmethod
    def parse(cls, data: bytes, *, ext: bool = False, detail: bool = False) -> Message:
        """Decode ``data`` given the two connection flags (ext part, detail part)."""
        timestamp, attempts = struct.unpack(">qH", data[:10])
        msg_id = data[10:26]
        internal_id, trace_id = struct.unpack(">QQ", msg_id)
        pos = 26
        ext_version: int | None = None
        ext_bytes = b""
        if ext:
            ext_version = data[pos]
            pos += 1
            if ext_version != 0:
                (length,) = struct.unpack(">H", data[pos : pos + 2])
                ext_bytes = data[pos + 2 : pos + 2 + length]
                pos += 2 + length
        offset = raw_size = None
        if detail:
            offset, raw_size = struct.unpack(">QI", data[pos : pos + 12])
            pos += 12
        return cls(
            data,
            timestamp,
            attempts,
            msg_id,
            internal_id,
            trace_id,
            ext_version,
            ext_bytes,
            offset,
            raw_size,
            data[pos:],
        )


def message_data(
    *,
    attempts: int,
    internal_id: int,
    trace_id: int,
    body: bytes,
    ext: tuple[int, bytes] | None = None,
    detail: tuple[int, int] | None = None,
    timestamp: int = 0,
) -> bytes:
    """Build a message frame's data as the fork lays it out (ext part, then detail, then
    body); compare with :func:`mask_timestamp` applied to the received data."""
    out = struct.pack(">qH", timestamp, attempts) + fork_id(internal_id, trace_id)
    if ext is not None:
        version, header = ext
        out += bytes([version])
        if version != 0:
            out += struct.pack(">H", len(header)) + header
    if detail is not None:
        out += struct.pack(">QI", *detail)
    return out + body


def mask_timestamp(data: bytes) -> bytes:
    """The message data with its 8 timestamp bytes zeroed (they vary run to run)."""
    return bytes(8) + data[8:]


class Wire:
    """One TCP connection to an nsqd, speaking raw bytes.

    Use it as a context manager so the socket is always closed.  ``magic`` is sent on
    connect unless ``None``.
    """

    def __init__(
        self, address: str, *, magic: bytes | None = MAGIC_V2, timeout: float = READ_TIMEOUT
    ) -> None:
        host, port = address.rsplit(":", 1)
        self.address = address
        self.timeout = timeout
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self._buf = bytearray()
        self.closed_by_server = False
        self.heartbeats = 0
        if magic is not None:
            self.send(magic)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def __repr__(self) -> str:
        return f"<Wire {self.address}>"

    # -- writing ------------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Write ``data`` exactly."""
        self.sock.sendall(data)

    def command(self, line: str | bytes, body: bytes | None = None) -> None:
        """Write ``line`` + ``\\n`` and, when given, ``[u32 len][body]``."""
        payload = (line.encode() if isinstance(line, str) else line) + b"\n"
        if body is not None:
            payload += struct.pack(">I", len(body)) + body
        self.send(payload)

    def identify_body(self, fields: dict[str, Any]) -> None:
        """Write an IDENTIFY with ``fields`` as its JSON body."""
        self.command("IDENTIFY", json.dumps(fields).encode())

    # -- reading ------------------------------------------------------------------------------

    def _fill(self, deadline: float) -> bool:
        """Read more bytes into the buffer; False on EOF; NoFrame at the deadline."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise NoFrame("timed out")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            raise NoFrame("timed out") from None
        except (ConnectionResetError, ConnectionAbortedError):
            chunk = b""
        if not chunk:
            self.closed_by_server = True
            return False
        self._buf += chunk
        return True

    def recv_raw(self, timeout: float | None = None) -> bytes:
        """Whatever bytes arrive next (at least one), for compressed streams; b"" on EOF."""
        if self._buf:
            data = bytes(self._buf)
            self._buf.clear()
            return data
        if not self._fill(time.monotonic() + (self.timeout if timeout is None else timeout)):
            return b""
        data = bytes(self._buf)
        self._buf.clear()
        return data

    def read_frame(self, timeout: float | None = None, *, heartbeats: bool = False) -> Frame:
        """The next frame; ``_heartbeat_`` frames are skipped unless ``heartbeats``.

        Raises :class:`NoFrame` after ``timeout`` and :class:`ServerClosed` on EOF.
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            while len(self._buf) < 4 or len(self._buf) < 4 + _size(self._buf):
                if not self._fill(deadline):
                    raise ServerClosed(f"server closed the connection ({bytes(self._buf)!r} left)")
            size = _size(self._buf)
            (ftype,) = struct.unpack(">i", self._buf[4:8])
            frame = Frame(ftype, bytes(self._buf[8 : 4 + size]))
            del self._buf[: 4 + size]
            if frame.type == FRAME_RESPONSE and frame.data == HEARTBEAT:
                self.heartbeats += 1
                if not heartbeats:
                    continue
            return frame

    def read_raw_frame(self, timeout: float | None = None) -> bytes:
        """The next non-heartbeat frame's exact bytes."""
        return self.read_frame(timeout).raw

    def read_message(
        self, *, ext: bool = False, detail: bool = False, timeout: float | None = None
    ) -> Message:
        """The next frame, which must be a message."""
        frame = self.read_frame(timeout)
        assert frame.type == FRAME_MESSAGE, f"expected a message, got {frame!r}"
        return Message.parse(frame.data, ext=ext, detail=detail)

    # -- expectations -------------------------------------------------------------------------

    def expect(self, raw: bytes, timeout: float | None = None) -> None:
        """The next frame is exactly ``raw`` (size, type and data)."""
        got = self.read_raw_frame(timeout)
        assert got == raw, f"expected {raw!r}, got {got!r}"

    def expect_ok(self) -> None:
        self.expect(response_frame(OK))

    def expect_error(self, text: str | bytes) -> None:
        """The next frame is the error frame with exactly this text."""
        self.expect(error_frame(text))

    def expect_closed(self, timeout: float = READ_TIMEOUT) -> None:
        """The server closes the connection without sending another (non-heartbeat) frame."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                frame = self.read_frame(max(0.0, deadline - time.monotonic()) or 0.001)
            except ServerClosed:
                assert not self._buf, f"partial frame before close: {bytes(self._buf)!r}"
                return
            except NoFrame:
                raise AssertionError(f"connection still open after {timeout}s") from None
            raise AssertionError(f"expected the server to close, got {frame!r}")

    def expect_silence(self, timeout: float = 1.0) -> None:
        """No (non-heartbeat) frame within ``timeout`` and the connection stays open."""
        with contextlib.suppress(NoFrame):
            frame = self.read_frame(timeout)
            raise AssertionError(f"expected no frame within {timeout}s, got {frame!r}")
        assert not self.closed_by_server, "server closed the connection"

    def expect_error_then_closed(self, text: str | bytes) -> None:
        """A fatal error (PROTOCOL.md §0 "F"): the error frame, then EOF."""
        self.expect_error(text)
        self.expect_closed()


def _size(buf: bytearray) -> int:
    (size,) = struct.unpack(">I", buf[:4])
    return int(size)
