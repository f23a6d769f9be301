"""``--timeout``: the one deadline of an admin command (``lookup``, ``topic ...``,
``channel ...``, ``leader move``, ``stats``), from its start to its end, however slowly a server
answers. Past it the command is cancelled and fails with an
:class:`~nsq_ha.errors.NsqTimeoutError` (one line, exit 1) that says what to do next.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator

from nsq_ha.errors import NsqTimeoutError
from nsq_ha.redact import redact_url

from .arguments import duration

__all__ = ["DEFAULT_TIMEOUT", "add_timeout_option", "command_deadline"]

#: seconds a command without a ``--timeout`` of its own may take
DEFAULT_TIMEOUT = 30.0


def add_timeout_option(
    parser: argparse.ArgumentParser,
    default: float = DEFAULT_TIMEOUT,
    what: str = "the command",
    *,
    included: str = "every request",
) -> None:
    """``--timeout SECONDS`` (finite, above 0: refused by argparse otherwise, exit 2), the one
    place the option is written: ``default`` is the library call's own where the command makes
    one that waits on purpose; the help says ``what`` it bounds, ``included`` what it covers."""
    parser.add_argument(
        "--timeout",
        type=duration,
        default=default,
        metavar="SECONDS",
        help=f"seconds {what} may take, {included} included ({default:g})",
    )


@contextlib.asynccontextmanager
async def command_deadline(args: argparse.Namespace, what: str = "") -> AsyncIterator[None]:
    """Run the block within ``args.timeout`` seconds; past it, :class:`NsqTimeoutError` naming
    the servers asked (passwords redacted) and what to do."""
    limit: float = args.timeout
    timer = asyncio.timeout(limit)
    try:
        async with timer:
            yield
    except TimeoutError:
        if not timer.expired():
            raise
        raise NsqTimeoutError(
            f"{what or 'no answer'} within {limit:g} s (--timeout {limit:g}): raise --timeout, "
            f"or check that {_servers(args)}"
        ) from None


def _servers(args: argparse.Namespace) -> str:
    lookupd = [redact_url(u) for u in getattr(args, "lookupd", None) or ()]
    nsqd_http = [redact_url(u) for u in getattr(args, "nsqd_http", None) or ()]
    if nsqd_http:
        return f"--nsqd-http {', '.join(nsqd_http)} names a running nsqd (its HTTP port)"
    if lookupd:
        return f"--lookupd {', '.join(lookupd)} names a running nsqlookupd (its HTTP port)"
    return "the servers are running"
