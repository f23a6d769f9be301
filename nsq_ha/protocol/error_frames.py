"""Error frames (§2.19): which error a frame is, and whether the connection survives it.

An error frame's data is ``<CODE> <description>`` (which may be empty: ``E_TOPIC_NOT_EXIST ``),
or nsqd's connection-limit text, which has no code. Whether nsqd then closes the connection
depends on the code, the failed command and the server kind, which the error classes carry
(``fatal``, ``nonfatal_after``, ``vanilla_fatal``). The client also drops it after any error
answering ``MPUB_EXT`` (:func:`must_drop`): nsqd raises its non-fatal header errors with the
rest of the body unread, then parses that body as commands (§2.15): the stream is out of step.
"""

from __future__ import annotations

import re

from nsq_ha.errors import BrokerError, MessageCommandError

#: nsqd's connection-limit error: plain text, no code.
TOO_MANY_CONNECTIONS = b"too much client connections"
#: Commands after whose failure the stream is out of step (§2.15), whatever the error.
OUT_OF_STEP_AFTER: frozenset[bytes] = frozenset({b"MPUB_EXT"})

# FIN/REQ/TOUCH failures print the id as a Go byte array on the fork ("[0 0 3 231 ...]") and as
# the 16 ASCII characters on vanilla.
_GO_BYTES_ID = re.compile(r"^\S+ \[((?:\d{1,3} ){15}\d{1,3})\]")
_ASCII_ID = re.compile(r"^\S+ (\S{16}) ")


def parse_error_frame(data: bytes) -> BrokerError:
    """Return the typed error for an error frame's data (``fatal`` is the class default): the
    code is the text before the first space; an unknown one gives a plain
    :class:`~nsq_ha.errors.BrokerError` that keeps it."""
    text = data.decode("utf-8", errors="replace")
    if data == TOO_MANY_CONNECTIONS:
        code, description = text, ""
    else:
        code, _, description = text.partition(" ")
    error = BrokerError.class_for(code)(code, description)
    if isinstance(error, MessageCommandError):
        error.message_id = message_id_in(description)
    return error


def message_id_in(description: str) -> bytes | None:
    """Return the 16-byte message id a FIN/REQ/TOUCH failure names, or ``None``."""
    match = _GO_BYTES_ID.match(description)
    if match is not None:
        values = [int(part) for part in match.group(1).split(" ")]
        return bytes(values) if all(value < 256 for value in values) else None
    match = _ASCII_ID.match(description)
    if match is not None:
        raw = match.group(1).encode("utf-8", errors="replace")
        return raw if len(raw) == 16 else None
    return None


def closes_connection(
    error_cls: type[BrokerError], command: bytes | None, *, fork: bool = True
) -> bool:
    """Say whether nsqd closes the connection after ``error_cls`` answered ``command`` (its
    name; ``None``, not known, gives the conservative answer); ``fork=False``: vanilla's rule."""
    if not fork:
        return error_cls.vanilla_fatal
    if command in error_cls.nonfatal_after:
        return False
    return error_cls.fatal


def must_drop(error_cls: type[BrokerError], command: bytes | None, *, fork: bool = True) -> bool:
    """Whether the client must drop the connection: nsqd closes it, or the stream is out of step."""
    if command in OUT_OF_STEP_AFTER:
        return True
    return closes_connection(error_cls, command, fork=fork)
