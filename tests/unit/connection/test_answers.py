"""PendingAnswers: a command's answer within its deadline, in sending order."""

from __future__ import annotations

import asyncio

import pytest

from nsq_ha.connection.reader import PendingAnswers
from nsq_ha.errors import BadTopicError, NsqTimeoutError


async def _flushed() -> None:
    raise AssertionError("not backlogged: nothing to wait for")


async def _wait(answers: PendingAnswers, future: asyncio.Future[bytes], limit: float) -> bytes:
    return await answers.wait(
        future,
        limit,
        backlogged=lambda: False,
        flushed=_flushed,
        command=b"PUB",
        address="127.0.0.1:4150",
    )


async def test_answers_complete_their_commands_in_order() -> None:
    answers = PendingAnswers()
    loop = asyncio.get_running_loop()
    first = asyncio.create_task(_wait(answers, answers.expect(loop), 5.0))
    second = asyncio.create_task(_wait(answers, answers.expect(loop), 5.0))
    await asyncio.sleep(0)
    answers.answer(b"OK")
    answers.refuse(BadTopicError("E_BAD_TOPIC"))
    assert await first == b"OK"
    with pytest.raises(BadTopicError):
        await second
    assert answers.waiting() == []


async def test_no_answer_by_the_deadline_raises_and_the_late_answer_is_dropped() -> None:
    answers = PendingAnswers()
    loop = asyncio.get_running_loop()
    future = answers.expect(loop)
    with pytest.raises(
        NsqTimeoutError, match=r"no answer to PUB from 127.0.0.1:4150 within 0.05 s"
    ):
        await _wait(answers, future, 0.05)
    later = asyncio.create_task(_wait(answers, answers.expect(loop), 5.0))
    await asyncio.sleep(0)
    answers.answer(b"OK")  # the late answer of the first command: dropped, in its place
    answers.answer(b"OK too")
    assert await later == b"OK too"


async def test_a_cancelled_caller_keeps_its_place() -> None:
    answers = PendingAnswers()
    loop = asyncio.get_running_loop()
    gave_up = asyncio.create_task(_wait(answers, answers.expect(loop), 5.0))
    waiting = asyncio.create_task(_wait(answers, answers.expect(loop), 5.0))
    await asyncio.sleep(0)
    gave_up.cancel()
    await asyncio.sleep(0)
    answers.answer(b"first")
    answers.answer(b"second")
    assert await waiting == b"second"
    assert gave_up.cancelled()


async def test_the_repr_shows_what_is_still_awaited() -> None:
    answers = PendingAnswers()
    loop = asyncio.get_running_loop()
    assert repr(answers) == "<PendingAnswers answers=0 syncs=0>"
    answers.expect(loop)
    answers.expect_sync(loop)
    assert repr(answers) == "<PendingAnswers answers=1 syncs=1>"
    answers.answer(b"OK")
    assert repr(answers) == "<PendingAnswers answers=0 syncs=1>"
