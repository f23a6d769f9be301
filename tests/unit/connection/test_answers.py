"""PendingAnswers: a command's answer within its deadline, in sending order."""

from __future__ import annotations

import asyncio

import pytest

from nsq_ha.connection.reader import PendingAnswers
from nsq_ha.errors import BadTopicError, NsqTimeoutError
from tests.unit.connection.wire import Pushed


async def _wait(answers: PendingAnswers, limit: float = 5.0) -> bytes:
    return await answers.wait(Pushed().transport, b"PUB", limit)


async def test_answers_complete_their_commands_in_order() -> None:
    answers = PendingAnswers()
    first = asyncio.create_task(_wait(answers))
    second = asyncio.create_task(_wait(answers))
    await asyncio.sleep(0)
    answers.answer(b"OK")
    answers.refuse(BadTopicError("E_BAD_TOPIC"))
    assert await first == b"OK"
    with pytest.raises(BadTopicError):
        await second
    assert answers.waiting() == []


async def test_no_answer_by_the_deadline_raises_and_the_late_answer_is_dropped() -> None:
    answers = PendingAnswers()
    with pytest.raises(
        NsqTimeoutError, match=r"no answer to PUB from 127.0.0.1:4150 within 0.05 s"
    ):
        await _wait(answers, 0.05)
    later = asyncio.create_task(_wait(answers))
    await asyncio.sleep(0)
    answers.answer(b"OK")  # the late answer of the first command: dropped, in its place
    answers.answer(b"OK too")
    assert await later == b"OK too"


async def test_a_cancelled_caller_keeps_its_place() -> None:
    answers = PendingAnswers()
    gave_up = asyncio.create_task(_wait(answers))
    waiting = asyncio.create_task(_wait(answers))
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
    waiting = asyncio.create_task(_wait(answers))
    await asyncio.sleep(0)
    answers.expect_sync(loop)
    assert repr(answers) == "<PendingAnswers answers=1 syncs=1>"
    answers.answer(b"OK")
    assert await waiting == b"OK"
    assert repr(answers) == "<PendingAnswers answers=0 syncs=1>"
