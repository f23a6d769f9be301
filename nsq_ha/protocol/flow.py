"""RDY enforced on receipt: is nsqd sending more messages than the client allowed? (§1.6)

``RDY n`` lets nsqd have at most ``n`` messages in flight to one client; a server that sends
beyond it makes the client buffer without limit. nsqd frees a slot on FIN or REQ, which the
client sees, but also in ways the client cannot see: a message times out ``msg_timeout`` after
nsqd sent it, and the fork requeues every in-flight message of a channel that it resets. So
:class:`DeliveryLedger` counts only what an honest nsqd must still hold:

* the **largest RDY sent** on the connection: a smaller RDY can reach nsqd after it has
  already sent messages under the larger one;
* the **live deliveries**: messages received and not yet answered with FIN or REQ, except
  those received more than ``expiry`` seconds ago (nsqd has timed them out, or soon will); a
  TOUCH renews a message, a redelivery of a message still held replaces it;
* a delivery that would make the live count exceed ``slack x largest RDY`` is a protocol
  violation (:class:`~nsq_ha.errors.RemoteProtocolError`). ``slack`` (2) leaves one RDY
  window for slots nsqd freed without telling: the message timed out a little earlier there
  (nsqd's clock starts when it sends, ours when we read), or a channel reset.

Without any RDY sent, no message is allowed. Sans-IO: the caller passes the time.
"""

from __future__ import annotations

import math

from nsq_ha.errors import InvalidArgumentError, RemoteProtocolError

__all__ = ["DEFAULT_SLACK", "MIN_EXPIRY", "DeliveryLedger"]

#: Live deliveries allowed per unit of the largest RDY sent.
DEFAULT_SLACK = 2
#: Shortest expiry used, in seconds, whatever msg_timeout nsqd announced (a lying server could
#: announce 1 ms to make every delivery expire at once).
MIN_EXPIRY = 1.0


class DeliveryLedger:
    """The receipt-side RDY check of one connection."""

    __slots__ = ("_live", "_max_rdy", "expiry", "slack")

    def __init__(self, *, expiry: float, slack: int = DEFAULT_SLACK) -> None:
        """Count a delivery as live for ``expiry`` seconds (at least :data:`MIN_EXPIRY`)."""
        if math.isnan(expiry) or slack < 1:
            raise InvalidArgumentError(f"bad ledger settings: expiry={expiry!r} slack={slack!r}")
        self.expiry = max(MIN_EXPIRY, expiry)
        self.slack = slack
        self._max_rdy = 0
        #: message id -> when it was received or last touched; oldest first
        self._live: dict[bytes, float] = {}

    def __repr__(self) -> str:
        """Show the live count and the limit."""
        return f"<DeliveryLedger live={len(self._live)} limit={self.limit}>"

    @property
    def limit(self) -> int:
        """How many live deliveries are allowed now."""
        return self.slack * self._max_rdy

    @property
    def max_rdy(self) -> int:
        """The largest RDY sent so far."""
        return self._max_rdy

    def live(self, now: float) -> int:
        """Live deliveries at ``now``."""
        self._expire(now)
        return len(self._live)

    def rdy(self, count: int) -> None:
        """Record a ``RDY count`` sent."""
        if count > self._max_rdy:
            self._max_rdy = count

    def delivered(self, message_id: bytes, now: float) -> None:
        """Record a message received at ``now``; raise RemoteProtocolError beyond the limit.

        Expired deliveries are dropped only when the count reaches the limit: the decision is
        the same, and the common case costs no scan (a dict that entries leave from the front
        makes ``next(iter())`` walk every freed slot until the dict is resized)."""
        live = self._live
        if message_id in live:  # nsqd timed it out and sent it again: still one message
            del live[message_id]
        elif len(live) >= self.limit:
            self._expire(now)
            if len(live) >= self.limit:
                raise RemoteProtocolError(
                    f"nsqd sent a message beyond the RDY given: {len(live)} messages already in "
                    f"flight unanswered within {self.expiry:g} s, allowed {self.limit} "
                    f"({self.slack} x the largest RDY sent, {self._max_rdy})"
                )
        live[message_id] = now

    def settled(self, message_id: bytes) -> None:
        """Forget a message answered with FIN or REQ."""
        self._live.pop(message_id, None)

    def touched(self, message_id: bytes, now: float) -> None:
        """Renew a message answered with TOUCH (nsqd restarts its timeout); one already expired
        is forgotten instead (nsqd has timed it out: the TOUCH fails there)."""
        live = self._live
        received = live.pop(message_id, None)
        if received is not None and received > now - self.expiry:
            live[message_id] = now

    def _expire(self, now: float) -> None:
        """Drop deliveries older than ``expiry`` (they are first: the dict is oldest first)."""
        live = self._live
        horizon = now - self.expiry
        while live:
            oldest = next(iter(live))
            if live[oldest] > horizon:
                return
            del live[oldest]
