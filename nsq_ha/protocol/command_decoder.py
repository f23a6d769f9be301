"""Server side of the command stream: an incremental decoder of what clients send (§1.2).

Meant for an in-process broker and for tests. It follows nsqd's reading rules:

* lines split on single spaces (a double or trailing space yields an empty parameter) and one
  ``\\r`` before ``\\n`` is stripped, except for FIN/REQ/TOUCH;
* FIN, REQ and TOUCH are read by position because their 16-byte ids are binary (§2.5-§2.7),
  even after a bare name (``FIN\\n`` waits for the id, as nsqd does);
* bodies are ``[i32 size][bytes]``; a size ``<= 0`` or above ``max_body_size`` is reported on
  the command (``body`` is ``None``) and the decoder stops, as nsqd closes the connection;
* MPUB* bodies are read structurally (count, then each message), like nsqd, so a declared size
  that does not match the content still works.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn

from nsq_ha.errors import InvalidArgumentError, RemoteProtocolError

__all__ = [
    "BODY_COMMANDS",
    "ClientCommand",
    "CommandDecoder",
    "Magic",
    "split_ext_message",
    "split_mpub_body",
    "split_trace_message",
]

#: Commands followed by a length-prefixed body.
BODY_COMMANDS = frozenset(
    {
        b"IDENTIFY",
        b"AUTH",
        b"PUB",
        b"PUB_TRACE",
        b"PUB_EXT",
        b"MPUB",
        b"MPUB_TRACE",
        b"MPUB_EXT",
        b"DPUB",
    }
)
_BATCH_COMMANDS = frozenset({b"MPUB", b"MPUB_TRACE", b"MPUB_EXT"})
_I32 = struct.Struct(">i")
_U16 = struct.Struct(">H")
#: the commands read by position, each with the byte that may follow its name
_POSITIONAL = tuple(name + sep for name in (b"FIN", b"REQ", b"TOUCH") for sep in (b" ", b"\n"))
_MAX_LINE = 4096
_DEFAULT_MAX_BODY_SIZE = 5 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Magic:
    """The four bytes a client sent first (``b"  V2"`` when valid)."""

    data: bytes


@dataclass(frozen=True, slots=True)
class ClientCommand:
    """One decoded command: name, parameters and (for body commands) the body.

    ``declared_size`` is the body length field as sent; ``body`` is ``None`` when that size
    was refused, in which case no more commands follow.
    """

    name: bytes
    params: tuple[bytes, ...] = ()
    body: bytes | None = None
    declared_size: int | None = None
    #: why an MPUB* body was refused while reading it structurally: ``("count", n)``,
    #: ``("message_size", index, n)`` (n <= 0) or ``("message_too_big", index, n)``
    refusal: tuple[str, ...] | None = None

    @property
    def refused(self) -> bool:
        """True for a body command whose body was not read (bad size or MPUB structure)."""
        return self.declared_size is not None and self.body is None


class CommandDecoder:
    """Incremental decoder of a client's byte stream, for the nsqd side."""

    __slots__ = (
        "_buffer",
        "_error",
        "_need_magic",
        "body_commands",
        "body_limits",
        "body_wanted",
        "max_body_size",
        "max_message_size",
    )

    def __init__(
        self,
        *,
        expect_magic: bool = True,
        max_body_size: int = _DEFAULT_MAX_BODY_SIZE,
        body_limits: Mapping[bytes, int] | None = None,
        max_message_size: int | None = None,
        body_commands: frozenset[bytes] = BODY_COMMANDS,
        body_wanted: Callable[[bytes, tuple[bytes, ...]], bool] | None = None,
    ) -> None:
        """Create a decoder; ``expect_magic`` makes the first event a :class:`Magic`.

        ``max_body_size`` bounds every body unless ``body_limits`` names the command (nsqd
        bounds PUB bodies by its message size, the rest by its body size);
        ``max_message_size`` bounds each message inside an MPUB* body.  ``body_commands``
        names the commands followed by a body (the fork has no DPUB: pass the set without it).
        ``body_wanted(name, params)`` returning False makes a body command come out without its
        body being read (``declared_size`` None), as nsqd answers some parameter errors before
        reading the body.
        """
        if max_body_size < 1:
            raise InvalidArgumentError(f"max_body_size must be positive, got {max_body_size}")
        self.max_body_size = max_body_size
        self.body_limits = dict(body_limits or {})
        self.max_message_size = max_message_size
        self.body_commands = body_commands
        self.body_wanted = body_wanted
        self._need_magic = expect_magic
        self._buffer = bytearray()
        self._error: RemoteProtocolError | None = None

    def feed(self, data: bytes) -> list[Magic | ClientCommand]:
        """Append ``data`` and return every event now complete, in order."""
        if self._error is not None:
            raise self._error
        self._buffer += data
        events: list[Magic | ClientCommand] = []
        while (event := self._next()) is not None:
            events.append(event)
            if isinstance(event, ClientCommand) and event.refused:
                self._error = RemoteProtocolError("the stream stopped after a refused body")
                self._buffer.clear()
                break
        return events

    def receive(self, data: bytes) -> None:
        """Append ``data`` without decoding (then take events one by one with :meth:`pop`)."""
        if self._error is not None:
            raise self._error
        self._buffer += data

    def pop(self) -> Magic | ClientCommand | None:
        """The next complete event, or None when more bytes are needed.

        One at a time, so a server can act on a command (e.g. :meth:`unread` part of its
        body) before the bytes after it are decoded.
        """
        if self._error is not None:
            raise self._error
        event = self._next()
        if isinstance(event, ClientCommand) and event.refused:
            self._error = RemoteProtocolError("the stream stopped after a refused body")
            self._buffer.clear()
        return event

    def unread(self, data: bytes) -> None:
        """Put ``data`` back in front of the unread bytes (a server that stopped reading a
        body half-way and parses the rest as commands, as nsqd does after some MPUB_EXT
        errors)."""
        self._buffer[:0] = data

    def _fail(self, reason: str) -> NoReturn:
        """Remember the error and raise it."""
        self._error = RemoteProtocolError(reason)
        self._buffer.clear()
        raise self._error

    def _next(self) -> Magic | ClientCommand | None:
        """Decode one event from the buffer, or return None if more bytes are needed."""
        buffer = self._buffer
        if self._need_magic:
            if len(buffer) < 4:
                return None
            magic = bytes(buffer[:4])
            del buffer[:4]
            self._need_magic = False
            return Magic(magic)
        if buffer[20:21] == b"\n" and buffer.startswith(b"FIN "):
            # the most frequent command, in its only valid form: what _positional makes of it
            command = ClientCommand(b"FIN", (bytes(buffer[4:20]),))
            del buffer[:21]
            return command
        if buffer.startswith(_POSITIONAL):
            return self._positional()
        newline = buffer.find(b"\n")
        if newline < 0:
            self._check_line_length(b"command")
            return None
        line = bytes(buffer[:newline])
        line = line.removesuffix(b"\r")
        name, *params = line.split(b" ")
        if name not in self.body_commands or (
            self.body_wanted is not None and not self.body_wanted(name, tuple(params))
        ):
            del buffer[: newline + 1]
            return ClientCommand(name, tuple(params))
        return self._with_body(newline + 1, name, tuple(params))

    def _check_line_length(self, what: bytes) -> None:
        """Fail once an unfinished line is longer than any valid command line."""
        if len(self._buffer) > _MAX_LINE:
            self._fail(f"{what.decode()} line longer than {_MAX_LINE} bytes")

    def _positional(self) -> ClientCommand | None:
        """Decode FIN/REQ/TOUCH, whose 16-byte id may contain spaces and newlines. The byte
        after the name is skipped whatever it is: a bare ``FIN\n`` waits for the id after it,
        as nsqd does."""
        buffer = self._buffer
        name = next(p[:-1] for p in _POSITIONAL if buffer.startswith(p))
        id_start = len(name) + 1
        id_end = id_start + 16
        if name == b"TOUCH":
            # When the first line ends inside the id, nsqd reads exactly the missing bytes.
            first = buffer.find(b"\n")
            if first < 0:
                self._check_line_length(name)
                return None
            end = first + 1 if first >= id_end else id_end + 1
            if len(buffer) < end:
                return None
            command = ClientCommand(name, (bytes(buffer[id_start:id_end]),))
            del buffer[:end]
            return command
        newline = buffer.find(b"\n", id_end)
        if newline < 0:
            self._check_line_length(name)
            return None
        params: tuple[bytes, ...] = (bytes(buffer[id_start:id_end]),)
        if name == b"REQ" and newline > id_end:  # ``REQ <id>\n``: no timeout at all
            params += (bytes(buffer[id_end + 1 : newline]),)
        del buffer[: newline + 1]
        return ClientCommand(name, params)

    def _with_body(
        self, start: int, name: bytes, params: tuple[bytes, ...]
    ) -> ClientCommand | None:
        """Decode a body command whose line ends at ``start``."""
        buffer = self._buffer
        if len(buffer) < start + 4:
            return None
        (declared,) = _I32.unpack_from(buffer, start)
        if declared <= 0 or declared > self.body_limits.get(name, self.max_body_size):
            del buffer[: start + 4]
            return ClientCommand(name, params, None, declared)
        body_start = start + 4
        if name in _BATCH_COMMANDS:
            end = _batch_end(buffer, body_start, self.max_body_size, self.max_message_size)
            if end is None:
                return None
            if isinstance(end, tuple):
                del buffer[:body_start]
                return ClientCommand(name, params, None, declared, end)
        else:
            end = body_start + declared
            if len(buffer) < end:
                return None
        command = ClientCommand(name, params, bytes(buffer[body_start:end]), declared)
        del buffer[:end]
        return command


def _batch_end(
    buffer: bytearray, start: int, max_body_size: int, max_message_size: int | None
) -> int | tuple[str, ...] | None:
    """Return where a structurally read MPUB body ends, None if incomplete, or why it is
    invalid (the ``refusal`` of :class:`ClientCommand`)."""
    if len(buffer) < start + 4:
        return None
    (count,) = _I32.unpack_from(buffer, start)
    if count <= 0 or count > (max_body_size - 4) // 5:
        return ("count", str(count))
    position = start + 4
    for index in range(count):
        if len(buffer) < position + 4:
            return None
        (size,) = _I32.unpack_from(buffer, position)
        if size <= 0:
            return ("message_size", str(index), str(size))
        if max_message_size is not None and size > max_message_size:
            return ("message_too_big", str(index), str(size))
        position += 4 + size
    return position if len(buffer) >= position else None


def split_mpub_body(body: bytes) -> list[bytes]:
    """Split an MPUB* body ``[u32 count]{[u32 len][msg]}`` into its messages."""
    if len(body) < 4:
        raise RemoteProtocolError("MPUB body is shorter than its message count")
    (count,) = _I32.unpack_from(body)
    if count <= 0:
        raise RemoteProtocolError(f"MPUB invalid message count {count}")
    messages: list[bytes] = []
    position = 4
    for index in range(count):
        if len(body) < position + 4:
            raise RemoteProtocolError(f"MPUB body ends before message({index}) size")
        (size,) = _I32.unpack_from(body, position)
        position += 4
        if size <= 0 or len(body) < position + size:
            raise RemoteProtocolError(f"MPUB invalid message({index}) body size {size}")
        messages.append(body[position : position + size])
        position += size
    if position != len(body):
        raise RemoteProtocolError(f"MPUB body has {len(body) - position} trailing bytes")
    return messages


def split_trace_message(data: bytes) -> tuple[int, bytes]:
    """Split a PUB_TRACE/MPUB_TRACE message into ``(trace_id, body)``."""
    if len(data) <= 8:
        raise RemoteProtocolError(f"invalid body size {len(data)} with trace id enabled")
    return int.from_bytes(data[:8], "big"), data[8:]


def split_ext_message(data: bytes) -> tuple[bytes, bytes]:
    """Split a PUB_EXT/MPUB_EXT message into ``(json_header, body)``."""
    if len(data) <= 2:
        raise RemoteProtocolError(f"invalid body size {len(data)} with ext json header enabled")
    (length,) = _U16.unpack_from(data)
    if len(data) <= 2 + length:
        raise RemoteProtocolError(
            f"invalid body size {len(data)} in ext json header content length"
        )
    return data[2 : 2 + length], data[2 + length :]
