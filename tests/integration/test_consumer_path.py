"""The modules one warm delivery passes through, from the socket read through ``async for`` to
``finish()`` returning (``sys.setprofile`` on the consumer's loop thread, as
``tools/journey.py`` counts them): the consumer's part is the consumer, the hand-out, the
subscription, the message and the RDY planner, and no argument check runs on the way. Under
the compiled build the modules mypyc compiled run no Python frames, so they are not seen.

Plain on vanilla nsqd (the message put in over HTTP by a thread), ordered on the embedded
broker (which runs on its own thread, so none of its code is counted)."""

from __future__ import annotations

import asyncio
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import pytest

import nsq_ha
from nsq_ha import sync
from nsq_ha._compiled_finder import is_compiled
from nsq_ha.consumer import Consumer
from nsq_ha.devcluster import DevClusterThread
from nsq_ha.testing.servers import VanillaCluster

PACKAGE = Path(nsq_ha.__file__).resolve().parent

#: what a warm delivery may enter of nsq_ha/consumer/: every one of them does work there
CONSUMER_PATH = [
    "consumer/core.py",
    "consumer/handout.py",
    "consumer/message.py",
    "consumer/rdy.py",
    "consumer/slots.py",
]


def python_part() -> list[str]:
    """``CONSUMER_PATH`` without the modules that run compiled (no frame to profile)."""
    return [
        path
        for path in CONSUMER_PATH
        if not is_compiled(sys.modules["nsq_ha." + path.removesuffix(".py").replace("/", ".")])
    ]


class Entered:
    """The nsq_ha files (relative to the package) whose functions run on this thread."""

    def __init__(self) -> None:
        self.files: set[str] = set()

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            path = Path(frame.f_code.co_filename)
            if path.is_relative_to(PACKAGE):
                self.files.add(path.relative_to(PACKAGE).as_posix())

    async def over(self, consumer: Consumer, publish: Callable[[], None]) -> None:
        """Profile one message: published by a thread, taken by ``async for``, finished."""
        messages = consumer.__aiter__()
        thread = threading.Thread(target=publish)
        sys.setprofile(self._profile)
        try:
            thread.start()
            async with asyncio.timeout(20):
                message = await messages.__anext__()
            await message.finish()
        finally:
            sys.setprofile(None)
            thread.join(20)

    def consumer_part(self) -> list[str]:
        return sorted(f for f in self.files if f.startswith("consumer/"))


async def _warm(consumer: Consumer, publish: Callable[[], None], count: int = 3) -> None:
    """Deliver and finish ``count`` messages first: connected, RDY given, every lazy import
    done."""
    messages = consumer.__aiter__()
    for _ in range(count):
        await asyncio.to_thread(publish)
        async with asyncio.timeout(20):
            message = await messages.__anext__()
        await message.finish()


@pytest.mark.vanilla
async def test_a_warm_plain_delivery_enters_five_consumer_modules_and_no_check(
    vanilla_cluster: VanillaCluster,
) -> None:
    node = vanilla_cluster.nodes[0]
    topic = f"path_{uuid.uuid4().hex[:10]}"
    url = f"{node.http_url}/pub?topic={topic}"

    def publish() -> None:
        httpx.post(url, content=b"path", timeout=10).raise_for_status()

    await asyncio.to_thread(publish)  # the topic exists before the channel subscribes
    async with Consumer(topic, "path", nsqd=node.tcp_address, max_in_flight=1) as consumer:
        await _warm(consumer, publish, count=4)
        entered = Entered()
        await entered.over(consumer, publish)
    assert entered.consumer_part() == python_part(), entered.consumer_part()
    assert "durations.py" not in entered.files


async def test_a_warm_ordered_delivery_enters_the_same_consumer_modules() -> None:
    topic = f"path_{uuid.uuid4().hex[:10]}"
    with DevClusterThread(nodes=1) as dev:
        dev.create_topic(topic, partitions=1, replicas=1, ordered=True)
        with sync.Producer(lookupd=dev.lookupd_http) as producer:

            def publish() -> None:
                producer.publish(topic, b"path", partition=0, timeout=10)

            async with Consumer(topic, "path", lookupd=dev.lookupd_http) as consumer:
                await _warm(consumer, publish)
                assert consumer.is_ordered
                entered = Entered()
                await entered.over(consumer, publish)
    assert entered.consumer_part() == python_part(), entered.consumer_part()
    assert "durations.py" not in entered.files
