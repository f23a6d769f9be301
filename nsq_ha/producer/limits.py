"""What nsqd's refusals teach about a batch (pure: no I/O).

nsqd does not announce its ``--max-msg-size`` / ``--max-body-size`` (the IDENTIFY answer has
neither) and refuses an ``MPUB*`` as a whole, nothing of it stored, for one message or a body
over it (PROTOCOL.md §2.13), naming the limit: ``E_BAD_MESSAGE MPUB message too big 2000 > 1000``,
``E_BAD_BODY MPUB body too big 100084 > 100000`` (the fork: "body too big"). Such a batch is cut
(:func:`split_batch`) and the parts sent on their own; :class:`ServerLimits` keeps the limit each
nsqd named, so later batches are cut under it and a message over it travels alone (nsqd, not the
client, refuses a single message: a server restarted with a larger limit takes it).
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
    """True when ``exc`` refuses a batch for a message or its size: smaller parts may pass."""
    return isinstance(exc, _CONTENT_REFUSALS)


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
        """Keep the limit ``exc`` names for ``address``, if it lowers what was known:
        ``E_BAD_MESSAGE ... too big 2000 > 1000`` names a max_msg_size of 1000, ``E_BAD_BODY ...
        too big 100084 > 100000`` a max_body_size of 100000."""
        if not isinstance(exc, BadMessageError | BadBodyError):
            return
        found = _TOO_BIG.search(exc.description.rstrip())
        if found is None or int(found.group(1)) <= (limit := int(found.group(2))):
            return  # another refusal, or not one for size after all
        msg, body = known = self.learned.get(address, (self.max_msg_size, self.max_body_size))
        if isinstance(exc, BadMessageError):
            msg = min(msg, limit)
        else:
            body = min(body, limit)
        if (msg, body) == known:
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
