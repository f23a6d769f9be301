"""The embedded broker's ``ext_filter`` and ``desired_tag`` key, and the store's requeue
bookkeeping, as pure functions (the conformance tier checks them against the fork)."""

from __future__ import annotations

from typing import Any

import pytest

from nsq_ha.devcluster.ext_filter import filter_matches, message_tag
from nsq_ha.devcluster.store import Partition, StoredMessage


def message(header: bytes | None) -> StoredMessage:
    return StoredMessage(
        internal_id=2,
        trace_id=0,
        offset=0,
        raw_size=0,
        timestamp=0,
        body=b"b",
        ext_version=4 if header is not None else 0,
        ext_data=header or b"",
    )


@pytest.mark.parametrize(
    ("ext_filter", "header", "passes"),
    [
        ({"type": 1, "filter_ext_key": "k", "filter_data": "v"}, b'{"k":"v"}', True),
        ({"type": 1, "filter_ext_key": "k", "filter_data": "v", "inverse": True}, None, True),
        ({"type": 2, "filter_ext_key": "k", "filter_data": "^$"}, b'{"j":"v"}', True),
        ({"type": 3, "filter_ext_key": "k", "filter_data": "{a,b}?"}, b'{"k":"bx"}', True),
        ({"type": 3, "filter_ext_key": "k", "filter_data": "[!a]*"}, b'{"k":"abc"}', False),
        ({"type": 3, "filter_ext_key": "k", "filter_data": "[a"}, b'{"k":"zz"}', True),
        ({"type": 1, "filter_ext_key": "a.b", "filter_data": "v"}, b'{"a":{"b":"v"}}', True),
        (
            {
                "type": 4,
                "filter_ext_key": "x",
                "filter_data_list": [{"filter_ext_key": "k", "filter_data": "v"}],
            },
            b'{"k":"v"}',
            False,
        ),
        (
            {"type": 7, "filter_ext_key": "k", "filter_data": "v", "inverse": True},
            b'{"k":"v"}',
            True,
        ),
        ({"type": 1, "filter_ext_key": "k", "filter_data": "v"}, b"[1]", False),
    ],
)
def test_filter_matches(ext_filter: dict[str, Any], header: bytes | None, passes: bool) -> None:
    assert filter_matches(ext_filter, message(header)) is passes


def test_message_tag() -> None:
    assert message_tag(message(b'{"##client_dispatch_tag":"t1"}')) == "t1"
    assert message_tag(message(b'{"##client_dispatch_tag":5}')) == ""
    assert message_tag(message(b"[1]")) == ""
    assert message_tag(message(None)) == ""


def test_release_takes_the_attempt_back_and_counts_a_requeue() -> None:
    part = Partition("t", 0, clock=lambda: 0.0, wall_clock_ns=lambda: 0)
    part.append(b"a")
    channel = part.channel("c")
    channel.cursor = 0
    assert channel.peek(0.0) is part.log[0]
    flight = channel.take("x", 1.0, 0.0)
    assert flight is not None
    assert flight.attempts == 1
    assert channel.peek(0.0) is None
    channel.release("x", 0.0)
    assert channel.requeue_count == 1
    again = channel.take("y", 1.0, 0.0)
    assert again is not None
    assert again.attempts == 1


def test_patterns_re2_refuses_build_no_filter() -> None:
    lookahead = {"type": 2, "filter_ext_key": "k", "filter_data": "v(?=1)", "inverse": True}
    assert filter_matches(lookahead, message(b'{"k":"v1"}'))


def test_gjson_path_syntax_is_refused_at_identify() -> None:
    from nsq_ha.devcluster.model import Limits, ServerError
    from nsq_ha.devcluster.nsqd.identify import read_identify

    body = b'{"ext_filter":{"type":1,"filter_ext_key":"a*","filter_data":"v"}}'
    with pytest.raises(ServerError, match="gjson path syntax"):
        read_identify(body, Limits())
    plain = read_identify(
        b'{"ext_filter":{"type":1,"filter_ext_key":"a.b","filter_data":"v"}}', Limits()
    )
    assert plain.ext_filter == {"type": 1, "filter_ext_key": "a.b", "filter_data": "v"}
