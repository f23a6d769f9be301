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

    def expect(self) -> asyncio.Future[bytes]:
        """Return the future the answer to the command just sent completes."""
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._answers.append(future)
        return future

    def expect_sync(self) -> asyncio.Future[None]:
        """Return the future the sync just sent completes."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._syncs.append(future)
        return future

    async def wait(
        self,
        future: asyncio.Future[bytes],
        limit: float,
        *,
        flushed: Callable[[], Awaitable[None]],
        command: bytes,
        address: str,
    ) -> bytes:
        """Wait for ``flushed()`` (the command left the socket buffer), then for the answer,
        both within ``limit`` seconds; the NsqTimeoutError names ``command`` and ``address``.

        A caller that gives up (timeout or cancellation) cancels its future: it keeps its
        place in the FIFO, and the late answer is discarded.
        """
        sent = False
        try:
            async with asyncio.timeout(limit):
                await flushed()
                sent = True
                return await future
        except asyncio.CancelledError:
            future.cancel()
            raise
        except TimeoutError as exc:
            if not future.done() or future.cancelled():
                future.cancel()
                name = command_name(command).decode(errors="replace")
                if not sent:
                    raise NsqTimeoutError(
                        f"{name} could not be written to {address} within {limit} s: nsqd is "
                        "not reading (socket buffer full)"
                    ) from exc
                raise NsqTimeoutError(
                    f"no answer to {name} from {address} within {limit} s"
                ) from exc
        # the answer (or its error, possibly a TimeoutError itself) came as the time ran out
        return future.result()

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
