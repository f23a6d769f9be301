"""What nsqd's refusals teach about a batch (pure: no I/O).

nsqd does not announce its ``--max-msg-size`` / ``--max-body-size`` (the IDENTIFY answer has
neither), and it refuses an ``MPUB*`` as a whole: one message over the limit, or a body over
it, and nothing of the batch is stored (PROTOCOL.md §2.13). Its refusal names the limit::

    E_BAD_MESSAGE MPUB message too big 2000 > 1000     (vanilla and the fork)
    E_BAD_BODY MPUB body too big 100084 > 100000        (vanilla; the fork: "body too big")

A batch refused for its messages (:func:`splits_batch`) is cut (:func:`split_batch`) and each
part sent on its own, down to the message nsqd refuses alone. :class:`ServerLimits` keeps the
limit each nsqd named, so later batches are cut under it and a message over it travels alone
(nsqd, not the client, refuses a single message: a server restarted with a larger limit takes it).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Final

from nsq_ha.errors import (
    BadBodyError,
    BadMessageError,
    BodyTooLargeError,
    ExtNotSupportedError,
    InvalidJsonHeaderError,
    InvalidTraceIdError,
)
from nsq_ha.producer.message import BatchBuilder, mpub_sizes
from nsq_ha.protocol.publish import PublishMessage

#: the most nsqd addresses whose limits are kept (the oldest is forgotten first)
MAX_SERVERS: Final = 1024

#: refusals of what a batch carries, not of where it went: cutting the batch isolates them
_CONTENT_REFUSALS: Final = (
    BadMessageError,  # a message too big, or malformed
    BadBodyError,  # the body too big, or a message's ext header length
    ExtNotSupportedError,  # a header on a topic without ext
    InvalidJsonHeaderError,
    InvalidTraceIdError,
    BodyTooLargeError,  # over a limit nsqd named before (checked here, nothing sent)
)
_TOO_BIG: Final = re.compile(r"too big (\d{1,12}) > (\d{1,12})$")


def splits_batch(exc: BaseException) -> bool:
    """True when ``exc`` refuses a batch for one of its messages or its size: sent in smaller
    parts, the others may well be taken."""
    return isinstance(exc, _CONTENT_REFUSALS)


def refused_limit(exc: BaseException) -> tuple[str, int] | None:
    """The limit a size refusal names: ``("max_msg_size", 1000)`` for ``E_BAD_MESSAGE ... too
    big 2000 > 1000``, ``("max_body_size", 100000)`` for ``E_BAD_BODY ... too big 100084 >
    100000``; None for any other error (or a text that does not add up)."""
    if not isinstance(exc, BadMessageError | BadBodyError):
        return None
    found = _TOO_BIG.search(exc.description.rstrip())
    if found is None:
        return None
    size, limit = int(found.group(1)), int(found.group(2))
    if size <= limit:
        return None  # not a refusal for size after all
    return ("max_msg_size" if isinstance(exc, BadMessageError) else "max_body_size", limit)


class ServerLimits:
    """The size limits nsqd addresses named in their refusals, under the configured
    ``max_msg_size`` and ``max_body_size`` (only ever lower); kept for :data:`MAX_SERVERS`."""

    __slots__ = ("learned", "max_body_size", "max_msg_size")

    def __init__(self, max_msg_size: int, max_body_size: int) -> None:
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        #: address -> (max_msg_size, max_body_size) of the addresses that refused a size
        self.learned: dict[str, tuple[int, int]] = {}

    def __repr__(self) -> str:
        return f"<ServerLimits learned={self.learned}>"

    def learn(self, address: str, exc: BaseException) -> None:
        """Keep the limit ``exc`` names for ``address``, if it lowers what was known."""
        named = refused_limit(exc)
        if named is None:
            return
        what, limit = named
        msg, body = self.learned.get(address, (self.max_msg_size, self.max_body_size))
        if what == "max_msg_size" and limit < msg:
            msg = limit
        elif what == "max_body_size" and limit < body:
            body = limit
        else:
            return
        self.learned.pop(address, None)
        if len(self.learned) >= MAX_SERVERS:
            del self.learned[next(iter(self.learned))]
        self.learned[address] = (msg, body)

    def lowest(self, addresses: Iterable[str]) -> tuple[int, int, bool]:
        """The lowest ``(max_msg_size, max_body_size)`` over ``addresses``, and whether any
        message size limit among them is a learned one (lower than the configured one)."""
        msg, body = self.max_msg_size, self.max_body_size
        for address in addresses:
            learned = self.learned.get(address)
            if learned is not None:
                msg, body = min(msg, learned[0]), min(body, learned[1])
        return msg, body, msg < self.max_msg_size

    def check(self, address: str, messages: Sequence[PublishMessage], name: bytes) -> None:
        """Refuse (BodyTooLargeError, nothing sent) a batch of several messages that breaks a
        limit ``address`` named: the sender then cuts it again instead of sending it."""
        learned = self.learned.get(address)
        if learned is None or len(messages) < 2:
            return
        body, largest = mpub_sizes(messages, name)
        command, named = name.decode(), f"(nsqd {address} named its limit)"
        if largest > learned[0]:
            raise BodyTooLargeError(f"a message of this {command} {named}", largest, learned[0])
        if body > learned[1]:
            raise BodyTooLargeError(f"this {command} body {named}", body, learned[1])


def split_batch(
    messages: Sequence[PublishMessage], builder: BatchBuilder
) -> list[list[PublishMessage]]:
    """Cut a refused batch of two or more messages into parts, in order: as ``builder`` cuts
    batches (under the limits known now; a message over the message limit alone), or, when
    that leaves it whole, in two halves."""
    queue = deque(messages)
    parts: list[list[PublishMessage]] = []
    while queue:
        parts.append(builder.take(queue))
    if len(parts) < 2:
        half = len(messages) // 2
        parts = [list(messages[:half]), list(messages[half:])]
    return parts
