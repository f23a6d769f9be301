"""Ordered failover: per-key order and no loss while a partition's leader moves.

1. create an ordered topic (2 partitions x 2 replicas) and start an ordered consumer on it;
   wait until it is subscribed to both partitions;
2. publish N messages (body JSON {key, seq}) over 16 keys, one task per key, each key's
   messages strictly one after the other;
3. at half, pause the writers until lookupd says the cluster is stable (a real cluster refuses
   moves otherwise), then move the leader of the first published key's partition with
   LookupdAdmin and let the writers go on while the leader moves;
4. check: every (key, seq) received, per-key order (a new seq below the key's last new seq is a
   violation; a redelivery of a seen (key, seq) is a duplicate), each key on exactly one
   partition (the producer's), and the consumer saw at least one leader change.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from _common import (
    Report,
    cluster,
    consume,
    print_table,
    run,
    unique,
    wait_connected,
    wait_progress,
)

from nsq_ha.admin import LookupdAdmin
from nsq_ha.consumer import Consumer, Message
from nsq_ha.producer import Producer, PublishResult

KEYS = [f"key-{k:02d}" for k in range(16)]
PARTITIONS, REPLICAS = 2, 2
HEADERS = (
    "partition,leader before,leader after,received,keys,leader changes,retries,longest publish s"
)


@dataclass
class Ledger:
    received: set[tuple[str, int]] = field(default_factory=set)
    last: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    violations: list[str] = field(default_factory=list)
    partitions_of: dict[str, set[int | None]] = field(default_factory=lambda: defaultdict(set))
    per_partition: Counter[int | None] = field(default_factory=Counter)

    def record(self, message: Message) -> None:
        body = json.loads(message.body)
        key, seq = str(body["key"]), int(body["seq"])
        self.partitions_of[key].add(message.partition)
        if (key, seq) in self.received:
            self.duplicates += 1
            return
        self.received.add((key, seq))
        self.per_partition[message.partition] += 1
        if key in self.last and seq < self.last[key]:
            self.violations.append(f"{key}: seq {seq} after {self.last[key]}")
        self.last[key] = seq


async def story(args: argparse.Namespace, report: Report) -> None:
    topic, total = unique("scn_failover"), args.messages
    per_key = {
        key: [s for s in range(total) if s * len(KEYS) + k < total] for k, key in enumerate(KEYS)
    }
    keys = [key for key in KEYS if per_key[key]]  # all 16 unless N < 16
    expected = {(key, seq) for key, seqs in per_key.items() for seq in seqs}
    ledger, results = Ledger(), dict[tuple[str, int], PublishResult]()
    half, resume = asyncio.Event(), asyncio.Event()
    waited: defaultdict[int | None, float] = defaultdict(float)  # longest publish, per partition
    async with cluster(args) as lookupd, LookupdAdmin(lookupd) as admin:
        await admin.create_topic(topic, PARTITIONS, REPLICAS, ordered=True)
        before = await admin.lookup.lookup(topic, "w", force=True)
        print(f"topic {topic}: ordered, {PARTITIONS} partitions x {REPLICAS} replicas")
        consumer = Consumer(
            topic, "scenario", lookupd=lookupd, ordered=True, max_in_flight=50, lookup_interval=2.0
        )
        async with consumer:
            await wait_connected(consumer, range(PARTITIONS))
            reader = asyncio.create_task(consume(consumer, ledger.record), name="consumer")

            async def write(producer: Producer, key: str) -> None:
                for seq in per_key[key]:
                    if len(results) >= max(1, total // 2) and not resume.is_set():
                        half.set()
                        await resume.wait()
                    body = json.dumps({"key": key, "seq": seq}).encode()
                    sent = time.monotonic()
                    result = await producer.publish(topic, body, sharding_key=key)
                    results[key, seq] = result
                    waited[result.partition] = max(
                        waited[result.partition], time.monotonic() - sent
                    )

            async with Producer(lookupd=lookupd) as producer:
                writers = [asyncio.create_task(write(producer, key)) for key in keys]
                writing = asyncio.gather(*writers)
                either: list[asyncio.Future[Any]] = [asyncio.ensure_future(half.wait()), writing]
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if writing.done():
                    writing.result()  # a publish that failed fails the scenario here
                paused = time.monotonic()
                await admin.wait_stable()
                (key, _), first = next(iter(results.items()))
                moved_partition = first.partition or 0
                print(
                    f"published {len(results)}/{total}; cluster stable after "
                    f"{time.monotonic() - paused:.1f}s; moving the leader of "
                    f"{topic}/{moved_partition} ({key}'s partition)"
                )
                move = asyncio.create_task(admin.move_leader(topic, moved_partition))
                resume.set()
                moving, moved = time.monotonic(), await move
                print(
                    f"leader of {topic}/{moved_partition} is now {moved.address} after "
                    f"{time.monotonic() - moving:.1f}s ({len(results)}/{total} published)"
                )
                await writing
            print(f"published {len(results)}/{total}")
            await wait_progress(lambda: len(ledger.received), total, [reader])
            for _ in range(150):  # up to 30 s for a lookup refresh to name the new leader
                if _leader_changes(consumer.stats) >= 1:
                    break
                await asyncio.sleep(0.2)
            stats = consumer.stats
        after = await admin.lookup.lookup(topic, "w", force=True)

    retries: Counter[int | None] = Counter()
    for result in results.values():
        retries[result.partition] += result.attempts - 1
    rows = []
    for p in range(PARTITIONS):
        old, new = before.leader(p), after.leader(p)
        rows.append(
            [
                p,
                old.address if old else "-",
                new.address if new else "-",
                ledger.per_partition[p],
                sum(p in parts for parts in ledger.partitions_of.values()),
                stats["partitions"].get(p, {}).get("leader_changes", 0),
                retries[p],
                round(waited[p], 2),
            ]
        )
    print_table(f"{topic}: per partition", HEADERS.split(","), rows)

    lost = expected - ledger.received
    report.check("all published", len(results) == total, f"{len(results)}/{total} acknowledged")
    report.check(
        "nothing lost",
        not lost,
        f"{len(ledger.received)}/{total} received, {len(lost)} lost, "
        f"{ledger.duplicates} duplicates" + (f" (e.g. {min(lost)})" if lost else ""),
    )
    report.check(
        "per-key order",
        not ledger.violations,
        f"{len(ledger.last)} keys, {len(ledger.violations)} violations"
        + (f" (first: {ledger.violations[0]})" if ledger.violations else ""),
    )
    written = {key: {r.partition for (k, _), r in results.items() if k == key} for key in keys}
    spread = [
        k
        for k in keys
        if len(ledger.partitions_of[k]) != 1
        or len(written[k]) != 1
        or ledger.partitions_of[k] != written[k]
    ]
    report.check(
        "each key on one partition",
        not spread,
        f"{len(keys) - len(spread)}/{len(keys)} keys on one partition, as published"
        + (
            f" (not: {spread[0]} {sorted(map(str, ledger.partitions_of[spread[0]]))})"
            if spread
            else ""
        ),
    )
    changes = _leader_changes(stats)
    report.check("leader change seen", changes >= 1, f"{changes} leader changes in consumer stats")


def _leader_changes(stats: dict[str, Any]) -> int:
    return sum(p.get("leader_changes", 0) for p in stats["partitions"].values())


if __name__ == "__main__":
    run(story, __doc__ or "", messages=2000)
