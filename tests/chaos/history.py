"""The chaos suite's history: what was published, acknowledged, consumed and broken, and when.

A run appends to one :class:`History` (publish calls and their outcome, every delivery, every
fault with its start and heal time); :func:`check` turns it into a :class:`Report` without
looking at anything else, so the checker is tested on hand-made histories
(``test_history.py``) as well as on real runs.

Bodies are ``key:seq`` (ASCII).  Definitions, per topic:

* **acknowledged**: the publish call returned a result (nsqd said OK);
* **lost**: acknowledged and never delivered;
* **overwritten by the server** (a kind of lost, traced publishes only): the acknowledgement
  named a (partition, offset) that was later delivered with another body, so nsqd gave an
  acknowledged write's place in its log to another message: the server's loss, not the
  client's;
* **duplicates**: deliveries beyond the first of a ``key:seq``;
* **order violation** (ordered topics): an acknowledged ``key:s`` delivered for the first time
  after an acknowledged ``key:t`` with ``t > s`` had been delivered.  Redelivery after a
  rewind (``1 2 3 2 3 4``) is duplication, not a violation; a publish that failed is
  indeterminate (it may or may not be in the topic) and takes no part in the order check;
* **indeterminate consumed**: delivered although its publish failed (allowed, reported);
* **recovery time** of a fault: from its heal until every partition that had traffic before
  the fault has both an acknowledged publish and a delivery again;
* **server failover** of a fault (where the nemesis can see it): from its heal until the
  cluster's own lookup names a writable leader for every partition again; the **client's
  recovery** counts from then (or from the heal when that came later, or was not seen), so it is
  the part the client is answerable for.
"""

from __future__ import annotations

import bisect
import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Delivery",
    "Fault",
    "History",
    "Report",
    "TopicReport",
    "check",
    "parse_body",
    "unrecovered_faults",
]

#: How many examples of each kind of problem a report keeps.
EXAMPLES = 10


def parse_body(body: bytes) -> tuple[str, int]:
    """``b"k7:42"`` -> ``("k7", 42)``; ValueError for anything else."""
    key, sep, seq = body.decode("ascii").rpartition(":")
    if not sep or not key:
        raise ValueError(f"not a key:seq body: {body[:40]!r}")
    return key, int(seq)


@dataclass(slots=True)
class Delivery:
    """One message delivered to a consumer."""

    at: float
    key: str
    seq: int
    #: the partition (fork), or the nsqd address (vanilla)
    partition: int | str | None
    offset: int | None
    attempts: int


@dataclass(slots=True)
class Fault:
    """One nemesis event: what, on what, when it started and when it was healed."""

    name: str
    target: str
    started: float
    healed: float | None = None
    error: str | None = None
    #: when lookupd named a writable leader for every partition again after the heal
    server_ready: float | None = None

    @property
    def client_from(self) -> float:
        """Where the client's recovery starts: the heal, or the server's failover if later."""
        healed = self.healed if self.healed is not None else self.started
        return max(healed, self.server_ready or healed)

    def describe(self, t0: float) -> str:
        """``+12.345s kill9 nsqd1 (healed +14.000s)``."""
        healed = "" if self.healed is None else f" (healed +{self.healed - t0:.3f}s"
        if healed and self.server_ready is not None:
            healed += f", writable again +{self.server_ready - t0:.3f}s"
        healed += ")" if healed else ""
        failed = "" if self.error is None else f" FAILED: {self.error}"
        return f"+{self.started - t0:.3f}s {self.name} {self.target}{healed}{failed}"


@dataclass
class History:
    """Everything a chaos run observed, appended to as it happens (one event loop)."""

    #: topic -> True when its channel is consumed ordered (the order check applies)
    topics: dict[str, bool]
    seed: int = 0
    started: float = field(default_factory=time.monotonic)
    #: the wall-clock time of ``started``, to line the report up with log lines
    started_wall: float = field(default_factory=time.time)
    #: topic -> (key, seq) -> publish outcome: a result tuple (partition, offset) or an error name
    acked: dict[str, dict[tuple[str, int], tuple[int | str | None, int | None]]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    failed: dict[str, dict[tuple[str, int], str]] = field(default_factory=lambda: defaultdict(dict))
    attempted: Counter[str] = field(default_factory=Counter)
    #: topic -> (key, seq) -> when it was acknowledged
    acked_at: dict[str, dict[tuple[str, int], float]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    #: (time, topic, partition) of every acknowledgement, in time order
    ack_times: list[tuple[float, str, int | str | None]] = field(default_factory=list)
    deliveries: dict[str, list[Delivery]] = field(default_factory=lambda: defaultdict(list))
    faults: list[Fault] = field(default_factory=list)
    #: bodies that were not ``key:seq`` (a corrupted delivery), with their topic
    garbage: list[tuple[str, bytes]] = field(default_factory=list)

    # -- recording ------------------------------------------------------------------------

    def publishing(self, topic: str) -> None:
        """A publish call is about to be made."""
        self.attempted[topic] += 1

    def ack(
        self, topic: str, key: str, seq: int, partition: int | str | None, offset: int | None
    ) -> None:
        """The publish of ``key:seq`` was acknowledged (``partition``: or the nsqd address)."""
        self.acked[topic][(key, seq)] = (partition, offset)
        self.failed[topic].pop((key, seq), None)
        now = time.monotonic()
        self.ack_times.append((now, topic, partition))
        self.acked_at[topic][(key, seq)] = now

    def fail(self, topic: str, key: str, seq: int, error: BaseException) -> None:
        """The publish of ``key:seq`` raised ``error`` (the message is indeterminate)."""
        self.failed[topic][(key, seq)] = type(error).__name__

    def deliver(
        self,
        topic: str,
        body: bytes,
        partition: int | str | None,
        offset: int | None = None,
        attempts: int = 1,
    ) -> None:
        """A consumer got ``body``."""
        try:
            key, seq = parse_body(body)
        except (ValueError, UnicodeDecodeError):
            self.garbage.append((topic, bytes(body[:64])))
            return
        self.deliveries[topic].append(
            Delivery(time.monotonic(), key, seq, partition, offset, attempts)
        )

    def fault(self, name: str, target: str) -> Fault:
        """A nemesis starts ``name`` on ``target``; set ``healed`` on the result when over."""
        event = Fault(name, target, time.monotonic())
        self.faults.append(event)
        return event

    def consumed(self, topic: str) -> set[tuple[str, int]]:
        """Distinct ``(key, seq)`` delivered on ``topic`` so far."""
        return {(d.key, d.seq) for d in self.deliveries[topic]}

    def missing(self, topic: str) -> set[tuple[str, int]]:
        """Acknowledged on ``topic`` and not (yet) delivered."""
        return set(self.acked[topic]) - self.consumed(topic)


@dataclass
class TopicReport:
    """The tallies of one topic."""

    topic: str
    ordered: bool
    attempted: int
    acknowledged: int
    errors: dict[str, int]
    consumed: int
    deliveries: int
    duplicates: int
    lost: list[tuple[str, int]]
    order_violations: list[str]
    indeterminate_consumed: int
    garbage: int
    #: for the first lost messages: where they were acknowledged and what was delivered around
    lost_context: list[str] = field(default_factory=list)
    #: the lost messages whose acknowledged (partition, offset) was delivered with another body
    overwritten: list[str] = field(default_factory=list)

    def line(self) -> str:
        """One line of tallies."""
        errors = ", ".join(f"{k}={v}" for k, v in sorted(self.errors.items())) or "none"
        return (
            f"{self.topic} ({'ordered' if self.ordered else 'unordered'}): "
            f"published {self.attempted}, acknowledged {self.acknowledged}, "
            f"publish errors {sum(self.errors.values())} ({errors}), "
            f"consumed {self.consumed} in {self.deliveries} deliveries, "
            f"lost {len(self.lost)} (overwritten by the server {len(self.overwritten)}), "
            f"duplicates {self.duplicates}, "
            f"order violations {len(self.order_violations) if self.ordered else 'n/a'}, "
            f"indeterminate consumed {self.indeterminate_consumed}, garbage {self.garbage}"
        )


@dataclass
class Report:
    """What :func:`check` found; ``ok`` is the verdict."""

    seed: int
    duration: float
    topics: list[TopicReport]
    #: wall-clock time of +0 s (the offsets in the report count from it)
    started_wall: float
    faults: list[str]
    fault_counts: dict[str, int]
    nemesis_errors: list[str]
    recovery: dict[str, float | None]
    max_recovery: float | None
    unrecovered: list[str]
    #: the longest the servers took, after a heal, to name a writable leader everywhere again
    max_server_failover: float | None = None
    #: the longest the client took to recover once the servers had (see :class:`Fault`)
    max_client_recovery: float | None = None
    #: for the slowest recovery: per partition, the last ack/delivery before the fault and the
    #: first after its heal (offsets from +0 s)
    slowest_detail: list[str] = field(default_factory=list)

    @property
    def events(self) -> int:
        """How many nemesis events were injected."""
        return sum(self.fault_counts.values())

    @property
    def messages(self) -> int:
        """Acknowledged messages over all topics."""
        return sum(t.acknowledged for t in self.topics)

    @property
    def lost(self) -> int:
        """Lost messages over all topics."""
        return sum(len(t.lost) for t in self.topics)

    @property
    def overwritten(self) -> int:
        """Lost messages whose acknowledged log position the server gave to another message."""
        return sum(len(t.overwritten) for t in self.topics)

    @property
    def order_violations(self) -> int:
        """Order violations over the ordered topics."""
        return sum(len(t.order_violations) for t in self.topics)

    @property
    def ok(self) -> bool:
        """Nothing acknowledged was lost, no order broken, no body corrupted."""
        return (
            self.lost == 0
            and self.order_violations == 0
            and not any(t.garbage for t in self.topics)
        )

    def render(self, backend: str = "") -> str:
        """The report as text (what the test prints, and fails with)."""
        t0 = time.strftime("%H:%M:%S", time.localtime(self.started_wall))
        head = f"chaos report{f' [{backend}]' if backend else ''}: seed={self.seed}, +0s = {t0}"
        lines = [
            head,
            f"  verdict: {'OK' if self.ok else 'FAILED'}: {self.messages} acknowledged "
            f"messages, {self.events} nemesis events in {self.duration:.1f}s, "
            f"lost {self.lost} (overwritten by the server {self.overwritten}), "
            f"order violations {self.order_violations}",
            "  events: " + (", ".join(f"{k}={v}" for k, v in sorted(self.fault_counts.items()))),
        ]
        lines += [f"  {t.line()}" for t in self.topics]
        rec = "n/a" if self.max_recovery is None else f"{self.max_recovery:.3f}s"
        lines.append(f"  max recovery after a fault: {rec}")
        if self.max_server_failover is not None:
            after = self.max_client_recovery
            client = "n/a" if after is None else f"{after:.3f}s"
            lines.append(
                f"  of which the servers' failover (heal -> lookupd names a writable leader for "
                f"every partition): up to {self.max_server_failover:.3f}s; the client's recovery "
                f"after that: up to {client}"
            )
        slowest = sorted(((v, k) for k, v in self.recovery.items() if v is not None), reverse=True)[
            :3
        ]
        if slowest:
            lines.append("  slowest recoveries: " + "; ".join(f"{k}: {v:.3f}s" for v, k in slowest))
        if self.slowest_detail:
            lines.append("  around the slowest recovery (per partition):")
            lines += [f"    {d}" for d in self.slowest_detail]
        if self.unrecovered:
            lines.append(f"  not recovered by the end: {', '.join(self.unrecovered)}")
        if self.nemesis_errors:
            lines.append("  nemesis errors: " + "; ".join(self.nemesis_errors[:EXAMPLES]))
        for t in self.topics:
            if t.lost:
                lines.append(f"  LOST on {t.topic} (first {EXAMPLES}): {t.lost[:EXAMPLES]}")
                lines += [f"    {c}" for c in t.lost_context]
            for o in t.overwritten[:EXAMPLES]:
                lines.append(f"  OVERWRITTEN BY THE SERVER on {t.topic}: {o}")
            for v in t.order_violations[:EXAMPLES]:
                lines.append(f"  ORDER on {t.topic}: {v}")
        lines.append(f"  rerun: NSQ_HA_CHAOS_SEED={self.seed}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-able dict (written next to the test's output)."""
        return {
            "seed": self.seed,
            "ok": self.ok,
            "duration": round(self.duration, 3),
            "events": self.events,
            "fault_counts": self.fault_counts,
            "acknowledged": self.messages,
            "lost": self.lost,
            "overwritten_by_server": self.overwritten,
            "order_violations": self.order_violations,
            "max_recovery": self.max_recovery,
            "max_server_failover": self.max_server_failover,
            "max_client_recovery": self.max_client_recovery,
            "unrecovered": self.unrecovered,
            "topics": [
                {**t.__dict__, "lost": [f"{k}:{s}" for k, s in t.lost]} for t in self.topics
            ],
            "faults": self.faults,
            "nemesis_errors": self.nemesis_errors,
        }

    def dumps(self) -> str:
        """JSON text of :meth:`to_json`."""
        return json.dumps(self.to_json(), indent=1, sort_keys=True)


def _order_violations(deliveries: list[Delivery], acked: dict[tuple[str, int], Any]) -> list[str]:
    highest: dict[str, tuple[int, Delivery]] = {}
    seen: set[tuple[str, int]] = set()
    violations: list[str] = []
    for d in deliveries:
        item = (d.key, d.seq)
        first = item not in seen
        seen.add(item)
        if item not in acked:
            continue
        top = highest.get(d.key)
        if first and top is not None and top[0] > d.seq:
            violations.append(
                f"{d.key}:{d.seq} (partition {d.partition} offset {d.offset}) first delivered "
                f"after {d.key}:{top[0]} (partition {top[1].partition} offset "
                f"{top[1].offset})"
            )
        if top is None or d.seq > top[0]:
            highest[d.key] = (d.seq, d)
    return violations


#: (topic, partition or nsqd address) -> sorted times of its acknowledgements or deliveries
Timeline = dict[tuple[str, int | str | None], list[float]]


def _timelines(history: History) -> tuple[Timeline, Timeline]:
    """The acknowledgement and delivery times of each partition, sorted (built once)."""
    acks: Timeline = defaultdict(list)
    for at, topic, where in history.ack_times:
        acks[(topic, where)].append(at)
    dels: Timeline = defaultdict(list)
    for topic, ds in history.deliveries.items():
        for d in ds:
            dels[(topic, d.partition)].append(d.at)
    for line in (*acks.values(), *dels.values()):
        line.sort()  # already in order when recorded live: a linear check
    return acks, dels


def unrecovered_faults(history: History) -> list[Fault]:
    """The faults (nemesis errors aside) some partition has not recovered from yet."""
    acks, dels = _timelines(history)
    return [f for f in history.faults if f.error is None and _recovery(f, acks, dels)[0] is None]


def _overwritten(history: History, topic: str, lost: list[tuple[str, int]]) -> list[str]:
    """The lost messages whose acknowledged (partition, offset) was delivered with another
    body: nsqd gave that place in its log to another message."""
    held: dict[tuple[int | str | None, int], tuple[str, int]] = {}
    for d in history.deliveries[topic]:
        if d.offset is not None:
            held.setdefault((d.partition, d.offset), (d.key, d.seq))
    out: list[str] = []
    for item in lost:
        partition, offset = history.acked[topic][item]
        if offset is None:
            continue
        other = held.get((partition, offset))
        if other is not None and other != item:
            out.append(
                f"{item[0]}:{item[1]} acknowledged at partition {partition} offset {offset}, "
                f"which was delivered as {other[0]}:{other[1]}"
            )
    return out


def _recovery(
    fault: Fault, acks: Timeline, dels: Timeline, since: float | None = None
) -> tuple[float | None, str]:
    """Seconds from ``fault``'s heal (or ``since``) until every partition busy before it acked
    and delivered, and which came last (``None`` when some partition never did again before
    the run ended).
    """
    healed = (
        since
        if since is not None
        else (fault.healed if fault.healed is not None else fault.started)
    )
    worst, what = 0.0, ""
    for kind, lines in (("ack", acks), ("delivery", dels)):
        for where, times in lines.items():
            if times[0] >= fault.started:
                continue  # no traffic there before the fault
            i = bisect.bisect_left(times, healed)
            if i == len(times):
                return None, f"no {kind} on {where[0]}/{where[1]}"
            if times[i] - healed >= worst:
                worst, what = times[i] - healed, f"{kind} on {where[0]}/{where[1]}"
    return worst, what


def _around(fault: Fault, acks: Timeline, dels: Timeline, t0: float) -> list[str]:
    """Per partition: the last ack and delivery before ``fault`` and the first after its heal."""
    healed = fault.healed if fault.healed is not None else fault.started
    out: list[str] = []
    for where in sorted({*acks, *dels}, key=str):
        parts = []
        for kind, lines in (("ack", acks), ("delivery", dels)):
            times = lines.get(where, [])
            i = bisect.bisect_left(times, fault.started)
            j = bisect.bisect_left(times, healed)
            before = f"+{times[i - 1] - t0:.3f}s" if i else "none"
            after = f"+{times[j] - t0:.3f}s" if j < len(times) else "none"
            parts.append(f"{kind} last before {before}, first after heal {after}")
        out.append(f"{where[0]}/{where[1]}: " + "; ".join(parts))
    return out


def _offset(d: Delivery) -> int:
    return d.offset or 0


def _lost_context(history: History, topic: str, lost: list[tuple[str, int]]) -> list[str]:
    """The history around each of the first lost messages: its acknowledgement (partition,
    offset, time), the deliveries of that partition with the nearest offsets, and the faults
    under way around then."""
    t0 = history.started
    out: list[str] = []
    for item in lost[:EXAMPLES]:
        partition, offset = history.acked[topic][item]
        at = history.acked_at[topic].get(item, t0)
        line = f"{item[0]}:{item[1]} acked +{at - t0:.3f}s partition {partition} offset {offset}"
        if offset is not None:
            same = [d for d in history.deliveries[topic] if d.partition == partition]
            same = [d for d in same if d.offset is not None]
            below = max((d for d in same if d.offset < offset), key=_offset, default=None)
            above = min((d for d in same if d.offset > offset), key=_offset, default=None)
            for name, d in (("below", below), ("above", above)):
                if d is not None:
                    line += (
                        f"; nearest delivered {name}: {d.key}:{d.seq} offset {d.offset} "
                        f"+{d.at - t0:.3f}s (attempts {d.attempts})"
                    )
        near = [
            f.describe(t0)
            for f in history.faults
            if f.started - 5 <= at <= (f.healed or f.started) + 5
        ]
        if near:
            line += f"; faults within 5 s: {', '.join(near)}"
        out.append(line)
    return out


def check(history: History, ended: float | None = None) -> Report:
    """Judge ``history``: tallies, losses, duplicates, order violations, recovery times."""
    t0 = history.started
    topics: list[TopicReport] = []
    for topic, ordered in history.topics.items():
        acked = history.acked[topic]
        failed = history.failed[topic]
        deliveries = history.deliveries[topic]
        consumed = {(d.key, d.seq) for d in deliveries}
        lost = sorted(set(acked) - consumed)
        topics.append(
            TopicReport(
                topic=topic,
                ordered=ordered,
                attempted=history.attempted[topic],
                acknowledged=len(acked),
                errors=dict(Counter(failed.values())),
                consumed=len(consumed),
                deliveries=len(deliveries),
                duplicates=len(deliveries) - len(consumed),
                lost=lost,
                order_violations=_order_violations(deliveries, acked) if ordered else [],
                indeterminate_consumed=len(consumed & set(failed)),
                garbage=sum(1 for t, _ in history.garbage if t == topic),
                lost_context=_lost_context(history, topic, lost),
                overwritten=_overwritten(history, topic, lost),
            )
        )
    recovery: dict[str, float | None] = {}
    unrecovered: list[str] = []
    slowest: tuple[float, Fault] | None = None
    failovers: list[float] = []
    client: list[float] = []
    acks, dels = _timelines(history)
    for fault in history.faults:
        if fault.error is not None:
            continue  # the nemesis could not act: nothing to recover from
        value, last = _recovery(fault, acks, dels)
        label = f"{fault.describe(t0)} [last: {last}]"
        recovery[label] = value
        if value is None:
            unrecovered.append(label)
        elif slowest is None or value > slowest[0]:
            slowest = (value, fault)
        if fault.server_ready is not None:
            failovers.append(max(0.0, fault.server_ready - (fault.healed or fault.started)))
            after = _recovery(fault, acks, dels, since=fault.client_from)[0]
            if after is not None:
                client.append(after)
        elif value is not None:
            client.append(value)
    values = [v for v in recovery.values() if v is not None]
    return Report(
        seed=history.seed,
        duration=(ended or time.monotonic()) - t0,
        topics=topics,
        started_wall=history.started_wall,
        faults=[f.describe(t0) for f in history.faults],
        fault_counts=dict(Counter(f.name for f in history.faults if f.error is None)),
        nemesis_errors=[f.describe(t0) for f in history.faults if f.error is not None],
        recovery=recovery,
        max_recovery=max(values) if values else None,
        unrecovered=unrecovered,
        max_server_failover=max(failovers) if failovers else None,
        max_client_recovery=max(client) if client else None,
        slowest_detail=[]
        if slowest is None
        else [f"{slowest[1].describe(t0)}:", *_around(slowest[1], acks, dels, t0)],
    )
