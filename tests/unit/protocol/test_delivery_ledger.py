"""The receipt-side RDY check (nsq_ha.protocol.message.DeliveryLedger), table by table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsq_ha.errors import RemoteProtocolError
from nsq_ha.protocol.message import MIN_EXPIRY, SLACK, DeliveryLedger


def _id(n: int) -> bytes:
    return b"%016x" % n


def test_no_message_before_any_rdy() -> None:
    ledger = DeliveryLedger(expiry=60)
    with pytest.raises(RemoteProtocolError, match="beyond the RDY given"):
        ledger.delivered(_id(0), 0.0)


def test_rdy_one_allows_slack_deliveries_then_refuses() -> None:
    ledger = DeliveryLedger(expiry=60)
    ledger.rdy(1)
    assert ledger.limit == SLACK == 2
    ledger.delivered(_id(0), 0.0)
    ledger.delivered(_id(1), 0.1)
    with pytest.raises(RemoteProtocolError, match=r"largest RDY sent, 1\)"):
        ledger.delivered(_id(2), 0.2)
    assert ledger.live(0.3) == 2
    assert repr(ledger) == "<DeliveryLedger live=2 limit=2>"


def test_fin_or_req_frees_a_slot() -> None:
    ledger = DeliveryLedger(expiry=60)
    ledger.rdy(1)
    for n in range(100):  # FIN after each: any number of messages, one at a time
        ledger.delivered(_id(n), float(n))
        ledger.settled(_id(n))
    ledger.settled(_id(999))  # unknown ids are ignored (a sync TOUCH, a late FIN)
    assert ledger.live(100.0) == 0


def test_deliveries_older_than_the_expiry_no_longer_count() -> None:
    """nsqd timed them out (msg_timeout) and may send others while the handler still runs."""
    ledger = DeliveryLedger(expiry=10)
    ledger.rdy(1)
    ledger.delivered(_id(0), 0.0)
    ledger.delivered(_id(1), 5.0)
    with pytest.raises(RemoteProtocolError):
        ledger.delivered(_id(2), 9.9)
    ledger.delivered(_id(2), 10.0)  # _id(0) expired at 10.0
    assert ledger.live(10.0) == 2


def test_touch_renews_a_delivery() -> None:
    ledger = DeliveryLedger(expiry=10)
    ledger.rdy(1)
    ledger.delivered(_id(0), 0.0)
    ledger.delivered(_id(1), 1.0)
    ledger.touched(_id(0), 8.0)  # nsqd restarts its timeout: it now lives until 18.0
    ledger.touched(_id(7), 8.0)  # not held: ignored
    assert ledger.live(11.5) == 1  # _id(1) expired at 11.0, the touched _id(0) did not
    ledger.delivered(_id(2), 11.5)
    with pytest.raises(RemoteProtocolError):
        ledger.delivered(_id(3), 11.5)


def test_a_touch_after_the_expiry_does_not_bring_a_delivery_back() -> None:
    """Expiry is applied when it matters (at the limit): a TOUCH in between of a message nsqd
    has already timed out must not renew it."""
    ledger = DeliveryLedger(expiry=10)
    ledger.rdy(1)
    ledger.delivered(_id(0), 0.0)
    ledger.delivered(_id(1), 5.0)
    ledger.touched(_id(0), 12.0)  # expired at 10.0: nsqd answers E_TOUCH_FAILED
    ledger.delivered(_id(2), 12.0)
    assert ledger.live(12.0) == 2


def test_a_redelivery_of_a_held_message_is_still_one_message() -> None:
    ledger = DeliveryLedger(expiry=60)
    ledger.rdy(1)
    ledger.delivered(_id(0), 0.0)
    ledger.delivered(_id(1), 0.0)
    for at in range(1, 50):
        ledger.delivered(_id(0), float(at))
    assert ledger.live(50.0) == 2


def test_the_largest_rdy_counts() -> None:
    """A smaller RDY may reach nsqd after it sent messages under the larger one."""
    ledger = DeliveryLedger(expiry=60)
    ledger.rdy(5)
    ledger.rdy(0)
    ledger.rdy(1)
    assert ledger.limit == 10
    for n in range(10):
        ledger.delivered(_id(n), 0.0)
    with pytest.raises(RemoteProtocolError):
        ledger.delivered(_id(10), 0.0)


def test_expiry_has_a_floor() -> None:
    """A server announcing msg_timeout 1 ms cannot make every delivery expire at once."""
    assert DeliveryLedger(expiry=0.001).expiry == MIN_EXPIRY
    assert DeliveryLedger(expiry=30).expiry == 30


@given(
    rdy=st.integers(1, 20),
    events=st.lists(st.tuples(st.sampled_from(["deliver", "fin"]), st.integers(0, 60))),
)
def test_an_honest_server_is_never_refused(rdy: int, events: list[tuple[str, int]]) -> None:
    """A server that keeps at most RDY unanswered messages in flight (no timeouts) passes."""
    ledger = DeliveryLedger(expiry=60)
    ledger.rdy(rdy)
    held: set[int] = set()
    for kind, n in events:
        if kind == "deliver" and len(held) < rdy and n not in held:
            ledger.delivered(_id(n), 0.0)
            held.add(n)
        elif kind == "fin" and n in held:
            ledger.settled(_id(n))
            held.discard(n)
    assert ledger.live(0.0) == len(held)
