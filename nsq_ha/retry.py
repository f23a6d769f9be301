"""The one place that turns an error into what to do next.

Every error class carries two flags (``errors.py``): ``retriable`` (trying the same operation
again may succeed) and ``refresh_lookup`` (the partition map is stale). Broker errors also carry
``fatal``, set by the connection from the command that failed (nsqd closes the connection, or
the stream is out of step). :func:`decide` reads those flags and nothing else, so the producer,
the consumer and the tools cannot disagree about an error::

    error                                   retry  refresh lookup  reconnect
    ------------------------------------    -----  --------------  ---------
    not an NsqError (a bug, cancellation)   no     no              no
    NsqConnectionError, NsqTimeoutError,    flag   yes             yes
      RemoteProtocolError (the stream broke)
    BrokerError                             flag   flag or fatal   fatal or refresh_lookup
    any other NsqError                      flag   flag            no

A broker error that says the partition moved (``refresh_lookup``) also drops the connection
even when nsqd keeps it open: connections are per (node, partition), and that node no longer
leads the partition. Whether the caller may still retry (a producer that is closing does not)
is the caller's business; what the error means is decided here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import (
    BrokerError,
    NsqConnectionError,
    NsqError,
    NsqTimeoutError,
    RemoteProtocolError,
)

__all__ = ["GIVE_UP", "Decision", "decide"]


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do after an error."""

    #: Trying the same operation again may succeed (after the retry policy's wait).
    retry: bool
    #: Ask nsqlookupd again before the next try: the partition map is stale.
    refresh_lookup: bool
    #: Drop the connection the error came from and open a new one for the next try.
    reconnect: bool

    @property
    def give_up(self) -> bool:
        """Nothing to try again: the error goes to the caller."""
        return not self.retry


#: The decision for an error nothing can be done about.
GIVE_UP = Decision(retry=False, refresh_lookup=False, reconnect=False)

_BROKEN_STREAM = (NsqConnectionError, NsqTimeoutError, RemoteProtocolError)


def decide(exc: BaseException) -> Decision:
    """Turn ``exc``'s flags into retry / refresh the lookup / reconnect / give up."""
    if not isinstance(exc, NsqError):
        return GIVE_UP
    if isinstance(exc, _BROKEN_STREAM):
        return Decision(retry=exc.retriable, refresh_lookup=True, reconnect=True)
    if isinstance(exc, BrokerError):
        reconnect = exc.fatal or exc.refresh_lookup
        return Decision(
            retry=exc.retriable,
            refresh_lookup=exc.refresh_lookup or reconnect,
            reconnect=reconnect,
        )
    return Decision(retry=exc.retriable, refresh_lookup=exc.refresh_lookup, reconnect=False)
