"""One chaos run: producers and consumers under a seeded nemesis, recorded into a History.

A run has four phases:

1. **warm-up**: producers and consumers start, traffic flows with no faults;
2. **chaos**: the nemesis injects a random fault (chosen with ``random.Random(seed)``), holds
   it, heals it, waits, and again, until the profile's event count is reached and the
   producers have had at least the profile's message count acknowledged;
3. **recovery**: producers go on with no fault for a few seconds, and on until every fault has
   recovered (acknowledgements and deliveries again on every partition busy before it) or
   ``recovery_patience`` seconds have passed since the last heal; then they stop;
4. **drain**: consumers run until every acknowledged message was delivered (or the drain
   timeout passes: what is still missing is then *lost*).

Producers: for each topic, ``keys`` tasks, each owning one key and publishing ``key:seq`` with
``sharding_key=key`` one call after the other (so each key has one writer and a defined order).
Publishes are traced on the fork, so each acknowledgement carries partition and offset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from nsq_ha.consumer import Consumer
from nsq_ha.errors import NsqError
from nsq_ha.producer import Producer

from .history import Fault, History, Report, check, unrecovered_faults

__all__ = [
    "MAX_PERIOD",
    "PROFILES",
    "Backend",
    "Nemesis",
    "Pace",
    "Profile",
    "profile_from_env",
    "run_chaos",
]

log = logging.getLogger("nsq_ha.chaos")


@dataclass(frozen=True)
class Profile:
    """How big a run is."""

    name: str
    #: at least this many acknowledged messages (all topics together)
    messages: int
    #: at least this many nemesis events
    events: int
    #: producer tasks per topic (one key each)
    keys: int = 24
    #: seconds between a heal and the next fault (uniform)
    gap: tuple[float, float] = (0.2, 0.8)
    #: seconds a fault is held before it is healed (uniform; instant faults ignore it)
    hold: tuple[float, float] = (0.5, 2.5)
    warmup: float = 1.0
    recovery: float = 3.0
    #: how long after the last heal the recovery phase waits for every fault to recover
    recovery_patience: float = 45.0
    #: seconds the drain waits with no delivery before it calls what is missing lost
    drain_timeout: float = 60.0


PROFILES = {
    "smoke": Profile("smoke", messages=3_000, events=5, keys=8),
    "ci": Profile("ci", messages=50_000, events=30),
    "long": Profile("long", messages=500_000, events=100, keys=32),
}


def profile_from_env(default: str = "ci") -> Profile:
    """``NSQ_HA_CHAOS_PROFILE`` (smoke, ci, long), else ``default``."""
    name = os.environ.get("NSQ_HA_CHAOS_PROFILE", default)
    if name not in PROFILES:
        raise ValueError(f"NSQ_HA_CHAOS_PROFILE={name!r}: pick one of {sorted(PROFILES)}")
    return PROFILES[name]


def seed_from_env() -> int:
    """``NSQ_HA_CHAOS_SEED`` when set (a rerun), else a fresh random seed."""
    given = os.environ.get("NSQ_HA_CHAOS_SEED")
    return int(given) if given else random.SystemRandom().randrange(2**32)


#: A nemesis: given the run's rng, the history and how long to hold, inject a fault, hold it,
#: heal it, and record it (``history.fault(...)``, then ``.healed``).
Nemesis = Callable[[random.Random, History, float], Awaitable[None]]


@dataclass
class Backend:
    """What a run needs from a cluster: topics, clients, nemeses, and a final heal."""

    name: str
    #: topic -> consumed ordered
    topics: dict[str, bool]
    make_producer: Callable[[], Producer]
    make_consumer: Callable[[str], Consumer]
    nemeses: dict[str, Nemesis]
    #: undo anything a failed nemesis may have left behind
    heal_all: Callable[[], Awaitable[None]]
    #: trace publishes (fork: partition + offset in every acknowledgement)
    traced: bool = True
    #: start the next fault only once the last one has recovered (up to the profile's
    #: ``recovery_patience``), so each fault's recovery time is its own: on the fork, lookupd
    #: names a killed leader as writable until its etcd session expires, so faults would pile up
    settle_between_faults: bool = False


#: the longest a producer task waits between two publishes: every partition keeps traffic, so
#: a recovery is measured to within a fraction of a second, never stretched by the pacer
MAX_PERIOD = 0.5


@dataclass
class Pace:
    """The producers' total publish rate (msgs/s; ``None``: as fast as they can).

    The nemesis loop sets it so the profile's messages spread over its events, whatever the
    backend's speed: faults always land on a loaded cluster, and the run is not stretched by
    a backlog the consumers cannot drain.  Each task still publishes at least every
    :data:`MAX_PERIOD` seconds.
    """

    rate: float | None = None
    tasks: int = 1

    def period(self) -> float:
        """Seconds between two publishes of one producer task."""
        return 0.0 if self.rate is None else min(self.tasks / self.rate, MAX_PERIOD)

    @staticmethod
    def rate_for(
        profile: Profile, *, acked: int, done: int, elapsed: float, wasted: float
    ) -> float:
        """The total rate that spreads what is left of ``profile``'s messages over its events
        left, from how long an event took so far (``elapsed`` seconds for ``done`` events, less
        the ``wasted`` seconds of nemeses that failed); 1/20 of the target once it is met."""
        left_events = max(profile.events - done, 1)
        cycle = max(elapsed - wasted, 0.1) / done if done else _guess_cycle(profile)
        return max(profile.messages - acked, profile.messages / 20) / (left_events * cycle)


async def _produce(
    producer: Producer,
    history: History,
    topic: str,
    key: str,
    stop: asyncio.Event,
    pace: Pace,
) -> None:
    seq = 0
    loop = asyncio.get_running_loop()
    slot = loop.time()
    while not stop.is_set():
        period = pace.period()
        if period:
            slot = max(slot + period, loop.time() - 1.0)  # at most 1 s of catching up
            if slot > loop.time():
                await asyncio.sleep(slot - loop.time())
        body = f"{key}:{seq}".encode()
        history.publishing(topic)
        try:
            result = await producer.publish(topic, body, sharding_key=key)
        except NsqError as exc:
            history.fail(topic, key, seq, exc)
            log.info("publish %s %s:%d failed: %s", topic, key, seq, exc)
        else:
            where = result.address if result.partition is None else result.partition
            history.ack(topic, key, seq, where, result.offset)
        seq += 1


async def _consume(consumer: Consumer, history: History, topic: str) -> None:
    async for message in consumer:
        where = message.address if message.partition is None else message.partition
        history.deliver(topic, message.body, where, message.offset, message.attempts)
        await message.finish()


async def _nemesis_loop(
    backend: Backend,
    profile: Profile,
    rng: random.Random,
    history: History,
    enough_messages: Callable[[], bool],
    pace: Pace,
) -> None:
    names = sorted(backend.nemeses)
    only = os.environ.get("NSQ_HA_CHAOS_NEMESES")
    if only:  # e.g. "kill9,stop": narrow a failing run down to the faults that matter
        unknown = set(only.split(",")) - set(names)
        if unknown:
            raise ValueError(f"NSQ_HA_CHAOS_NEMESES: {sorted(unknown)} not among {names}")
        names = [n for n in names if n in only.split(",")]
    done = 0
    began = time.monotonic()
    wasted = 0.0  # seconds spent in nemeses that failed: not a measure of an event's length
    while done < profile.events or not enough_messages():
        pace.rate = Pace.rate_for(
            profile,
            acked=sum(len(a) for a in history.acked.values()),
            done=done,
            elapsed=time.monotonic() - began,
            wasted=wasted,
        )
        name = names[done % len(names)] if done < len(names) else rng.choice(names)
        hold = rng.uniform(*profile.hold)
        before = len(history.faults)
        tried = time.monotonic()
        try:
            await backend.nemeses[name](rng, history, hold)
        except Exception as exc:  # a nemesis that could not act is reported, not fatal
            wasted += time.monotonic() - tried
            log.warning("nemesis %s failed: %r", name, exc)
            if len(history.faults) > before:
                history.faults[-1].error = repr(exc)
            else:
                history.fault(name, "?").error = repr(exc)
            await backend.heal_all()
        else:
            done += 1
            if backend.settle_between_faults:
                await _settle_fault(history, history.faults[-1], profile.recovery_patience)
        await asyncio.sleep(rng.uniform(*profile.gap))


def _guess_cycle(profile: Profile) -> float:
    """Seconds one nemesis event takes, before any was timed."""
    return sum(profile.hold) / 2 + sum(profile.gap) / 2 + 0.5


async def run_chaos(backend: Backend, profile: Profile, seed: int) -> Report:
    """Run ``profile`` against ``backend`` with ``seed``; the checked report."""
    rng = random.Random(seed)  # noqa: S311 - a replayable schedule, not crypto
    history = History(dict(backend.topics), seed=seed)
    log.warning("chaos run [%s] profile=%s seed=%d", backend.name, profile.name, seed)
    stop = asyncio.Event()
    consumers = [backend.make_consumer(topic) for topic in backend.topics]
    producer = backend.make_producer()
    tasks: list[asyncio.Task[None]] = []
    try:
        for consumer in consumers:
            await consumer.start()
        for topic, consumer in zip(backend.topics, consumers, strict=True):
            tasks.append(asyncio.create_task(_consume(consumer, history, topic)))
        pace = Pace(
            rate=profile.messages / (profile.events * _guess_cycle(profile)),
            tasks=len(backend.topics) * profile.keys,
        )
        producers = [
            asyncio.create_task(_produce(producer, history, topic, f"k{i}", stop, pace))
            for topic in backend.topics
            for i in range(profile.keys)
        ]
        await asyncio.sleep(profile.warmup)

        def enough() -> bool:
            return sum(len(a) for a in history.acked.values()) >= profile.messages

        await _nemesis_loop(backend, profile, rng, history, enough, pace)
        await _recover(history, profile)
        stop.set()
        await _settle(producers, profile.drain_timeout)
        await _drain(history, backend.topics, profile.drain_timeout)
        ended = time.monotonic()
    finally:
        stop.set()
        await backend.heal_all()
        with contextlib.suppress(Exception):
            await producer.close()
        for consumer in consumers:
            with contextlib.suppress(Exception):
                await consumer.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return check(history, ended)


async def _settle_fault(history: History, fault: Fault, patience: float) -> None:
    """Wait until ``fault`` has recovered, or ``patience`` seconds passed since its heal."""
    healed = fault.healed if fault.healed is not None else fault.started
    while time.monotonic() - healed < patience:
        if fault not in unrecovered_faults(history):
            return
        await asyncio.sleep(0.5)


async def _recover(history: History, profile: Profile) -> None:
    """The recovery phase: ``profile.recovery`` seconds, then on until no fault is left
    unrecovered or ``profile.recovery_patience`` seconds passed since the last heal."""
    await asyncio.sleep(profile.recovery)
    last_heal = max((f.healed or f.started for f in history.faults), default=time.monotonic())
    while time.monotonic() - last_heal < profile.recovery_patience:
        pending = unrecovered_faults(history)  # tens of ms on a CI-sized history
        if not pending:
            return
        log.info("recovery: waiting for %d fault(s): %s", len(pending), pending[-1].name)
        await asyncio.sleep(1.0)


async def _settle(producers: Sequence[asyncio.Task[None]], timeout: float) -> None:  # noqa: ASYNC109
    """Let each producer task finish its current call (they stop at the next loop turn)."""
    done, pending = await asyncio.wait(producers, timeout=timeout)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        if task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


async def _drain(history: History, topics: dict[str, bool], timeout: float) -> None:  # noqa: ASYNC109
    """Wait until every acknowledged message was delivered, or ``timeout`` seconds pass with
    no new delivery (a slow consumer still making progress is waited for)."""
    last, progressed = -1, time.monotonic()
    while time.monotonic() - progressed < timeout:
        missing = sum(len(history.missing(t)) for t in topics)
        if not missing:
            return
        delivered = sum(len(history.deliveries[t]) for t in topics)
        if delivered != last:
            last, progressed = delivered, time.monotonic()
            log.info("drain: %d acknowledged messages not delivered yet", missing)
        await asyncio.sleep(0.5)
