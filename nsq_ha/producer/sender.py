"""Sending one batch: one attempt (route, connect, encode, command, read the answer), and the
retry loop around it, which asks :func:`nsq_ha.retry.decide` what an error means and the
:class:`~nsq_ha.producer.policy.RetryPolicy` how long to keep trying.

The sender gets the producer's pieces it needs (the route table, the connection pool, the
connections' settings) and calls them; nothing calls back into the producer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Literal, TypeVar, cast

from nsq_ha import events
from nsq_ha.connection import ConnectionConfig
from nsq_ha.errors import (
    NsqError,
    PartitionNotAvailableError,
    PublishError,
    UnsupportedByServerError,
)
from nsq_ha.producer.batch import (
    BatchBuilder,
    OutgoingMessage,
    Receipt,
    batch_command,
    encode_batch,
    receipts_from_answer,
)
from nsq_ha.producer.lanes import Outcome, Window
from nsq_ha.producer.limits import ServerLimits, split_batch, splits_batch
from nsq_ha.producer.policy import RetryPolicy
from nsq_ha.producer.pool import ConnectionPool
from nsq_ha.producer.result import PublishResult
from nsq_ha.producer.routes import ConnKey, Routes, RouteTable, check_features
from nsq_ha.protocol.publish import encode_dpub
from nsq_ha.redact import redact_text as redact
from nsq_ha.retry import decide

__all__ = ["Sender", "results_of"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


def results_of(
    topic: str, partition: int | None, address: str, attempts: int, receipts: Sequence[Receipt]
) -> list[PublishResult]:
    """One result per receipt; neighbours answered by the same receipt share one (immutable)
    result, so a plain ``OK`` for a thousand messages builds one object."""
    results: list[PublishResult] = []
    for _, run in itertools.groupby(receipts, id):
        same = list(run)
        receipt = same[0]
        result = PublishResult(
            topic,
            partition,
            address,
            attempts,
            receipt.internal_id,
            receipt.trace_id,
            receipt.offset,
            receipt.raw_size,
        )
        results += [result] * len(same)
    return results


class Sender:
    """Sends batches of one producer: :meth:`send` retries :meth:`attempt` under the policy.

    ``closing()`` says the producer is closing (no forced lookups then); once
    ``pool.aborting`` is set, a retriable failure ends as PublishError ("closed before nsqd
    acknowledged") instead of another try. ``stats`` counts commands, messages published,
    retries, forced lookups and batches split after a refusal (``batches_split``).
    ``limits`` holds the size limits nsqd named in its refusals.

    Logging: a retry loop's first failure is a warning, unless a loop for the same target
    (``what``: a topic's lookup, its unkeyed batches, or one slot) already warned in the same
    streak; later failures are debug lines; the retried call that succeeds ends the streak with
    an info line, and a loop that gives up ends it silently (its caller gets the error).
    """

    __slots__ = (
        "_streaks",
        "_windows",
        "closing",
        "config",
        "limits",
        "max_batch",
        "policy",
        "pool",
        "routes",
        "stats",
        "trace",
        "unkeyed_window",
    )

    def __init__(
        self,
        *,
        routes: RouteTable,
        pool: ConnectionPool,
        config: ConnectionConfig,
        policy: RetryPolicy,
        stats: MutableMapping[str, int],
        trace: bool,
        max_batch: int,
        unkeyed_window: int,
        closing: Callable[[], bool],
    ) -> None:
        self.routes = routes
        self.pool = pool
        self.config = config
        self.policy = policy
        self.stats = stats
        self.trace = trace
        self.max_batch = max_batch
        self.unkeyed_window = unkeyed_window
        self.closing = closing
        self.limits = ServerLimits(
            max_msg_size=config.max_msg_size, max_body_size=config.max_body_size
        )
        self._windows: dict[tuple[str, int], Window] = {}
        #: (topic, what) -> failed tries, while a streak of failures of ``what`` lasts
        self._streaks: dict[tuple[str, str], int] = {}

    def builder(self, routes: Routes | None) -> BatchBuilder:
        """How batches for ``routes``' topic are cut: under the configured size limits, or
        the lowest that one of the topic's nsqd named in a refusal."""
        max_msg, max_body, checks_each = self.config.max_msg_size, self.config.max_body_size, False
        if self.limits and routes is not None:
            addresses = (node.address for node in routes.nodes.values())
            max_msg, max_body, checks_each = self.limits.lowest(addresses)
        return BatchBuilder(
            max_msg_size=max_msg,
            max_body_size=max_body,
            max_count=self.max_batch,
            tracing=self.trace and routes is not None and routes.fork is True,
            ext_topic=routes is not None and routes.ext is True,
            checks_each=checks_each,
        )

    # -- the retry loop ---------------------------------------------------------------------

    async def retried(
        self,
        what: str,
        attempt: Callable[[int], Awaitable[_T]],
        *,
        topic: str,
        slot: int | None = None,
        operation: Literal["publish", "lookup"] = "publish",
    ) -> _T:
        """``await attempt(n)`` for n = 1, 2, ... until it succeeds, the error is not worth
        another try, or the policy gives up (PublishError, ``__cause__`` the last error, and a
        :class:`~nsq_ha.events.PublishGaveUp` event)."""
        started = time.monotonic()  # the loop's clock, without asking for the running loop
        try:
            return await attempt(1)
        except NsqError as exc:
            stop = self._stop(what, exc, 1, started, topic=topic, slot=slot, operation=operation)
            if stop is exc:
                raise
            if stop is not None:
                raise stop from exc
            failure = exc
        number, succeeded = 1, False
        try:  # a streak of failures: logged once, ended by however this loop ends
            while True:
                wait = self.policy.delay(number)
                self.stats["retries"] += 1
                self._failed_try(topic, what, number, failure, wait)
                await asyncio.sleep(wait)
                number += 1
                try:
                    result = await attempt(number)
                except NsqError as exc:
                    stop = self._stop(
                        what, exc, number, started, topic=topic, slot=slot, operation=operation
                    )
                    if stop is exc:
                        raise
                    if stop is not None:
                        raise stop from exc
                    failure = exc
                else:
                    succeeded = True
                    return result
        finally:
            self._streak_over(topic, what, number, succeeded=succeeded)

    def _stop(
        self,
        what: str,
        exc: NsqError,
        number: int,
        started: float,
        *,
        topic: str,
        slot: int | None,
        operation: Literal["publish", "lookup"],
    ) -> NsqError | None:
        """After try ``number`` failed with ``exc``: None to try again, else what to raise
        (``exc`` itself when it is not worth another try; PublishError when the producer is
        closing or the policy gives up)."""
        if not decide(exc).retry:
            return exc
        if self.pool.aborting:
            return PublishError(
                f"{what}: the producer closed before nsqd acknowledged it",
                attempts=number,
                last_error=exc,
            )
        if not self.policy.exhausted(number, time.monotonic() - started):
            return None
        events.emit(
            events.PublishGaveUp(
                topic=topic,
                partition=slot,
                attempts=number,
                error=redact(str(exc)),
                operation=operation,
            )
        )
        return PublishError(
            f"{what} failed after {number} attempts: {redact(str(exc))}",
            attempts=number,
            last_error=exc,
        )

    def _failed_try(self, topic: str, what: str, number: int, exc: NsqError, wait: float) -> None:
        """Log a failed try: a warning when it starts a streak for ``what``, else debug."""
        key = (topic, what)
        failed = self._streaks.get(key)
        self._streaks[key] = (failed or 0) + 1
        if failed is None:
            log.warning(
                "%s failed (%s); retrying under the retry policy (up to %d attempts%s), "
                "further failures are logged at debug level until it succeeds",
                what,
                redact(str(exc)),
                self.policy.attempts,
                "" if self.policy.deadline is None else f" or {self.policy.deadline:g} s",
            )
        else:
            log.debug(
                "%s failed on attempt %d (%s); retrying in %.2fs",
                what,
                number,
                redact(str(exc)),
                wait,
            )

    def _streak_over(self, topic: str, what: str, number: int, *, succeeded: bool) -> None:
        """A retried call ended: the streak of ``what``, if one is on, ends (with an info line
        when the call succeeded: the target works again)."""
        failed = self._streaks.pop((topic, what), None)
        if failed is not None and succeeded:
            log.info(
                "%s succeeded again on attempt %d (%d failed tries in the streak)",
                what,
                number,
                failed,
            )

    async def resolve(self, topic: str, *, keyed: bool) -> Routes:
        """The topic's routes, looked up again under the policy while it has no writable
        partition (or, ``keyed``, no known partition count)."""
        return await self.retried(
            f"lookup of {topic!r}",
            lambda _: self.routes.current(topic, keyed=keyed),
            topic=topic,
            operation="lookup",
        )

    async def send(
        self,
        topic: str,
        messages: list[OutgoingMessage],
        *,
        slot: int | None,
        defer: float | None = None,
    ) -> list[PublishResult]:
        """Send one batch (to ``slot``, or round-robin when None), retried under the policy."""
        where = f"publish to {topic!r}" + (f" slot {slot}" if slot is not None else "")
        return await self.retried(
            where,
            lambda number: self.attempt(topic, messages, slot, defer, number),
            topic=topic,
            slot=slot,
        )

    async def send_batch(
        self, topic: str, messages: list[OutgoingMessage], slot: int | None
    ) -> list[Outcome]:
        """:meth:`send` without ``defer`` (what a lane's sender calls): each message's outcome.

        nsqd takes or refuses an ``MPUB*`` as a whole. When it refuses a batch for one of its
        messages or for its size (:func:`~nsq_ha.producer.limits.splits_batch`; nothing of it
        was stored), the batch is cut (under the limit the refusal named, or in halves) and
        the parts are sent one after the other, in order, each split again if refused: every
        message ends with its own answer. A part that fails for another reason (the partition,
        the connection) fails the parts after it too, as the whole batch would have.
        """
        try:
            return cast("list[Outcome]", await self.send(topic, messages, slot=slot))
        except NsqError as exc:
            if len(messages) < 2 or not splits_batch(exc):
                raise
            refusal = exc
        self.stats["batches_split"] += 1
        parts = split_batch(messages, self.builder(self.routes.cached(topic)))
        log.info(
            "publish to %r: nsqd refused a batch of %d messages (%s); sending it again in %d parts",
            topic,
            len(messages),
            redact(str(refusal)),
            len(parts),
        )
        outcomes: list[Outcome] = []
        for part in parts:
            try:
                outcomes += await self.send_batch(topic, part, slot)
            except NsqError as exc:
                if len(part) == 1 and splits_batch(exc):
                    outcomes.append(exc)  # this message's own refusal
                    continue
                outcomes += [exc] * (len(messages) - len(outcomes))
                break
        return outcomes

    # -- one attempt ------------------------------------------------------------------------

    async def attempt(
        self,
        topic: str,
        messages: list[OutgoingMessage],
        slot: int | None,
        defer: float | None,
        attempts: int,
    ) -> list[PublishResult]:
        """Send ``messages`` once and read nsqd's answer; on an error, drop what it says is
        stale (the connection, the cached map) before raising it."""
        routes = await self.routes.current(topic)
        windowed = slot is None  # unkeyed: up to unkeyed_window commands out per partition
        if slot is None:
            slot = self.routes.next_slot(routes)
        node = routes.nodes.get(slot)
        if node is None:
            missing = PartitionNotAvailableError(
                f"{topic!r} partition {slot} has no writable leader in the current lookup"
            )
            # look again now (the next try reads the fresh map), not at the periodic refresh
            await self._after_failure(topic, None, missing)
            raise missing
        key = routes.key(slot, node)
        partition = routes.wire_partition(slot)
        window = self._window(topic, slot) if windowed else None
        try:
            async with window if window is not None else contextlib.nullcontext():
                conn = await self.pool.get(key)
                fork = conn.is_fork
                tracing = self.trace and fork
                name = batch_command(messages, tracing=tracing)
                self.limits.check(node.address, messages, name)  # a limit nsqd named before
                if routes.fork is None:  # nsqd= addresses: the kind is known only now
                    if fork and not windowed:
                        raise UnsupportedByServerError(
                            f"{node.address} is a fork nsqd: a sharding key needs topic "
                            f"{topic!r}'s partition count and leaders, which only nsqlookupd "
                            "knows; publish keyed messages through lookupd= (nsqd= addresses "
                            "of the fork take unkeyed publishes only)"
                        )
                    check_features(fork, topic, messages, defer=defer, partition=partition)
                if defer is not None:
                    data = encode_dpub(
                        topic, messages[0].body, defer, max_msg_size=self.config.max_msg_size
                    )
                else:
                    data = encode_batch(
                        topic,
                        partition,
                        messages,
                        tracing=tracing,
                        max_msg_size=self.config.max_msg_size,
                        max_body_size=self.config.max_body_size,
                        name=name,
                    )
                self.stats["commands"] += 1
                answer = await conn.command(data, response_timeout=self.policy.attempt_timeout)
                receipts = receipts_from_answer(
                    answer, messages, tracing=tracing, ext_topic=routes.ext, name=name
                )
        except NsqError as exc:
            self.limits.learn(node.address, exc)
            await self._after_failure(topic, key, exc, attempts)
            raise
        self.stats["published"] += len(messages)
        return results_of(topic, partition, node.address, attempts, receipts)

    async def _after_failure(
        self, topic: str, key: ConnKey | None, exc: BaseException, attempts: int = 1
    ) -> None:
        """Drop what the error says is stale; refresh the lookup at once when it says so."""
        decision = decide(exc)
        if key is not None and decision.reconnect:
            self.pool.drop(key)
            events.emit(
                events.Reconnecting(
                    role="producer",
                    topic=topic,
                    partition=key[2] if key[2] >= 0 else None,
                    address=key[0],
                    error=redact(str(exc)),
                    attempt=attempts,
                )
            )
        if decision.refresh_lookup and self.routes.lookup is not None and not self.closing():
            self.stats["lookups_forced"] += 1
            with contextlib.suppress(NsqError):
                await self.routes.refresh(topic)

    # -- unkeyed windows --------------------------------------------------------------------

    def _window(self, topic: str, slot: int) -> Window:
        window = self._windows.get((topic, slot))
        if window is None:
            window = self._windows[(topic, slot)] = Window(self.unkeyed_window)
        return window

    def busy_topics(self) -> set[str]:
        """Topics with an unkeyed command out or waiting for room in its window."""
        return {
            topic
            for (topic, _), window in self._windows.items()
            if window.waiters or window.free < self.unkeyed_window
        }

    def forget(self, topics: Iterable[str]) -> None:
        """Drop the windows of ``topics``."""
        names = set(topics)
        for key in [k for k in self._windows if k[0] in names]:
            del self._windows[key]
        for streak in [k for k in self._streaks if k[0] in names]:
            del self._streaks[streak]

    @property
    def window_topics(self) -> set[str]:
        """Topics that have a window."""
        return {topic for topic, _ in self._windows}
