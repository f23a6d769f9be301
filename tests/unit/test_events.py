"""The client events registry (``nsq_ha.events``) and the route table's leader-change event."""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Iterator

import pytest

from nsq_ha import events
from nsq_ha.connection import ConnectionConfig
from nsq_ha.lookup import NodeInfo, PartitionMap, TopicMeta
from nsq_ha.producer.pool import ConnectionPool
from nsq_ha.producer.topic import SlotMemo, Topic
from nsq_ha.routing import get_strategy

MOVED = events.LeaderChanged(role="consumer", topic="t", partition=0, old="a:1", new="b:1")
LOST = events.Reconnecting(
    role="producer", topic="t", partition=None, address="a:1", error="gone", attempt=1
)
GAVE_UP = events.PublishGaveUp(topic="t", partition=3, attempts=5, error="E_FAILED_ON_NOT_LEADER")
SKIPPED = events.MessageGaveUp(
    topic="t", channel="c", partition=None, message_id="00", attempts=6, max_attempts=5
)
ALL: list[events.Event] = [MOVED, LOST, GAVE_UP, SKIPPED]


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    """Every test starts and ends with no listener (other tests' listeners kept aside)."""
    saved = events._listeners
    events._listeners = []
    try:
        yield
    finally:
        events._listeners = saved


def test_no_listener_emit_does_nothing() -> None:
    assert events._listeners == []
    for event in ALL:
        events.emit(event)


def test_a_listener_of_every_kind_gets_every_event_in_order() -> None:
    got: list[events.Event] = []
    assert events.subscribe(got.append) == got.append
    assert events._listeners != []
    for event in ALL:
        events.emit(event)
    assert got == ALL


def test_kinds_filter_what_a_listener_gets() -> None:
    moves: list[events.Event] = []
    give_ups: list[events.Event] = []
    events.subscribe(moves.append, events.LeaderChanged)
    events.subscribe(give_ups.append, events.PublishGaveUp, events.MessageGaveUp)
    for event in ALL:
        events.emit(event)
    assert moves == [MOVED]
    assert give_ups == [GAVE_UP, SKIPPED]


def test_subscribing_again_replaces_the_kinds_and_keeps_one_call() -> None:
    got: list[events.Event] = []
    events.subscribe(got.append, events.LeaderChanged)
    events.subscribe(got.append, events.Reconnecting)
    for event in ALL:
        events.emit(event)
    assert got == [LOST]


def test_listeners_run_in_subscription_order() -> None:
    order: list[str] = []
    events.subscribe(lambda e: order.append("first"))
    events.subscribe(lambda e: order.append("second"))
    events.emit(MOVED)
    assert order == ["first", "second"]


def test_unsubscribe() -> None:
    got: list[events.Event] = []
    events.subscribe(got.append)
    assert events.unsubscribe(got.append) is True
    assert events.unsubscribe(got.append) is False
    assert events._listeners == []
    events.emit(MOVED)
    assert got == []


def test_a_failing_listener_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    got: list[events.Event] = []

    def broken(event: events.Event) -> None:
        raise RuntimeError("listener bug")

    events.subscribe(broken)
    events.subscribe(got.append)
    with caplog.at_level(logging.ERROR, logger="nsq_ha.events"):
        events.emit(LOST)
    assert got == [LOST]
    assert "listener bug" in caplog.text


class ListenerBug(BaseException):
    """Not an Exception: what a listener raises that ``except Exception`` would let out."""


@pytest.mark.parametrize(
    "raised", [SystemExit(3), KeyboardInterrupt(), ListenerBug("broken"), GeneratorExit()]
)
def test_a_listener_raising_any_base_exception_is_contained(
    caplog: pytest.LogCaptureFixture, raised: BaseException
) -> None:
    """emit() returns normally (the client's code goes on), the later listeners still run,
    and one error record names the listener."""
    got: list[events.Event] = []

    def quits(event: events.Event) -> None:
        raise raised

    events.subscribe(quits)
    events.subscribe(got.append)
    with caplog.at_level(logging.ERROR, logger="nsq_ha.events"):
        events.emit(GAVE_UP)
        events.emit(GAVE_UP)
    assert got == [GAVE_UP, GAVE_UP]
    records = [r for r in caplog.records if r.name == "nsq_ha.events"]
    assert len(records) == 2  # one per failed call
    assert all(r.levelno == logging.ERROR for r in records)
    assert all("quits" in r.getMessage() for r in records)
    assert records[0].exc_info is not None
    assert records[0].exc_info[1] is raised


def test_a_listener_calling_sys_exit_is_told_it_must_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def stop_on_give_up(event: events.Event) -> None:
        sys.exit(1)

    events.subscribe(stop_on_give_up, events.PublishGaveUp)
    with caplog.at_level(logging.ERROR, logger="nsq_ha.events"):
        events.emit(GAVE_UP)
    message = caplog.records[-1].getMessage()
    assert "stop_on_give_up" in message
    assert "sys.exit" in message
    assert "keep running" in message


def test_a_listener_may_unsubscribe_itself_while_called() -> None:
    calls: list[events.Event] = []

    def once(event: events.Event) -> None:
        calls.append(event)
        events.unsubscribe(once)

    events.subscribe(once)
    events.emit(MOVED)
    events.emit(MOVED)
    assert calls == [MOVED]


def test_bad_subscriptions_are_refused() -> None:
    with pytest.raises(TypeError, match="callable"):
        events.subscribe("not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not an nsq_ha event class"):
        events.subscribe(print, dict)  # type: ignore[arg-type]
    assert events._listeners == []


@pytest.mark.parametrize("event", ALL)
def test_events_are_frozen_and_slotted(event: events.Event) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.topic = "other"  # type: ignore[misc]
    assert not hasattr(event, "__dict__")


def test_events_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        events.LeaderChanged("consumer", "t", 0, "a", "b")  # type: ignore[call-arg]


def fork_map(leaders: dict[int, int]) -> PartitionMap:
    nodes = {p: NodeInfo("127.0.0.1", port, port + 1) for p, port in leaders.items()}
    return PartitionMap("t", "w", nodes, meta=TopicMeta(partition_num=2), fork=True)


def _watched_topic() -> Topic:
    pool = ConnectionPool(ConnectionConfig(), {})
    topic = Topic("t", lookup=None, static=None, memo=SlotMemo(get_strategy("murmur3")), pool=pool)
    topic.watched = True
    return topic


def test_the_producers_topic_reports_a_moved_leader_once() -> None:
    got: list[events.Event] = []
    events.subscribe(got.append)
    table = _watched_topic()
    table._on_map(fork_map({0: 4150, 1: 4250}))  # first sight: no move
    table._on_map(fork_map({0: 4150, 1: 4250}))  # the same leaders
    table._on_map(fork_map({0: 4350}))  # partition 1 without a leader for now
    table._on_map(fork_map({0: 4350, 1: 4450}))
    assert got == [
        events.LeaderChanged(
            role="producer", topic="t", partition=0, old="127.0.0.1:4150", new="127.0.0.1:4350"
        ),
        events.LeaderChanged(
            role="producer", topic="t", partition=1, old="127.0.0.1:4250", new="127.0.0.1:4450"
        ),
    ]
    table = _watched_topic()  # the topic expired: a new one
    table._on_map(fork_map({0: 4150, 1: 4250}))  # forgotten: first sight again
    assert len(got) == 2
