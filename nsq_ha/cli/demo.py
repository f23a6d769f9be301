"""``nsq-ha demo``: the main story, on the embedded cluster, verified.

1. start the embedded 3-node fork cluster; create ``demo_orders`` (ordered, 4 partitions,
   2 replicas) and ``demo_events`` (plain, 3 partitions, 1 replica) through lookupd's admin API;
2. start an ordered consumer on ``demo_orders`` and a plain one on ``demo_events``;
3. publish N keyed, traced messages from several producer tasks (each key belongs to one task,
   so each key has one writer and a defined order), every message to both topics, and move a
   partition's leader when half are out;
4. wait until both consumers have everything, then print a table per partition and check:
   nothing lost, per-key order on the ordered topic, each key on one partition, every trace id
   and message id delivered as the producer was told. Exit 0 only if all of it holds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from nsq_ha.admin import LookupdAdmin
from nsq_ha.consumer import Consumer, Message
from nsq_ha.producer import Producer, PublishResult

from .output import Progress, print_table

__all__ = ["DEMO_KEYS", "DEMO_MESSAGES", "DEMO_PRODUCERS", "Ledger", "cmd_demo", "run_demo"]

ORDERS, EVENTS, CHANNEL = "demo_orders", "demo_events", "demo"
#: the messages published (``--messages``)
DEMO_MESSAGES = 10_000
#: the producer tasks publishing them (``--producers``)
DEMO_PRODUCERS = 4
#: the distinct sharding keys (``--keys``)
DEMO_KEYS = 64


@dataclass
class Ledger:
    """What was published and what each consumer received, and the checks over them."""

    #: (key, seq) -> the producer's result on the ordered topic
    sent: dict[tuple[str, int], PublishResult] = field(default_factory=dict)
    #: (key, seq) -> the trace id sent
    traces: dict[tuple[str, int], int] = field(default_factory=dict)
    #: per key, the seqs in delivery order (ordered consumer), first deliveries only
    order: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    received: dict[str, set[tuple[str, int]]] = field(default_factory=lambda: defaultdict(set))
    duplicates: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    key_partition: dict[str, int | None] = field(default_factory=dict)
    partition_rows: dict[int, dict[str, Any]] = field(default_factory=dict)

    def record(self, topic: str, message: Message) -> bool:
        """Account a delivery; False if it was a duplicate."""
        body = json.loads(message.body)
        item = (str(body["key"]), int(body["seq"]))
        seen = self.received[topic]
        if item in seen:
            self.duplicates[topic] += 1
            return False
        seen.add(item)
        if topic != ORDERS:
            return True
        key, seq = item
        history = self.order[key]
        if history and seq < history[-1]:
            self.violations.append(f"key {key}: seq {seq} after {history[-1]}")
        history.append(seq)
        first = self.key_partition.setdefault(key, message.partition)
        if first != message.partition:
            self.violations.append(f"key {key} on partitions {first} and {message.partition}")
        result = self.sent.get(item)
        if result is not None:
            if message.trace_id != result.trace_id:
                self.mismatches.append(f"{item}: trace {message.trace_id} != {result.trace_id}")
            elif result.message_id is not None and message.id != result.message_id:
                self.mismatches.append(f"{item}: id {message.id.hex()} != producer's")
        row = self.partition_rows.setdefault(
            message.partition or 0,
            {"messages": 0, "keys": set(), "first": None, "last": None},
        )
        row["messages"] += 1
        row["keys"].add(key)
        if message.offset is not None:
            if row["first"] is None:
                row["first"] = message.offset
            if row["last"] is not None and message.offset <= row["last"]:
                self.violations.append(
                    f"partition {message.partition}: offset {message.offset} after {row['last']}"
                )
            row["last"] = message.offset
        return True


async def _consume(
    consumer: Consumer, topic: str, ledger: Ledger, total: int, progress: Progress
) -> None:
    async for message in consumer:
        if ledger.record(topic, message):
            progress.advance(f"consumed {topic}")
        await message.finish()
        if len(ledger.received[topic]) >= total:
            return


async def _produce(
    producer: Producer,
    task: int,
    plan: list[tuple[str, int]],
    ledger: Ledger,
    progress: Progress,
    halfway: asyncio.Event,
    total: int,
) -> None:
    for key, seq in plan:
        body = json.dumps({"key": key, "seq": seq, "task": task}).encode()
        trace_id = ledger.traces[(key, seq)]
        result = await producer.publish(ORDERS, body, sharding_key=key, trace_id=trace_id)
        await producer.publish(EVENTS, body, sharding_key=key, trace_id=trace_id)
        ledger.sent[(key, seq)] = result
        progress.advance("published")
        if len(ledger.sent) >= total // 2:
            halfway.set()


def _plans(messages: int, producers: int, keys: int) -> list[list[tuple[str, int]]]:
    """Per producer task, its (key, seq) in publishing order; key k belongs to task k % T."""
    plans: list[list[tuple[str, int]]] = [[] for _ in range(producers)]
    seqs: Counter[str] = Counter()
    for i in range(messages):
        k = i % keys
        key = f"customer-{k:03d}"
        plans[k % producers].append((key, seqs[key]))
        seqs[key] += 1
    return plans


async def run_demo(
    lookupd: str,
    *,
    messages: int = DEMO_MESSAGES,
    producers: int = DEMO_PRODUCERS,
    keys: int = DEMO_KEYS,
    plain: bool = False,
    out: Any = None,
) -> bool:
    """The story against the cluster at ``lookupd``; prints the report, True if it holds."""
    out = out or sys.stdout
    started = time.monotonic()
    ledger = Ledger()
    plans = _plans(messages, producers, keys)
    for t, plan in enumerate(plans):
        for j, item in enumerate(plan):
            ledger.traces[item] = (t + 1) << 32 | (j + 1)
    async with LookupdAdmin(lookupd) as admin:
        await admin.create_topic(ORDERS, 4, 2, ordered=True)
        await admin.create_topic(EVENTS, 3, 1)
        print(
            f"topics {ORDERS} (ordered, 4 partitions x 2 replicas), {EVENTS} (plain, 3 partitions)"
        )
        with Progress(plain=plain) as progress:
            progress.add("published", messages)
            progress.add(f"consumed {ORDERS}", messages)
            progress.add(f"consumed {EVENTS}", messages)
            orders = Consumer(ORDERS, CHANNEL, lookupd=lookupd, max_in_flight=50)
            events = Consumer(EVENTS, CHANNEL, lookupd=lookupd, max_in_flight=200)
            async with orders, events:
                # a fork channel made by the first SUB starts at the partitions' end: wait for
                # every subscription before publishing what the consumers must see
                async with asyncio.timeout(30):
                    while len(orders.connections) < 4 or len(events.connections) < 3:  # noqa: ASYNC110
                        await asyncio.sleep(0.05)
                halfway = asyncio.Event()
                consumers = [
                    asyncio.create_task(_consume(orders, ORDERS, ledger, messages, progress)),
                    asyncio.create_task(_consume(events, EVENTS, ledger, messages, progress)),
                ]
                async with Producer(lookupd=lookupd, trace=True) as producer:
                    writers = [
                        asyncio.create_task(
                            _produce(producer, t, plan, ledger, progress, halfway, messages)
                        )
                        for t, plan in enumerate(plans)
                    ]
                    await halfway.wait()
                    moved = await admin.move_leader(ORDERS, 1)
                    progress.note(
                        f"moved the leader of {ORDERS}/1 to {moved.address} with "
                        f"{len(ledger.sent)} of {messages} published"
                    )
                    await asyncio.gather(*writers)
                done, pending = await asyncio.wait(consumers, timeout=60)
                for task in pending:
                    task.cancel()
                for task in done:
                    task.result()
                orders_stats = orders.stats
            final = await admin.lookup.lookup(ORDERS, "w", force=True)
    return _report(ledger, messages, orders_stats, final, time.monotonic() - started, plain, out)


def _report(
    ledger: Ledger,
    messages: int,
    stats: dict[str, Any],
    final: Any,
    elapsed: float,
    plain: bool,
    out: Any,
) -> bool:
    retries: Counter[int] = Counter()
    for result in ledger.sent.values():
        retries[result.partition or 0] += result.attempts - 1
    rows = []
    for part in range(4):
        row = ledger.partition_rows.get(part, {"messages": 0, "keys": set()})
        leader = final.leader(part)
        rows.append(
            [
                part,
                leader.address if leader else "-",
                row["messages"],
                len(row["keys"]),
                row.get("first"),
                row.get("last"),
                stats["partitions"].get(part, {}).get("leader_changes", 0),
                retries[part],
            ]
        )
    print_table(
        f"{ORDERS}: ordered consumer, per partition",
        [
            "partition",
            "leader now",
            "messages",
            "keys",
            "first offset",
            "last offset",
            "leader changes seen",
            "retries",
        ],
        rows,
        stream=out,
        plain=plain,
    )
    expected = set(ledger.traces)
    checks = []
    for topic in (ORDERS, EVENTS):
        lost = len(expected - ledger.received[topic])
        checks.append(
            (
                f"{topic}: nothing lost",
                lost == 0,
                f"{len(ledger.received[topic])}/{messages} received, {lost} lost, "
                f"{ledger.duplicates[topic]} duplicates",
            )
        )
    checks.append(
        (
            f"{ORDERS}: per-key order",
            not ledger.violations,
            f"{len(ledger.order)} keys, {len(ledger.violations)} violations"
            + (f" (first: {ledger.violations[0]})" if ledger.violations else ""),
        )
    )
    checks.append(
        (
            "trace ids and message ids",
            not ledger.mismatches and len(ledger.sent) == messages,
            f"{messages - len(ledger.mismatches)}/{messages} as the producer was told"
            + (f" (first: {ledger.mismatches[0]})" if ledger.mismatches else ""),
        )
    )
    leader_changes = sum(r[6] for r in rows)
    checks.append(
        ("the leader move was seen", leader_changes >= 1, f"{leader_changes} leader changes")
    )
    print_table(
        "verification",
        ["check", "result", "detail"],
        [[name, "OK" if ok else "FAILED", detail] for name, ok, detail in checks],
        stream=out,
        plain=plain,
    )
    ok = all(ok for _, ok, _ in checks)
    print(f"{'PASSED' if ok else 'FAILED'} in {elapsed:.1f}s", file=out, flush=True)
    return ok


async def cmd_demo(args: argparse.Namespace) -> int:
    """``nsq-ha demo``: run the story on a fresh embedded cluster."""
    from nsq_ha.devcluster import DevCluster

    async with DevCluster(nodes=3) as cluster:
        print(
            f"embedded cluster: lookupd {cluster.lookupd_http}, "
            f"nsqd {', '.join(n.tcp_address for n in cluster.nodes)}"
        )
        ok = await run_demo(
            cluster.lookupd_http,
            messages=args.messages,
            producers=args.producers,
            keys=args.keys,
            plain=args.plain,
        )
    return 0 if ok else 1
