"""Ctrl-C in a blocking ``sync.Consumer.get()`` on the embedded cluster: the interrupted call
takes nothing with it. What its fetch already took is handed out by the next ``get()``, later
messages all reach the program, and ``close()`` does not wait for messages nobody holds."""

from __future__ import annotations

import functools
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from nsq_ha import _sync_handout, sync
from nsq_ha.devcluster import DevClusterThread

TOPIC = "interrupted"
CHANNEL = "c"
COUNT = 50


@pytest.fixture(autouse=True)
def ctrl_c_raises() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt in the main thread during these tests, as in a program,
    whatever SIGINT handler an earlier test of the session left: with another handler, the
    interrupted get(timeout=None) would wait for ever."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def ctrl_c() -> None:
    """Deliver SIGINT to the main thread, as Ctrl-C does: its wait is interrupted and
    KeyboardInterrupt raised there."""
    main = threading.main_thread().ident
    assert main is not None
    signal.pthread_kill(main, signal.SIGINT)


@contextmanager
def ctrl_c_after(seconds: float) -> Iterator[threading.Event]:
    """:func:`ctrl_c` after ``seconds``; the event is set once it was sent."""
    sent = threading.Event()
    assert threading.current_thread() is threading.main_thread()

    def fire() -> None:
        ctrl_c()
        sent.set()

    timer = threading.Timer(seconds, fire)
    timer.start()
    try:
        yield sent
    finally:
        timer.cancel()
        timer.join(5)


def _setup(devcluster: DevClusterThread) -> None:
    devcluster.create_topic(TOPIC, 2, 1)
    devcluster.call(devcluster.cluster.create_channel, TOPIC, CHANNEL)


def _receive(consumer: sync.Consumer, count: int) -> list[bytes]:
    """Up to ``count`` bodies (each message finished); stops at the first 5 s without one."""
    got: list[bytes] = []
    for _ in range(count):
        message = consumer.get(timeout=5)
        if message is None:
            break
        got.append(message.body)
        message.finish()
    return got


@pytest.mark.parametrize("timeout", [None, 60.0])
def test_an_interrupted_get_leaves_every_later_message_to_the_program(
    devcluster: DevClusterThread, timeout: float | None
) -> None:
    """A get() waiting on an empty topic is interrupted; the 50 messages published after it
    all reach later get() calls, and close() returns at once (nothing is held unseen)."""
    _setup(devcluster)
    bodies = [b"m%d" % i for i in range(COUNT)]
    consumer = sync.Consumer(TOPIC, CHANNEL, lookupd=devcluster.lookupd_http)
    try:
        with ctrl_c_after(0.5) as sent, pytest.raises(KeyboardInterrupt):
            consumer.get(timeout=timeout)
        assert sent.is_set()
        with sync.Producer(lookupd=devcluster.lookupd_http) as producer:
            producer.publish_many(TOPIC, bodies, timeout=30)
        got = _receive(consumer, COUNT)
    finally:
        started = time.monotonic()
        consumer.close()
        closed_in = time.monotonic() - started
    assert sorted(got) == sorted(bodies)
    assert closed_in < 5.0


def _hold_loop(entered: threading.Event, release: threading.Event) -> None:
    """Run on the shared loop: keep it busy until ``release`` (at most 10 s)."""
    entered.set()
    release.wait(10)


def test_messages_taken_just_before_the_interrupt_go_to_the_next_get(
    devcluster: DevClusterThread,
) -> None:
    """The fetch takes the messages already waiting and the interrupt lands before its result
    reaches the waiting thread: the next get() hands them out, none is held unseen."""
    _setup(devcluster)
    bodies = [b"w%d" % i for i in range(5)]
    with sync.Producer(lookupd=devcluster.lookupd_http) as producer:
        producer.publish_many(TOPIC, bodies, timeout=30)
    consumer = sync.Consumer(TOPIC, CHANNEL, lookupd=devcluster.lookupd_http)
    loop = sync.shared_loop()
    first, second = threading.Event(), threading.Event()
    entered_first, entered_second = threading.Event(), threading.Event()

    def interrupt_once_the_fetch_is_queued() -> None:
        # get() has queued its fetch behind the first hold by now; the second hold goes in
        # behind the fetch's start, so the fetch's first step (which takes every message
        # waiting) is scheduled while the loop is held, before the interrupt's clean-up
        loop.call_soon_threadsafe(_hold_loop, entered_second, second)
        first.set()
        entered_second.wait(10)
        ctrl_c()

    assert threading.current_thread() is threading.main_thread()
    try:
        deadline = time.monotonic() + 10  # every message delivered to the consumer first
        while consumer.stats["queued"] < len(bodies) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert consumer.stats["queued"] == len(bodies)
        loop.call_soon_threadsafe(_hold_loop, entered_first, first)
        assert entered_first.wait(10)
        timer = threading.Timer(0.3, interrupt_once_the_fetch_is_queued)
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                consumer.get()
        finally:
            first.set()
            second.set()
            timer.join(15)
        assert entered_second.is_set()
        assert consumer.stats["queued"] == 0  # the interrupted fetch did take them
        got = _receive(consumer, len(bodies))
    finally:
        started = time.monotonic()
        consumer.close()
        closed_in = time.monotonic() - started
    assert sorted(got) == sorted(bodies)
    assert closed_in < 5.0


def _take_one(consumer: sync.Consumer, how: str) -> sync.Message | None:
    return consumer.get(timeout=10) if how == "get" else next(iter(consumer))


@pytest.mark.parametrize("how", ["get", "iterate"])
def test_an_interrupt_while_a_message_is_handed_out_keeps_it(
    devcluster: DevClusterThread, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Ctrl-C after a fetched message left the queue of fetched ones but before it reached the
    program: the next get() (or iteration) hands it out at once, none is held unseen (nor
    delivered twice after nsqd's msg_timeout)."""
    _setup(devcluster)
    bodies = [b"h%d" % i for i in range(5)]
    with sync.Producer(lookupd=devcluster.lookupd_http) as producer:
        producer.publish_many(TOPIC, bodies, timeout=30)
    consumer = sync.Consumer(TOPIC, CHANNEL, lookupd=devcluster.lookupd_http)
    made = sync.Message
    interrupted: list[int] = []

    def interrupts_once() -> sync.Message:
        if not interrupted:
            interrupted.append(1)
            raise KeyboardInterrupt
        return made()

    got: list[tuple[bytes, int]] = []
    try:
        first = consumer.get(timeout=10)
        assert first is not None
        got.append((first.body, first.attempts))
        first.finish()
        # the hand-out step of get() and of iterating (compiled, it takes its stand-in as make=)
        hand_one = functools.partial(_sync_handout.hand_one, make=interrupts_once)
        monkeypatch.setattr(sync, "hand_one", hand_one)
        stand_in = functools.partial(_sync_handout.hand_out, make=interrupts_once)
        monkeypatch.setattr(sync, "hand_out", stand_in)
        with pytest.raises(KeyboardInterrupt):
            _take_one(consumer, how)
        assert interrupted
        monkeypatch.undo()
        while len(got) < len(bodies):
            message = _take_one(consumer, how)  # get(): within 10 s; iterating: no limit
            if message is None:
                break
            got.append((message.body, message.attempts))
            message.finish()
    finally:
        started = time.monotonic()
        consumer.close()
        closed_in = time.monotonic() - started
    assert sorted(got) == sorted((body, 1) for body in bodies)
    assert closed_in < 5.0
