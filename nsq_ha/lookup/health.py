"""One nsqlookupd as a :class:`~nsq_ha.lookup.LookupClient` sees it: its address, its failures
in a row and the backoff that follows them (:data:`nsq_ha.retry.LOOKUPD`'s family), and the
log lines of a failure streak: a warning when it starts, debug lines while it lasts, an info
line when the lookupd answers again."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from nsq_ha.lookup.http import Endpoint
from nsq_ha.retry import Backoff

__all__ = ["LookupdHealth"]

log = logging.getLogger(__name__)


@dataclass
class LookupdHealth:
    """One lookupd: where it is, and how its recent requests went."""

    endpoint: Endpoint
    failures: int = 0
    #: ``time.monotonic()`` before which it is asked only if no other lookupd may be
    retry_at: float = 0.0
    #: what its last failure was (for the error when no lookupd has ever answered)
    reason: str = ""

    def usable(self, now: float) -> bool:
        """Its backoff is over at ``now``."""
        return now >= self.retry_at

    def failed(self, reason: str, now: float, backoff: Backoff) -> None:
        """Skip it for ``backoff``'s wait after this many failures in a row (unless no other
        lookupd may be asked); log a warning for the first failure in a row and a debug line
        for the others, in the words of :mod:`nsq_ha.retry`'s loops."""
        self.failures += 1
        self.reason = reason
        delay = backoff.delay(self.failures)
        self.retry_at = now + delay
        if self.failures == 1:
            log.warning(
                "nsqlookupd %s failed on attempt 1 (%s); next try in %.2f s, further failures "
                "in a row are logged at debug level until it answers again",
                self.endpoint.shown,
                reason,
                delay,
            )
        else:
            log.debug(
                "nsqlookupd %s failed on attempt %d (%s); next try in %.2f s",
                self.endpoint.shown,
                self.failures,
                reason,
                delay,
            )

    def answered(self) -> None:
        """It answered (not with a server error): the streak, if any, ends with an info line."""
        if self.failures:
            log.info(
                "nsqlookupd %s answers again (after %d failures in a row)",
                self.endpoint.shown,
                self.failures,
            )
        self.failures, self.retry_at = 0, 0.0
