"""What a failed lookup raises and what its message says to do (nsq_ha.lookup.client)."""

from __future__ import annotations

import pytest

from nsq_ha.errors import (
    LookupdNeverAnsweredError,
    LookupdUnavailableError,
    TopicNotFoundError,
    TopicNotWritableError,
)
from nsq_ha.lookup.client import NSQD_TCP_PORT, lookup_failure, never_answered, unwritable
from nsq_ha.lookup.wire import LookupdError, PartitionMap, TopicMeta
from nsq_ha.retry import decide


def test_an_unknown_fork_topic_names_the_command_and_the_admin_call() -> None:
    error = lookup_failure("orders", "w", [LookupdError(404, "Key not found", "http://l:4161")])
    assert type(error) is TopicNotFoundError
    text = str(error)
    assert "nsq-ha topic create --lookupd URL --topic orders --partitions N --replicas R" in text
    assert "LookupdAdmin.create_topic('orders', partitions=N, replicas=R)" in text
    assert "POST" not in text


def test_a_fork_map_without_partitions_says_the_same() -> None:
    pmap = PartitionMap("orders", "w", fork=True, meta=TopicMeta(partition_num=0))
    error = unwritable(pmap)
    assert type(error) is TopicNotFoundError
    assert "nsq-ha topic create" in str(error)
    assert "LookupdAdmin.create_topic" in str(error)


def test_other_lookup_failures_keep_their_kind() -> None:
    vanilla = lookup_failure("t", "w", [LookupdError(404, "TOPIC_NOT_FOUND")])
    assert type(vanilla) is TopicNotFoundError
    assert "nsqd= addresses" in str(vanilla)
    no_channel = lookup_failure("t", "w", [LookupdError(500, "no channel for topic")])
    assert type(no_channel) is TopicNotWritableError
    down = lookup_failure("t", "w", [LookupdUnavailableError("nsqlookupd x unreachable")])
    assert type(down) is LookupdUnavailableError
    assert decide(down).retry


@pytest.mark.parametrize(
    ("reason", "advice"),
    [
        ("unreachable: ConnectError: All connection attempts failed", "usually 4161"),
        # the reasons LookupClient gives for an answer that is not HTTP, and for nsqd's
        (
            "its answer is not HTTP (RemoteProtocolError: illegal request line)",
            "not nsqd's TCP port 4150",
        ),
        (f"it answered nsqd's E_BAD_PROTOCOL, not HTTP: {NSQD_TCP_PORT}", "nsqd's TCP port (4150)"),
    ],
    ids=["refused", "not-http", "nsqd-tcp-port"],
)
def test_no_lookupd_ever_answered_is_not_retried_and_says_what_to_check(
    reason: str, advice: str
) -> None:
    error = never_answered([("http://u:***@h:4150", reason)])
    assert isinstance(error, LookupdNeverAnsweredError)
    assert isinstance(error, LookupdUnavailableError)
    assert not decide(error).retry
    assert "http://u:***@h:4150" in str(error)
    assert reason in str(error)
    assert advice in str(error)
