"""The nsqlookupds a :class:`~nsq_ha.lookup.LookupClient` asks: :class:`LookupdPool`.

* Seeds are nsqlookupd HTTP addresses; ``/listlookup`` finds the rest of a fork's lookupds.
* Every usable lookupd is asked at once (:meth:`LookupdPool.gather`), so a slow lookupd never
  holds back the others.
* A lookupd whose answer is refused (:mod:`nsq_ha.lookup.http` caps its size,
  :mod:`nsq_ha.lookup.wire` what it may hold) counts as failed, and a failed one is skipped until
  its backoff (:class:`LookupdHealth`) has passed, unless no other lookupd may be asked.
* Credentials in a seed are sent as HTTP basic auth (:class:`~nsq_ha.lookup.http.Endpoint`).
* Until a lookupd has answered, an address that answered something that is not HTTP is asked
  once more, in NSQ's own protocol (:func:`looks_like_nsqd`): nsqd's TCP port (4150, given for
  lookupd's HTTP port 4161, the usual mix-up) answers anything but its magic with
  ``E_BAD_PROTOCOL``, and :func:`never_answered`'s error then says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from nsq_ha.errors import (
    LookupdNeverAnsweredError,
    LookupdUnavailableError,
    NsqError,
    RemoteProtocolError,
)
from nsq_ha.lookup.http import Endpoint, get_answer, normalize_lookupd, tls_context
from nsq_ha.lookup.wire import LookupdError, parse_listlookup, unwrap
from nsq_ha.retry import Backoff, log_failure

if TYPE_CHECKING:  # httpx is imported where a request is made: nsqd= clients never load it
    import httpx

__all__ = ["ANSWER_GRACE", "NSQD_TCP_PORT", "LookupdHealth", "LookupdPool", "never_answered"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds the other lookupds get, once one has answered a lookup, to answer too.
ANSWER_GRACE = 0.5
#: What an address that answers with nsqd's E_BAD_PROTOCOL is told.
NSQD_TCP_PORT = "this looks like nsqd's TCP port (4150): lookupd's HTTP port is usually 4161"
#: The most of a probe's answer read: nsqd's whole E_BAD_PROTOCOL frame is 22 bytes.
_PROBE_BYTES = 256


def never_answered(tried: Sequence[tuple[str, str]]) -> LookupdNeverAnsweredError:
    """No lookupd has answered since the client started: ``tried`` is (address, what it did)."""
    what = "; ".join(f"{shown}: {reason}" for shown, reason in tried) or "none given"
    reasons = " ".join(reason for _, reason in tried)
    if NSQD_TCP_PORT in reasons:
        advice = "give nsqlookupd's HTTP address"
    elif "not HTTP" in reasons:
        advice = (
            "check the port (nsqlookupd's HTTP port, usually 4161, not nsqd's TCP port 4150) "
            "and the scheme (http:// or https://)"
        )
    else:
        advice = (
            "check the address: nsqlookupd's HTTP port (usually 4161), that nsqlookupd runs "
            "there and is reachable from here"
        )
    return LookupdNeverAnsweredError(
        f"no nsqlookupd has answered yet (tried {what}): {advice}. A lookupd that never "
        "answered is taken for a wrong address and not retried; one that answered once is "
        "retried through outages"
    )


async def looks_like_nsqd(url: str) -> bool:
    """Whether ``url``'s host and port answer like nsqd's TCP port: a request that is not
    NSQ's magic gets ``E_BAD_PROTOCOL``. The caller bounds the time; any failure is False."""
    import httpx

    parsed = httpx.URL(url)
    writer = None
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        reader, writer = await asyncio.open_connection(parsed.host, port)
        writer.write(b"GET / HTTP/1.1\r\n\r\n")  # what an HTTP client sends first
        await writer.drain()
        return b"E_BAD_PROTOCOL" in await reader.read(_PROBE_BYTES)
    except OSError:
        return False
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


@dataclass
class LookupdHealth:
    """One lookupd: where it is, and how its recent requests went."""

    endpoint: Endpoint
    failures: int = 0
    #: ``time.monotonic()`` before which it is asked only if no other lookupd may be
    retry_at: float = 0.0
    #: what its last failure was (for the error when no lookupd has ever answered)
    reason: str = ""

    def failed(self, reason: str, backoff: Backoff) -> None:
        """Skip it for ``backoff``'s wait after this many failures in a row (logged)."""
        self.failures += 1
        self.reason = reason
        delay = backoff.delay(self.failures)
        self.retry_at = time.monotonic() + delay
        what = f"nsqlookupd {self.endpoint.shown}"
        log_failure(log, what, self.failures, reason, delay, "until it answers again")

    def answered(self) -> None:
        """It answered (not with a server error): the streak, if any, ends."""
        if self.failures:
            shown = self.endpoint.shown
            log.info(
                "nsqlookupd %s answers again (after %d failures in a row)", shown, self.failures
            )
        self.failures, self.retry_at = 0, 0.0


class LookupdPool:
    """The known nsqlookupds (:attr:`states`, by URL), their health, and how a question is put
    to them."""

    def __init__(
        self,
        seeds: Sequence[str],
        *,
        http: httpx.AsyncClient | None,
        timeout: float,
        max_bytes: int,
        backoff: Backoff,
    ) -> None:
        """``seeds``: addresses as given (checked here); the options are checked by the caller."""
        import httpx

        self._seeds: dict[str, Endpoint] = {}
        for endpoint in (Endpoint.parse(normalize_lookupd(seed)) for seed in seeds):
            self._seeds.setdefault(endpoint.url, endpoint)
        self.states = {u: LookupdHealth(e) for u, e in self._seeds.items()}
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.backoff = backoff
        self._owns_http = http is None
        self._http = http or httpx.AsyncClient(timeout=timeout, verify=tls_context())
        #: requests still running after their question returned (they end by its deadline)
        self._stragglers: set[asyncio.Task[object]] = set()
        #: ``/listlookup`` was asked once (the lookupds known are the cluster's)
        self.discovered = False
        #: some lookupd has sent an HTTP answer (until then, failures are not retried)
        self.answered = False

    async def close(self) -> None:
        """Stop the requests still running; close the HTTP client if this pool made it."""
        await self._cancel(list(self._stragglers))
        if self._owns_http:
            await self._http.aclose()

    def never_answered(self, errors: Sequence[object]) -> LookupdNeverAnsweredError | None:
        """The error of a question ``errors`` answered, if no lookupd has ever answered and
        each was unreachable: a wrong address, not an outage."""
        if self.answered or not all(isinstance(e, LookupdUnavailableError) for e in errors):
            return None
        return never_answered(
            [(s.endpoint.shown, s.reason) for s in self.states.values() if s.failures]
        )

    async def _ask(
        self,
        state: LookupdHealth,
        path: str,
        params: dict[str, str] | None,
        parse: Callable[[object], T],
        deadline: float,
    ) -> T:
        """GET ``path`` of one lookupd by ``deadline`` (loop time) and parse the answer.

        A lookupd that cannot be reached, misses the deadline or sends an answer we refuse is
        marked failed (backoff); an error status is not (it answered). While no lookupd has
        ever answered, an answer that is not HTTP is checked for nsqd's TCP port.
        """
        import httpx

        shown = state.endpoint.shown
        try:
            async with asyncio.timeout_at(deadline):
                answer = await get_answer(
                    self._http, state.endpoint, path, params, max_bytes=self.max_bytes
                )
        except TimeoutError:
            what = f"did not answer {path} within {self.timeout:.1f} s"
            state.failed(what, self.backoff)
            raise LookupdUnavailableError(f"nsqlookupd {shown} {what} (timeout)") from None
        except httpx.HTTPError as exc:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            what = f"unreachable: {reason}"
            if isinstance(exc, httpx.RemoteProtocolError) and not self.answered:
                what = f"its answer is not HTTP ({reason})"
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(deadline):
                        if await looks_like_nsqd(state.endpoint.url):
                            what = f"it answered nsqd's E_BAD_PROTOCOL, not HTTP: {NSQD_TCP_PORT}"
            state.failed(what, self.backoff)
            raise LookupdUnavailableError(f"nsqlookupd {shown} {what}") from exc
        except RemoteProtocolError as exc:
            self.answered = True  # an HTTP answer, refused for its size or encoding
            state.failed(str(exc), self.backoff)
            raise
        self.answered = True
        if answer.status < 500:
            state.answered()
        try:
            return parse(unwrap(answer.status, answer.headers, answer.body, shown + path))
        except RemoteProtocolError as exc:
            state.failed(str(exc), self.backoff)
            raise

    def _start(
        self,
        path: str,
        params: dict[str, str] | None,
        parse: Callable[[object], T],
        deadline: float,
    ) -> list[asyncio.Task[T]]:
        """Ask every usable lookupd, or, while each one is backing off, the one whose backoff
        ends first rather than none."""
        now = time.monotonic()
        states = [s for s in self.states.values() if now >= s.retry_at]
        states = states or [min(self.states.values(), key=lambda s: s.retry_at)]
        loop = asyncio.get_running_loop()
        asks = (self._ask(s, path, params, parse, deadline) for s in states)
        return [loop.create_task(ask, name=f"nsq_ha-lookupd-{path}") for ask in asks]

    @staticmethod
    async def _cancel(tasks: Sequence[asyncio.Task[T]]) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _straggler_done(self, task: asyncio.Task[object]) -> None:
        self._stragglers.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a late answer or failure was already accounted for

    async def discover(self, deadline: float) -> None:
        """Ask ``/listlookup`` for the fork's lookupds by ``deadline``; keep the seeds on
        vanilla (404) and on a standalone fork (null). The first decisive answer wins.

        The lookupds it names come first (leader first), then the seeds not named; lookupds
        discovered before and no longer named are forgotten. A named lookupd that is also a
        seed keeps the seed's credentials; the others get none.
        """
        tasks = self._start("/listlookup", None, parse_listlookup, deadline)
        first_error: NsqError | None = None
        try:
            for next_done in asyncio.as_completed(tasks):
                try:
                    found = await next_done
                except LookupdUnavailableError:
                    continue
                except NsqError as exc:
                    if isinstance(exc, LookupdError) and exc.status == 404:
                        log.debug("nsqlookupd has no /listlookup (vanilla): using the seeds")
                        break
                    first_error = first_error or exc
                    continue
                if not found:
                    log.debug("/listlookup is null (standalone fork): using the seeds")
                    break
                self.states = {
                    u: self.states.get(u) or LookupdHealth(self._seeds.get(u) or Endpoint(u, u))
                    for u in found + [u for u in self._seeds if u not in found]
                }
                log.info("nsqlookupd cluster: %s (leader first)", ", ".join(found))
                break
            else:
                if first_error is not None:
                    raise first_error
        finally:
            await self._cancel(tasks)
        self.discovered = True

    async def gather(
        self,
        path: str,
        params: dict[str, str] | None,
        parse: Callable[[object], T],
        deadline: float,
    ) -> list[T | NsqError]:
        """Ask every usable lookupd at once; their answers or errors, in their order.

        Waits for all of them until one has answered, then :data:`ANSWER_GRACE` more seconds
        at most: the requests still running then are left out of the result and go on in the
        background until the deadline (a lookupd that misses it is marked failed).
        """
        loop = asyncio.get_running_loop()
        tasks = self._start(path, params, parse, deadline)
        pending: set[asyncio.Task[T]] = set(tasks)
        grace_end: float | None = None
        try:
            while pending:
                wait = None if grace_end is None else max(0.0, grace_end - loop.time())
                done, pending = await asyncio.wait(
                    pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    break
                if grace_end is None and any(
                    not t.cancelled() and t.exception() is None for t in done
                ):
                    grace_end = min(deadline, loop.time() + ANSWER_GRACE)
        except BaseException:
            await self._cancel(tasks)
            raise
        results: list[T | NsqError] = []
        for task in tasks:
            if task in pending:
                self._stragglers.add(task)
                task.add_done_callback(self._straggler_done)
            elif (exc := task.exception()) is None:
                results.append(task.result())
            elif isinstance(exc, NsqError):
                results.append(exc)
            else:
                raise exc
        return results
