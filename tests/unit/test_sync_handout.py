"""The blocking facade's messages without a server: every public attribute of the asyncio
message, and answers queued in the calling thread, then written on the shared loop in the order
given, a burst in one loop turn, a failing one logged without dropping the ones after it."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import cast

import pytest

from nsq_ha import _sync_handout, sync
from nsq_ha._sync_runtime import loop_thread
from nsq_ha.consumer import Message as AsyncMessage
from nsq_ha.consumer import Outcome
from nsq_ha.errors import ConfigError, MessageAlreadyRespondedError
from nsq_ha.protocol.message import DecodedMessage


@dataclass
class Owner:
    """The consumer's side of a message: records each answer and the thread it came in."""

    topic: str = "t"
    channel: str = "c"
    partition: int | None = 3
    address: str = "127.0.0.1:4150"
    ordered: bool = False
    calls: list[str] = field(default_factory=list)
    threads: set[str] = field(default_factory=set)
    fails: bytes | None = None  # the body whose finish raises

    def finish(self, message: AsyncMessage) -> None:
        self.threads.add(threading.current_thread().name)
        if message.body == self.fails:
            raise RuntimeError("the connection refused it")
        self.calls.append(f"fin {message.body.decode()}")
        message.outcome = Outcome.FINISHED

    def requeue(self, message: AsyncMessage, delay: float | None, backoff: bool) -> None:
        self.threads.add(threading.current_thread().name)
        self.calls.append(f"req {message.body.decode()} {delay} {backoff}")
        message.outcome = Outcome.REQUEUED

    def touch(self, message: AsyncMessage) -> None:
        self.calls.append(f"touch {message.body.decode()}")


def delivered(owner: Owner, body: bytes) -> AsyncMessage:
    decoded = DecodedMessage(timestamp=1, attempts=2, id=b"0" * 16, body=body, offset=70)
    return AsyncMessage(decoded, owner)


def handed(answers: _sync_handout.Answers, message: AsyncMessage) -> sync.Message:
    """The blocking handle of ``message``, made by the consumer's hand-out."""
    source = cast("sync.Consumer", None)  # not asked: a message is waiting
    fetched = collections.deque([message])
    return next(_sync_handout.hand_out(source, answers.runner, fetched, answers))


@contextmanager
def loop_held() -> Iterator[None]:
    """The shared loop is busy in the block: nothing posted to it runs until the block ends."""
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        release.wait(10)

    loop_thread().loop.call_soon_threadsafe(hold)
    assert entered.wait(10)
    try:
        yield
    finally:
        release.set()


def settled() -> None:
    """Return once the shared loop ran everything posted before this call."""
    done = threading.Event()
    loop_thread().loop.call_soon_threadsafe(done.set)
    assert done.wait(10)


def test_a_blocking_message_has_every_public_attribute_of_the_asyncio_one() -> None:
    owner = Owner()
    message = delivered(owner, b"hello")
    handle = handed(_sync_handout.Answers(loop_thread()), message)
    names = [name for name in dir(AsyncMessage) if not name.startswith("_")]
    assert {"body", "offset", "partition", "ext", "outcome", "check_answerable"} <= set(names)
    for name in names:
        if name in ("finish", "requeue", "touch", "responded"):
            continue  # the blocking ones, with the same meaning
        assert getattr(handle, name) == getattr(message, name), name
    assert (handle.body, handle.attempts, handle.offset, handle.topic) == (b"hello", 2, 70, "t")
    assert handle.aio is message
    assert type(handle) is sync.Message  # the public class is the (compiled) one handed out
    assert repr(handle) == repr(message)
    missing, attribute = "no_such_attribute", "body"
    with pytest.raises(AttributeError, match="no_such_attribute"):
        getattr(handle, missing)
    with pytest.raises(AttributeError):
        setattr(handle, attribute, b"changed")  # read-only, as on the asyncio message


def test_answers_given_together_are_written_in_order_on_the_loop() -> None:
    owner = Owner()
    answers = _sync_handout.Answers(loop_thread())
    first, second, third = (handed(answers, delivered(owner, b)) for b in (b"a", b"b", b"c"))
    with loop_held():
        first.finish()
        second.requeue(0.5, backoff=False)
        third.finish()
        assert owner.calls == []  # queued: the loop writes them
        assert [h.responded for h in (first, second, third)] == [True, True, True]
        with pytest.raises(MessageAlreadyRespondedError, match="already finished"):
            first.requeue()  # refused at once, before the FIN was written
        with pytest.raises(MessageAlreadyRespondedError, match="already requeued"):
            second.finish()
    settled()
    assert owner.calls == ["fin a", "req b 0.5 False", "fin c"]
    assert owner.threads == {loop_thread().thread.name}


def test_a_bad_requeue_delay_changes_nothing() -> None:
    owner = Owner()
    handle = handed(_sync_handout.Answers(loop_thread()), delivered(owner, b"a"))
    with pytest.raises(ConfigError):
        handle.requeue(-1)
    bad: object = "5"  # ConfigError compiled too, not mypyc's TypeError
    with pytest.raises(ConfigError):
        handle.requeue(bad)
    assert not handle.responded
    handle.finish()
    settled()
    assert owner.calls == ["fin a"]


def test_a_burst_of_answers_wakes_the_loop_once(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = loop_thread()
    posted: list[object] = []
    post = runner.loop.call_soon_threadsafe

    def counted(call: Callable[[], object]) -> None:
        posted.append(call)
        post(call)

    owner = Owner()
    answers = _sync_handout.Answers(runner)
    handles = [handed(answers, delivered(owner, b"m%d" % i)) for i in range(100)]
    with loop_held():
        monkeypatch.setattr(runner.loop, "call_soon_threadsafe", counted)
        for handle in handles:
            handle.finish()
    settled()
    assert owner.calls == [f"fin m{i}" for i in range(100)]
    assert len(posted) == 2  # one flush for the 100 answers, and settled()'s own call
    handles[0].aio.outcome = None
    with pytest.raises(MessageAlreadyRespondedError):
        handles[0].finish()  # answered here already, whatever the loop did since


def test_an_answer_that_fails_on_the_loop_is_logged_and_the_next_ones_are_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    owner = Owner(fails=b"b")
    answers = _sync_handout.Answers(loop_thread())
    handles = [handed(answers, delivered(owner, b)) for b in (b"a", b"b", b"c")]
    with caplog.at_level(logging.WARNING, logger="nsq_ha.sync"), loop_held():
        for handle in handles:
            handle.finish()
    settled()
    assert owner.calls == ["fin a", "fin c"]
    assert "the connection refused it" in caplog.text
