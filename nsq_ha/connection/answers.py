"""The futures waiting for nsqd's answers on one connection.

:class:`PendingAnswers` keeps one future per command sent that nsqd answers, in sending order:
the :class:`~nsq_ha.protocol.session.ClientSession` keeps the same commands in the same order and
says, with each event, whether the oldest one was answered (nsqd answers in order, §1.5). It also
keeps the futures of :meth:`NsqdConnection.sync` calls, answered by the session's ``SYNCED``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

from nsq_ha.errors import NsqTimeoutError
from nsq_ha.protocol.state import command_name

__all__ = ["PendingAnswers"]


class PendingAnswers:
    """FIFO of answer futures (and of sync futures) for one connection."""

    __slots__ = ("_answers", "_syncs")

    def __init__(self) -> None:
        """Start with nothing pending."""
        self._answers: deque[asyncio.Future[bytes]] = deque()
        self._syncs: deque[asyncio.Future[None]] = deque()

    def __repr__(self) -> str:
        """Show the queue sizes."""
        return f"<PendingAnswers answers={len(self._answers)} syncs={len(self._syncs)}>"

    def __len__(self) -> int:
        """Answers still expected."""
        return len(self._answers)

    def expect(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[bytes]:
        """Return the future (of ``loop``) the answer to the command just sent completes."""
        future: asyncio.Future[bytes] = loop.create_future()
        self._answers.append(future)
        return future

    def expect_sync(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """Return the future (of ``loop``) the sync just sent completes."""
        future: asyncio.Future[None] = loop.create_future()
        self._syncs.append(future)
        return future

    async def wait(
        self,
        future: asyncio.Future[bytes],
        limit: float,
        *,
        backlogged: Callable[[], bool],
        flushed: Callable[[], Awaitable[None]],
        command: bytes,
        address: str,
    ) -> bytes:
        """Wait for the answer within ``limit`` seconds, and first for ``flushed()`` (the
        command left the socket buffer) when ``backlogged()``; the NsqTimeoutError names
        ``command`` and ``address``.

        The answer's deadline is a timer that fails the future: no ``asyncio.timeout`` per
        command, which asks for the current task and the running loop (two ``getpid()``
        system calls on Python 3.11). A caller that gives up (timeout or cancellation) leaves
        its future done: it keeps its place in the FIFO, and the late answer is discarded.
        """
        loop = future.get_loop()
        deadline = loop.time() + limit
        try:
            if backlogged():  # rare: nsqd is not reading what was sent
                try:
                    async with asyncio.timeout_at(deadline):
                        await flushed()
                except TimeoutError as exc:
                    name = command_name(command).decode(errors="replace")
                    raise NsqTimeoutError(
                        f"{name} could not be written to {address} within {limit} s: nsqd is "
                        "not reading (socket buffer full)"
                    ) from exc
            timer = loop.call_at(deadline, _no_answer, future, command, address, limit)
            try:
                return await future
            finally:
                timer.cancel()
        except BaseException:
            future.cancel()
            raise

    def answer(self, data: bytes) -> None:
        """The oldest command got its answer (a caller that gave up no longer waits)."""
        future = self._answers.popleft()
        if not future.done():
            future.set_result(data)

    def refuse(self, error: BaseException) -> None:
        """The oldest command got an error frame."""
        future = self._answers.popleft()
        if not future.done():
            future.set_exception(error)

    def synced(self) -> None:
        """The oldest sync is done."""
        future = self._syncs.popleft()
        if not future.done():
            future.set_result(None)

    def waiting(self) -> list[asyncio.Future[bytes]]:
        """The answer futures someone still waits for."""
        return [future for future in self._answers if not future.done()]

    def fail_all(self, error: BaseException) -> None:
        """The connection closed: every waiter gets ``error``."""
        while self._answers:
            answer = self._answers.popleft()
            if not answer.done():
                answer.set_exception(error)
        while self._syncs:
            sync = self._syncs.popleft()
            if not sync.done():
                sync.set_exception(error)


def _no_answer(future: asyncio.Future[bytes], command: bytes, address: str, limit: float) -> None:
    """The deadline of a command's answer passed."""
    if not future.done():
        name = command_name(command).decode(errors="replace")
        error = NsqTimeoutError(f"no answer to {name} from {address} within {limit} s")
        future.set_exception(error)
