"""What a failed lookup raises and what its message says to do (nsq_ha.lookup.failures)."""

from __future__ import annotations

import pytest

from nsq_ha.errors import LookupdNeverAnsweredError, LookupdUnavailableError
from nsq_ha.lookup.failures import never_answered, not_http
from nsq_ha.retry import decide


@pytest.mark.parametrize(
    ("reason", "advice"),
    [
        ("unreachable: ConnectError: All connection attempts failed", "usually 4161"),
        (not_http("RemoteProtocolError: illegal request line", False), "not nsqd's TCP port 4150"),
        (not_http("RemoteProtocolError: illegal request line", True), "nsqd's TCP port (4150)"),
    ],
    ids=["refused", "not-http", "nsqd-tcp-port"],
)
def test_no_lookupd_ever_answered_is_not_retried_and_says_what_to_check(
    reason: str, advice: str
) -> None:
    error = never_answered([("http://u:***@h:4150", reason)])
    assert isinstance(error, LookupdNeverAnsweredError)
    assert isinstance(error, LookupdUnavailableError)
    assert decide(error).give_up
    assert "http://u:***@h:4150" in str(error)
    assert reason in str(error)
    assert advice in str(error)
