"""Trace pipeline: follow every trace id from the producer's acknowledgement to the consumer.

1. create an ordered topic (3 partitions x 1 replica; ordered subscriptions deliver each
   message's queue offset) and start an ordered consumer; wait for its subscriptions;
2. publish N messages, each with its own trace id (a random 63-bit base plus a counter, also
   written in the body as JSON {n, trace}), and keep every PublishResult: partition, offset,
   message id (internal id + trace id, 16 bytes) and trace id;
3. the consumer records what arrives, by trace id;
4. check, per trace id: the producer was told a partition, an offset and a message id; the
   consumer received it once or more with the same trace id (header and body), the same 16-byte
   message id, on the same partition at the same offset; no unknown trace id arrived.
A few sample rows show the trail.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
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
from nsq_ha.producer import Producer, PublishResult

PARTITIONS, CHANNEL, WINDOW, SAMPLES = 3, "scenario", 100, 5


@dataclass(frozen=True)
class Seen:
    """What the consumer saw of one message (its first delivery)."""

    trace_id: int | None
    body_trace: int
    partition: int | None
    offset: int | None
    message_id: bytes


@dataclass
class Ledger:
    seen: dict[int, Seen] = field(default_factory=dict)
    duplicates: int = 0

    def record(self, message: Message) -> None:
        body_trace = int(json.loads(message.body)["trace"])
        if body_trace in self.seen:
            self.duplicates += 1
            return
        self.seen[body_trace] = Seen(
            message.trace_id, body_trace, message.partition, message.offset, bytes(message.id)
        )


def _mismatch(result: PublishResult, seen: Seen | None) -> str | None:
    """Why the trail of ``result`` is broken, or None if producer and consumer agree."""
    if result.offset is None or result.message_id is None or result.partition is None:
        return "the producer was not told its offset, message id or partition"
    if seen is None:
        return "never received"
    pairs = [
        ("trace id", result.trace_id, seen.trace_id),
        ("body trace", result.trace_id, seen.body_trace),
        ("message id", result.message_id.hex(), seen.message_id.hex()),
        ("partition", result.partition, seen.partition),
        ("offset", result.offset, seen.offset),
    ]
    wrong = [f"{what} {sent} != {got}" for what, sent, got in pairs if sent != got]
    if len(seen.message_id) != 16:
        wrong.append(f"message id has {len(seen.message_id)} bytes")
    return ", ".join(wrong) or None


async def story(args: argparse.Namespace, report: Report) -> None:
    topic, total = unique("scn_trace"), args.messages
    base = secrets.randbits(62)  # base + counter stays below 2**63
    traces = [base + n + 1 for n in range(total)]
    ledger, sent = Ledger(), dict[int, PublishResult]()
    async with cluster(args) as lookupd, LookupdAdmin(lookupd) as admin:
        await admin.create_topic(topic, PARTITIONS, 1, ordered=True)
        print(f"topic {topic}: ordered, {PARTITIONS} partitions x 1 replica")
        async with Consumer(topic, CHANNEL, lookupd=lookupd, ordered=True) as consumer:
            await wait_connected(consumer, range(PARTITIONS))
            reader = asyncio.create_task(consume(consumer, ledger.record), name="consumer")
            async with Producer(lookupd=lookupd) as producer:
                for start in range(0, total, WINDOW):
                    batch = traces[start : start + WINDOW]
                    results = await asyncio.gather(
                        *(
                            producer.publish(
                                topic,
                                json.dumps({"n": start + i, "trace": t}).encode(),
                                trace_id=t,
                            )
                            for i, t in enumerate(batch)
                        )
                    )
                    sent.update(zip(batch, results, strict=True))
            print(f"published {len(sent)}/{total} with trace ids {traces[0]}..{traces[-1]}")
            await wait_progress(lambda: len(ledger.seen), total, [reader])

    rows = []
    for trace in traces[:: max(1, total // SAMPLES)][:SAMPLES]:
        result, seen = sent[trace], ledger.seen.get(trace)
        rows.append(
            [
                trace,
                result.partition if result.partition is not None else "-",
                result.offset if result.offset is not None else "-",
                result.message_id.hex() if result.message_id else "-",
                "same" if _mismatch(result, seen) is None else "DIFFERENT",
            ]
        )
    print_table(
        "sample trails (as the producer was told; consumer's view compared)",
        ["trace id", "partition", "offset", "message id", "consumer saw"],
        rows,
    )

    broken = {t: why for t, r in sent.items() if (why := _mismatch(r, ledger.seen.get(t)))}
    matched = len(sent) - len(broken)
    print(f"\nmatched traces: {matched}/{total}")
    report.check("all published", len(sent) == total, f"{len(sent)}/{total} acknowledged")
    first = next(iter(broken.items()), None)
    report.check(
        "every trace followed producer -> consumer",
        not broken and len(sent) == total,
        f"{matched}/{total} same trace id, message id, partition and offset, "
        f"{ledger.duplicates} duplicates" + (f" (first: {first[0]}: {first[1]})" if first else ""),
    )
    unknown = set(ledger.seen) - set(sent)
    report.check("no unknown trace ids", not unknown, f"{len(unknown)} unknown")
    offsets = {(r.partition, r.offset) for r in sent.values()}
    report.check("offsets distinct", len(offsets) == len(sent), f"{len(offsets)} distinct")


if __name__ == "__main__":
    run(story, __doc__ or "", messages=500)
