"""The embedded cluster's event log: enum kinds, the string values they print, and waiting for
an event instead of sleeping (``DevCluster.wait_for``, ``DevClusterThread.wait_for``)."""

from __future__ import annotations

import asyncio

import pytest

from nsq_ha.devcluster import DevCluster, DevClusterThread, EventKind, NodeState


def test_kinds_and_states_keep_their_string_values() -> None:
    assert EventKind.LEADER_MOVED == "leader_moved"
    assert str(EventKind.TOPIC_CREATED) == "topic_created"
    assert NodeState.STOPPED == "stopped"
    cluster = DevCluster(nodes=2)
    cluster.create_topic("t", 1, 2)
    (event,) = cluster.events
    assert event.kind is EventKind.TOPIC_CREATED
    assert " topic_created topic=t " in f" {event} "
    assert cluster.events_of("topic_created") == cluster.events_of(EventKind.TOPIC_CREATED)


async def test_wait_for_finds_a_past_event_and_filters_on_details() -> None:
    cluster = DevCluster(nodes=2)
    cluster.create_topic("a", 1, 2)
    cluster.create_topic("b", 1, 2)
    found = await cluster.wait_for(EventKind.TOPIC_CREATED, topic="b", timeout=1)
    assert found is cluster.events[1]
    with pytest.raises(TimeoutError):
        await cluster.wait_for(EventKind.TOPIC_CREATED, topic="c", timeout=0.01)
    with pytest.raises(TimeoutError):  # ``since`` skips what is already in the log
        await cluster.wait_for(EventKind.TOPIC_CREATED, since=len(cluster.events), timeout=0.01)


async def test_wait_for_returns_the_next_matching_event() -> None:
    cluster = DevCluster(nodes=3)
    cluster.create_topic("t", 1, 3)
    mark = len(cluster.events)
    waiting = asyncio.ensure_future(
        cluster.wait_for(EventKind.LEADER_MOVED, since=mark, reason="move", timeout=5)
    )
    await asyncio.sleep(0)
    assert not waiting.done()
    cluster.create_topic("other", 1, 1)  # another kind: still waiting
    await asyncio.sleep(0)
    assert not waiting.done()
    new = cluster.move_leader("t", 0, to=1)
    event = await waiting
    assert (event.detail["topic"], event.detail["new"]) == ("t", new.index)
    assert "listeners=0" in repr(cluster.log)  # the waiter unsubscribed


async def test_kill_then_wait_for_the_failover() -> None:
    async with DevCluster(nodes=3, failover_delay=0.05) as cluster:
        cluster.create_topic("t", 1, 2)
        old = cluster.leader_of("t", 0)
        mark = len(cluster.events)
        await cluster.stop_node(old, kill=True)
        moved = await cluster.wait_for(
            EventKind.LEADER_MOVED, since=mark, reason="failover", timeout=5
        )
        assert moved.detail["old"] == old.index
        assert cluster.leader_of("t", 0).index == moved.detail["new"]
        assert old.state is NodeState.STOPPED


def test_threaded_wait_for() -> None:
    with DevClusterThread(nodes=2) as dev:
        dev.create_topic("t", 1, 2)
        event = dev.wait_for(EventKind.TOPIC_CREATED, topic="t", timeout=1)
        assert event.detail["replicas"] == 2
        with pytest.raises(TimeoutError):
            dev.wait_for(EventKind.NODE_KILLED, timeout=0.05)
