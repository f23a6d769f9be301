"""Sharded consumers: three members of one channel split a 6-partition topic without overlap.

1. create a plain topic with 6 partitions, 1 replica, multi-part (several partitions may share
   a node);
2. start 3 consumers on the SAME channel with member=(i, 3): member i takes the partitions
   p with p % 3 == i; wait until every member is subscribed to all of its partitions;
3. publish N unkeyed messages (round-robin over the partitions), body JSON {n};
4. check: each member received only its own partitions, every partition was consumed by exactly
   one member, the union of what the members received is everything published (on the
   partition the producer was told), and no message reached two members.
A member x partition table shows the split.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

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
from nsq_ha.producer import Producer

PARTITIONS, MEMBERS, CHANNEL = 6, 3, "scenario"
#: publishes in flight at once
WINDOW = 200


@dataclass
class Ledger:
    #: n -> the members that received it (first deliveries per member)
    receivers: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    #: n -> the partition it arrived on
    arrived_on: dict[int, int | None] = field(default_factory=dict)
    #: (member, partition) -> messages
    counts: Counter[tuple[int, int | None]] = field(default_factory=Counter)
    redeliveries: int = 0

    def recorder(self, member: int) -> Callable[[Message], None]:
        def record(message: Message) -> None:
            n = int(json.loads(message.body)["n"])
            if member in self.receivers[n]:
                self.redeliveries += 1
                return
            self.receivers[n].add(member)
            self.arrived_on.setdefault(n, message.partition)
            self.counts[member, message.partition] += 1

        return record


async def story(args: argparse.Namespace, report: Report) -> None:
    topic, total = unique("scn_sharded"), args.messages
    ledger, written = Ledger(), dict[int, int | None]()
    own = {i: [p for p in range(PARTITIONS) if p % MEMBERS == i] for i in range(MEMBERS)}
    async with cluster(args) as lookupd, LookupdAdmin(lookupd) as admin:
        await admin.create_topic(topic, PARTITIONS, 1, multi_part=True)
        print(f"topic {topic}: plain, {PARTITIONS} partitions x 1 replica, multi-part")
        consumers = [
            Consumer(topic, CHANNEL, lookupd=lookupd, member=(i, MEMBERS), max_in_flight=100)
            for i in range(MEMBERS)
        ]
        try:
            for consumer in consumers:
                await consumer.start()
            for i, consumer in enumerate(consumers):
                await wait_connected(consumer, own[i])
                print(f"member {i}/{MEMBERS} subscribed to partitions {own[i]}")
            readers = [
                asyncio.create_task(consume(c, ledger.recorder(i)), name=f"member-{i}")
                for i, c in enumerate(consumers)
            ]
            async with Producer(lookupd=lookupd) as producer:
                for start in range(0, total, WINDOW):
                    numbers = range(start, min(start + WINDOW, total))
                    results = await asyncio.gather(
                        *(producer.publish(topic, json.dumps({"n": n}).encode()) for n in numbers)
                    )
                    for n, result in zip(numbers, results, strict=True):
                        written[n] = result.partition
            print(f"published {len(written)}/{total}")
            await wait_progress(lambda: len(ledger.receivers), total, readers)
        finally:
            await asyncio.gather(*(c.close() for c in consumers))

    print_table(
        f"{topic}/{CHANNEL}: messages per member x partition",
        ["member", *(f"p{p}" for p in range(PARTITIONS)), "total"],
        [
            [
                i,
                *(ledger.counts[i, p] for p in range(PARTITIONS)),
                sum(ledger.counts[i, p] for p in range(PARTITIONS)),
            ]
            for i in range(MEMBERS)
        ],
    )

    foreign = [(m, p) for (m, p), c in ledger.counts.items() if c and p not in own[m]]
    report.check(
        "members kept to their partitions",
        not foreign,
        "member i only got p % 3 == i"
        + (f" (not: member {foreign[0][0]} got partition {foreign[0][1]})" if foreign else ""),
    )
    targets = sorted({p for p in written.values() if p is not None})  # all 6 unless N < 6
    by_partition = {p: {m for (m, q), c in ledger.counts.items() if q == p and c} for p in targets}
    bad = {p: sorted(ms) for p, ms in by_partition.items() if len(ms) != 1}
    report.check(
        "each partition consumed by one member",
        not bad and len(targets) == min(total, PARTITIONS),
        f"{len(targets) - len(bad)}/{len(targets)} partitions published to"
        + (f" (not: {bad})" if bad else ""),
    )
    missing = set(range(total)) - set(ledger.receivers)
    report.check(
        "union is everything published",
        len(written) == total and not missing,
        f"{len(ledger.receivers)}/{total} received, {len(missing)} missing",
    )
    misplaced = [n for n, p in ledger.arrived_on.items() if written.get(n, p) != p]
    report.check(
        "on the producer's partition",
        not misplaced,
        f"{len(ledger.arrived_on) - len(misplaced)}/{len(ledger.arrived_on)} as published",
    )
    shared = [n for n, members in ledger.receivers.items() if len(members) > 1]
    report.check(
        "no message reached two members",
        not shared,
        f"{len(shared)} shared, {ledger.redeliveries} redeliveries to the same member",
    )


if __name__ == "__main__":
    run(story, __doc__ or "", messages=3000)
