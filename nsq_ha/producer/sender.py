"""The producer's one sender: every publish joins the lane of its topic and slot as one
:class:`~nsq_ha.producer.batch.Call` (:meth:`Sender.submit`); a lane's tasks cut the queue into
batches (group commit) and send each: one attempt outside any retry loop (a publish that succeeds
builds none), then, after a retriable failure, :func:`nsq_ha.retry.retry_after` under the
:class:`~nsq_ha.producer.RetryPolicy`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Final, Literal, TypeVar, cast

from nsq_ha import events
from nsq_ha.errors import (
    NsqError,
    PartitionNotAvailableError,
    PublishError,
    UnsupportedByServerError,
)
from nsq_ha.producer.batch import (
    Call,
    Outcome,
    Outcomes,
    Run,
    batch_command,
    live,
    messages_of,
    results_from_answer,
    settle,
    take,
)
from nsq_ha.producer.config import ProducerConfig
from nsq_ha.producer.limits import ServerLimits, split_batch, splits_batch
from nsq_ha.producer.message import BatchBuilder, PublishResult
from nsq_ha.producer.pool import ConnectionPool
from nsq_ha.producer.routes import ConnKey, Routes, check_features
from nsq_ha.producer.topic import Lane, Topic, Window
from nsq_ha.protocol.publish import Dpub, Publish, PublishMessage
from nsq_ha.redact import redact_text as redact
from nsq_ha.retry import Failure, decide, retry_after

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: how a lane sends one batch: ``send_batch(topic, messages, slot)``, each message's outcome
SendBatch = Callable[[Topic, list[PublishMessage], "int | None"], Awaitable[list[Outcome]]]


class Sender:
    """Sends the batches of one producer. ``closing()``: the producer is closing (no forced
    lookups); once ``pool.aborting`` is set, a retriable failure ends as PublishError.

    Logging: a retry loop's first failure is a warning, unless one for the same target (a topic's
    lookup, its unkeyed batches, a slot) already warned in this streak; later ones are debug lines,
    and a retried call that succeeds ends the streak with an info line."""

    __slots__ = (
        "_builders",
        "_cut",
        "_transmit",
        "closing",
        "config",
        "limits",
        "linger",
        "max_batch",
        "policy",
        "pool",
        "splits",
        "stats",
        "trace",
        "unkeyed_window",
    )

    def __init__(
        self,
        settings: ProducerConfig,
        pool: ConnectionPool,
        stats: MutableMapping[str, int],
        closing: Callable[[], bool],
        *,
        send_batch: SendBatch | None = None,
        builder: Callable[[Routes | None], BatchBuilder] | None = None,
    ) -> None:
        """``send_batch`` and ``builder`` replace those methods where the lanes send and cut
        their batches (a test's seam: a compiled Sender cannot be subclassed)."""
        self._transmit: SendBatch = send_batch or self.send_batch
        self._cut: Callable[[Routes | None], BatchBuilder] = builder or self.builder
        self.pool = pool
        self.config = config = settings.connection
        self.policy = settings.retry
        self.stats = stats
        # read on every batch: attributes of their own, not through ``settings``
        self.trace = settings.trace
        self.max_batch = settings.max_batch
        self.linger = settings.linger
        self.unkeyed_window = settings.unkeyed_window
        self.closing = closing
        #: the size limits nsqd named in its refusals
        self.limits = ServerLimits(config.max_msg_size, config.max_body_size)
        #: calls whose messages went in several batches, while some of them are still out
        self.splits: set[Call] = set()
        #: (tracing, ext topic) -> the builder of batches under the configured limits
        self._builders: dict[tuple[bool, bool], BatchBuilder] = {}

    def builder(self, routes: Routes | None) -> BatchBuilder:
        """How batches for ``routes``' topic are cut: under the configured limits (four builders,
        each made once), or the lowest one of the topic's nsqd named in a refusal."""
        tracing = self.trace and routes is not None and routes.fork is True
        ext_topic = routes is not None and routes.ext is True
        learned = routes.addresses.values() if self.limits.learned and routes is not None else None
        kind = (tracing, ext_topic)
        builder = self._builders.get(kind) if learned is None else None
        if builder is None:
            msg, body, each = self.limits.lowest(learned or ())  # each: a learned message limit
            builder = BatchBuilder(msg, body, self.max_batch, tracing, ext_topic, each)
            if learned is None:
                self._builders[kind] = builder
        return builder

    def submit(
        self, topic: Topic, slot: int | None, messages: list[PublishMessage], plain: int | None
    ) -> asyncio.Future[Outcomes]:
        """Queue ``messages`` (``plain``: their plain_size) on the lane of ``slot`` (None:
        unkeyed); the future gets their outcomes (a PublishResult, or what stopped each)."""
        lane = topic.lanes.get(slot) or topic.lane(slot)
        loop = lane.loop
        future: asyncio.Future[Outcomes] = (
            asyncio.Future(loop=loop) if lane.direct_futures else loop.create_future()
        )
        lane.queue.append(Call(messages, future, plain))
        lane.waiting += len(messages)
        if not lane.senders or (slot is None and lane.sending >= len(lane.senders)):
            self._start(topic, lane)  # no task will take these with its next batch
        return future

    def queue_ready(
        self,
        topic: Topic,
        messages: list[PublishMessage],
        key: object,
        partition: object,
        plain_bytes: int | None,
    ) -> asyncio.Future[Outcomes] | None:
        """:meth:`submit` a call at once when ``topic``'s cached routes serve it; None when it must
        look up or, keyed, wait behind an earlier keyed call (:meth:`Topic.turn`)."""
        keyed = key is not None or partition is not None
        if keyed and topic.waiting is not None:
            return None
        routes = topic.ready(keyed)
        if routes is None:
            return None
        slot = topic.place(routes, messages, key, partition)
        return self.submit(topic, slot, messages, plain_bytes)

    def queue_plain(
        self, topics: dict[Any, Topic], name: object, body: object, key: object, partition: object
    ) -> asyncio.Future[Outcomes] | None:
        """:meth:`queue_ready` of a plain message (non-empty ``bytes`` within ``max_msg_size``) to
        ``topics[name]``; None when ``body`` is not one, with no such topic, or as it says."""
        if type(body) is not bytes or not 0 < (size := len(body)) <= self.config.max_msg_size:
            return None
        if (topic := topics.get(name)) is None:
            return None
        return self.queue_ready(topic, [PublishMessage(body)], key, partition, 4 + size)

    def _start(self, topic: Topic, lane: Lane) -> None:
        """Start a task for ``lane`` unless one is about to take the next batch anyway: a keyed
        lane has one (:meth:`submit` starts it); an unkeyed one more while the others wait for
        their answers, up to two per writable partition (one in flight while the next fills)."""
        senders = len(lane.senders)
        if senders:
            routes = topic.routes
            most = max(2, 2 * len(routes.writable)) if routes is not None else 2
            if lane.sending < senders or senders >= most:
                return
        task = lane.loop.create_task(
            self._drain(topic, lane), name=f"nsq_ha-lane-{topic.name}-{lane.slot}"
        )
        lane.senders.add(task)

    async def _drain(self, topic: Topic, lane: Lane) -> None:
        """Send a lane's queue, one batch at a time (the lane's other tasks take others)."""
        runs: list[Run] = []
        try:
            while lane.queue:
                if self.linger and lane.waiting < self.max_batch:
                    await asyncio.sleep(self.linger)
                    if not lane.queue:
                        break
                routes = topic.routes
                share = None
                if lane.slot is None:
                    # an unkeyed burst is spread: a batch takes whole calls up to its share of
                    # what is queued among the partitions with no batch out; without linger at
                    # least two shares, so callers that wait for one batch and publish again
                    # never all ride the same batch (with linger, gathering was asked for)
                    writable = len(routes.writable) if routes is not None else 1
                    shares = writable if self.linger else max(2, writable)
                    free = max(1, shares - lane.sending)
                    share = -(-lane.waiting // free)
                runs, taken = take(lane.queue, self._cut(routes), share)
                lane.waiting -= taken
                runs = live(runs, self.splits)
                if not runs:
                    continue
                lane.sending += 1
                if share is not None and lane.queue:
                    self._start(topic, lane)  # the rest goes to other partitions meanwhile
                batch = messages_of(runs)
                try:
                    results = await self._transmit(topic, batch, lane.slot)
                except NsqError as exc:
                    results = [exc] * len(batch)
                finally:
                    lane.sending -= 1
                settle(runs, results, self.splits)
                runs = []
                if lane.slot is not None and lane.queue:
                    # the callers just settled publish again in the next turn and ride the next
                    # batch (else two halves alternate, each a command per round trip)
                    await asyncio.sleep(0)
        except BaseException as exc:  # cancelled (closed), or a bug: never leave callers waiting
            error = exc
            if isinstance(exc, asyncio.CancelledError):
                error = PublishError(
                    f"publish to {topic.name!r} partition {lane.slot}: the producer closed "
                    "before nsqd acknowledged it",
                    attempts=0,
                )
            self._fail(lane, runs, error)
            raise
        finally:
            # not in a done callback: a submit before it ran would count this task as busy
            # and leave its messages with no task at all
            lane.senders.discard(cast("asyncio.Task[None]", asyncio.current_task(lane.loop)))
            topic.last_used = time.monotonic()  # idle from the end of its work on

    def abort(self, topics: Iterable[Topic]) -> None:
        """Cancel every lane's tasks and fail every queued message (the producer gave up)."""
        error = PublishError("the producer closed before nsqd acknowledged it", attempts=0)
        for topic in topics:
            for lane in topic.lanes.values():
                for task in lane.senders:
                    task.cancel()
                self._fail(lane, [], error)  # a task cancelled before it ran

    def _fail(self, lane: Lane, runs: list[Run], error: BaseException) -> None:
        """Fail the messages of ``runs`` (a batch that was out) and of ``lane``'s queue."""
        runs = [*runs, *((c, c.taken, len(c.messages)) for c in lane.queue)]
        lane.queue.clear()
        lane.waiting = 0
        settle(runs, [error] * sum(end - start for _, start, end in runs), self.splits)

    async def resolve(self, topic: Topic, *, keyed: bool) -> Routes:
        """The topic's routes, looked up again under the policy while it has no writable
        partition (or, ``keyed``, no known partition count)."""
        started = time.monotonic()
        try:
            return await topic.current(keyed=keyed, closing=self.closing)
        except NsqError as exc:
            first = exc  # retried outside the except block (see attempt())
        retry = lambda _: topic.current(keyed=keyed, closing=self.closing)  # noqa: E731
        return await self._retry(first, retry, topic, None, started, "lookup")

    async def send(
        self,
        topic: Topic,
        messages: list[PublishMessage],
        *,
        slot: int | None,
        defer: float | None = None,
    ) -> list[PublishResult]:
        """Send one batch (to ``slot``, or round-robin when None), retried under the policy:
        the first try here, the others (after a retriable failure) in :meth:`_retry`."""
        started = time.monotonic()
        try:
            return await self.attempt(topic, messages, slot, defer, 1)
        except NsqError as exc:
            first = exc  # retried outside the except block (see attempt())
        retry = lambda number: self.attempt(topic, messages, slot, defer, number)  # noqa: E731
        return await self._retry(first, retry, topic, slot, started, "publish")

    async def _retry(
        self,
        first_error: NsqError,
        attempt: Callable[[int], Awaitable[_T]],
        topic: Topic,
        slot: int | None,
        started: float,
        operation: Literal["publish", "lookup"],
    ) -> _T:
        """Tries 2, 3, ... after try 1 (begun at ``started``) failed with ``first_error``; when the
        policy gives up, PublishError (``__cause__`` the last error) and a PublishGaveUp event."""
        what = f"lookup of {topic.name!r}"
        if operation == "publish":
            what = f"publish to {topic.name!r}" + (f" slot {slot}" if slot is not None else "")
        tries = 1  # the attempt under way

        def on_retry(failure: Failure) -> None:
            nonlocal tries
            tries = failure.attempt + 1
            self.stats["retries"] += 1
            topic.streaks[what] = topic.streaks.get(what, 0) + 1

        def give_up(failure: Failure) -> BaseException:
            error = redact(str(failure.error))
            events.emit(
                events.PublishGaveUp(
                    topic=topic.name,
                    partition=slot,
                    attempts=failure.attempt,
                    error=error,
                    operation=operation,
                )
            )
            return PublishError(
                f"{what} failed after {failure.attempt} attempts: {error}",
                attempts=failure.attempt,
                last_error=failure.error,
            )

        if not decide(first_error).retry:
            raise first_error
        policy = self.policy
        try:
            result = await retry_after(
                first_error,
                attempt,
                what=what,
                backoff=policy.waits,
                attempts=policy.attempts,
                deadline=policy.deadline,
                started=started,
                should_retry=lambda exc: decide(exc).retry and not self.pool.aborting,
                on_retry=on_retry,
                give_up=give_up,
                describe=lambda exc: redact(str(exc)),
                # read as the loop starts: tenacity logs the first failure before it first waits
                logger=_QUIET if topic.streaks.get(what) else log,
            )
        except NsqError as exc:
            if decide(exc).retry and self.pool.aborting:  # closed before or under the loop
                raise PublishError(
                    f"{what}: the producer closed before nsqd acknowledged it",
                    attempts=tries,
                    last_error=exc,
                ) from exc
            raise
        finally:
            failed = topic.streaks.pop(what, None)
        if failed is not None:
            log.info(
                "%s succeeded again on attempt %d (%d failed tries in the streak)",
                what,
                tries,
                failed,
            )
        return result

    async def send_batch(
        self, topic: Topic, messages: list[PublishMessage], slot: int | None
    ) -> list[Outcome]:
        """:meth:`send` without ``defer``: each message's outcome. A batch nsqd refuses for one
        of its messages or its size (nothing of it stored) is cut (under the limit the refusal
        named, or in halves) and the parts sent in order, each split again if refused; a part
        that fails for another reason fails the parts after it too, as the whole batch would."""
        try:
            return cast("list[Outcome]", await self.send(topic, messages, slot=slot))
        except NsqError as exc:
            if len(messages) < 2 or not splits_batch(exc):
                raise
            refusal = exc
        self.stats["batches_split"] += 1
        parts = split_batch(messages, self.builder(topic.routes))
        log.info(
            "publish to %r: nsqd refused a batch of %d messages (%s); sending it again in %d parts",
            topic.name,
            len(messages),
            redact(str(refusal)),
            len(parts),
        )
        outcomes: list[Outcome] = []
        for part in parts:
            try:
                outcomes += await self.send_batch(topic, part, slot)
            except NsqError as exc:
                if len(part) > 1 or not splits_batch(exc):
                    outcomes += [exc] * (len(messages) - len(outcomes))
                    break
                outcomes.append(exc)  # this message's own refusal
        return outcomes

    async def attempt(
        self,
        topic: Topic,
        messages: list[PublishMessage],
        slot: int | None,
        defer: float | None,
        attempts: int,
    ) -> list[PublishResult]:
        """Send ``messages`` once and read nsqd's answer; on an error, drop what it says is
        stale (the connection, the cached map) before raising it."""
        name = topic.name
        routes = topic.routes
        if routes is None or (topic.lookup is not None and not topic.watched):
            routes = await topic.current(keyed=False, closing=self.closing)
        window: Window | contextlib.nullcontext[None] = _NO_WINDOW
        windowed = slot is None  # unkeyed: up to unkeyed_window commands out per partition
        if slot is None:
            slot = topic.next_slot(routes)
            window = topic.windows.get(slot) or topic.windows.setdefault(
                slot, Window(self.unkeyed_window)
            )
        address = routes.addresses.get(slot)
        if address is None:
            missing = PartitionNotAvailableError(
                f"{name!r} partition {slot} has no writable leader in the current lookup"
            )
            # look again now (the next try reads the fresh map), not at the periodic refresh
            await self._after_failure(topic, None, missing)
            raise missing
        fork = routes.fork
        partition = slot if fork else None
        key: ConnKey = (address, name, slot) if fork else (address, "", -1)
        try:
            async with window:
                conn = topic.conns.get(slot) if fork else self.pool.shared.get(address)
                if conn is None or conn.closed:
                    conn = await self.pool.get(key, topic.conns)
                static = fork is None  # nsqd= addresses: the kind is known only now
                if static:
                    fork = conn.is_fork
                    if fork and not windowed:
                        raise UnsupportedByServerError(
                            f"{address} is a fork nsqd: a sharding key needs topic "
                            f"{name!r}'s partition count and leaders, which only nsqlookupd "
                            "knows; publish keyed messages through lookupd= (nsqd= addresses "
                            "of the fork take unkeyed publishes only)"
                        )
                tracing = self.trace and bool(fork)
                command = batch_command(messages, tracing=tracing)
                if static and (defer is not None or command not in _PLAIN):
                    check_features(fork, name, messages, defer=defer, partition=partition)
                if self.limits.learned:  # a limit nsqd named before
                    self.limits.check(address, messages, command)
                conf = self.config
                request: Publish | Dpub = (
                    Publish(
                        command, name, partition, messages, conf.max_msg_size, conf.max_body_size
                    )
                    if defer is None
                    else Dpub(name, messages[0].body, defer)
                )
                self.stats["commands"] += 1
                answer = await conn.command(request, response_timeout=self.policy.attempt_timeout)
                where = (name, partition, address, attempts)
                results = results_from_answer(answer, messages, command, where, routes.ext)
        except NsqError as exc:
            # handled after the except block: compiled by mypyc, an await inside it and a
            # bare raise after it freed the error once too often (a crash when it was read)
            failure = exc
        else:
            self.stats["published"] += len(messages)
            return results
        self.limits.learn(address, failure)
        await self._after_failure(topic, key, failure, attempts)
        raise failure

    async def _after_failure(
        self, topic: Topic, key: ConnKey | None, exc: BaseException, attempts: int = 1
    ) -> None:
        """Drop what the error says is stale; refresh the lookup at once when it says so."""
        decision = decide(exc)
        if key is not None and decision.reconnect:
            self.pool.drop(key, topic.conns)
            events.emit(
                events.Reconnecting(
                    role="producer",
                    topic=topic.name,
                    partition=key[2] if key[2] >= 0 else None,
                    address=key[0],
                    error=redact(str(exc)),
                    attempt=attempts,
                )
            )
        if decision.refresh_lookup and topic.lookup is not None and not self.closing():
            self.stats["lookups_forced"] += 1
            with contextlib.suppress(NsqError):
                await topic.lookup.refresh(topic.name, "w")


_NO_WINDOW: Final[contextlib.nullcontext[None]] = contextlib.nullcontext()
#: the commands of messages with no trace id and no ext header
_PLAIN: Final = (b"PUB", b"MPUB")


class _Quiet(logging.LoggerAdapter):  # type: ignore[type-arg]
    """The log of a retry loop whose target already failed in this streak (several batches of
    one topic fail together when its leader goes): its first failure is a debug line too."""

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        self.debug(msg, *args, **kwargs)


_QUIET: Final = cast("logging.Logger", _Quiet(log, {}))
