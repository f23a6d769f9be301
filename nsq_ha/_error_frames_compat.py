"""The old error-frame classmethods of :class:`~nsq_ha.errors.BrokerError`, kept for callers.

``BrokerError.from_frame`` / ``from_code`` / ``closes_connection`` / ``needs_reconnect`` were
how nsq_ha read error frames. The client now reads them in :mod:`nsq_ha.protocol.error_frames`
(through :class:`~nsq_ha.protocol.session.ClientSession`); :mod:`nsq_ha.errors` cannot import
that module (protocol imports errors), so this mixin keeps the old methods working with the same
answers, which ``tests/unit/test_session.py`` checks against the protocol functions. Nothing in
nsq_ha calls them: delete this module once the last callers move to the protocol functions.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["ErrorFrameCompat"]


def _name(command: bytes | None) -> bytes | None:
    """The command name of a name or whole command line."""
    return None if command is None else command.split(b"\n", 1)[0].split(b" ", 1)[0]


class ErrorFrameCompat:
    """Mixin of :class:`~nsq_ha.errors.BrokerError` with the old classmethods."""

    # what the error class provides
    fatal: bool
    nonfatal_after: ClassVar[frozenset[bytes]]
    vanilla_fatal: ClassVar[bool]
    class_for: ClassVar[Any]

    @classmethod
    def closes_connection(cls, after_command: bytes | None = None, *, fork: bool = True) -> bool:
        """Whether nsqd closes the connection after this error answered ``after_command``."""
        if not fork:
            return cls.vanilla_fatal
        return cls.fatal and _name(after_command) not in cls.nonfatal_after

    @classmethod
    def needs_reconnect(cls, after_command: bytes | None = None, *, fork: bool = True) -> bool:
        """Whether the client drops the connection: nsqd closes it, or the error answered
        ``MPUB_EXT`` (the stream is out of step, §2.15)."""
        if _name(after_command) == b"MPUB_EXT":
            return True
        return cls.closes_connection(after_command, fork=fork)

    @classmethod
    def from_code(
        cls,
        code: str,
        description: str = "",
        *,
        after_command: bytes | None = None,
        fork: bool = True,
    ) -> Any:
        """Build the registered class for ``code``, ``fatal`` from :meth:`closes_connection`."""
        error_cls = cls.class_for(code)
        return error_cls(
            code, description, fatal=error_cls.closes_connection(after_command, fork=fork)
        )

    @classmethod
    def from_frame(
        cls, data: bytes, *, after_command: bytes | None = None, fork: bool = True
    ) -> Any:
        """Parse an error frame's data (``message_id`` of FIN/REQ/TOUCH failures is not read:
        :func:`nsq_ha.protocol.error_frames.parse_error_frame` does that)."""
        text = data.decode("utf-8", errors="replace")
        code, _, description = text.partition(" ")
        if cls.class_for(text).wire_code == text:  # the connection-limit text has no code
            code, description = text, ""
        return cls.from_code(code, description, after_command=after_command, fork=fork)
