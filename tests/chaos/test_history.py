"""The checker on hand-made histories: it must see every loss, duplicate and reorder."""

from __future__ import annotations

import json

import pytest

from .history import Delivery, History, check, parse_body, unrecovered_faults

ORD, PLAIN = "ord", "plain"


def _history() -> History:
    return History({ORD: True, PLAIN: False}, seed=7)


def _publish(h: History, topic: str, key: str, seqs: range | list[int]) -> None:
    for seq in seqs:
        h.publishing(topic)
        h.ack(topic, key, seq, 0, seq * 10)


def _deliver(h: History, topic: str, key: str, seqs: list[int]) -> None:
    for seq in seqs:
        h.deliver(topic, f"{key}:{seq}".encode(), 0, seq * 10)


def test_clean_history_is_ok() -> None:
    h = _history()
    _publish(h, ORD, "a", range(5))
    _deliver(h, ORD, "a", [0, 1, 2, 3, 4])
    report = check(h)
    assert report.ok
    assert (report.lost, report.order_violations, report.messages) == (0, 0, 5)
    assert "seed=7" in report.render()
    assert json.loads(report.dumps())["ok"] is True


def test_loss_is_reported_with_the_missing_messages() -> None:
    h = _history()
    _publish(h, PLAIN, "a", range(4))
    _deliver(h, PLAIN, "a", [0, 3])
    report = check(h)
    assert not report.ok
    assert report.topics[1].lost == [("a", 1), ("a", 2)]
    assert "LOST on plain" in report.render()


def test_rewind_redelivery_is_duplication_not_reordering() -> None:
    h = _history()
    _publish(h, ORD, "a", range(6))
    _deliver(h, ORD, "a", [0, 1, 2, 3, 2, 3, 4, 5])
    report = check(h)
    assert report.ok
    assert report.topics[0].duplicates == 2


@pytest.mark.parametrize(
    "order",
    [[0, 2, 1, 3], [1, 0, 2, 3], [0, 1, 3, 2]],
)
def test_first_delivery_after_a_later_seq_is_an_order_violation(order: list[int]) -> None:
    h = _history()
    _publish(h, ORD, "a", range(4))
    _deliver(h, ORD, "a", order)
    report = check(h)
    assert not report.ok
    assert report.order_violations == 1
    assert "first delivered after" in report.topics[0].order_violations[0]


def test_order_is_per_key_and_only_on_ordered_topics() -> None:
    h = _history()
    _publish(h, ORD, "a", range(2))
    _publish(h, ORD, "b", range(2))
    _deliver(h, ORD, "b", [0])
    _deliver(h, ORD, "a", [0, 1])
    _deliver(h, ORD, "b", [1])
    _publish(h, PLAIN, "a", range(3))
    _deliver(h, PLAIN, "a", [2, 1, 0])
    assert check(h).ok


def test_failed_publishes_are_indeterminate_not_lost_nor_ordered() -> None:
    h = _history()
    _publish(h, ORD, "a", [0, 2])
    h.publishing(ORD)
    h.fail(ORD, "a", 1, TimeoutError())
    _deliver(h, ORD, "a", [0, 2, 1])  # 1 was written late: not an acknowledged message
    report = check(h)
    assert report.ok
    topic = report.topics[0]
    assert topic.errors == {"TimeoutError": 1}
    assert topic.indeterminate_consumed == 1
    assert topic.attempted == 3


def test_a_corrupted_body_fails_the_run() -> None:
    h = _history()
    h.deliver(PLAIN, b"\xff\x00garbage", 0)
    report = check(h)
    assert not report.ok
    assert report.topics[1].garbage == 1


def test_recovery_time_and_unrecovered_faults() -> None:
    h = _history()
    h.started -= 10
    h.ack_times.append((h.started + 1, ORD, 0))
    h.deliveries[ORD].append(_at(h, 1.0))
    fault = h.fault("kill9", "node0")
    fault.started, fault.healed = h.started + 2, h.started + 3
    h.ack_times.append((h.started + 3.5, ORD, 0))
    h.deliveries[ORD].append(_at(h, 4.0))
    report = check(h, ended=h.started + 5)
    assert report.max_recovery == pytest.approx(1.0)
    assert report.slowest_detail[1:] == [
        "ord/0: ack last before +1.000s, first after heal +3.500s; "
        "delivery last before +1.000s, first after heal +4.000s"
    ]
    assert "around the slowest recovery" in report.render()
    late = h.fault("pause", "node1")
    late.started, late.healed = h.started + 4.5, h.started + 4.6
    report = check(h, ended=h.started + 5)
    assert report.unrecovered
    assert "pause node1" in report.unrecovered[0]
    assert report.fault_counts == {"kill9": 1, "pause": 1}
    assert unrecovered_faults(h) == [late]
    h.ack_times.append((h.started + 4.8, ORD, 0))
    assert unrecovered_faults(h) == [late]  # acknowledged again, but nothing delivered yet
    h.deliveries[ORD].append(_at(h, 4.9))
    assert unrecovered_faults(h) == []


def _at(h: History, offset: float) -> Delivery:
    return Delivery(h.started + offset, "a", 0, 0, 0, 1)


def test_parse_body() -> None:
    assert parse_body(b"k1:42") == ("k1", 42)
    assert parse_body(b"a:b:7") == ("a:b", 7)
    for bad in (b"42", b":1", b"k:", b"k:x"):
        with pytest.raises(ValueError, match=r"key:seq|invalid literal"):
            parse_body(bad)


def test_a_lost_message_comes_with_the_history_around_it() -> None:
    h = _history()
    _publish(h, ORD, "a", range(3))  # offsets 0, 10, 20 on partition 0
    _deliver(h, ORD, "a", [0, 2])
    h.fault("kill9", "node0").healed = h.started + 1
    (context,) = check(h).topics[0].lost_context
    assert "a:1 acked" in context
    assert "partition 0 offset 10" in context
    assert "below: a:0 offset 0" in context
    assert "above: a:2 offset 20" in context
    assert "kill9 node0" in context


def test_an_acknowledged_offset_delivered_with_another_body_is_the_servers_loss() -> None:
    h = _history()
    _publish(h, PLAIN, "a", range(4))  # offsets 0, 10, 20, 30 on partition 0
    _deliver(h, PLAIN, "a", [0, 3])
    h.deliver(PLAIN, b"b:7", 0, 10)  # a:1's acknowledged place now holds b:7
    h.deliver(PLAIN, b"c:1", 1, 20)  # the same offset on another partition is no overwrite
    report = check(h)
    topic = report.topics[1]
    assert topic.lost == [("a", 1), ("a", 2)]
    assert topic.overwritten == [
        "a:1 acknowledged at partition 0 offset 10, which was delivered as b:7"
    ]
    assert (report.lost, report.overwritten) == (2, 1)
    assert not report.ok
    text = report.render()
    assert "lost 2 (overwritten by the server 1)" in text
    assert "OVERWRITTEN BY THE SERVER on plain: a:1" in text
    assert json.loads(report.dumps())["overwritten_by_server"] == 1


def test_redelivery_at_the_acknowledged_offset_is_no_overwrite() -> None:
    h = _history()
    _publish(h, ORD, "a", range(2))
    _deliver(h, ORD, "a", [0, 1, 1])
    assert check(h).overwritten == 0


def test_the_servers_failover_and_the_clients_recovery_are_told_apart() -> None:
    """A kill whose partition the servers took 20 s to make writable again, and the client
    0.5 s after that: recovery 20.5 s, of which the client's 0.5 s."""
    h = _history()
    h.started -= 30
    h.ack_times.append((h.started + 1, ORD, 0))
    h.deliveries[ORD].append(_at(h, 1.0))
    kill = h.fault("kill9", "nsqd0")
    kill.started, kill.healed, kill.server_ready = h.started + 2, h.started + 3, h.started + 23
    h.ack_times.append((h.started + 23.4, ORD, 0))
    h.deliveries[ORD].append(_at(h, 23.5))
    report = check(h, ended=h.started + 30)
    assert report.max_recovery == pytest.approx(20.5)
    assert report.max_server_failover == pytest.approx(20.0)
    assert report.max_client_recovery == pytest.approx(0.5)
    assert "the client's recovery after that: up to 0.500s" in report.render()
    assert "writable again +23.000s" in report.render()
