"""A small nsq_ha program with no OpenTelemetry code, for ``opentelemetry-instrument``
(tests/integration/test_otel_instrument_command.py runs it).

It starts an embedded cluster with an ext topic, publishes, consumes with ``async for`` and with
the blocking facade's ``get()``, finishes every message, and writes what it consumed (partition
and id in hex: ids repeat across partitions) to the JSON file named by its first argument.
Every wait has a deadline; nothing goes to stdout (the console exporter writes the spans there).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from nsq_ha import sync
from nsq_ha.connection import ConnectionConfig
from nsq_ha.consumer import Consumer
from nsq_ha.devcluster import DevClusterThread
from nsq_ha.producer import Producer

TOPIC = "otel_app_orders"
PARTITIONS = 2
COUNT = 2
#: the IDENTIFY client_id of each consumer: the spans' ``messaging.client.id``
ASYNC_CLIENT = "otel-app-async"
SYNC_CLIENT = "otel-app-sync"
DEADLINE = 60.0


async def consume_async(lookupd: str) -> list[tuple[int | None, str]]:
    """Publish COUNT messages and take them with ``async for``."""
    consumer = Consumer(
        TOPIC, "async_reader", lookupd=lookupd, connection=ConnectionConfig(client_id=ASYNC_CLIENT)
    )
    got: list[tuple[int | None, str]] = []
    async with asyncio.timeout(DEADLINE):
        await consumer.start()
        # a new channel gets only what is published after it exists
        while len(consumer.connections) < PARTITIONS:  # noqa: ASYNC110 - no event to wait on
            await asyncio.sleep(0.02)
        async with Producer(lookupd=lookupd) as producer:
            for i in range(COUNT):
                await producer.publish(TOPIC, b"async %d" % i, sharding_key=f"a{i}")
        async for message in consumer:
            got.append((message.partition, message.id.hex()))
            await message.finish()
            if len(got) == COUNT:
                break
        await consumer.close()
    return got


def consume_sync(lookupd: str) -> list[tuple[int | None, str]]:
    """Publish COUNT messages and take them with the blocking ``get()``."""
    got: list[tuple[int | None, str]] = []
    with sync.Consumer(
        TOPIC, "sync_reader", lookupd=lookupd, connection=ConnectionConfig(client_id=SYNC_CLIENT)
    ) as consumer:
        deadline = time.monotonic() + DEADLINE
        while consumer.stats["connections"] < PARTITIONS:
            if time.monotonic() > deadline:
                raise SystemExit(f"not subscribed within {DEADLINE} s: {consumer.stats}")
            time.sleep(0.02)
        with sync.Producer(lookupd=lookupd) as producer:
            for i in range(COUNT):
                producer.publish(TOPIC, b"sync %d" % i, sharding_key=f"s{i}", timeout=DEADLINE)
        while len(got) < COUNT:
            message = consumer.get(timeout=DEADLINE)
            if message is None:
                raise SystemExit(f"only {len(got)} of {COUNT} messages within {DEADLINE} s")
            got.append((message.partition, message.id.hex()))
            message.finish()
    return got


def main(out: str) -> None:
    with DevClusterThread(nodes=1) as dev:
        dev.create_topic(TOPIC, partitions=PARTITIONS, ext=True)
        consumed = {
            "async": asyncio.run(consume_async(dev.lookupd_http)),
            "sync": consume_sync(dev.lookupd_http),
        }
    with open(out, "w", encoding="utf-8") as file:
        json.dump(consumed, file)


if __name__ == "__main__":
    main(sys.argv[1])
