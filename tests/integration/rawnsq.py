"""A deliberately tiny raw-socket NSQ speaker for the harness smoke tests.

It proves the servers the suite starts are real and reachable without depending on the client
under test: bytes are written as PROTOCOL.md §1-2 lays them out and frames read back by hand.
"""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import dataclass

FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE = 0, 1, 2


@dataclass
class RawMessage:
    timestamp: int
    attempts: int
    id: bytes
    body: bytes


class RawConn:
    """One TCP connection to nsqd speaking protocol V2."""

    def __init__(self, address: str, timeout: float = 10.0) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.sendall(b"  V2")

    def close(self) -> None:
        self.sock.close()

    def _recv_exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"server closed the connection ({len(buf)}/{n} bytes read)")
            buf += chunk
        return buf

    def read_frame(self) -> tuple[int, bytes]:
        """The next frame that is not a heartbeat (heartbeats are answered with NOP)."""
        while True:
            size, ftype = struct.unpack(">iI", self._recv_exact(8))
            data = self._recv_exact(size - 4)
            if ftype == FRAME_RESPONSE and data == b"_heartbeat_":
                self.sock.sendall(b"NOP\n")
                continue
            return ftype, data

    def expect_ok(self) -> None:
        ftype, data = self.read_frame()
        if (ftype, data) != (FRAME_RESPONSE, b"OK"):
            raise AssertionError(f"expected OK, got frame type {ftype}: {data!r}")

    def identify(self, **fields: object) -> bytes:
        body = json.dumps({"client_id": "nsq_ha-smoke", **fields}).encode()
        self.sock.sendall(b"IDENTIFY\n" + struct.pack(">I", len(body)) + body)
        ftype, data = self.read_frame()
        assert ftype == FRAME_RESPONSE, data
        return data

    def command(self, line: str, body: bytes | None = None) -> None:
        payload = line.encode() + b"\n"
        if body is not None:
            payload += struct.pack(">I", len(body)) + body
        self.sock.sendall(payload)

    def pub(self, topic: str, body: bytes, partition: int | None = None) -> None:
        line = f"PUB {topic}" + ("" if partition is None else f" {partition}")
        self.command(line, body)
        self.expect_ok()

    def sub(self, topic: str, channel: str, partition: int | None = None) -> None:
        line = f"SUB {topic} {channel}" + ("" if partition is None else f" {partition}")
        self.command(line)
        self.expect_ok()

    def read_message(self) -> RawMessage:
        ftype, data = self.read_frame()
        if ftype != FRAME_MESSAGE:
            raise AssertionError(f"expected a message, got frame type {ftype}: {data!r}")
        ts, attempts = struct.unpack(">qH", data[:10])
        return RawMessage(ts, attempts, data[10:26], data[26:])

    def fin(self, msg_id: bytes) -> None:
        self.sock.sendall(b"FIN " + msg_id + b"\n")

    def close_cleanly(self) -> None:
        """CLS and expect CLOSE_WAIT: any error left by an earlier FIN would come first."""
        self.command("CLS")
        ftype, data = self.read_frame()
        if (ftype, data) != (FRAME_RESPONSE, b"CLOSE_WAIT"):
            raise AssertionError(f"expected CLOSE_WAIT, got frame type {ftype}: {data!r}")
        self.close()
